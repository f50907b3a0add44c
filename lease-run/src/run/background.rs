//! Work this process does on a run after the caller stopped waiting for it: a cancelled
//! open finishing and handing the run back, a cancelled release finishing, a dropped
//! [`Run`] being released. Each holds a [`Pending`] mark for the run's path while it
//! works; [`Run::settle`] waits until no mark is left, and [`Run::open`] settles first, so
//! the same process reopening a run never races its own background release.

#[cfg(doc)]
use super::Run;
use crate::sync::lock_std;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use tokio::sync::watch;

/// Per run path (as given to [`Run::open`]): how many background steps are working on it.
fn registry() -> &'static Mutex<HashMap<PathBuf, watch::Sender<usize>>> {
    static PENDING: OnceLock<Mutex<HashMap<PathBuf, watch::Sender<usize>>>> = OnceLock::new();
    PENDING.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A background step working on a run; counted from [`Pending::start`] until dropped.
#[derive(Debug)]
pub(crate) struct Pending {
    path: PathBuf,
}

impl Pending {
    /// Mark `path` as having a background step in progress.
    pub(crate) fn start(path: &Path) -> Pending {
        let mut map = lock_std(registry());
        map.entry(path.to_path_buf())
            .or_insert_with(|| watch::Sender::new(0))
            .send_modify(|n| *n += 1);
        Pending {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut map = lock_std(registry());
        let done = match map.get(&self.path) {
            Some(tx) => {
                tx.send_modify(|n| *n = n.saturating_sub(1));
                *tx.borrow() == 0
            }
            None => false,
        };
        if done {
            // Waiters already saw 0 (or see the sender gone): both mean settled.
            map.remove(&self.path);
        }
    }
}

/// Whether a background step of this process is working on `path` now.
#[cfg(test)]
pub(crate) fn is_pending(path: &Path) -> bool {
    lock_std(registry())
        .get(path)
        .is_some_and(|tx| *tx.borrow() > 0)
}

/// Wait until no background step of this process works on `path`.
pub(crate) async fn settle(path: &Path) {
    let rx = lock_std(registry()).get(path).map(watch::Sender::subscribe);
    if let Some(mut rx) = rx {
        // An error means the sender is gone: the last step ended.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settle_waits_for_every_mark_of_its_path_only() {
        let (a, b) = (Path::new("/x/settle-a"), Path::new("/x/settle-b"));
        settle(a).await; // nothing pending: at once
        let m1 = Pending::start(a);
        let m2 = Pending::start(a);
        let other = Pending::start(b);
        assert!(is_pending(a) && is_pending(b));
        let waiter = tokio::spawn(async move { settle(Path::new("/x/settle-a")).await });
        tokio::task::yield_now().await;
        drop(m1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one mark is left");
        drop(m2);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("settled once the last mark went")
            .unwrap();
        assert!(!is_pending(a));
        assert!(is_pending(b), "another path's mark is its own");
        drop(other);
        assert!(!is_pending(b));
    }
}
