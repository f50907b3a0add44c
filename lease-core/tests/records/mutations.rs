//! Byte mutations of canonical records.

use crate::checks::check_rejected_or_canonical;
use crate::samples::{Subject, decode_then_encode, must_encode};
use proptest::prelude::*;
use proptest::sample::{Index, select};

// ---------------------------------------------------------------------------------------
// Byte mutations
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Flip(Index, u8),
    Replace(Index, u8),
    Truncate(Index),
    Insert(Index, u8),
    DuplicateLastLf,
    Delete(Index),
    SwapAdjacent(Index),
}

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (
            any::<Index>(),
            select(b"{}[]\",:\\0123456789-+.eEtrufalsn \n".to_vec())
        )
            .prop_map(|(i, b)| Mutation::Replace(i, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), select(vec![b' ', b'\n', b'\t', b'\r']))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        Just(Mutation::DuplicateLastLf),
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::SwapAdjacent),
    ]
}

impl Mutation {
    pub(crate) fn apply(&self, b: &mut Vec<u8>) {
        match self {
            Mutation::Flip(i, mask) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] ^= mask;
            }
            Mutation::Replace(i, c) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] = *c;
            }
            Mutation::Truncate(i) if !b.is_empty() => b.truncate(i.index(b.len())),
            Mutation::Insert(i, c) => b.insert(i.index(b.len() + 1), *c),
            Mutation::DuplicateLastLf => b.push(b'\n'),
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i.index(b.len()));
            }
            Mutation::SwapAdjacent(i) if b.len() >= 2 => {
                let k = i.index(b.len() - 1);
                b.swap(k, k + 1);
            }
            _ => {}
        }
    }
}

pub(crate) fn check_mutations<R: Subject>(
    record: &R,
    mutations: &[Mutation],
) -> Result<(), TestCaseError> {
    let mut bytes = must_encode(record);
    for m in mutations {
        m.apply(&mut bytes);
        check_rejected_or_canonical(decode_then_encode::<R>, &bytes)?;
    }
    Ok(())
}
