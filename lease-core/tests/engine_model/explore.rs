//! Breadth-first exploration of the engine model, with what it covered.

use crate::world::{Config, World, world};
use std::collections::{HashSet, VecDeque};

/// What the exploration covered (so a run that never reached the cases it is for says so):
/// distinct states in which some record was refused; checked transitions that lost an
/// answer, held a request, delivered one late, or started a resolution. A late delivery
/// seldom makes a new state: the guard makes it inert (it lands as the lost answer's
/// landing would have, or is refused), which is the point.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    pub(crate) refused: usize,
    pub(crate) lost: usize,
    pub(crate) held: usize,
    pub(crate) late: usize,
    pub(crate) resolutions: usize,
    /// Truncations started, and reads without a lease that met a truncation (and so read
    /// again: the state after is one seen before, so these are counted as transitions).
    pub(crate) truncations: usize,
    pub(crate) observer_retries: usize,
}

/// Breadth-first exploration: ((states, shortest violating trace), what it covered).
pub(crate) fn explore_covering(c: &Config) -> ((usize, Option<Vec<String>>), Coverage) {
    let mut cov = Coverage::default();
    let start = world(c);
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(start.fingerprint());
    let mut links: Vec<(usize, String)> = vec![(usize::MAX, "start".into())];
    let mut queue: VecDeque<(World, usize)> = VecDeque::from([(start, 0)]);
    while let Some((w, idx)) = queue.pop_front() {
        for (next, line) in w.successors() {
            if line.contains("VIOLATION") {
                let mut steps = vec![line];
                let mut i = idx;
                while i != 0 && i != usize::MAX {
                    steps.push(links[i].1.clone());
                    i = links[i].0;
                }
                steps.reverse();
                return ((seen.len(), Some(steps)), cov);
            }
            // Every successor was checked (`World::checked`), new or not.
            cov.lost += usize::from(line.contains("answer lost"));
            cov.held += usize::from(line.contains("held by the network"));
            cov.late += usize::from(line.contains("late"));
            cov.resolutions += usize::from(line.contains("resolves"));
            cov.truncations += usize::from(line.contains("truncates"));
            cov.observer_retries += usize::from(line.contains("reads again"));
            if seen.insert(next.fingerprint()) {
                cov.refused += usize::from(!next.refused.is_empty());
                links.push((idx, line));
                if seen.len() < c.max_states {
                    queue.push_back((next, links.len() - 1));
                }
            }
        }
    }
    ((seen.len(), None), cov)
}
