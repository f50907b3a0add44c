//! The heartbeat file's in-place format: two fixed-size slots, each with a sequence
//! number and a checksum (PROTOCOL.md §2 "Heartbeat file", §5.3).
//!
//! An owner writes each heartbeat into one slot with a single positioned write (`pwrite`),
//! alternating slots by sequence number, so the other slot always holds the previous beat
//! whole. A reader takes the valid slot with the highest sequence and ignores a slot whose
//! checksum does not match (a write in flight, or one torn by a power loss): a heartbeat can
//! never make the run unreadable, and a power loss during one leaves the previous beat.
//!
//! A file starts with sequence 1 written whole (temp file and rename, [`fresh_file`]); beat
//! `n > 1` overwrites only the `SLOT_BYTES` at [`slot_offset`]`(n)`. Every byte of the
//! format is decided here, so every adapter (disk, simulation, in-memory) writes the same
//! bytes.
//!
//! Slot layout (all integers little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | magic `rlbeat1\n` |
//! | 8..16 | sequence (`u64`, ≥ 1) |
//! | 16..20 | payload length (`u32`) |
//! | 20..52 | SHA-256 of bytes 0..20 followed by the payload |
//! | 52..52+len | the payload: the canonical JSON heartbeat record |
//! | rest | zero |
//!
//! ```
//! use lease_core::beat::{fresh_file, put_slot, read_slots, slot_bytes, slot_offset, SlotRead};
//! let mut file = fresh_file(1, b"{\"a\":1}\n").unwrap();
//! // Beat 2 goes into the other slot; a reader sees it.
//! put_slot(&mut file, 2, &slot_bytes(2, b"{\"a\":2}\n").unwrap());
//! assert_eq!(read_slots(&file), SlotRead::Valid { seq: 2, payload: b"{\"a\":2}\n", torn: false });
//! // Beat 3 torn half-way: the reader falls back to beat 2.
//! let slot = slot_bytes(3, b"{\"a\":3}\n").unwrap();
//! let at = slot_offset(3) as usize;
//! file[at..at + 30].copy_from_slice(&slot[..30]);
//! assert_eq!(read_slots(&file), SlotRead::Valid { seq: 2, payload: b"{\"a\":2}\n", torn: true });
//! ```

use sha2::Digest as _;

/// Size of one slot in bytes.
pub const SLOT_BYTES: usize = 2048;
/// Number of slots in a heartbeat file.
pub const SLOTS: usize = 2;
/// Size of a heartbeat file written by this version.
pub const FILE_BYTES: usize = SLOT_BYTES * SLOTS;
/// The slot header: magic, sequence, length and checksum.
pub const HEADER_BYTES: usize = 52;
/// The largest payload a slot holds.
pub const MAX_PAYLOAD: usize = SLOT_BYTES - HEADER_BYTES;
/// The magic that starts every slot.
pub const MAGIC: &[u8; 8] = b"rlbeat1\n";

/// A payload that does not fit a slot, or a sequence of 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// The payload is longer than [`MAX_PAYLOAD`].
    #[error("heartbeat record is {len} bytes; a slot holds at most {MAX_PAYLOAD}")]
    TooLong {
        /// The payload's length.
        len: usize,
    },
    /// Sequence numbers start at 1.
    #[error("heartbeat slot sequence 0 (sequences start at 1)")]
    ZeroSequence,
}

/// The byte offset of the slot that beat `seq` is written to (odd and even sequences
/// alternate).
pub fn slot_offset(seq: u64) -> u64 {
    // mutant beat_one_slot: every beat overwrites the same slot (§4, §9 heartbeat).
    if crate::mutant::mutant("beat_one_slot") {
        return 0;
    }
    (seq % SLOTS as u64) * SLOT_BYTES as u64
}

fn checksum(head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    h.update(head);
    h.update(payload);
    h.finalize().into()
}

/// The `SLOT_BYTES` bytes of slot `seq` holding `payload`.
pub fn slot_bytes(seq: u64, payload: &[u8]) -> Result<Vec<u8>, SlotError> {
    if seq == 0 {
        return Err(SlotError::ZeroSequence);
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(SlotError::TooLong { len: payload.len() });
    }
    let mut out = vec![0u8; SLOT_BYTES];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    // In range: payload.len() <= MAX_PAYLOAD < u32::MAX.
    out[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let sum = checksum(&out[..20], payload);
    out[20..HEADER_BYTES].copy_from_slice(&sum);
    out[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(payload);
    Ok(out)
}

/// Put `slot` (the bytes of beat `seq`'s slot, [`slot_bytes`]) at its place in the file
/// bytes `file`, growing them with zeros as far as needed: what one in-place write does.
pub fn put_slot(file: &mut Vec<u8>, seq: u64, slot: &[u8]) {
    let at = slot_offset(seq) as usize;
    if file.len() < at + slot.len() {
        file.resize(at + slot.len(), 0);
    }
    file[at..at + slot.len()].copy_from_slice(slot);
}

/// A whole heartbeat file ([`FILE_BYTES`]) whose only valid slot is the slot of beat `seq`
/// (`slot`, from [`slot_bytes`]); the other slot is zero.
pub fn fresh_file_of_slot(seq: u64, slot: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; FILE_BYTES];
    put_slot(&mut out, seq, slot);
    out
}

/// A whole heartbeat file ([`FILE_BYTES`]) whose only valid slot is `seq` with `payload`;
/// the other slot is zero.
pub fn fresh_file(seq: u64, payload: &[u8]) -> Result<Vec<u8>, SlotError> {
    Ok(fresh_file_of_slot(seq, &slot_bytes(seq, payload)?))
}

/// One slot decoded: `Some((seq, payload))` when its magic, length and checksum hold.
fn decode_slot(slot: &[u8]) -> Option<(u64, &[u8])> {
    if slot.len() < HEADER_BYTES || &slot[..8] != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(slot[8..16].try_into().ok()?);
    let len = u32::from_le_bytes(slot[16..20].try_into().ok()?) as usize;
    if seq == 0 || len > MAX_PAYLOAD || HEADER_BYTES + len > slot.len() {
        return None;
    }
    let payload = &slot[HEADER_BYTES..HEADER_BYTES + len];
    // mutant beat_checksum_ignored: a torn slot is read as whole (§4, §9 heartbeat).
    if crate::mutant::mutant("beat_checksum_ignored") {
        return Some((seq, payload));
    }
    (checksum(&slot[..20], payload)[..] == slot[20..HEADER_BYTES]).then_some((seq, payload))
}

/// What a heartbeat file's bytes hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotRead<'a> {
    /// The valid slot with the highest sequence. `torn`: another slot holds bytes that are
    /// not a valid slot (a write in flight or cut by a power loss), which the reader
    /// ignored.
    Valid {
        /// The slot's sequence number.
        seq: u64,
        /// Its payload (the heartbeat record's bytes).
        payload: &'a [u8],
        /// Whether another slot held something other than a valid slot or zeros.
        torn: bool,
    },
    /// The file is empty, or all zero: nothing was written that reached the disk.
    Empty,
    /// No valid slot, but not empty either: a first write cut short (under the `local`
    /// policy, by a power loss) or bytes nobody wrote.
    Torn,
    /// The file is in the format older versions wrote (one JSON record replaced by
    /// rename): the whole file is the payload.
    Legacy(&'a [u8]),
}

/// Decode a heartbeat file's bytes (never fails: bad slots are reported, not errors).
pub fn read_slots(bytes: &[u8]) -> SlotRead<'_> {
    // The older format is one JSON record (under a slot's size). A file longer than a
    // slot that starts with `{` is an old record whose second slot was written since.
    if bytes.first() == Some(&b'{') && bytes.len() <= SLOT_BYTES {
        return SlotRead::Legacy(bytes);
    }
    let mut best: Option<(u64, &[u8])> = None;
    let mut torn = false;
    for slot in bytes.chunks(SLOT_BYTES).take(SLOTS) {
        match decode_slot(slot) {
            Some((seq, payload)) => {
                if best.is_none_or(|(s, _)| seq > s) {
                    best = Some((seq, payload));
                }
            }
            None => torn |= slot.iter().any(|&b| b != 0),
        }
    }
    // Bytes past the slots are nobody's.
    torn |= bytes.len() > FILE_BYTES;
    match best {
        Some((seq, payload)) => SlotRead::Valid { seq, payload, torn },
        None if torn => SlotRead::Torn,
        None => SlotRead::Empty,
    }
}

/// The newest heartbeat record a heartbeat file holds (the payload of its newest valid
/// slot, or the whole file in the older one-record format), if any.
pub fn newest_record(bytes: &[u8]) -> Option<&[u8]> {
    match read_slots(bytes) {
        SlotRead::Valid { payload, .. } => Some(payload),
        SlotRead::Legacy(b) => Some(b),
        SlotRead::Empty | SlotRead::Torn => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_of_an_in_place_write_leaves_a_valid_beat() {
        let mut file = fresh_file(1, b"{\"n\":1}\n").unwrap();
        for seq in 2..6u64 {
            let payload = format!("{{\"n\":{seq}}}\n");
            let slot = slot_bytes(seq, payload.as_bytes()).unwrap();
            let at = slot_offset(seq) as usize;
            let prev = format!("{{\"n\":{}}}\n", seq - 1);
            for cut in 0..=SLOT_BYTES {
                let mut torn = file.clone();
                torn[at..at + cut].copy_from_slice(&slot[..cut]);
                match read_slots(&torn) {
                    SlotRead::Valid {
                        seq: s, payload: p, ..
                    } if s == seq => {
                        assert_eq!(p, payload.as_bytes());
                    }
                    SlotRead::Valid {
                        seq: s, payload: p, ..
                    } => {
                        assert_eq!((s, p), (seq - 1, prev.as_bytes()), "cut {cut}");
                    }
                    other => panic!("cut {cut}: {other:?}"),
                }
            }
            put_slot(&mut file, seq, &slot);
        }
    }

    #[test]
    fn empty_torn_legacy_and_limits() {
        assert_eq!(read_slots(b""), SlotRead::Empty);
        assert_eq!(read_slots(&[0u8; FILE_BYTES]), SlotRead::Empty);
        let f = fresh_file(1, b"{}\n").unwrap();
        assert_eq!(read_slots(&f[..SLOT_BYTES + 10]), SlotRead::Torn);
        assert_eq!(read_slots(b"{\"a\":1}\n"), SlotRead::Legacy(b"{\"a\":1}\n"));
        let mut flipped = f.clone();
        flipped[SLOT_BYTES + HEADER_BYTES] ^= 1;
        assert_eq!(read_slots(&flipped), SlotRead::Torn);
        assert_eq!(slot_bytes(0, b""), Err(SlotError::ZeroSequence));
        assert!(slot_bytes(1, &vec![b'x'; MAX_PAYLOAD]).is_ok());
        assert_eq!(
            slot_bytes(1, &vec![b'x'; MAX_PAYLOAD + 1]),
            Err(SlotError::TooLong {
                len: MAX_PAYLOAD + 1
            })
        );
        let mut long = f.clone();
        long.push(1);
        assert!(matches!(
            read_slots(&long),
            SlotRead::Valid { torn: true, .. }
        ));
    }

    /// The file is two slots of 2048 bytes: a fresh file is exactly that, its other slot
    /// zero (nothing torn), whichever slot its beat is in.
    #[test]
    fn a_fresh_file_is_two_slots_and_nothing_torn() {
        assert_eq!(FILE_BYTES, 4096);
        for seq in [1u64, 2] {
            let f = fresh_file(seq, b"{}\n").unwrap();
            assert_eq!(f.len(), 4096, "beat {seq}");
            let expected = SlotRead::Valid {
                seq,
                payload: b"{}\n",
                torn: false,
            };
            assert_eq!(read_slots(&f), expected);
        }
    }

    /// `put_slot` is one in-place write: it grows a short file with zeros up to the end
    /// of its slot, and never shrinks or pads a file that already reaches it.
    #[test]
    fn put_slot_grows_a_short_file_and_never_shrinks_a_long_one() {
        let slot1 = slot_bytes(1, b"{}\n").unwrap();
        let slot2 = slot_bytes(2, b"{}\n").unwrap();
        let mut f = Vec::new();
        put_slot(&mut f, 2, &slot2);
        assert_eq!(f, slot2);
        let mut f = Vec::new();
        put_slot(&mut f, 1, &slot1);
        assert_eq!(f.len(), FILE_BYTES);
        assert!(f[..SLOT_BYTES].iter().all(|&b| b == 0));
        assert_eq!(&f[SLOT_BYTES..], &slot1[..]);
        let mut long = vec![7u8; FILE_BYTES + 10];
        put_slot(&mut long, 1, &slot1);
        assert_eq!(long.len(), FILE_BYTES + 10);
        assert_eq!(&long[SLOT_BYTES..FILE_BYTES], &slot1[..]);
        assert!(long[..SLOT_BYTES].iter().all(|&b| b == 7));
    }

    /// A slot is read at its bounds: a payload filling it, a header with an empty payload;
    /// a slot cut inside its payload is torn (never read past its end), and sequence 0 is
    /// never valid, even under a matching checksum.
    #[test]
    fn slot_decoding_at_its_bounds() {
        let big = vec![b'x'; MAX_PAYLOAD];
        let full = SlotRead::Valid {
            seq: 2,
            payload: &big,
            torn: false,
        };
        assert_eq!(read_slots(&fresh_file(2, &big).unwrap()), full);
        let empty = slot_bytes(1, b"").unwrap();
        let header_only = SlotRead::Valid {
            seq: 1,
            payload: b"",
            torn: false,
        };
        assert_eq!(read_slots(&empty[..HEADER_BYTES]), header_only);
        let f = fresh_file(1, b"{}\n").unwrap();
        assert_eq!(
            read_slots(&f[..SLOT_BYTES + HEADER_BYTES + 2]),
            SlotRead::Torn
        );
        let mut zero = slot_bytes(1, b"{}\n").unwrap();
        zero[8..16].copy_from_slice(&0u64.to_le_bytes());
        let sum = checksum(&zero[..20], b"{}\n");
        zero[20..HEADER_BYTES].copy_from_slice(&sum);
        assert_eq!(read_slots(&zero), SlotRead::Torn);
    }

    #[test]
    fn newest_record_is_the_newest_valid_payload_or_a_legacy_file() {
        let mut f = fresh_file(1, b"{\"n\":1}\n").unwrap();
        assert_eq!(newest_record(&f), Some(&b"{\"n\":1}\n"[..]));
        put_slot(&mut f, 2, &slot_bytes(2, b"{\"n\":2}\n").unwrap());
        assert_eq!(newest_record(&f), Some(&b"{\"n\":2}\n"[..]));
        assert_eq!(newest_record(b"{\"a\":1}\n"), Some(&b"{\"a\":1}\n"[..]));
        assert_eq!(newest_record(&[0u8; FILE_BYTES]), None);
        assert_eq!(
            newest_record(&f[..SLOT_BYTES + 10]),
            Some(&b"{\"n\":2}\n"[..])
        );
        assert_eq!(newest_record(&f[SLOT_BYTES..SLOT_BYTES + 10]), None);
    }
}
