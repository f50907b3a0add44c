//! Bugs found by trying `runlease` as a demanding new user would (one test per bug, each
//! written before its fix): hand-placed symlinks for files inside the run, a closed stderr,
//! a `runlease run` nested in a command of the same run.

mod common;

use common::*;

/// A run with one released generation (epochs 1 and 2) and one event.
fn used_run(dir: &std::path::Path) {
    let o = runlease(&[
        "run",
        dir.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step >/dev/null"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// A record file replaced by a symlink is bad input on disk like a symlinked folder: 65
/// `RUN_LAYOUT_INVALID` naming the file, not 74 `IO_ERROR` (which says "retry"), and
/// nothing changes.
#[test]
fn a_record_file_replaced_by_a_symlink_is_a_layout_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    used_run(&run);
    let d = run.to_str().unwrap();
    let head = epoch_file(&run, 2);
    let moved = tmp.path().join("moved-epoch");
    std::fs::rename(&head, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &head).unwrap();
    let before = tree(tmp.path());
    for args in [
        vec!["status", d],
        vec!["verify", d],
        vec!["events", d],
        vec!["doctor", d],
        vec!["retire", d],
        vec!["run", d, "--retire-dead", "--takeover-stale", "--", "true"],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
        assert!(
            err.starts_with("runlease: RUN_LAYOUT_INVALID: ")
                && err.contains("lease/epochs/00000000000000000002.json")
                && err.contains("symlink"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(tree(tmp.path()), before, "something changed on disk");

    // The same for run.json and the owner lock (read by `run` before it claims).
    std::fs::rename(&moved, &head).unwrap();
    for name in ["run.json", "owner.lock"] {
        let file = run.join(name);
        let moved = tmp.path().join(format!("moved-{name}"));
        std::fs::rename(&file, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &file).unwrap();
        let before = tree(tmp.path());
        let o = runlease(&["run", d, "--", "true"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{name}: {err}");
        assert!(
            err.starts_with("runlease: RUN_LAYOUT_INVALID: ")
                && err.contains(name)
                && err.contains("symlink"),
            "{name}: {err}"
        );
        assert_eq!(
            tree(tmp.path()),
            before,
            "{name}: something changed on disk"
        );
        std::fs::remove_file(&file).unwrap();
        std::fs::rename(&moved, &file).unwrap();
    }
}
