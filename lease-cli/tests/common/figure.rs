//! The figure lines of the suites (`recovery: ...`, `gate: ...`, `cancellation: ...`),
//! shared with lease-run's tests (`#[path]`).

/// Print a figure line (`recovery: ...`, `gate: ...`) and append it to the file
/// `RUNLEASE_FIGURES` names, when set: CI prints that file after the test command
/// instead of running the figure tests a second time. One `write` of the whole line
/// with `O_APPEND`, so lines of tests running at once do not interleave.
pub fn figure(line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os("RUNLEASE_FIGURES") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open RUNLEASE_FIGURES");
        f.write_all(format!("{line}\n").as_bytes())
            .expect("append to RUNLEASE_FIGURES");
    }
}
