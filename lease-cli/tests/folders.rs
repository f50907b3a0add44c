//! Run folders that trust nobody else (issue #15), through the real `runlease` binary:
//! a foreign folder is never adopted without `init`/`--init`, no existing mode is ever
//! changed, and a run folder or record that another uid owns or others may change is
//! refused with `RUN_NOT_OWNED` (77) before anything is read or written.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Output;

/// Everything below `root` (and `root` itself as `.`): path -> (type and bytes, mode with
/// the sticky/setid bits, owner uid). Symlinks are recorded, never followed.
fn listing(root: &Path) -> BTreeMap<String, (String, u32, u32)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u32, u32)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, (format!("symlink -> {}", t.display()), mode, m.uid()));
            } else if m.is_dir() {
                out.insert(rel, ("dir".into(), mode, m.uid()));
                walk(root, &p, out);
            } else {
                let bytes = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
                out.insert(rel, (format!("file {bytes}"), mode, m.uid()));
            }
        }
    }
    let mut out = BTreeMap::new();
    let m = std::fs::symlink_metadata(root).unwrap();
    out.insert(
        ".".into(),
        ("dir".into(), m.permissions().mode() & 0o7777, m.uid()),
    );
    walk(root, root, &mut out);
    out
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn expect(o: &Output, exit: i32, code: &str) -> String {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(exit), "expected {code}: {err}");
    assert!(err.contains(&format!("runlease: {code}: ")), "{err}");
    err
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A folder someone else made: a note, a sticky world-writable `tmp/`, a `work/` with a
/// file, and a `lease/` folder that is not a run's (no `epochs/`).
fn foreign_folder(root: &Path) {
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    chmod(&root.join("tmp"), 0o1777);
    std::fs::create_dir_all(root.join("work")).unwrap();
    chmod(&root.join("work"), 0o755);
    std::fs::write(root.join("work/data.csv"), b"a,b\n1,2\n").unwrap();
    chmod(&root.join("work/data.csv"), 0o644);
    std::fs::create_dir_all(root.join("lease")).unwrap();
    chmod(&root.join("lease"), 0o755);
    std::fs::write(root.join("notes.txt"), b"mine\n").unwrap();
    chmod(&root.join("notes.txt"), 0o644);
}

#[test]
fn a_non_empty_foreign_folder_is_refused_and_left_exactly_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("theirs");
    foreign_folder(&dir);
    let d = dir.to_str().unwrap();
    let before = listing(&dir);
    assert_eq!(before["tmp"].1, 0o1777);

    let o = runlease(&["run", d, "--", "true"]);
    let err = expect(&o, 64, "RUN_FOLDER_FOREIGN");
    assert!(
        err.contains("not a run") && err.contains("runlease init"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(listing(&dir), before, "`run` changed the foreign folder");

    // JSON: the same refusal as an error object.
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(64));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_FOLDER_FOREIGN", "{e}");
    assert_eq!(listing(&dir), before);

    // Even explicitly, its world-writable tmp/ is refused (77), never chmodded.
    for args in [vec!["init", d], vec!["run", "--init", d, "--", "true"]] {
        let o = runlease(&args);
        let err = expect(&o, 77, "RUN_NOT_OWNED");
        assert!(err.contains("folder tmp"), "{args:?}: {err}");
        assert!(err.contains("mode 1777"), "{args:?}: {err}");
        assert!(err.contains("chmod go-w"), "{args:?}: {err}");
        assert_eq!(listing(&dir), before, "{args:?} changed the foreign folder");
    }
    // Reading it (it reads as never claimed) writes nothing either.
    for sub in ["status", "verify", "events"] {
        runlease(&[sub, d]);
        assert_eq!(listing(&dir), before, "`{sub}` changed the foreign folder");
    }
}

#[test]
fn dot_and_dotdot_need_an_explicit_init() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("p");
    let here = parent.join("here");
    std::fs::create_dir_all(&here).unwrap();
    let before = listing(tmp.path());
    let in_here = |args: &[&str]| {
        cmd(args)
            .current_dir(&here)
            .output()
            .expect("spawn runlease")
    };
    // `.` is empty and `..` holds only `here/`: still refused, nothing written.
    for args in [
        ["run", ".", "--", "true"],
        ["run", "..", "--", "true"],
        ["run", "./", "--", "true"],
        ["run", "../here/..", "--", "true"],
    ] {
        let o = in_here(&args);
        let err = expect(&o, 64, "RUN_FOLDER_FOREIGN");
        assert!(err.contains("runlease init"), "{args:?}: {err}");
        assert_eq!(listing(tmp.path()), before, "{args:?} wrote something");
    }
    // A folder holding the current one, named by its absolute path, is the same.
    let o = in_here(&["run", parent.to_str().unwrap(), "--", "true"]);
    expect(&o, 64, "RUN_FOLDER_FOREIGN");
    assert_eq!(listing(tmp.path()), before);

    // With --init `.` becomes a run; afterwards it is a run and needs nothing more.
    let o = in_here(&["run", "--init", ".", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = in_here(&["run", ".", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(mode(&here.join("lease/epochs")), 0o700);
    assert_eq!(mode(&parent), before["p"].1, "the parent's mode changed");
}

#[test]
fn init_then_run_works_and_changes_no_existing_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("adopted");
    foreign_folder(&dir);
    // What the operator fixed first: tmp/ sticky but no longer world-writable.
    chmod(&dir.join("tmp"), 0o1755);
    chmod(&dir, 0o755);
    let d = dir.to_str().unwrap();
    let before = listing(&dir);

    let o = runlease(&["init", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o).remove(0);
    assert_eq!(v["schema"], "runlease/cli/init/1");
    assert_eq!(v["found"], "foreign", "{v}");
    assert_eq!(v["run_id"], "adopted");
    let created: Vec<&str> = v["created"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(created.contains(&"lease/epochs"), "{v}");
    assert!(
        !created.contains(&"tmp") && !created.contains(&"lease"),
        "{v}"
    );
    // Idempotent: a run now, nothing more to create.
    let o = runlease(&["init", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o).remove(0);
    assert_eq!(v["found"], "run", "{v}");
    assert_eq!(v["created"], serde_json::json!([]), "{v}");

    for _ in 0..2 {
        let o = runlease(&[
            "run",
            d,
            "--",
            "sh",
            "-c",
            "echo out > \"$RUNLEASE_RUN/work/out.txt\"",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    let after = listing(&dir);
    for (path, was) in &before {
        assert_eq!(after.get(path), Some(was), "{path} changed");
    }
    for (path, (kind, m, _)) in &after {
        if before.contains_key(path) || path.starts_with("store/") || path.starts_with("work/") {
            continue;
        }
        let want = if kind == "dir" { 0o700 } else { 0o600 };
        assert_eq!(*m, want, "new {path} has mode {m:o}");
    }
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn a_record_open_to_others_is_refused_naming_it() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    let epoch = "lease/epochs/00000000000000000002.json";
    // (file or folder, its bad mode, the subcommands that read it and so must refuse)
    let all: &[&str] = &["run", "status", "verify", "events"];
    for (file, bad, subs) in [
        (epoch, 0o664, all),
        (epoch, 0o666, all),
        ("lease", 0o757, all),
        ("run.json", 0o646, &["run", "status"][..]),
        ("owner.lock", 0o660, &["run", "status"][..]),
        ("events", 0o770, &["run", "verify", "events"][..]),
        ("tmp", 0o1777, &["run"][..]),
    ] {
        let p = dir.join(file);
        let good = mode(&p);
        chmod(&p, bad);
        let before = listing(&dir);
        for sub in subs {
            let args = if *sub == "run" {
                vec!["run", d, "--", "true"]
            } else {
                vec![*sub, d]
            };
            let o = runlease(&args);
            let err = expect(&o, 77, "RUN_NOT_OWNED");
            assert!(
                err.contains(&format!(" {file} (")),
                "{args:?} {file}: {err}"
            );
            assert!(err.contains(&format!("mode {bad:04o}")), "{args:?}: {err}");
            assert!(err.contains("was not read"), "{args:?}: {err}");
            assert_eq!(listing(&dir), before, "{args:?} {file}: something changed");
        }
        // --json carries the code and 77.
        let o = runlease(&["run", "--json", d, "--", "true"]);
        let e = json_lines(&o).remove(0);
        assert_eq!(
            (e["code"].as_str(), e["exit_code"].as_i64()),
            (Some("RUN_NOT_OWNED"), Some(77)),
            "{e}"
        );
        chmod(&p, good);
    }
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
}

#[test]
fn a_run_folder_of_another_uid_is_refused_and_nothing_written() {
    if !is_root() {
        eprintln!("skipped: needs root to chown a folder to uid 65534");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A run of uid 65534 (made by us, then given away).
    let run = tmp.path().join("their-run");
    let r = run.to_str().unwrap();
    assert_eq!(runlease(&["run", r, "--", "true"]).status.code(), Some(0));
    let chown = |p: &Path| {
        let st = std::process::Command::new("chown")
            .args(["-R", "65534", p.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
    };
    chown(&run);
    // An empty folder of uid 65534.
    let empty = tmp.path().join("their-empty");
    std::fs::create_dir(&empty).unwrap();
    chown(&empty);
    for dir in [&run, &empty] {
        let d = dir.to_str().unwrap();
        let before = listing(dir);
        for args in [
            vec!["run", d, "--", "true"],
            vec!["run", "--init", d, "--", "true"],
            vec!["init", d],
            vec!["status", d],
            vec!["verify", d],
            vec!["events", d],
            vec!["doctor", d],
        ] {
            let o = runlease(&args);
            let err = expect(&o, 77, "RUN_NOT_OWNED");
            assert!(err.contains("uid 65534"), "{args:?}: {err}");
            assert!(err.contains("the run folder itself"), "{args:?}: {err}");
            assert!(
                err.contains("was not read and nothing was written"),
                "{args:?}: {err}"
            );
            assert_eq!(listing(dir), before, "{args:?}: something was written");
        }
    }
    // Ours again, but one record of another uid: refused, naming it.
    let st = std::process::Command::new("chown")
        .args(["-R", "0", r])
        .status()
        .unwrap();
    assert!(st.success());
    let rec = run.join("lease/epochs/00000000000000000002.json");
    std::os::unix::fs::chown(&rec, Some(65534), None).unwrap();
    let before = listing(&run);
    for args in [vec!["run", r, "--", "true"], vec!["status", r]] {
        let o = runlease(&args);
        let err = expect(&o, 77, "RUN_NOT_OWNED");
        assert!(
            err.contains("lease/epochs/00000000000000000002.json"),
            "{err}"
        );
        assert!(err.contains("owned by uid 65534"), "{err}");
        assert_eq!(listing(&run), before);
    }
    std::os::unix::fs::chown(&rec, Some(0), None).unwrap();
    assert_eq!(runlease(&["run", r, "--", "true"]).status.code(), Some(0));
}

/// A second user meets a run folder of this one (root's here): `runlease` makes run folders
/// `0700`, so the kernel refuses the folder's open before runlease can judge its owner.
/// That refusal is reported as what it is, `RUN_NOT_OWNED` (77) naming the owner, the
/// mode and the fix, as for a folder the second user can open (not `IO_ERROR` 74, which
/// reads as "retry"), and nothing is written.
#[test]
fn a_run_folder_the_second_user_cannot_open_is_refused_as_not_owned() {
    let test = "a_run_folder_the_second_user_cannot_open_is_refused_as_not_owned";
    let tmp = tempfile::tempdir().unwrap();
    // The binary where uid 65534 can run it (its home; the run below is root's).
    let Some((home, bin)) = nobody_home(test, tmp.path()) else {
        return;
    };
    let run = tmp.path().join("roots-run");
    let r = run.to_str().unwrap();
    assert_eq!(runlease(&["run", r, "--", "true"]).status.code(), Some(0));
    assert_eq!(
        std::fs::metadata(&run).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let before = listing(&run);
    for args in [
        vec!["status", r],
        vec!["status", "--json", r],
        vec!["run", r, "--", "true"],
        vec!["run", "--retire-dead", r, "--", "true"],
        vec!["retire", r],
        vec!["verify", r],
        vec!["events", r],
        vec!["doctor", r],
        vec!["store", "get", r, "k"],
    ] {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(&args);
        let o = scrub_owner_env(&mut c)
            .current_dir(&home)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = expect(&o, 77, "RUN_NOT_OWNED");
        assert!(
            err.contains("the run folder itself") && err.contains("owner uid 0, mode 0700"),
            "{args:?}: {err}"
        );
        assert!(err.contains("not by uid 65534"), "{args:?}: {err}");
        assert_eq!(listing(&run), before, "{args:?}: something was written");
    }
}

/// `runlease ARGS` under `umask MASK` (through `sh`, so this process's umask is untouched),
/// with the environment of `common::cmd`.
fn with_umask(mask: &str, args: &[&str]) -> Output {
    let script = format!("umask {mask} && exec \"$0\" \"$@\"");
    let mut sh = std::process::Command::new("sh");
    sh.args(["-c", script.as_str(), BIN]).args(args);
    for (k, v) in cmd(&[]).get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh.stdin(std::process::Stdio::null())
        .output()
        .expect("spawn sh")
}

#[test]
fn any_umask_yields_0700_folders_and_0600_records() {
    for mask in ["0277", "0", "0077"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("new/parents/run");
        let d = dir.to_str().unwrap();
        let o = with_umask(
            mask,
            &[
                "run",
                d,
                "--",
                "sh",
                "-c",
                "runlease append \"$RUNLEASE_RUN\" --type step",
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "umask {mask}: {}",
            text(&o.stderr)
        );
        let o = with_umask(mask, &["init", tmp.path().join("inited").to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "umask {mask}: {}",
            text(&o.stderr)
        );
        let all = listing(tmp.path());
        let mut files = 0;
        for (path, (kind, m, _)) in &all {
            if path == "." || path.contains("/store/") {
                continue; // the temp folder; the SQLite store is lease-sqlite's
            }
            if kind == "dir" {
                assert_eq!(*m, 0o700, "umask {mask}: {path} is {m:o}");
            } else {
                files += 1;
                assert_eq!(*m, 0o600, "umask {mask}: {path} is {m:o}");
            }
        }
        assert!(all.contains_key("new/parents/run/events/00000000000000000001.json"));
        assert!(all.contains_key("inited/lease/epochs"));
        assert!(files >= 5, "umask {mask}: {all:?}");
        // And it still reads back as ours.
        let o = with_umask(mask, &["verify", d]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "umask {mask}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn a_missing_or_empty_folder_still_becomes_a_run_without_init() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    chmod(&empty, 0o755);
    for dir in [empty.clone(), tmp.path().join("missing/run")] {
        let d = dir.to_str().unwrap();
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "{d}: {}", text(&o.stderr));
        assert!(dir.join("lease/epochs").is_dir());
    }
    assert_eq!(mode(&empty), 0o755, "the empty folder's own mode changed");
    // `list` shows both: a run is a folder holding lease/epochs/.
    std::fs::create_dir_all(tmp.path().join("not-a-run/lease")).unwrap();
    let o = runlease(&["list", "--json", tmp.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let runs: Vec<String> = json_lines(&o)
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(runs, vec!["empty".to_string()], "{runs:?}");
}

/// Eight `runlease run` of the same new folder at once: the folder is being laid out by
/// one of them while the others look at it (`lease/` before `lease/epochs/`), which must not
/// read as a foreign folder. Each ends 0 (it got the run) or 76 (held), never 64; and an
/// `init` interrupted after its first folder is finished by the next `run`.
#[test]
fn concurrent_first_runs_and_an_interrupted_init_are_not_foreign_folders() {
    for round in 0..3 {
        let (_tmp, dir) = scratch();
        let d = dir.to_str().unwrap().to_string();
        let children: Vec<_> = (0..8)
            .map(|_| spawn(&["run", &d, "--", "sleep", "0.2"]))
            .collect();
        for mut c in children {
            let code = wait_exit(&mut c, std::time::Duration::from_secs(30)).code();
            assert!(
                matches!(code, Some(0) | Some(76)),
                "round {round}: exit {code:?}"
            );
        }
    }
    // What a crash after the first mkdir of an init leaves: empty layout folders only.
    let (_tmp, dir) = scratch();
    std::fs::create_dir_all(dir.join("lease/beats")).unwrap();
    std::fs::create_dir(dir.join("tmp")).unwrap();
    let o = runlease(&["run", dir.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Content in a layout-named folder is someone's: still foreign.
    let (_tmp, dir) = scratch();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("work/data.csv"), b"1,2\n").unwrap();
    let o = runlease(&["run", dir.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("RUN_FOLDER_FOREIGN"));
}
