//! Triage: run one input through a target's check and print what happened.
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example show -- <target> <file>
//! ```
//!
//! `transitions` prints the actors' trace, `read_folder` the decoded folder and every
//! operation's answer on the MemDisk and the SimFs; the others just run the check. A failing
//! check panics with its message (and, for `transitions`, the trace up to the failure).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, file] = args.as_slice() else {
        eprintln!("usage: show <target> <file>");
        std::process::exit(64);
    };
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    match target.as_str() {
        "transitions" => {
            for line in runlease_fuzz::transitions::trace(&data) {
                println!("{line}");
            }
        }
        "read_folder" => println!("{}", runlease_fuzz::folder::describe(&data)),
        other => {
            let Some((_, check)) = runlease_fuzz::TARGETS.iter().find(|(n, _)| *n == other) else {
                eprintln!("unknown target {other}");
                std::process::exit(64);
            };
            check(&data);
        }
    }
    println!("ok: {file} passes the {target} check");
}
