//! Verified-prefix marks from the shell (issue #33, PROTOCOL §13.1): `runlease append`,
//! `run` and `status` check the log only from the newest mark, so tampering below it is
//! left to `verify` and `doctor`, which find it; what follows the mark (and the mark's own
//! event) every writer refuses, with the code `verify` gives, writing nothing.

mod common;

use common::*;
use std::path::Path;

/// A released run whose log has `n` events, appended by `runlease append` processes
/// under one `runlease run` (so the marks are those the shell path leaves).
fn run_with_events(dir: &Path, n: u32) {
    let d = dir.to_str().unwrap();
    let script = format!(
        r#"i=0; while [ $i -lt {n} ]; do runlease append -q "$RUNLEASE_RUN" --type step >/dev/null || exit 9; i=$((i+1)); done"#
    );
    let o = cmd(&["run", "-q", d, "--", "sh", "-c", &script])
        .env("PATH", path_with_binary())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

fn marks(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("lease/marks"))
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A copy of the run `dir` under the same name (its run id) in a sibling folder `beside`.
fn copy_beside(dir: &Path, beside: &str) -> std::path::PathBuf {
    let copy = dir
        .parent()
        .unwrap()
        .join(beside)
        .join(dir.file_name().unwrap());
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    copy_tree(dir, &copy);
    copy
}

fn edit_event(dir: &Path, s: u64) {
    let p = dir.join(format!("events/{s:020}.json"));
    let text = std::fs::read_to_string(&p).unwrap();
    let edited = text.replacen("\"type\":\"step\"", "\"type\":\"stpp\"", 1);
    assert_ne!(edited, text);
    std::fs::write(&p, edited).unwrap();
}

// §13.1: the shell path leaves a mark, and only the newest one is kept.
#[test]
fn appends_from_the_shell_leave_one_mark_at_a_multiple_of_64() {
    let (_tmp, dir) = scratch();
    run_with_events(&dir, 130);
    assert_eq!(marks(&dir), [format!("{:020}.json", 128)]);
    let o = runlease(&["verify", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

// §13.1, the stated trade-off: an edit below the mark is verify's and doctor's to find;
// after the mark (or of the mark's own event) every writer refuses it with verify's code.
#[test]
fn an_edit_below_the_mark_is_found_by_verify_and_doctor_and_one_after_it_by_every_writer() {
    let (_tmp, dir) = scratch();
    run_with_events(&dir, 70);
    assert_eq!(marks(&dir), [format!("{:020}.json", 64)]);

    // Below the mark.
    let below = copy_beside(&dir, "below");
    edit_event(&below, 10);
    let b = below.to_str().unwrap();
    let v = runlease(&["verify", b]);
    assert_eq!(v.status.code(), Some(65), "{}", text(&v.stderr));
    assert!(
        text(&v.stderr).contains("CHAIN_BROKEN"),
        "{}",
        text(&v.stderr)
    );
    let doc = runlease(&["doctor", b]);
    assert_ne!(
        doc.status.code(),
        Some(0),
        "doctor finds it: {}",
        text(&doc.stdout)
    );
    let o = cmd(&["run", "-q", b, "--", "true"]).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "below the mark a writer does not look: {}",
        text(&o.stderr)
    );

    // The mark's own event, and one after it: refused before anything is written.
    for s in [64, 67] {
        let copy = copy_beside(&dir, &format!("at{s}"));
        edit_event(&copy, s);
        let c = copy.to_str().unwrap();
        let before = tree(&copy);
        let o = cmd(&["run", "-q", c, "--", "true"]).output().unwrap();
        assert_eq!(o.status.code(), Some(65), "event {s}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("CHAIN_BROKEN"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(tree(&copy), before, "event {s}: the refusal wrote nothing");
        let v = runlease(&["verify", c]);
        assert_eq!(v.status.code(), Some(65), "{}", text(&v.stderr));
        let st = status_json(&copy);
        assert_ne!(
            st["next_step"],
            serde_json::json!(null),
            "status names a next step"
        );
    }
}
