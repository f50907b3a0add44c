//! Breadth-first exploration and seeded random walks of the transition system.

use crate::world::{Config, World, world};
use std::collections::{HashSet, VecDeque};

/// Breadth-first exploration; returns (states explored, shortest violating trace if any).
pub(crate) fn explore(c: &Config) -> (usize, Option<Vec<String>>) {
    let start = world(c);
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(start.fingerprint());
    // Parent links for traces: (parent index, step description).
    let mut links: Vec<(usize, String)> = vec![(usize::MAX, "start".into())];
    let mut memo = std::collections::HashMap::new();
    let mut queue: VecDeque<(World, usize)> = VecDeque::new();
    queue.push_back((start, 0));
    let trace = |links: &Vec<(usize, String)>, mut i: usize, last: String| {
        let mut steps = vec![last];
        while i != usize::MAX && i != 0 {
            steps.push(links[i].1.clone());
            i = links[i].0;
        }
        steps.reverse();
        steps
    };
    while let Some((w, idx)) = queue.pop_front() {
        for (mut next, line, power) in w.successors() {
            if line.starts_with("VIOLATION") {
                return (seen.len(), Some(trace(&links, idx, line)));
            }
            if let Err(msg) = next.check(power, &mut memo) {
                return (
                    seen.len(),
                    Some(trace(&links, idx, format!("{line}\n  VIOLATION: {msg}"))),
                );
            }
            let fp = next.fingerprint();
            if seen.insert(fp) {
                links.push((idx, line));
                let id = links.len() - 1;
                if seen.len() < c.max_states {
                    queue.push_back((next, id));
                }
            }
        }
    }
    (seen.len(), None)
}

/// Random deep walks through the same transition system (the BFS bound does not reach
/// the 40-60 steps some 3-actor scenarios need): `walks` runs of up to `depth` steps from
/// the initial state, successors chosen by a seeded xorshift generator, every invariant
/// checked in every state. Returns (states visited, first violating trace).
///
/// Walk `k` is driven by its own seed, `walk_seed(seed, k)` (walk 0's is `seed` itself), so
/// one failing walk replays alone: `RUNLEASE_MODEL_SEED=<its seed> RUNLEASE_MODEL_WALKS=1`.
/// A violation is returned with that seed.
pub(crate) fn walk(
    c: &Config,
    walks: u32,
    depth: usize,
    seed: u64,
) -> (usize, Option<(u32, u64, Vec<String>)>) {
    let mut memo = std::collections::HashMap::new();
    let mut visited = 0;
    for k in 0..walks {
        let this_seed = walk_seed(seed, k);
        // splitmix64 of the seed starts the xorshift generator (never 0).
        let mut x = {
            let mut z = this_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) | 1
        };
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut w = world(c);
        let mut trace = Vec::new();
        // Swarm testing: each walk draws how strongly it keeps running the same actor, and
        // a third of the walks leave one actor idle throughout, so fewer steps go to
        // actions that play no part in a given interleaving.
        let stick = [70, 80, 90, 95][(rnd() % 4) as usize];
        let muted =
            (rnd() % 3 == 0).then(|| w.actors[(rnd() % w.actors.len() as u64) as usize].name);
        let is_muted = |line: &str| {
            let mut ch = line.chars();
            muted.is_some_and(|m| {
                ch.next() == Some(m) && ch.next().is_some_and(|d| d.is_ascii_digit())
            })
        };
        for _ in 0..depth {
            let succ: Vec<_> = w
                .successors()
                .into_iter()
                .filter(|(_, l, _)| !is_muted(l))
                .collect();
            if succ.is_empty() {
                break;
            }
            // Like a real scheduler, mostly keep running the actor that ran last (deep
            // sequential scenarios), sometimes switch, crash or jump the clock.
            let own: Vec<usize> = match w.running {
                Some(r) if w.actors[r].busy() => {
                    let prefix = format!("{}{}", w.actors[r].name, w.actors[r].incarnation);
                    succ.iter()
                        .enumerate()
                        .filter(|(_, (_, l, _))| l.starts_with(&prefix) && !l.contains("crashes"))
                        .map(|(k, _)| k)
                        .collect()
                }
                _ => Vec::new(),
            };
            let pick = if !own.is_empty() && rnd() % 100 < stick {
                own[(rnd() % own.len() as u64) as usize]
            } else {
                (rnd() % succ.len() as u64) as usize
            };
            let (mut next, line, power) = succ.into_iter().nth(pick).unwrap();
            trace.push(line.clone());
            if line.starts_with("VIOLATION") {
                return (visited, Some((k, this_seed, trace)));
            }
            if let Err(msg) = next.check(power, &mut memo) {
                trace.push(format!("  VIOLATION: {msg}"));
                return (visited, Some((k, this_seed, trace)));
            }
            visited += 1;
            w = next;
            // A power loss may strike in any state: check that it would be survived here
            // too (without walking on from it), as the crash-point tests do for single
            // operations. A walk then needs to reach the state, not also to pick the
            // power loss at that very step.
            if w.power_losses_left > 0 && w.actors.iter().any(|a| a.busy() || a.lease.is_some()) {
                for tear in [false, true] {
                    let mut p = w.clone_deep();
                    let line = p.power_loss(tear);
                    if let Err(msg) = p.check(true, &mut memo) {
                        trace.push(format!("(probe) {line}"));
                        trace.push(format!("  VIOLATION: {msg}"));
                        return (visited, Some((k, this_seed, trace)));
                    }
                }
            }
        }
    }
    (visited, None)
}

/// The seed of walk `k` of a run started from `seed`.
pub(crate) fn walk_seed(seed: u64, k: u32) -> u64 {
    seed.wrapping_add(u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A `u64` from the environment (decimal or `0x` hex), if set.
pub(crate) fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}
