//! Strategies for scalars, identifiers, free text and JSON payloads.

use lease_core::*;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Number, Value};

/// Milliseconds of 9999-12-31T23:59:59.999Z, the last representable timestamp.
const MAX_MS: u64 = 253_402_300_799_999;
pub(crate) const DAY_MS: u64 = 24 * 3600 * 1000;

// ---------------------------------------------------------------------------------------
// Strategies: scalars and identifiers
// ---------------------------------------------------------------------------------------

/// Any u64, biased towards small values and the top of the range.
pub(crate) fn u64_biased() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        4 => 0u64..=16,
        4 => any::<u64>(),
        1 => (u64::MAX - 16)..=u64::MAX,
        1 => Just(1u64 << 53),
    ]
}

/// A value for a generation or a sequence (>= 1).
pub(crate) fn positive_u64() -> impl Strategy<Value = u64> + Clone {
    u64_biased().prop_map(|v| v.max(1))
}

/// A value in `1..u64::MAX` (so that `+ 1` exists).
pub(crate) fn below_max_u64() -> impl Strategy<Value = u64> + Clone {
    positive_u64().prop_map(|v| v.min(u64::MAX - 1))
}

pub(crate) fn pid() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![3 => 1u32..=65_536, 2 => 1u32..=u32::MAX, 1 => Just(u32::MAX)]
}

/// A character allowed somewhere in an identity (no control characters; whitespace is
/// allowed inside, trimming takes care of the ends).
fn identity_char() -> impl Strategy<Value = char> + Clone {
    prop_oneof![
        8 => proptest::char::range('!', '~'),
        2 => Just(' '),
        2 => select(vec![
            '\u{a0}', '\u{3000}', '\u{2028}', '\u{200b}', '\u{feff}', '\u{fffd}', 'é', 'ß', '中',
            '😀', '\u{10ffff}', '"', '\\', '/', '\u{ad}',
        ]),
        3 => any::<char>().prop_map(|c| if c.is_control() { '?' } else { c }),
    ]
}

/// Make a valid identity out of arbitrary identity characters: trim, cut at 256 bytes (on a
/// character boundary), trim again, never empty.
fn fix_identity(chars: Vec<char>) -> Identity {
    let s: String = chars.into_iter().collect();
    let s = s.trim();
    let mut end = s.len().min(256);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let s = s[..end].trim();
    let s = if s.is_empty() { "x" } else { s };
    Identity::new(s).unwrap_or_else(|e| panic!("test strategy built a bad identity: {e}"))
}

pub(crate) fn identity() -> impl Strategy<Value = Identity> + Clone {
    prop_oneof![
        6 => vec(identity_char(), 1..24),
        1 => vec(proptest::char::range(' ', '~'), 250..=262),
        1 => vec(identity_char(), 60..=300),
    ]
    .prop_map(fix_identity)
}

/// A *word* ([`Identity::check_word`]): what owner ids and host names must be (1 to 128
/// ASCII letters, digits and `-_.:@`, starting with a letter or digit), biased to the
/// forms runlease writes (`run-<hex>`, UUIDs, host names) and the length bound.
pub(crate) fn word() -> impl Strategy<Value = Identity> + Clone {
    prop_oneof![
        6 => "[A-Za-z0-9][A-Za-z0-9._:@-]{0,23}",
        1 => "run-[0-9a-f]{32}",
        1 => "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        1 => "[A-Za-z0-9][A-Za-z0-9._:@-]{120,127}",
    ]
    .prop_map(|s| Identity::new(s).unwrap_or_else(|e| panic!("bad word strategy: {e}")))
}

pub(crate) fn run_id() -> impl Strategy<Value = RunId> {
    proptest::string::string_regex("[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        .unwrap_or_else(|e| panic!("bad regex: {e}"))
        .prop_map(|s| RunId::new(s).unwrap_or_else(|e| panic!("bad run id strategy: {e}")))
}

pub(crate) fn timestamp() -> impl Strategy<Value = Timestamp> + Clone {
    prop_oneof![
        8 => 0..=MAX_MS,
        1 => Just(0),
        1 => Just(MAX_MS),
        // Around 2000-02-29 and the 2026 dates the rest of the project uses.
        2 => 951_696_000_000u64..951_955_200_000,
        2 => 1_790_000_000_000u64..1_800_000_000_000,
    ]
    .prop_map(|ms| Timestamp::from_unix_millis(ms).unwrap_or(Timestamp::EPOCH))
}

pub(crate) fn digest() -> impl Strategy<Value = Digest> + Clone {
    vec(any::<u8>(), 0..16).prop_map(|b| Digest::of(&b))
}

/// Characters of free text: controls, quotes, backslashes, unicode separators, astral.
pub(crate) fn text_char() -> impl Strategy<Value = char> + Clone {
    prop_oneof![
        6 => proptest::char::range(' ', '~'),
        2 => proptest::char::range('\0', '\u{1f}'),
        2 => select(vec![
            '\u{7f}', '\u{80}', '\u{9f}', '\u{2028}', '\u{2029}', '\u{feff}', '"', '\\', '/', 'é',
            '中', '😀', '\u{10ffff}', '\u{fffd}',
        ]),
        2 => any::<char>(),
    ]
}

pub(crate) fn text(max_chars: usize) -> impl Strategy<Value = String> + Clone {
    vec(text_char(), 0..max_chars).prop_map(|c| c.into_iter().collect())
}

/// Free text of at most `max` bytes, cut on a character boundary.
pub(crate) fn truncate_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Arbitrary JSON for event payloads: depth <= 4.
pub(crate) fn json() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        2 => any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        1 => select(vec![0.0f64, -0.0, 1.0, 0.1, 1e300, -1e-300, 5e-324, 1e16, 9007199254740993.0])
            .prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        3 => text(16).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(text(8), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}
