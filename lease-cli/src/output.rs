//! Where output goes: human lines or one JSON object per line on stdout ([`Out`], with
//! control and bidi characters escaped in both), informational lines and the terminal
//! progress line on stderr ([`Progress`]).

use crate::text::terminal_safe;
use serde_json::Value;
use std::io::Write;

/// Where output goes: human text, or one JSON object per line (`--json`).
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// `--json` was given.
    pub json: bool,
    /// `--quiet`: no progress or informational lines on stderr.
    pub quiet: bool,
}

/// Whether `--json` output writes `c` as a `\uXXXX` escape although JSON allows it raw:
/// DEL and the C1 controls (U+007F–U+009F; serde_json already escapes C0), the
/// bidirectional controls a terminal or an editor reorders text by (U+061C, U+200E/F,
/// U+202A–U+202E, U+2066–U+2069) and the line and paragraph separators (U+2028/9), so a
/// consumer that shows or logs a line sees the escape, never the effect.
fn json_escaped(c: char) -> bool {
    matches!(
        c,
        '\u{7f}'..='\u{9f}'
            | '\u{061c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// serde_json's compact output, with [`json_escaped`] characters as `\uXXXX` too.
struct SafeJson;

impl serde_json::ser::Formatter for SafeJson {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if json_escaped(c) {
                w.write_all(&fragment.as_bytes()[start..i])?;
                // Every such character is in the Basic Multilingual Plane: one escape.
                write!(w, "\\u{:04x}", u32::from(c))?;
                start = i + c.len_utf8();
            }
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// `v` as the one line `--json` prints (compact, without the LF): serde_json's text, with
/// DEL, C1 controls, bidi controls and U+2028/9 escaped as well ([`json_escaped`]). The
/// same value as serde_json's own text, parsed back.
pub fn json_text(v: &Value) -> String {
    let mut buf = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, SafeJson);
    // Serializing a `Value` into memory cannot fail (its keys are strings).
    let _ = serde::Serialize::serialize(v, &mut ser);
    // Only whole UTF-8 characters are written, and escapes are ASCII.
    String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Out {
    /// Write one line to stdout. Returns `false` when stdout is gone (a closed pipe), so
    /// loops like `events --follow` can stop. Human lines go through [`terminal_safe`].
    pub fn line(&self, s: &str) -> bool {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", terminal_safe(s))
            .and_then(|()| o.flush())
            .is_ok()
    }

    /// Write one compact JSON object as one line to stdout ([`json_text`]: control and
    /// bidi characters in strings as `\u` escapes).
    pub fn json_line(&self, v: &Value) -> bool {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", json_text(v))
            .and_then(|()| o.flush())
            .is_ok()
    }

    /// An informational line on stderr (suppressed by `--quiet`).
    pub fn info(&self, s: &str) {
        if !self.quiet {
            eprintln!("runlease: {s}");
        }
    }
}

/// A one-line progress message on stderr, only when stderr is a terminal.
pub struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    /// A progress line for `out` (shown only on a terminal, not with --quiet or --json).
    pub fn new(out: Out) -> Progress {
        Progress {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()) && !out.quiet && !out.json,
            shown: false,
        }
    }
    /// Replace the line with `msg`.
    pub fn show(&mut self, msg: &str) {
        if self.tty {
            // Our own erase-line sequence goes out as is; the message (which names a
            // holder from the records) is made terminal-safe.
            let mut msg = terminal_safe(msg).into_owned();
            if let Some((cut, _)) = msg.char_indices().nth(200) {
                msg.truncate(cut);
            }
            raw_stderr(&format!("\r\x1b[Krunlease: {msg}"));
            self.shown = true;
        }
    }
    /// Erase the line, if one is shown.
    pub fn clear(&mut self) {
        if self.shown {
            raw_stderr("\r\x1b[K");
            self.shown = false;
        }
    }
}

/// Write to stderr as is (the progress line's own control sequence), never panicking.
fn raw_stderr(s: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(s.as_bytes());
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_escapes_c1_del_and_bidi_controls() {
        let v = json!({"s": "a\u{9b}31m\u{7f}\u{202e}gnp\u{2066}\u{200f}\u{61c}\n\u{1b}é中"});
        let t = json_text(&v);
        assert_eq!(
            t,
            r#"{"s":"a\u009b31m\u007f\u202egnp\u2066\u200f\u061c\n\u001bé中"}"#
        );
        assert!(t.is_ascii() || t.chars().all(|c| !json_escaped(c) && !c.is_control()));
        let back: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(back, v);
    }
}
