//! The exit-code and error-code tables have one source, and every copy is checked against
//! it (issue #16): `lease_cli::exit_codes::EXIT_CODES` (rendered into `runlease --help`)
//! against README.md's "Exit codes" table, and every layer's code table
//! (`lease_core::ERROR_CODES`, `lease_fs::FS_ERROR_CODES`, `lease_sqlite::STORE_ERROR_CODES`,
//! `lease_run::RUN_ERROR_CODES`, `lease_run::ETCD_ERROR_CODES`, the CLI's own) against
//! docs/PROTOCOL.md §12. A code missing from a document, a stale row, or a different exit
//! code fails here.
//!
//! In every build, with or without the `etcd` feature: the codes are the product's
//! contract, so `lease_run::ETCD_ERROR_CODES` (lease-core's table) is there even when the
//! etcd engine is not compiled in.

use lease_cli::exit_codes::{CLI_ERROR_CODES, EXIT_CODES, exit_for};
use std::collections::BTreeMap;

const README: &str = include_str!("../../README.md");
const PROTOCOL: &str = include_str!("../../docs/PROTOCOL.md");

/// Every error code with its exit code as the docs write it ("65", "126/127", "128+N"):
/// the codes each layer raises (their tables) with the CLI's one mapping
/// (`exit_codes::exit_for`), and the CLI's own codes as its table writes them.
fn all_codes() -> BTreeMap<String, String> {
    let layers: [&[lease_core::Code]; 5] = [
        lease_core::ERROR_CODES,
        lease_fs::FS_ERROR_CODES,
        lease_sqlite::STORE_ERROR_CODES,
        lease_run::RUN_ERROR_CODES,
        lease_run::ETCD_ERROR_CODES,
    ];
    let mut all: BTreeMap<String, String> = BTreeMap::new();
    for code in layers.into_iter().flatten() {
        all.insert(code.as_str().to_string(), exit_for(*code).to_string());
    }
    for (code, exit) in CLI_ERROR_CODES {
        let before = all.insert(code.to_string(), exit.to_string());
        assert!(before.is_none(), "{code} is a CLI code and a layer's code");
    }
    all
}

/// The rows of the first Markdown table after `heading`, as trimmed cells.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The backticked ALL_CAPS codes in a cell.
fn codes_in(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.len() > 3 && t.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_exit_codes_table_is_the_one_runlease_help_prints() {
    let rows = table_after(README, "## Exit codes");
    let readme: Vec<(String, String)> = rows.iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    let source: Vec<(String, String)> = EXIT_CODES
        .iter()
        .map(|(c, m)| (c.to_string(), m.to_string()))
        .collect();
    assert_eq!(
        readme, source,
        "README.md's Exit codes table (code | meaning) must equal lease_cli::exit_codes::EXIT_CODES"
    );
    // Every code named as an example exits with its row's code.
    let all = all_codes();
    for r in &rows {
        for code in codes_in(&r[2]) {
            let exit = all
                .get(&code)
                .unwrap_or_else(|| panic!("README names {code}, which no code table has"));
            assert!(
                exit.split('/').any(|e| e == r[0]),
                "README lists {code} under exit {}, but it exits {exit}",
                r[0]
            );
        }
    }
}

#[test]
fn protocol_section_12_lists_every_code_with_its_exit_code() {
    let mut documented: BTreeMap<String, String> = BTreeMap::new();
    for r in table_after(PROTOCOL, "## 12. Error codes") {
        for code in codes_in(&r[0]) {
            documented.insert(code, r[1].clone());
        }
    }
    let all = all_codes();
    let missing: Vec<_> = all
        .keys()
        .filter(|c| !documented.contains_key(*c))
        .collect();
    assert!(missing.is_empty(), "PROTOCOL §12 lacks {missing:?}");
    let stale: Vec<_> = documented
        .keys()
        .filter(|c| !all.contains_key(*c))
        .collect();
    assert!(
        stale.is_empty(),
        "PROTOCOL §12 lists codes no table has: {stale:?}"
    );
    for (code, exit) in &all {
        assert_eq!(&documented[code], exit, "PROTOCOL §12: exit code of {code}");
    }
}

#[test]
fn runlease_help_prints_the_exit_code_table() {
    let help = lease_cli::cli::command().render_long_help().to_string();
    assert!(
        help.contains(&lease_cli::exit_codes::help_block()),
        "{help}"
    );
}

#[test]
fn every_code_is_a_code_variant_and_back() {
    // The code tables (the layers' and the CLI's) and `lease_core::Code` name the same
    // codes: a variant no table lists (so no document either) or a table entry that is no
    // variant fails here.
    let all = all_codes();
    for code in all.keys() {
        assert!(
            lease_core::Code::parse(code).is_some(),
            "{code} is in a code table but not a lease_core::Code"
        );
    }
    for c in lease_core::Code::ALL {
        assert!(
            all.contains_key(c.as_str()),
            "lease_core::Code::{c:?} is in no code table (and so in no document)"
        );
    }
}

#[test]
fn the_cli_exit_mapping_gives_every_cli_code_its_documented_exit_code() {
    // `exit_for` is the one code -> exit code mapping; the layers' codes take their exit
    // from it (above), the CLI's own are written in its table: they must agree. Codes
    // whose exit depends on the case are written "126/127" or "128+N": the mapping's value
    // must be one of them.
    for (code, documented) in CLI_ERROR_CODES
        .iter()
        .map(|(c, e)| (c.to_string(), e.to_string()))
    {
        let c = lease_core::Code::parse(&code).unwrap();
        let exit = lease_cli::exit_codes::exit_for(c).to_string();
        let ok = documented.split('/').any(|d| d == exit)
            || (documented == "128+N" && exit.parse::<i32>().is_ok_and(|e| e > 128));
        assert!(
            ok,
            "{code}: exit_for gives {exit}, the docs say {documented}"
        );
    }
}
