//! The test's controls of a [`SimFs`]: forks and fingerprints, crashes and crash points,
//! injected faults, setup, snapshots and call counters.

use super::{Counters, Node, ROOT, SimFs, State, check_entry};
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

impl SimFs {
    /// An empty file system: only the (durable) root directory.
    pub fn new() -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(State::new())),
        }
    }

    /// An independent deep copy of the whole file system (live and durable state, pending
    /// crash points and faults): the model checker explores each successor on a fork.
    pub fn fork(&self) -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(self.lock().clone())),
        }
    }

    /// A canonical description of the state that matters for future behaviour: the live
    /// tree and the durable tree by path (inodes numbered by first appearance, so hard
    /// links show), each file's live and durable data, and the order in which unsynced
    /// files were written (which one a torn crash would tear). Two file systems with equal
    /// fingerprints behave the same under every future call and crash.
    pub fn fingerprint(&self) -> String {
        let st = self.lock();
        let mut ids: BTreeMap<u64, usize> = BTreeMap::new();
        let mut out = String::new();
        let mut unsynced: Vec<(u64, String)> = Vec::new();
        for durable in [false, true] {
            out.push_str(if durable { "|durable:" } else { "live:" });
            let mut stack = vec![(ROOT, String::new())];
            while let Some((id, path)) = stack.pop() {
                let Some(Node::Dir(d)) = st.nodes.get(&id) else {
                    continue;
                };
                let entries = if durable { &d.durable } else { &d.live };
                for (name, child) in entries.iter().rev() {
                    let p = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}/{name}")
                    };
                    let n = ids.len();
                    let canon = *ids.entry(*child).or_insert(n);
                    match st.nodes.get(child) {
                        Some(Node::Dir(_)) => {
                            out.push_str(&format!("{p}/=d{canon};"));
                            stack.push((*child, p));
                        }
                        Some(Node::File(f)) => {
                            out.push_str(&format!(
                                "{p}=f{canon}:{}/{}/{};",
                                String::from_utf8_lossy(&f.live),
                                if f.durable == f.live {
                                    std::borrow::Cow::Borrowed("=")
                                } else {
                                    String::from_utf8_lossy(&f.durable)
                                },
                                f.synced
                            ));
                            if let Some((at, len)) = f.in_place {
                                // What a torn crash would keep depends on the range.
                                out.push_str(&format!("inplace{at}+{len};"));
                            }
                            if !f.synced && !durable {
                                unsynced.push((f.written, p));
                            }
                        }
                        None => out.push_str(&format!("{p}=dangling;")),
                    }
                }
            }
        }
        unsynced.sort();
        out.push_str("|unsynced-order:");
        for (_, p) in unsynced {
            out.push_str(&p);
            out.push(';');
        }
        out
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power loss now: the live state becomes the durable one (see the module docs);
    /// with `tear`, the most recently written surviving unsynced file keeps a prefix of
    /// its data. Does not re-enable calls after a crash point: see [`SimFs::resume`].
    pub fn crash(&self, tear: bool) {
        self.lock().crash(tear);
    }

    /// Bring the file system back up after a crash point: disarm it and let calls run
    /// again. Without a preceding [`SimFs::crash`] this models a process crash, which loses
    /// nothing. Pending faults whose call has already passed are dropped.
    pub fn resume(&self) {
        let mut st = self.lock();
        st.down = false;
        st.crash_at = None;
        let tick = st.tick;
        st.faults.retain(|&at, _| at > tick);
    }

    /// [`SimFs::crash`] then [`SimFs::resume`]: reboot after power loss.
    pub fn recover(&self, tear: bool) {
        self.crash(tear);
        self.resume();
    }

    /// Arm a crash point: the next `n` calls run normally, every call after them fails
    /// with the simulated crash error and has no effect, until [`SimFs::resume`].
    /// `crash_after(0)` stops the very next call.
    pub fn crash_after(&self, n: u64) {
        let mut st = self.lock();
        st.crash_at = Some(st.tick + n + 1);
    }

    /// Whether a crash point was reached (calls fail until [`SimFs::resume`]).
    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// Make the `n`-th call from now (`1` = the next one) fail with
    /// `io::Error::from_raw_os_error(errno)`, without effect (except the optional empty
    /// file of an `ENOSPC` `write_new`, see [`SimFs::set_enospc_leaves_empty_file`]).
    /// Later calls work normally. Several faults may be pending.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fail_nth(&self, n: u64, errno: i32) {
        assert!(n > 0, "fail_nth: calls are numbered from 1");
        let mut st = self.lock();
        let at = st.tick + n;
        st.faults.insert(at, (errno, false));
    }

    /// Like [`SimFs::fail_nth`], but the call takes effect before reporting the error: an
    /// ambiguous failure (e.g. an NFS `link` that succeeded on the server but whose reply
    /// was lost). An error the call itself returns wins over the injected one.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fail_nth_after_effect(&self, n: u64, errno: i32) {
        assert!(n > 0, "fail_nth_after_effect: calls are numbered from 1");
        let mut st = self.lock();
        let at = st.tick + n;
        st.faults.insert(at, (errno, true));
    }

    /// Drop every pending fault of [`SimFs::fail_nth`] and [`SimFs::fail_nth_after_effect`].
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Whether a `write_new` failed by an injected `ENOSPC` leaves an empty (unsynced) file
    /// behind, as a real disk may. Default: `false` (no effect).
    pub fn set_enospc_leaves_empty_file(&self, on: bool) {
        self.lock().enospc_leaves_empty_file = on;
    }

    /// Make every later `rename` durable at once while the renamed file's data stays as
    /// durable as its fsyncs made it (see the module docs): a power loss can then leave a
    /// file that was renamed into place without an fsync empty or torn. Default: `false`.
    pub fn set_renames_outrun_data(&self, on: bool) {
        self.lock().renames_outrun_data = on;
    }

    /// Make this file system report that it may lose unsynced writes while the writer
    /// lives, as a network or user-space one does ([`crate::fstype`]).
    pub fn set_loses_unsynced_writes(&self, on: bool) {
        self.lock().loses_unsynced_writes = on;
    }

    /// The torn file of a `crash(true)` keeps `len * num / den` bytes. Default `1/2`.
    ///
    /// # Panics
    ///
    /// If `den` is 0 or `num > den`.
    pub fn set_tear_fraction(&self, num: u64, den: u64) {
        assert!(
            den > 0 && num <= den,
            "set_tear_fraction: need 0 <= num <= den, den > 0"
        );
        self.lock().tear = (num, den);
    }

    /// Make `check_root` fail (the run root was renamed or replaced underneath), or pass
    /// again. Other calls keep working, as they would through the held root descriptor.
    pub fn set_root_replaced(&self, replaced: bool) {
        self.lock().root_replaced = replaced;
    }

    /// Set the age `age_secs` reports for the file at `path` (shared by all its links;
    /// survives crashes). New files have age 0. Not a call: not counted, never crashes.
    pub fn set_age(&self, path: &str, secs: u64) -> io::Result<()> {
        check_entry("set_age", path)?;
        let mut st = self.lock();
        let id = st.file_id("set_age", path, "is a directory")?;
        st.file_mut(id).age = secs;
        Ok(())
    }

    /// Write `bytes` to `path` durably at once, for tests that hand-edit records: missing
    /// parent directories are created durably, an existing file's inode gets the new
    /// content (live and durable, seen through all its links), and only this entry is made
    /// durable (other pending changes stay pending). Not a call: not counted, never
    /// crashes or fails by injection.
    pub fn put(&self, path: &str, bytes: &[u8]) -> io::Result<()> {
        self.lock().put(path, bytes)
    }

    /// Every file reachable through live entries, by path, with its live data (a file with
    /// several links appears under each name; directories are not listed).
    pub fn snapshot_live(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().snapshot(false)
    }

    /// What a crash without tear would leave: every file reachable through durable
    /// entries, by path, with its durable data.
    pub fn snapshot_durable(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().snapshot(true)
    }

    /// Trait calls made since creation or the last [`SimFs::reset_counters`].
    pub fn calls(&self) -> u64 {
        self.lock().counters.calls
    }

    /// `fsync` calls made since creation or the last [`SimFs::reset_counters`].
    pub fn fsync_count(&self) -> u64 {
        self.lock().counters.fsync
    }

    /// `fsync_dir` calls made since creation or the last [`SimFs::reset_counters`]
    /// (not counting the fsyncs inside `ensure_dir`, see [`Counters::ensure_dir_syncs`]).
    pub fn fsync_dir_count(&self) -> u64 {
        self.lock().counters.fsync_dir
    }

    /// All counters at once.
    pub fn counters(&self) -> Counters {
        self.lock().counters
    }

    /// Zero the counters (crash points and pending faults are not affected).
    pub fn reset_counters(&self) {
        self.lock().counters = Counters::default();
    }
}
