//! Arbitrary bytes and JSON objects, every decoder: never a panic, accepted only if canonical.

use crate::cases;
use crate::checks::check_rejected_or_canonical;
use crate::samples::DECODERS;
use crate::strategies::{json, text};
use lease_core::canonical::canonical_value_bytes;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value};

proptest! {
    #![proptest_config(cases(256))]

    /// Strict decoding of untrusted files: arbitrary bytes never panic any decoder, and are
    /// accepted only if they are exactly canonical.
    #[test]
    fn arbitrary_bytes_never_panic_and_decode_only_if_canonical(
        bytes in vec(any::<u8>(), 0..512),
    ) {
        for (_, decode) in DECODERS {
            check_rejected_or_canonical(decode, &bytes)?;
        }
    }

    /// Same, for inputs that are JSON objects ending in LF (so decoding reaches the version
    /// check and the field decoders), with and without each kind's version.
    #[test]
    fn arbitrary_json_objects_never_panic_and_decode_only_if_canonical(
        fields in btree_map(
            prop_oneof![
                select(vec![
                    "run_id", "generation", "sequence", "version", "owner_id", "prev_hash",
                    "payload", "type", "timestamp", "holder", "policy", "count",
                ])
                .prop_map(String::from),
                text(8),
            ],
            json(),
            0..8,
        ),
        with_version in any::<bool>(),
    ) {
        for (kind, decode) in DECODERS {
            let mut map: Map<String, Value> = fields.clone().into_iter().collect();
            if with_version {
                map.insert("version".into(), Value::String(format!("runlease/{kind}/1")));
            }
            check_rejected_or_canonical(decode, &canonical_value_bytes(&Value::Object(map)))?;
        }
    }
}
