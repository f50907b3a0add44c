//! `--json` output against its contract, docs/cli-json.md: every subcommand is run with
//! `--json`, and each object it prints must carry every field the doc marks `always: yes`
//! and no field the doc does not list. The field lists are read from the doc file itself,
//! so the doc and the code cannot drift apart silently.

mod common;

use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One documented shape: its fields, each with whether it is always present.
type Shape = BTreeMap<String, bool>;

/// Parse docs/cli-json.md: `## \`schema\`` headings (optionally qualified by
/// `"event": "X"`), each followed by a `| field | always | type | meaning |` table.
fn documented() -> BTreeMap<String, Shape> {
    let doc = include_str!("../../docs/cli-json.md");
    let mut shapes: BTreeMap<String, Shape> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = h.split('`').nth(1).map(|schema| {
                match h
                    .split("\"event\": \"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                {
                    Some(ev) => format!("{schema}#{ev}"),
                    None => schema.to_string(),
                }
            });
            if let Some(c) = &current {
                assert!(
                    shapes.insert(c.clone(), Shape::new()).is_none(),
                    "{c} twice"
                );
            }
            continue;
        }
        let Some(key) = &current else { continue };
        if !line.starts_with("| `") {
            continue;
        }
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let field = cols[1].trim_matches('`').to_string();
        let always = match cols[2] {
            "yes" => true,
            "no" => false,
            other => panic!("{key}.{field}: `always` must be yes or no, not {other:?}"),
        };
        shapes.get_mut(key).unwrap().insert(field, always);
    }
    shapes
}

/// The doc key of an object: its schema, plus `#event` for `run/1`.
fn key_of(v: &Value) -> String {
    let schema = v["schema"]
        .as_str()
        .expect("schema is a string")
        .to_string();
    match v.get("event").and_then(Value::as_str) {
        Some(ev) if schema == "runlease/cli/run/1" => format!("{schema}#{ev}"),
        _ => schema,
    }
}

fn check(
    shapes: &BTreeMap<String, Shape>,
    seen: &RefCell<BTreeSet<String>>,
    v: &Value,
    from: &str,
) {
    let key = key_of(v);
    let shape = shapes
        .get(&key)
        .unwrap_or_else(|| panic!("`{from}` printed undocumented schema {key}: {v}"));
    let obj = v.as_object().expect("an object");
    for (field, always) in shape {
        if *always {
            assert!(
                obj.contains_key(field),
                "`{from}`: {key} lacks documented field {field}: {v}"
            );
        }
    }
    for field in obj.keys() {
        assert!(
            shape.contains_key(field),
            "`{from}`: {key} has undocumented field {field}: {v}"
        );
    }
    seen.borrow_mut().insert(key);
}

#[test]
fn the_doc_parses_into_every_schema() {
    let shapes = documented();
    for s in [
        "runlease/cli/status/1",
        "runlease/cli/run/1#owned",
        "runlease/cli/run/1#released",
        "runlease/cli/takeover/1",
        "runlease/cli/retire/1",
        "runlease/cli/release/1",
        "runlease/cli/append/1",
        "runlease/cli/event/1",
        "runlease/cli/verify/1",
        "runlease/cli/doctor/1",
        "runlease/cli/prune/1",
        "runlease/cli/init/1",
        "runlease/cli/store-doc/1",
        "runlease/cli/store-commit/1",
        "runlease/cli/store-write/1",
        "runlease/cli/error/1",
    ] {
        let shape = shapes.get(s).unwrap_or_else(|| panic!("doc lacks {s}"));
        assert_eq!(shape.get("schema"), Some(&true), "{s} lacks `schema`");
        assert!(shape.len() >= 4, "{s}: table not parsed: {shape:?}");
    }
}

#[test]
fn every_subcommand_prints_exactly_its_documented_fields() {
    let shapes = documented();
    let seen = RefCell::new(BTreeSet::new());
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let (ad, parent) = (a.to_str().unwrap(), tmp.path().to_str().unwrap());
    let all = |args: &[&str], expect: i32| -> Vec<Value> {
        let o = runlease(args);
        assert_eq!(
            o.status.code(),
            Some(expect),
            "{args:?}: {}",
            text(&o.stderr)
        );
        let lines = json_lines(&o);
        assert!(!lines.is_empty(), "{args:?} printed no JSON");
        for v in &lines {
            check(&shapes, &seen, v, &args.join(" "));
        }
        lines
    };

    // run (owned, released), append inside it, release on request.
    all(
        &[
            "run",
            "--json",
            ad,
            "--",
            "sh",
            "-c",
            r#"runlease append --json "$RUNLEASE_RUN" --type step --payload '{"n":1}' && runlease store put --json "$RUNLEASE_RUN" k v"#,
        ],
        0,
    );
    let v = all(
        &[
            "run",
            "--json",
            ad,
            "--",
            "sh",
            "-c",
            "runlease release --json",
        ],
        0,
    );
    assert!(
        v.iter()
            .any(|o| o["schema"] == "runlease/cli/release/1" && o["how"] == "owner"),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|o| o["event"] == "released" && o["on_request"] == true),
        "{v:?}"
    );
    all(&["status", "--json", ad], 0);
    all(&["list", "--json", parent], 0);
    all(&["events", "--json", ad], 0);
    all(&["verify", "--json", ad], 0);
    for _ in 0..3 {
        all(&["run", "--json", ad, "--", "true"], 0);
    }
    all(&["prune", "--json", ad, "--keep", "2"], 0);
    // init: on a run (nothing to create), on a missing folder.
    all(&["init", "--json", ad], 0);
    all(
        &["init", "--json", tmp.path().join("c").to_str().unwrap()],
        0,
    );
    // doctor: a temp file old enough to be removed, then OK.
    let tmpfile = a.join("lease/epochs/.tmp-1-1-000000009");
    std::fs::write(&tmpfile, b"x").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmpfile)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    let v = all(&["doctor", "--json", ad, "--clean-temp"], 0);
    assert_eq!(v[0]["code"], "TEMP_FILES_REMOVED", "{v:?}");
    assert_eq!(v[0]["count"], 1);
    all(&["doctor", "--json", ad], 0);
    // store get/list/log on a run whose owner committed through lease-run.
    let e = tmp.path().join("e");
    let ed = e.to_str().unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let run = lease_run::Run::open(&e, lease_run::OpenOptions::default())
                .await
                .unwrap();
            run.commit(
                lease_run::Batch::new()
                    .put("k", "v")
                    .delete("gone")
                    .log("why"),
            )
            .await
            .unwrap();
            run.commit(lease_run::Batch::new().put("bin", vec![0xff_u8]))
                .await
                .unwrap();
            run.release(lease_run::FinalStatus::Done).await.unwrap();
        });
    all(&["store", "get", "--json", ed, "k"], 0);
    all(&["store", "get", "--json", ed, "nothing-here"], 1);
    let v = all(&["store", "list", "--json", ed], 0);
    assert_eq!(v.len(), 2, "{v:?}");
    let v = all(&["store", "log", "--json", ed], 0);
    assert_eq!(v.len(), 2, "{v:?}");
    // Errors: a missing run; a stale token.
    all(
        &[
            "status",
            "--json",
            tmp.path().join("nope").to_str().unwrap(),
        ],
        64,
    );
    all(
        &[
            "append",
            "--json",
            ad,
            "--type",
            "x",
            "--generation",
            "1",
            "--owner",
            "o",
        ],
        75,
    );

    // A held run (error with holder), a direct release (how: direct) whose old owner is
    // then fenced (error with generation and command_exit).
    let b = tmp.path().join("b");
    let bd = b.to_str().unwrap();
    let mut owner = spawn(&[&["run", "--json", bd][..], &FAST, &["--", "sleep", "30"]].concat());
    let s = wait_for_state(&b, "active", Duration::from_secs(10));
    let e = all(&["run", "--json", bd, "--", "true"], 76);
    assert!(e[0]["holder"]["pid"].is_u64(), "{e:?}");
    let g = s["generation"].to_string();
    let v = all(
        &[
            "release",
            "--json",
            bd,
            "--generation",
            &g,
            "--owner",
            s["owner_id"].as_str().unwrap(),
        ],
        0,
    );
    assert_eq!(v[0]["how"], "direct");
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
    let o = owner.wait_with_output().unwrap();
    for v in json_lines(&o) {
        check(&shapes, &seen, &v, "run (fenced)");
    }

    // takeover of a stopped owner; retire of a killed one.
    let c = tmp.path().join("c");
    let cd = c.to_str().unwrap();
    let mut owner = spawn(&[&["run", "--json", cd][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&c, "active", Duration::from_secs(10));
    signal(owner.id(), Signal::STOP);
    let s = wait_for_state(&c, "stale", Duration::from_secs(10));
    all(
        &[
            "takeover",
            "--json",
            cd,
            "--expect-owner",
            s["expect_owner"].as_str().unwrap(),
            "--expect-heartbeat",
            s["expect_heartbeat"].as_str().unwrap(),
        ],
        0,
    );
    signal(owner.id(), Signal::CONT);
    // The stop may land while the owner starts its command; whatever it was doing, a
    // replaced owner exits 75 (it once said SPAWN_FAILED, 70, when its watchdog killed
    // the command gate before the spawn step noticed the lost lease).
    let st = wait_exit(&mut owner, Duration::from_secs(10)).code();
    if st != Some(75) {
        let o = owner.wait_with_output().unwrap();
        panic!(
            "the replaced owner exited {st:?}, not 75; its stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    let d = tmp.path().join("d");
    let dd = d.to_str().unwrap();
    let pidfile = tmp.path().join("d.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut owner = spawn(&[&["run", dd][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let child = read_pid(&pidfile);
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    signal(child, Signal::KILL);
    wait_for_state(&d, "dead", Duration::from_secs(10));
    all(&["retire", "--json", dd], 0);

    let missing: Vec<_> = shapes
        .keys()
        .filter(|k| !seen.borrow().contains(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "schemas never printed by this test: {missing:?}"
    );
}

/// The doctor finding codes of the doc's table.
fn documented_doctor_codes() -> Vec<String> {
    let doc = include_str!("../../docs/cli-json.md");
    let table = doc
        .split("## Doctor finding codes")
        .nth(1)
        .expect("doc has a doctor code table");
    table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| code") && !l.starts_with("|---"))
        .map(|l| l.split('|').nth(1).unwrap().trim().to_string())
        .collect()
}

#[test]
fn doctor_codes_in_help_json_and_doc_agree() {
    let codes = documented_doctor_codes();
    assert!(codes.len() >= 10, "{codes:?}");
    let help = text(&runlease(&["doctor", "--help"]).stdout);
    for c in &codes {
        assert!(help.contains(c.as_str()), "`doctor --help` lacks {c}");
    }
    // The doctor schema's `code` field lists the same codes.
    let doc = include_str!("../../docs/cli-json.md");
    let code_row = doc
        .lines()
        .find(|l| l.starts_with("| `code` | yes | string | `OK`"))
        .expect("doctor/1 code row");
    for c in &codes {
        assert!(
            code_row.contains(&format!("`{c}`")),
            "doctor/1 `code` lacks {c}"
        );
    }
    // Every code doctor prints on a run with findings is documented.
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    std::fs::write(dir.join("lease/epochs/.tmp-1-1-000000001"), b"x").unwrap();
    std::fs::write(dir.join("lease/epochs/notes.txt"), b"x").unwrap();
    let printed = json_lines(&runlease(&["doctor", "--json", d]));
    assert!(printed.len() >= 2, "{printed:?}");
    for f in printed {
        let c = f["code"].as_str().unwrap();
        assert!(codes.iter().any(|x| x == c), "undocumented doctor code {c}");
    }
}
