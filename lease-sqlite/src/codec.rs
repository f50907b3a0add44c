//! The encoding of a commit's writes in `commits.writes` (one BLOB per commit).
//!
//! Keeping a commit's writes in its own row (rather than one row per write in a table of
//! its own) makes a one-document commit touch two b-tree pages (`commits`, `docs`) instead
//! of three, which is a third less to write and fsync per commit.
//!
//! Format, repeated for each write in order, all integers big-endian:
//! `0x01 key_len:u32 key value_len:u32 value` (put) or `0x02 key_len:u32 key` (delete).
//! Keys are UTF-8. Decoding is strict: an unknown tag, a length past the end or invalid
//! UTF-8 is an error (the caller reports `STORE_CORRUPT`).

use crate::store::Write;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// Encode `writes`; `Err` names a key or value too long for a `u32` length.
pub(crate) fn encode(writes: &[Write]) -> Result<Vec<u8>, String> {
    let len = |what: &str, n: usize| {
        u32::try_from(n).map_err(|_| format!("{what} of {n} bytes is longer than 4 GiB"))
    };
    let mut out = Vec::with_capacity(
        writes
            .iter()
            .map(|w| match w {
                Write::Put { key, value } => 9 + key.len() + value.len(),
                Write::Delete { key } => 5 + key.len(),
            })
            .sum(),
    );
    for w in writes {
        match w {
            Write::Put { key, value } => {
                out.push(PUT);
                out.extend_from_slice(&len("key", key.len())?.to_be_bytes());
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(&len("value", value.len())?.to_be_bytes());
                out.extend_from_slice(value);
            }
            Write::Delete { key } => {
                out.push(DELETE);
                out.extend_from_slice(&len("key", key.len())?.to_be_bytes());
                out.extend_from_slice(key.as_bytes());
            }
        }
    }
    Ok(out)
}

/// Decode what [`encode`] wrote; `Err` says what is wrong.
pub(crate) fn decode(mut bytes: &[u8]) -> Result<Vec<Write>, String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!("needs {n} more bytes, {} are left", bytes.len()));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    fn chunk<'a>(bytes: &mut &'a [u8]) -> Result<&'a [u8], String> {
        let n = take(bytes, 4)?;
        let n = u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize;
        take(bytes, n)
    }
    let mut out = Vec::new();
    while let Some((&tag, rest)) = bytes.split_first() {
        bytes = rest;
        let key = String::from_utf8(chunk(&mut bytes)?.to_vec())
            .map_err(|_| "a key is not UTF-8".to_string())?;
        out.push(match tag {
            PUT => Write::Put {
                key,
                value: chunk(&mut bytes)?.to_vec(),
            },
            DELETE => Write::Delete { key },
            other => return Err(format!("unknown write tag {other}")),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_round_trip_and_bad_bytes_are_refused() {
        let w = vec![
            Write::Put {
                key: "a/é".into(),
                value: vec![0, 1, 2],
            },
            Write::Delete { key: "".into() },
            Write::Put {
                key: "k".into(),
                value: vec![],
            },
        ];
        let bytes = encode(&w).unwrap();
        assert_eq!(decode(&bytes).unwrap(), w);
        assert_eq!(decode(&[]).unwrap(), vec![]);
        for cut in 1..bytes.len() {
            // Every strict prefix either fails or decodes to fewer writes.
            if let Ok(d) = decode(&bytes[..cut]) {
                assert!(d.len() < w.len());
            }
        }
        assert!(decode(&[9, 0, 0, 0, 0]).is_err());
        assert!(decode(&[PUT, 0, 0, 0, 1, 0xff, 0, 0, 0, 0]).is_err());
        assert!(decode(&[DELETE, 0, 0, 0, 5, b'a']).is_err());
    }
}
