//! `doctor`, `list` and `prune`: healthy runs, a missing store, a broken run.json.

use crate::common::*;

#[test]
fn doctor_list_and_prune_on_healthy_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    std::fs::create_dir(tmp.path().join("not-a-run")).unwrap();
    for _ in 0..3 {
        assert_eq!(
            runlease(&["run", a.to_str().unwrap(), "--", "true"])
                .status
                .code(),
            Some(0)
        );
    }
    assert_eq!(
        runlease(&["run", b.to_str().unwrap(), "--", "true"])
            .status
            .code(),
        Some(0)
    );
    // An orphan temp file and a stray name.
    std::fs::write(a.join("lease/epochs/.tmp-1-1-000000001"), b"x").unwrap();
    std::fs::write(a.join("lease/epochs/notes.txt"), b"x").unwrap();
    let o = runlease(&["doctor", "--json", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let codes: Vec<String> = json_lines(&o)
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes.contains(&"ORPHAN_TEMP_FILES".to_string()),
        "{codes:?}"
    );
    assert!(codes.contains(&"STRAY_NAMES".to_string()), "{codes:?}");
    let o = runlease(&["doctor", "--json", b.to_str().unwrap()]);
    assert_eq!(json_lines(&o)[0]["code"], "OK");

    let o = runlease(&["list", "--json", tmp.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["state"] == "free"));

    let o = runlease(&["prune", "--json", a.to_str().unwrap(), "--keep", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["floor"], 5);
    assert_eq!(
        runlease(&["verify", a.to_str().unwrap()]).status.code(),
        Some(0)
    );
    assert_eq!(
        runlease(&["run", a.to_str().unwrap(), "--", "true"])
            .status
            .code(),
        Some(0)
    );
}

/// Doctor reports the store writing nothing: a sealed store that is gone (`STORE_MISSING`,
/// from the chain), and a foreign store copied in, judged read-only against the seal as
/// `run` judges it before claiming. Each is an error (65) and changes nothing.
#[test]
fn doctor_reports_a_missing_or_foreign_store_writing_nothing() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let store = dir.join(lease_core::layout::STORE_FILE);
    std::fs::remove_file(&store).unwrap();

    // Gone: found from the chain's seal, before any run tried.
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
    let f = json_lines(&o);
    let missing: Vec<_> = f.iter().filter(|f| f["code"] == "STORE_MISSING").collect();
    assert_eq!(missing.len(), 1, "{f:?}");
    let detail = missing[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("store/run.sqlite is missing") && detail.contains("sealed at sequence"),
        "{detail}"
    );
    // `run` refuses it with the same code; doctor still says it once.
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "STORE_MISSING");
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(
        f.iter().filter(|f| f["code"] == "STORE_MISSING").count(),
        1,
        "{f:?}"
    );
    // status: free, but its next step is doctor, not "claim it".
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert!(
        st["next_step"]
            .as_str()
            .unwrap()
            .starts_with(&format!("runlease doctor -- {d}")),
        "{st}"
    );

    // Another run's store copied in: `run` refuses it before claiming (issue #28: read
    // without writing, against the seal), and doctor, judging it the same way, reports it.
    let (_tmp2, other) = scratch();
    let od = other.to_str().unwrap();
    assert_eq!(runlease(&["run", od, "--", "true"]).status.code(), Some(0));
    std::fs::copy(other.join(lease_core::layout::STORE_FILE), &store).unwrap();
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let code = json_lines(&o)[0]["code"].as_str().unwrap().to_string();
    assert!(
        ["STORE_IDENTITY_MISMATCH", "STORE_CORRUPT"].contains(&code.as_str()),
        "{code}"
    );
    let before = tree(&dir);
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    let f = json_lines(&o);
    let found: Vec<_> = f.iter().filter(|f| f["code"] == code.as_str()).collect();
    assert_eq!(found.len(), 1, "{f:?}");
    assert_eq!(found[0]["severity"], "error");
    assert!(
        found[0]["detail"].as_str().unwrap().contains("run.sqlite"),
        "{found:?}"
    );
    assert_eq!(tree(&dir), before, "doctor changed the run");
}

/// A hand-broken run.json: status names it and sends the operator to doctor (not "claim
/// it"), `run` refuses (65) naming the file, doctor reports it, and nothing is repaired.
#[test]
fn a_hand_broken_run_json_is_reported_by_status_run_and_doctor_and_kept() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    std::fs::write(dir.join("run.json"), b"{bad").unwrap();
    let before = tree(&dir);
    let st = status_json(&dir);
    assert_eq!(st["run_status"]["status"], "invalid", "{st}");
    assert!(
        st["next_step"]
            .as_str()
            .unwrap()
            .starts_with(&format!("runlease doctor -- {d}")),
        "{st}"
    );
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("run.json") && err.contains("RECORD_INVALID"),
        "{err}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        json_lines(&o)
            .iter()
            .any(|f| f["code"] == "INVALID_RECORD"
                && f["detail"].as_str().unwrap().contains("run.json")),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(
        tree(&dir),
        before,
        "run.json was repaired or the run changed"
    );
}
