//! `cargo xtask dist`: shell completions (bash, zsh, fish) and man pages for `runlease`,
//! generated from the clap definition the binary parses with (`lease_cli::cli::command`),
//! written to `target/dist/`:
//!
//! ```text
//! target/dist/completions/runlease.bash
//! target/dist/completions/_runlease            (zsh)
//! target/dist/completions/runlease.fish
//! target/dist/man/runlease.1                   (and runlease-SUBCOMMAND.1 for each)
//! ```
//!
//! Files are written whole (create, write, then rename over the old one), so an
//! interrupted run leaves either the old or the new file, never a torn one; `target/`
//! is a build output, so no fsync is needed.

use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Generate everything below `out` (normally `<workspace>/target/dist`); returns the
/// files written.
pub fn generate(out: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    let completions = out.join("completions");
    let man = out.join("man");
    for d in [&completions, &man] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    for (shell, name) in [
        (Shell::Bash, "runlease.bash"),
        (Shell::Zsh, "_runlease"),
        (Shell::Fish, "runlease.fish"),
    ] {
        let mut cmd = lease_cli::cli::command();
        let mut bytes = Vec::new();
        clap_complete::generate(shell, &mut cmd, "runlease", &mut bytes);
        written.push(write(&completions.join(name), &bytes)?);
    }
    let cmd = lease_cli::cli::command();
    written.push(write(&man.join("runlease.1"), &render(cmd.clone())?)?);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("runlease-{}", sub.get_name());
        let page = sub.clone().name(name.clone()).display_name(name.clone());
        written.push(write(&man.join(format!("{name}.1")), &render(page)?)?);
    }
    Ok(written)
}

/// One man page in roff.
fn render(cmd: clap::Command) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut bytes)
        .map_err(|e| format!("cannot render the man page: {e}"))?;
    Ok(bytes)
}

/// Write a file whole: a temp file beside it, then rename over it.
fn write(path: &Path, bytes: &[u8]) -> Result<PathBuf, String> {
    let tmp = path.with_extension("tmp-xtask");
    std::fs::write(&tmp, bytes).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), path.display()))?;
    Ok(path.to_path_buf())
}

/// `cargo xtask dist`.
pub fn run(root: &Path) -> Result<(), String> {
    let out = root.join("target").join("dist");
    let files = generate(&out)?;
    for f in &files {
        eprintln!("wrote {}", f.strip_prefix(root).unwrap_or(f).display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runlease_command_is_consistent() {
        lease_cli::cli::command().debug_assert();
    }

    #[test]
    fn dist_writes_completions_and_man_pages_for_every_subcommand() {
        let tmp = std::env::temp_dir().join(format!("xtask-dist-test-{}", std::process::id()));
        let files = generate(&tmp).unwrap();
        let read = |rel: &str| std::fs::read_to_string(tmp.join(rel)).unwrap();
        assert!(read("completions/runlease.bash").contains("runlease"));
        assert!(read("completions/_runlease").starts_with("#compdef runlease"));
        assert!(read("completions/runlease.fish").contains("complete -c runlease"));
        let page = read("man/runlease.1");
        assert!(page.contains(".TH runlease"), "{page}");
        // The exit codes (after_help) reach the man page.
        assert!(page.contains("76"), "{page}");
        for sub in [
            "run", "init", "status", "list", "takeover", "retire", "release", "append", "events",
            "verify", "doctor", "prune", "store",
        ] {
            let p = read(&format!("man/runlease-{sub}.1"));
            assert!(p.contains("Example"), "runlease-{sub}.1 lacks its example");
            assert!(
                read("completions/runlease.bash").contains(sub),
                "bash lacks {sub}"
            );
        }
        assert_eq!(files.len(), 3 + 1 + 13);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
