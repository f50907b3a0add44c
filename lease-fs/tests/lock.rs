//! The kernel owner lock: exclusive within and across processes, immune to the POSIX-lock
//! pitfall, released by the kernel when the holder dies.

use std::io::{BufRead, BufReader, ErrorKind};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lease_fs::lock::{LOCK_FILE, OwnerLock, probe_owner_lock};
use lease_fs::real::RealFs;

/// Set in the environment of a child copy of this test binary: the run root whose lock the
/// child takes and holds until it is killed.
const CHILD_ROOT_VAR: &str = "LEASE_FS_TEST_LOCK_CHILD_ROOT";
const CHILD_READY: &str = "LEASE_FS_TEST_CHILD_LOCKED";

/// Whether the lock of `root` becomes free within 1 s. Right after a release it may still
/// be held for a moment: a process forked by another test thread (to spawn a command) holds
/// a copy of every descriptor until it execs, when `O_CLOEXEC` closes them.
fn becomes_free(root: &Path) -> bool {
    OwnerLock::acquire_timeout(root, Duration::from_secs(1))
        .unwrap()
        .is_some()
}

/// Not a test of its own: the body of the child process of
/// `a_killed_holder_releases_the_lock` (does nothing unless that child's variable is set).
#[test]
fn child_holds_lock_helper() {
    let Some(root) = std::env::var_os(CHILD_ROOT_VAR) else {
        return;
    };
    let lock = OwnerLock::try_acquire(Path::new(&root))
        .unwrap()
        .expect("the child must get the lock");
    println!("{CHILD_READY}");
    std::thread::sleep(Duration::from_secs(60));
    drop(lock);
}

#[test]
fn a_second_acquirer_in_the_same_process_gets_none() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    assert!(probe_owner_lock(root).unwrap());
    let first = OwnerLock::try_acquire(root)
        .unwrap()
        .expect("free at first");
    assert_eq!(first.path(), root.join(LOCK_FILE));
    assert!(OwnerLock::try_acquire(root).unwrap().is_none());
    assert!(!probe_owner_lock(root).unwrap());
    // Another thread is no different.
    let r = root.to_path_buf();
    let other = std::thread::spawn(move || OwnerLock::try_acquire(&r).unwrap().is_none());
    assert!(other.join().unwrap());
    drop(first);
    assert!(becomes_free(root));
}

#[test]
fn closing_another_descriptor_of_the_lock_file_keeps_the_lock() {
    // The POSIX (fcntl) lock pitfall: closing ANY descriptor of the file drops the process's
    // locks on it. flock locks belong to the open file description and survive this.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let held = OwnerLock::try_acquire(root).unwrap().unwrap();
    let lock_path = root.join(LOCK_FILE);

    drop(std::fs::File::open(&lock_path).unwrap());
    drop(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&lock_path)
            .unwrap(),
    );
    let _ = std::fs::read(&lock_path).unwrap();
    // A reader going through RealFs opens and closes it too.
    let fs = RealFs::open(root).unwrap();
    let _ = lease_fs::fs::Fs::read(&fs, LOCK_FILE, 1024).unwrap();
    // And a probe that fails to take it closes its own descriptor.
    assert!(!probe_owner_lock(root).unwrap());

    assert!(
        OwnerLock::try_acquire(root).unwrap().is_none(),
        "closing another descriptor must not drop the lock"
    );
    let r = root.to_path_buf();
    assert!(
        std::thread::spawn(move || OwnerLock::try_acquire(&r).unwrap().is_none())
            .join()
            .unwrap()
    );
    drop(held);
    assert!(becomes_free(root));
}

#[test]
fn a_killed_holder_releases_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_lock_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROOT_VAR, root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let ready = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break false;
        }
        seen.push_str(&line);
        if line.contains(CHILD_READY) {
            break true;
        }
    };
    if !ready {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child never reported the lock; its output:\n{seen}");
    }

    assert!(OwnerLock::try_acquire(root).unwrap().is_none());
    assert!(!probe_owner_lock(root).unwrap());

    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    let status = child.wait().unwrap();
    assert!(!status.success());

    let t = Instant::now();
    let lock = loop {
        if let Some(lock) = OwnerLock::try_acquire(root).unwrap() {
            break lock;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "the lock of a SIGKILLed holder was not released within 1 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    drop(lock);
}

#[test]
fn the_lock_is_not_inherited_by_child_processes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let held = OwnerLock::try_acquire(root).unwrap().unwrap();
    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    drop(held);
    // The `sleep` child lives 30 s: had it inherited the lock, it would stay held.
    let free = becomes_free(root);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        free,
        "a child command kept the owner lock held (descriptor inherited)"
    );
}

#[test]
fn acquire_timeout_waits_for_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let held = OwnerLock::try_acquire(&root).unwrap().unwrap();

    let t = Instant::now();
    let got = OwnerLock::acquire_timeout(&root, Duration::from_millis(80)).unwrap();
    let waited = t.elapsed();
    assert!(got.is_none());
    assert!(waited >= Duration::from_millis(80), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");

    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
    });
    let t = Instant::now();
    let got = OwnerLock::acquire_timeout(&root, Duration::from_secs(5)).unwrap();
    assert!(got.is_some());
    assert!(t.elapsed() < Duration::from_secs(2));
    releaser.join().unwrap();
}

#[test]
fn the_lock_file_is_private_and_never_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A probe never creates the file.
    assert!(probe_owner_lock(root).unwrap());
    assert!(!root.join(LOCK_FILE).exists());
    let lock = OwnerLock::try_acquire(root).unwrap().unwrap();
    let mode = std::fs::metadata(root.join(LOCK_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(lock);
    assert!(becomes_free(root));

    let other = tempfile::tempdir().unwrap();
    let victim = other.path().join("victim");
    std::fs::write(&victim, b"").unwrap();
    let root2 = other.path().join("run");
    std::fs::create_dir(&root2).unwrap();
    symlink(&victim, root2.join(LOCK_FILE)).unwrap();
    assert!(OwnerLock::try_acquire(&root2).is_err());
    assert!(probe_owner_lock(&root2).is_err());

    let missing = other.path().join("missing");
    let e = OwnerLock::try_acquire(&missing).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(
        probe_owner_lock(&missing).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(!missing.exists());
}

#[test]
fn try_acquire_in_locks_the_opened_root_even_after_a_rename() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    std::fs::create_dir(&root).unwrap();
    let fs = RealFs::open(&root).unwrap();
    let moved = dir.path().join("moved");
    std::fs::rename(&root, &moved).unwrap();
    std::fs::create_dir(&root).unwrap();
    let lock = OwnerLock::try_acquire_in(&fs).unwrap().unwrap();
    assert!(moved.join(LOCK_FILE).exists());
    assert!(!root.join(LOCK_FILE).exists());
    assert!(!probe_owner_lock(&moved).unwrap());
    drop(lock);
    assert!(becomes_free(&moved));
}

/// An exited process that nobody reaped yet (a zombie) cannot act: liveness treats it as
/// gone, while its pid still exists in /proc.
#[test]
fn a_zombie_process_counts_as_gone_for_liveness() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Wait until it has exited but is not reaped.
    let start = std::time::Instant::now();
    loop {
        if lease_fs::probe::read_stat(pid).unwrap().unwrap().state == 'Z' {
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(lease_fs::probe::process_start_time(pid).unwrap().is_some());
    assert_eq!(lease_fs::probe::live_process_start_time(pid).unwrap(), None);
    child.wait().unwrap();
    assert_eq!(lease_fs::probe::live_process_start_time(pid).unwrap(), None);
}
