//! Text helpers every other module uses and which use nothing of this crate, so no
//! circle can form through them: whether a terminal would act on a character and shown
//! text made safe ([`terminal_safe`]), shell quoting of a suggested command's words
//! ([`Quoting`], [`quote_word`], [`command_line`], [`shell_path`]), durations for people
//! ([`human_ms`]).

use std::path::Path;

/// Whether a terminal could act on `c` instead of showing it: control characters (C0 and
/// C1, including ESC of ANSI sequences, CR and LF inside a line; tab is kept) and the
/// bidirectional controls that reorder what is shown (U+061C, U+200E/F, U+202A–U+202E,
/// U+2066–U+2069).
pub(crate) fn terminal_unsafe(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal would interpret ([`terminal_unsafe`]) written
/// readably: LF as `\n`, CR as `\r`, any other as `\u{…}` (its code point in hex). Human
/// output shows text from records (a `run.json` detail, an event payload) and paths, and
/// anyone who can write the run folder chooses that text. A suggested command never needs
/// this: it is written with [`Quoting::Terminal`], which leaves no such character in it.
/// JSON output has its own escapes (`json_text`, output.rs).
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(terminal_unsafe) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if terminal_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A path as one word of a command suggested in human text (to be pasted into a shell:
/// [`shell_path_as`] with [`Quoting::Terminal`]).
pub fn shell_path(p: &Path) -> String {
    shell_path_as(p, Quoting::Terminal)
}

/// A path as one word of a suggested command, quoted as `q` says
/// ([`quote_word`]). A relative path starting with `-` is written `./-…`
/// (the same folder), because in prose no `--` stands before it; the argument vectors
/// (diagnosis.rs's `next_argv`) put `--` there instead and keep the path as given.
pub fn shell_path_as(p: &Path, q: Quoting) -> String {
    let s = p.display().to_string();
    let s = if s.starts_with('-') {
        format!("./{s}")
    } else {
        s
    };
    quote_word(&s, q)
}

/// How a suggested command is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quoting {
    /// For a POSIX shell (`sh -c "$next_step"`): every word quoted by [`shlex`] where it
    /// needs it; a control character stays as it is inside single quotes (which is what
    /// a shell reads back). The `--json` form.
    Sh,
    /// For a terminal, to be pasted: the same, except that a word holding a character a
    /// terminal would act on (`terminal_unsafe`: controls, bidi overrides) is written as
    /// `$'...'` with those characters as octal UTF-8 bytes, which bash, zsh, ksh and
    /// POSIX.1-2024 shells read back exactly, and which shows nothing a terminal acts on.
    Terminal,
}

/// One word of a command line, quoted as `q` says (nothing is pasted unquoted: an owner
/// id, a host or a path is data, never shell text).
pub fn quote_word(word: &str, q: Quoting) -> String {
    if q == Quoting::Terminal && word.chars().any(terminal_unsafe) {
        return dollar_quote(word);
    }
    // shlex refuses only a NUL byte, which no path or record field holds; `$'\000'`
    // would end the word in every shell anyway, so say it in the one form that shows it.
    shlex::try_quote(word).map_or_else(|_| dollar_quote(word), |w| w.into_owned())
}

/// `word` as `$'...'`: printable ASCII as is (`'` and `\` escaped), every character a
/// terminal would act on as its UTF-8 bytes in octal (U+202E as `\342\200\256`), the
/// rest of Unicode as is.
fn dollar_quote(word: &str) -> String {
    let mut out = String::from("$'");
    for c in word.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c == ' ' || c.is_ascii_graphic() => out.push(c),
            c if !c.is_ascii() && !terminal_unsafe(c) => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\{b:03o}"));
                }
            }
        }
    }
    out.push('\'');
    out
}

/// An argument vector as one command line, each word quoted by [`quote_word`].
pub fn command_line(argv: &[String], q: Quoting) -> String {
    argv.iter()
        .map(|w| quote_word(w, q))
        .collect::<Vec<_>>()
        .join(" ")
}

/// [`human_ms`] of a [`Duration`](std::time::Duration) (saturating).
pub fn human_duration(d: std::time::Duration) -> String {
    human_ms(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Human form of a duration in ms: `850 ms`, `1.2 s`, `3 min 5 s`.
pub fn human_ms(ms: i64) -> String {
    let neg = ms < 0;
    let a = ms.unsigned_abs();
    let s = if a < 1000 {
        format!("{a} ms")
    } else if a < 60_000 {
        format!("{:.1} s", a as f64 / 1000.0)
    } else if a < 3_600_000 {
        format!("{} min {} s", a / 60_000, (a % 60_000) / 1000)
    } else {
        format!("{} h {} min", a / 3_600_000, (a % 3_600_000) / 60_000)
    };
    if neg {
        format!("-{s} (in the future)")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_text_escapes_controls_readably() {
        assert_eq!(
            terminal_safe("a\nb\rc\u{1b}d\u{202e}e\tf"),
            "a\\nb\\rc\\u{1b}d\\u{202e}e\tf"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(1234), "1.2 s");
        assert_eq!(human_ms(185_000), "3 min 5 s");
        assert!(human_ms(-2000).contains("future"));
    }

    #[test]
    fn shell_paths_are_quoted_when_needed() {
        assert_eq!(shell_path(Path::new("./demo-run")), "./demo-run");
        assert_eq!(shell_path(Path::new("a b")), "'a b'");
        assert_eq!(shell_path(Path::new("-rf")), "./-rf");
        assert_eq!(shell_path(Path::new("$(x)")), "'$(x)'");
        assert_eq!(shell_path(Path::new("a\nb")), "$'a\\012b'");
    }
}
