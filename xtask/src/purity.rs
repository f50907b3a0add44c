//! `cargo xtask purity`: evidence that `lease-core` stays sans-IO, and that lease-cli
//! names no layer below lease-run.
//!
//! Four independent checks, all of which run (so one report lists every problem):
//!
//! (a) **Dependency closure.** `cargo metadata --filter-platform <host>` gives the
//!     resolved graph; the transitive closure of `lease-core` over *normal* edges
//!     (not dev, not build) must not contain any crate in [`FORBIDDEN_CRATES`].
//!     The resolve is the workspace-wide one, so a feature another member turns on
//!     in a shared dependency counts too (that is what a workspace build links).
//!     Feature-level checks (e.g. chrono's `clock`) are deliberately not done.
//! (b) **Clippy.** `cargo clippy -p lease-core --all-targets -- -D warnings`, which
//!     enforces `lease-core/clippy.toml` (disallowed std::fs, std::process, clocks...).
//!     `--all-targets` builds the tests, so lease-core's dev-dependency on itself with the
//!     `ghost` feature is on: the feature-gated `lease_core::ghost` is linted too.
//! (c) **Source grep.** `lease-core/src/**/*.rs` must not contain any of
//!     [`FORBIDDEN_PATTERNS`]. Comment prose is skipped (a doc saying "no std::fs"
//!     is fine), but code inside fenced doc examples is checked, because doctests
//!     compile it. Every file is read whatever the features (`src/ghost.rs` included).
//! (d) **Layers.** lease-cli's direct normal dependencies name none of lease-fs,
//!     lease-sqlite and lease-etcd: the CLI reaches them through lease-run, where the
//!     decisions are (its tests may use them to build fixtures).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The package whose purity we prove.
const CORE: &str = "lease-core";

/// Crates that would give lease-core I/O, an async runtime, a database, raw syscalls
/// or its own randomness.
const FORBIDDEN_CRATES: &[&str] = &[
    "tokio",
    "rusqlite",
    "libsqlite3-sys",
    "rustix",
    "libc",
    "nix",
    "mio",
    "rand",
    "getrandom",
];

/// The CLI, which decides nothing about a run (ARCHITECTURE.md).
const CLI: &str = "lease-cli";

/// Layers below lease-run that the CLI must not depend on directly (normal edges; its
/// tests may, to build fixtures).
const BELOW_RUN: &[&str] = &["lease-fs", "lease-sqlite", "lease-etcd"];

/// Text that must not appear in lease-core's source code.
const FORBIDDEN_PATTERNS: &[&str] = &[
    "std::fs",
    "std::process",
    "SystemTime::now",
    "Instant::now",
    "tokio::",
    "rusqlite",
    "std::net",
    "thread::sleep",
];

/// Run all three checks from the workspace root; error if any fails.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let mut failures = Vec::new();

    eprintln!("purity (a): normal dependency closure of {CORE}");
    match check_closure(root) {
        Ok(()) => eprintln!("purity (a): ok"),
        Err(e) => {
            eprintln!("purity (a): FAILED\n{e}");
            failures.push("(a) dependency closure");
        }
    }

    eprintln!("purity (b): cargo clippy -p {CORE} --all-targets -- -D warnings");
    match crate::run_status(crate::cargo(&[
        "clippy",
        "-p",
        CORE,
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])) {
        Ok(()) => eprintln!("purity (b): ok"),
        Err(e) => {
            eprintln!("purity (b): FAILED: {e}");
            failures.push("(b) clippy");
        }
    }

    eprintln!("purity (c): forbidden patterns in {CORE}/src");
    match check_sources(root, &root.join(CORE).join("src")) {
        Ok(()) => eprintln!("purity (c): ok"),
        Err(e) => {
            eprintln!("purity (c): FAILED\n{e}");
            failures.push("(c) source grep");
        }
    }

    eprintln!("purity (d): {CLI} names no layer below lease-run");
    match check_cli_layers(root) {
        Ok(()) => eprintln!("purity (d): ok"),
        Err(e) => {
            eprintln!("purity (d): FAILED\n{e}");
            failures.push("(d) lease-cli's layers");
        }
    }

    crate::none_failed("purity checks failed", &failures)
}

/// The host target triple, from `rustc -vV`.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("could not run rustc -vV: {e}"))?;
    if !out.status.success() {
        return Err(format!("rustc -vV exited with {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
        .ok_or_else(|| "rustc -vV printed no `host:` line".to_owned())
}

/// Check (a) against the real workspace.
fn check_closure(root: &Path) -> Result<(), String> {
    let host = host_triple()?;
    let out = crate::cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ])
    .current_dir(root)
    .output()
    .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata exited with {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let hits = forbidden_normal_deps(&metadata, CORE, FORBIDDEN_CRATES)?;
    if hits.is_empty() {
        return Ok(());
    }
    let mut report = format!("{CORE} depends (normal edges) on forbidden crates:\n");
    for path in hits {
        report.push_str("  ");
        report.push_str(&path.join(" -> "));
        report.push('\n');
    }
    Err(report)
}

/// Check (d): lease-cli's own normal (non-dev, non-build) dependencies name none of
/// [`BELOW_RUN`], optional ones included (a feature could turn them on).
fn check_cli_layers(root: &Path) -> Result<(), String> {
    let out = crate::cargo(&["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata exited with {}", out.status));
    }
    let metadata: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let hits = direct_normal_deps_named(&metadata, CLI, BELOW_RUN)?;
    if hits.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{CLI} depends directly on {} (go through lease-run: ARCHITECTURE.md, \"Crates and who may depend on whom\")",
            hits.join(", ")
        ))
    }
}

/// The direct normal dependencies of workspace package `package` that are in `names`.
fn direct_normal_deps_named(
    metadata: &Value,
    package: &str,
    names: &[&str],
) -> Result<Vec<String>, String> {
    let pkg = metadata
        .get("packages")
        .and_then(Value::as_array)
        .ok_or("metadata has no `packages` array")?
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(package))
        .ok_or_else(|| format!("package `{package}` not found in cargo metadata"))?;
    let deps = pkg
        .get("dependencies")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("package `{package}` has no `dependencies` array"))?;
    Ok(deps
        .iter()
        .filter(|d| d.get("kind").is_none_or(Value::is_null))
        .filter_map(|d| d.get("name").and_then(Value::as_str))
        .filter(|n| names.contains(n))
        .map(str::to_string)
        .collect())
}

/// True if a `resolve.nodes[].deps[]` entry has at least one normal (non-dev,
/// non-build) edge. Old cargo without `dep_kinds` is treated as normal (conservative).
fn is_normal_edge(dep: &Value) -> bool {
    match dep.get("dep_kinds").and_then(Value::as_array) {
        Some(kinds) => kinds
            .iter()
            .any(|k| k.get("kind").is_none_or(Value::is_null)),
        None => true,
    }
}

/// Breadth-first search over normal edges from the workspace package named `root`.
/// Returns, for each forbidden package reached, one shortest path of package names
/// from `root` to it (sorted, for stable output).
fn forbidden_normal_deps(
    metadata: &Value,
    root: &str,
    forbidden: &[&str],
) -> Result<Vec<Vec<String>>, String> {
    let packages = metadata
        .get("packages")
        .and_then(Value::as_array)
        .ok_or("metadata has no `packages` array")?;
    let names: BTreeMap<&str, &str> = packages
        .iter()
        .filter_map(|p| Some((p.get("id")?.as_str()?, p.get("name")?.as_str()?)))
        .collect();

    let members: Vec<&str> = metadata
        .get("workspace_members")
        .and_then(Value::as_array)
        .ok_or("metadata has no `workspace_members` array")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let root_id = members
        .iter()
        .copied()
        .find(|id| names.get(id) == Some(&root))
        .ok_or_else(|| format!("workspace member `{root}` not found in cargo metadata"))?;

    let nodes: BTreeMap<&str, &Value> = metadata
        .get("resolve")
        .and_then(|r| r.get("nodes"))
        .and_then(Value::as_array)
        .ok_or("metadata has no `resolve.nodes` (was --no-deps used?)")?
        .iter()
        .filter_map(|n| Some((n.get("id")?.as_str()?, n)))
        .collect();

    // parent[id] = the package we reached `id` from (None for the root).
    let mut parent: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    parent.insert(root_id, None);
    let mut queue = VecDeque::from([root_id]);
    while let Some(id) = queue.pop_front() {
        let node = nodes
            .get(id)
            .ok_or_else(|| format!("package id `{id}` has no resolve node"))?;
        let deps = node.get("deps").and_then(Value::as_array);
        for dep in deps.into_iter().flatten() {
            if !is_normal_edge(dep) {
                continue;
            }
            let Some(dep_id) = dep.get("pkg").and_then(Value::as_str) else {
                continue;
            };
            if !parent.contains_key(dep_id) {
                parent.insert(dep_id, Some(id));
                queue.push_back(dep_id);
            }
        }
    }

    let name_of = |id: &str| names.get(id).copied().unwrap_or(id).to_owned();
    let mut hits: Vec<Vec<String>> = parent
        .keys()
        .filter(|id| forbidden.contains(&names.get(*id).copied().unwrap_or("")))
        .map(|&id| {
            let mut path = vec![name_of(id)];
            let mut cur = id;
            while let Some(Some(p)) = parent.get(cur) {
                path.push(name_of(p));
                cur = p;
            }
            path.reverse();
            path
        })
        .collect();
    hits.sort();
    Ok(hits)
}

/// Check (c) over every `.rs` file under `src` (reported relative to `root`).
fn check_sources(root: &Path, src: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    collect_rs_files(src, &mut files)?;
    if files.is_empty() {
        return Err(format!("no .rs files found under {}", src.display()));
    }
    files.sort();
    let mut report = String::new();
    for file in &files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        for (line, pattern) in scan_source(&text, FORBIDDEN_PATTERNS) {
            let shown = file.strip_prefix(root).unwrap_or(file);
            report.push_str(&format!(
                "  {}:{line}: forbidden `{pattern}`\n",
                shown.display()
            ));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
        if kind.is_dir() {
            collect_rs_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Find forbidden patterns in one source file: `(1-based line, pattern)` per hit.
///
/// Code lines are checked in full (including any trailing comment). Lines that are
/// only a comment are skipped, except the inside of a fenced code block in doc
/// comments (`///` or `//!`), which doctests compile.
fn scan_source<'p>(text: &str, patterns: &[&'p str]) -> Vec<(usize, &'p str)> {
    let mut hits = Vec::new();
    let mut in_doc_fence = false;
    for (idx, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let checked = if let Some(comment) = trimmed.strip_prefix("//") {
            let doc = comment
                .strip_prefix('/')
                .or_else(|| comment.strip_prefix('!'));
            match doc {
                Some(doc) if doc.trim_start().starts_with("```") => {
                    in_doc_fence = !in_doc_fence;
                    continue;
                }
                Some(doc) if in_doc_fence => doc,
                _ => continue,
            }
        } else {
            in_doc_fence = false;
            line
        };
        hits.extend(
            patterns
                .iter()
                .filter(|p| checked.contains(*p))
                .map(|p| (idx + 1, *p)),
        );
    }
    hits
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cli_that_depends_on_a_layer_below_lease_run_is_caught() {
        let meta = serde_json::json!({"packages": [
            {"name": "lease-cli", "dependencies": [
                {"name": "lease-run", "kind": null},
                {"name": "lease-fs", "kind": null},
                {"name": "lease-etcd", "kind": null, "optional": true},
                {"name": "lease-sqlite", "kind": "dev"},
            ]},
        ]});
        let hits = super::direct_normal_deps_named(&meta, "lease-cli", super::BELOW_RUN).unwrap();
        assert_eq!(hits, ["lease-fs", "lease-etcd"]);
    }

    use super::{FORBIDDEN_CRATES, FORBIDDEN_PATTERNS, forbidden_normal_deps, scan_source};
    use serde_json::{Value, json};

    /// A normal / dev / build edge in `resolve.nodes[].deps[]` form.
    fn edge(pkg: &str, kind: Option<&str>) -> Value {
        json!({ "name": pkg, "pkg": pkg, "dep_kinds": [{ "kind": kind, "target": null }] })
    }

    /// Hand-made metadata: lease-core -> serde (normal), -> wrapper (normal, only if
    /// `wrapper_pulls_tokio`) -> tokio; plus a dev-dep proptest -> rand and a build-dep
    /// cc -> libc that must NOT be reported. lease-fs -> libc is another member's edge.
    fn fixture(wrapper_pulls_tokio: bool) -> Value {
        let pkgs = [
            "lease-core",
            "lease-fs",
            "serde",
            "wrapper",
            "tokio",
            "proptest",
            "rand",
            "cc",
            "libc",
        ];
        let packages: Vec<Value> = pkgs
            .iter()
            .map(|p| json!({ "id": p, "name": p, "version": "1.0.0" }))
            .collect();
        let mut core_deps = vec![
            edge("serde", None),
            edge("proptest", Some("dev")),
            edge("cc", Some("build")),
        ];
        if wrapper_pulls_tokio {
            core_deps.push(edge("wrapper", None));
        }
        json!({
            "packages": packages,
            "workspace_members": ["lease-core", "lease-fs"],
            "resolve": { "root": null, "nodes": [
                { "id": "lease-core", "deps": core_deps },
                { "id": "lease-fs", "deps": [edge("libc", None), edge("lease-core", None)] },
                { "id": "serde", "deps": [] },
                { "id": "wrapper", "deps": [edge("tokio", None)] },
                { "id": "tokio", "deps": [edge("libc", None)] },
                { "id": "proptest", "deps": [edge("rand", None)] },
                { "id": "rand", "deps": [edge("libc", None)] },
                { "id": "cc", "deps": [edge("libc", None)] },
                { "id": "libc", "deps": [] },
            ]}
        })
    }

    #[test]
    fn forbidden_transitive_dependency_is_reported_with_its_path() {
        let hits = forbidden_normal_deps(&fixture(true), "lease-core", FORBIDDEN_CRATES)
            .expect("fixture is well-formed");
        assert_eq!(
            hits,
            vec![
                vec!["lease-core", "wrapper", "tokio"],
                vec!["lease-core", "wrapper", "tokio", "libc"],
            ]
        );
    }

    #[test]
    fn clean_graph_is_not_reported_and_dev_and_build_edges_are_ignored() {
        // proptest -> rand (dev) and cc -> libc (build) are present but not normal edges;
        // lease-fs -> libc belongs to another member.
        let hits = forbidden_normal_deps(&fixture(false), "lease-core", FORBIDDEN_CRATES)
            .expect("fixture is well-formed");
        assert!(hits.is_empty(), "unexpected: {hits:?}");
    }

    #[test]
    fn edge_that_is_both_dev_and_normal_counts_as_normal() {
        let mut meta = fixture(false);
        meta["resolve"]["nodes"][0]["deps"][1]["dep_kinds"] =
            json!([{ "kind": "dev", "target": null }, { "kind": null, "target": null }]);
        let hits = forbidden_normal_deps(&meta, "lease-core", FORBIDDEN_CRATES).unwrap();
        assert_eq!(
            hits,
            vec![
                vec!["lease-core", "proptest", "rand"],
                vec!["lease-core", "proptest", "rand", "libc"],
            ]
        );
    }

    #[test]
    fn missing_root_is_an_error_not_a_pass() {
        assert!(forbidden_normal_deps(&fixture(true), "no-such-crate", FORBIDDEN_CRATES).is_err());
        assert!(forbidden_normal_deps(&json!({}), "lease-core", FORBIDDEN_CRATES).is_err());
    }

    #[test]
    fn scan_reports_code_and_doctest_hits_but_not_prose() {
        let src = "\
//! lease-core does no I/O: no std::fs, no tokio::, no Instant::now.
//!
//! ```
//! let t = std::time::Instant::now();
//! ```
use std::collections::BTreeMap;
// a plain comment about std::process is fine
fn f() { let _ = std::fs::read(\"x\"); }
/// Docs about SystemTime::now are fine.
fn g() { std::thread::sleep(d); } // trailing
";
        assert_eq!(
            scan_source(src, FORBIDDEN_PATTERNS),
            vec![(4, "Instant::now"), (8, "std::fs"), (10, "thread::sleep")]
        );
    }

    #[test]
    fn scan_of_clean_source_is_empty() {
        let src = "use std::collections::BTreeMap;\npub fn pure(x: u64) -> u64 { x + 1 }\n";
        assert!(scan_source(src, FORBIDDEN_PATTERNS).is_empty());
    }
}
