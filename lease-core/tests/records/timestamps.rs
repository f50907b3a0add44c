//! Timestamps: one canonical text form, and parsing accepts nothing else.

use crate::cases;
use crate::strategies::{text, timestamp};
use lease_core::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(cases(256))]

    /// Timestamps have one 24-byte text form that parses back to the same instant.
    #[test]
    fn every_timestamp_has_one_canonical_text_form(t in timestamp()) {
        let text = t.to_string();
        prop_assert_eq!(text.len(), 24);
        prop_assert_eq!(Timestamp::parse(&text), Ok(t));
    }

    /// Parsing accepts only text that formatting would produce.
    #[test]
    fn timestamp_parsing_accepts_only_the_canonical_form(
        text in prop_oneof![
            proptest::string::string_regex(
                "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"
            ).unwrap_or_else(|e| panic!("bad regex: {e}")),
            proptest::string::string_regex(
                "(19[7-9][0-9]|20[0-9]{2}|9999)-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\\.[0-9]{3}Z"
            ).unwrap_or_else(|e| panic!("bad regex: {e}")),
            text(30),
        ],
    ) {
        if let Ok(t) = Timestamp::parse(&text) {
            prop_assert_eq!(t.to_string(), text);
        }
    }
}
