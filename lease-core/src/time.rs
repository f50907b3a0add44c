//! Wall-clock timestamps in the one canonical form the protocol accepts.
//!
//! The core never reads a clock: callers pass [`Timestamp`]s (wall time) and
//! [`std::time::Duration`] readings of their own monotonic clock.

use crate::invalid::InvalidValue;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A wall-clock instant with millisecond precision, UTC, between 1970-01-01 and 9999-12-31.
///
/// Its only text form is RFC 3339 `YYYY-MM-DDTHH:MM:SS.mmmZ` (24 bytes); parsing accepts
/// exactly that form, so every timestamp has one byte representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

/// Milliseconds of 9999-12-31T23:59:59.999Z.
const MAX_MS: u64 = 253_402_300_799_999;

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From milliseconds since the Unix epoch; `None` past year 9999.
    pub fn from_unix_millis(ms: u64) -> Option<Timestamp> {
        (ms <= MAX_MS).then_some(Timestamp(ms))
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_millis(self) -> u64 {
        self.0
    }

    /// `self - earlier` in milliseconds (negative when `earlier` is later).
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        // Both are below 2^48, so the difference fits.
        self.0 as i64 - earlier.0 as i64
    }

    /// This instant plus `ms` milliseconds, saturating at the maximum.
    pub fn plus_millis(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms).min(MAX_MS))
    }

    /// Parse the canonical form `YYYY-MM-DDTHH:MM:SS.mmmZ`; anything else is an error.
    pub fn parse(s: &str) -> Result<Timestamp, InvalidValue> {
        let bad = |why: &str| InvalidValue::new("timestamp", format!("{s:?} {why}"));
        let b = s.as_bytes();
        if b.len() != 24 {
            return Err(bad("is not of the form YYYY-MM-DDTHH:MM:SS.mmmZ"));
        }
        let shape_ok = b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'.'
            && b[23] == b'Z';
        let digits = [0..4, 5..7, 8..10, 11..13, 14..16, 17..19, 20..23];
        if !shape_ok
            || !digits
                .iter()
                .all(|r| b[r.clone()].iter().all(u8::is_ascii_digit))
        {
            return Err(bad("is not of the form YYYY-MM-DDTHH:MM:SS.mmmZ"));
        }
        let num = |r: std::ops::Range<usize>| {
            b[r].iter()
                .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'))
        };
        let (year, month, day) = (num(0..4), num(5..7), num(8..10));
        let (hour, minute, second, milli) = (num(11..13), num(14..16), num(17..19), num(20..23));
        if year < 1970 {
            return Err(bad("is before 1970"));
        }
        if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
            return Err(bad("is not a calendar date"));
        }
        if hour > 23 || minute > 59 || second > 59 {
            return Err(bad("has an invalid time of day"));
        }
        let days = days_from_civil(year, month, day);
        let ms = ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + milli;
        Ok(Timestamp(ms))
    }
}

fn is_leap(y: u64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date with year >= 1970
/// (H. Hinnant's `days_from_civil`, restricted to non-negative results).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(z: u64) -> (u64, u64, u64) {
    let z = z + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0 % 1000;
        let secs = self.0 / 1000;
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, mo, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_timestamps_round_trip() {
        for s in [
            "1970-01-01T00:00:00.000Z",
            "2000-02-29T23:59:59.999Z",
            "2026-12-02T15:50:42.123Z",
            "9999-12-31T23:59:59.999Z",
        ] {
            let t = Timestamp::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
        }
        assert_eq!(
            Timestamp::parse("1970-01-02T00:00:00.001Z")
                .unwrap()
                .unix_millis(),
            86_400_001
        );
    }

    #[test]
    fn non_canonical_timestamps_are_rejected() {
        for s in [
            "2026-12-02",
            "2026-12-02T15:50:42Z",
            "2026-12-02T15:50:42.12Z",
            "2026-12-02T15:50:42.123+00:00",
            "2026-12-02t15:50:42.123Z",
            "2026-02-29T00:00:00.000Z",
            "1900-02-28T00:00:00.000Z",
            "2026-13-01T00:00:00.000Z",
            "2026-12-00T00:00:00.000Z",
            "2026-12-02T24:00:00.000Z",
            "2026-12-02T23:60:00.000Z",
            "2026-12-02T23:59:60.000Z",
            "+026-12-02T23:59:59.000Z",
            "２026-12-02T23:59:59.000Z",
        ] {
            assert!(Timestamp::parse(s).is_err(), "{s} accepted");
        }
    }

    #[test]
    fn every_day_round_trips_through_civil_conversion() {
        for days in (0..2_932_896u64).step_by(7) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
