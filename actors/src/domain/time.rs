//! Timestamps and durations.
//!
//! The API's timestamps are RFC 3339 in UTC with a `Z` (docs/api.md § Conventions). Internally a timestamp is
//! a count of Unix milliseconds, which is cheap to compare, to store and to add TTLs to; this
//! module owns the conversion between the two and the parsing of human durations such as `30m`
//! found in settings.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Why a timestamp or a duration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum TimeError {
    /// The text is not an RFC 3339 timestamp.
    #[error("invalid RFC 3339 timestamp `{input}`: {reason}")]
    InvalidTimestamp {
        /// The text that was refused.
        input: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The timestamp names no zone: neither `Z` nor an offset.
    #[error(
        "timestamp `{0}` must end with `Z` or an offset (e.g. 2026-11-22T01:23:44.123Z or 2026-11-22T02:23:44+01:00)"
    )]
    NoZone(String),
    /// The text is not a duration such as `500ms`, `5s`, `30m` or `2h`.
    #[error("invalid duration `{input}`: {reason}")]
    InvalidDuration {
        /// The text that was refused.
        input: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The duration does not fit in 64 bits of milliseconds.
    #[error("duration `{0}` is too long")]
    DurationTooLong(String),
}

/// An instant, in milliseconds since the Unix epoch, UTC.
///
/// Values are kept at or before 9999-12-31T23:59:59.999Z, the last instant RFC 3339 can write,
/// so every timestamp can be serialised and parsed back.
///
/// Serde reads and writes the RFC 3339 text without an intermediate `String`: every journal event, ledger
/// entry and record carries timestamps, and the startup audit decodes a million of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch, 1970-01-01T00:00:00.000Z.
    pub const EPOCH: Timestamp = Timestamp(0);
    /// The latest representable instant, 9999-12-31T23:59:59.999Z.
    pub const MAX: Timestamp = Timestamp(253_402_300_799_999);

    /// The current wall-clock time.
    ///
    /// A clock set before 1970 reads as the epoch rather than failing, because no caller could
    /// do anything better with the error.
    pub fn now() -> Timestamp {
        let millis = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis()).unwrap_or(0);
        Timestamp::from_unix_ms(u64::try_from(millis).unwrap_or(u64::MAX))
    }

    /// Builds a timestamp from Unix milliseconds, clamped to [`Timestamp::MAX`].
    pub fn from_unix_ms(unix_ms: u64) -> Timestamp {
        Timestamp(unix_ms.min(Self::MAX.0))
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_ms(self) -> u64 {
        self.0
    }

    /// Whole seconds since the Unix epoch, as webhook signatures use.
    pub fn unix_s(self) -> u64 {
        self.0 / 1_000
    }

    /// The instant `ms` milliseconds later, saturating at [`Timestamp::MAX`]; used for TTLs.
    pub fn plus_ms(self, ms: u64) -> Timestamp {
        Timestamp::from_unix_ms(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    pub fn ms_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Writes the instant as RFC 3339 UTC with milliseconds, e.g. `2026-11-22T01:23:44.123Z`.
    pub fn to_rfc3339(&self) -> String {
        self.to_string()
    }

    fn as_system_time(self) -> SystemTime {
        // The value is at most `MAX`, inside the range humantime can format (it cannot format
        // year 10000 and would panic); the `EPOCH` fallback is never taken.
        UNIX_EPOCH.checked_add(Duration::from_millis(self.0.min(Self::MAX.0))).unwrap_or(UNIX_EPOCH)
    }

    /// Parses an RFC 3339 timestamp, with or without a fraction of a second: UTC (`Z`, or `z`) or with an
    /// offset (`+01:00`, `-05:30`), which is taken away to give the instant in UTC. `T` may be written `t`,
    /// as RFC 3339 allows.
    ///
    /// Digits beyond milliseconds are truncated. A timestamp without a zone is refused: it names no instant.
    pub fn parse_rfc3339(input: &str) -> Result<Timestamp, TimeError> {
        let invalid =
            |reason: &str| TimeError::InvalidTimestamp { input: input.to_string(), reason: reason.to_string() };
        if !input.is_ascii() {
            return Err(invalid("expected YYYY-MM-DDTHH:MM:SS[.fff]Z or an offset such as +01:00"));
        }
        let upper = input.to_ascii_uppercase();
        let (local, offset_ms) = match split_offset(&upper) {
            Some((local, offset_ms)) => (format!("{local}Z"), offset_ms),
            None => (upper, 0),
        };
        let utc = Timestamp::parse_utc(&local).map_err(|e| match e {
            TimeError::InvalidTimestamp { reason, .. } => invalid(&reason),
            _ => TimeError::NoZone(input.to_string()),
        })?;
        let millis = i128::from(utc.0) - i128::from(offset_ms);
        if millis < 0 {
            return Err(invalid("before 1970"));
        }
        match u64::try_from(millis) {
            Ok(millis) if millis <= Self::MAX.0 => Ok(Timestamp(millis)),
            _ => Err(invalid("out of range")),
        }
    }

    /// [`Timestamp::parse_rfc3339`] of a timestamp ending in `Z`, `T` in capitals.
    fn parse_utc(input: &str) -> Result<Timestamp, TimeError> {
        let invalid =
            |reason: &str| TimeError::InvalidTimestamp { input: input.to_string(), reason: reason.to_string() };
        let bytes = input.as_bytes();
        if !input.ends_with('Z') {
            // Only call it a zone problem when the rest looks like a timestamp.
            let looks_dated = bytes.get(10) == Some(&b'T') && bytes.len() >= 19;
            return Err(if looks_dated {
                TimeError::NoZone(input.to_string())
            } else {
                invalid("expected YYYY-MM-DDTHH:MM:SS[.fff]Z or an offset such as +01:00")
            });
        }
        // humantime lets through `…:44.Z` (no digit) and `…:44ZZ` (trailing text); RFC 3339
        // allows neither, so what follows the seconds is checked here first.
        let tail_ok = match input.get(19..) {
            Some("Z") => true,
            Some(tail) => tail
                .strip_prefix('.')
                .and_then(|fraction| fraction.strip_suffix('Z'))
                .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())),
            None => false,
        };
        if !tail_ok {
            return Err(invalid("expected YYYY-MM-DDTHH:MM:SS[.fff]Z or an offset such as +01:00"));
        }
        let time = humantime::parse_rfc3339(input).map_err(|e| invalid(&e.to_string()))?;
        let elapsed = time.duration_since(UNIX_EPOCH).map_err(|_| invalid("before 1970"))?;
        let millis = u64::try_from(elapsed.as_millis()).map_err(|_| invalid("out of range"))?;
        Ok(Timestamp::from_unix_ms(millis))
    }
}

/// A timestamp ending in an offset (`+HH:MM` or `-HH:MM`, hours below 24, minutes below 60) split into the
/// local time before it and the offset in milliseconds (east of UTC positive).
fn split_offset(input: &str) -> Option<(&str, i64)> {
    let at = input.len().checked_sub(6)?;
    let (local, offset) = (input.get(..at)?, input.get(at..)?.as_bytes());
    let sign = match offset[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let two = |a: u8, b: u8| {
        (a.is_ascii_digit() && b.is_ascii_digit()).then(|| i64::from(a - b'0') * 10 + i64::from(b - b'0'))
    };
    let (hours, minutes) = (two(offset[1], offset[2])?, two(offset[4], offset[5])?);
    (offset[3] == b':' && hours < 24 && minutes < 60 && local.len() >= 19)
        .then_some((local, sign * (hours * 60 + minutes) * 60_000))
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.as_system_time()))
    }
}

/// RFC 3339 text in human-readable formats (the API's JSON); milliseconds since the epoch in compact ones (the
/// store's binary records), where the text would take three times the bytes and a parse per read.
impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Timestamp, D::Error> {
        if deserializer.is_human_readable() {
            super::parse_str(deserializer, "an RFC 3339 timestamp", Timestamp::parse_rfc3339)
        } else {
            let unix_ms = u64::deserialize(deserializer)?;
            if unix_ms > Timestamp::MAX.0 {
                return Err(serde::de::Error::custom(format!("timestamp {unix_ms} ms is after 9999-12-31")));
            }
            Ok(Timestamp(unix_ms))
        }
    }
}

impl TryFrom<String> for Timestamp {
    type Error = TimeError;

    fn try_from(input: String) -> Result<Timestamp, TimeError> {
        Timestamp::parse_rfc3339(&input)
    }
}

impl From<Timestamp> for String {
    fn from(timestamp: Timestamp) -> String {
        timestamp.to_rfc3339()
    }
}

/// Parses a human duration from settings (`500ms`, `5s`, `30m`, `2h`, `1h 30m`) into
/// milliseconds.
pub fn parse_duration_ms(input: &str) -> Result<u64, TimeError> {
    let duration = humantime::parse_duration(input)
        .map_err(|e| TimeError::InvalidDuration { input: input.to_string(), reason: e.to_string() })?;
    u64::try_from(duration.as_millis()).map_err(|_| TimeError::DurationTooLong(input.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_after_2024() {
        let now = Timestamp::now();
        assert!(now.unix_ms() > 1_704_067_200_000);
        assert!(now <= Timestamp::MAX);
    }

    #[test]
    fn from_unix_ms_keeps_and_clamps() {
        let t = Timestamp::from_unix_ms(1_234_567);
        assert_eq!(t.unix_ms(), 1_234_567);
        assert_eq!(t.unix_s(), 1_234);
        assert_eq!(Timestamp::from_unix_ms(u64::MAX), Timestamp::MAX);
        assert_eq!(Timestamp::from_unix_ms(0), Timestamp::EPOCH);
    }

    #[test]
    fn plus_ms_saturates() {
        let t = Timestamp::from_unix_ms(1_000);
        assert_eq!(t.plus_ms(500).unix_ms(), 1_500);
        assert_eq!(t.plus_ms(u64::MAX), Timestamp::MAX);
        assert_eq!(Timestamp::MAX.plus_ms(1), Timestamp::MAX);
        assert_eq!(t.plus_ms(500).ms_since(t), 500);
        assert_eq!(t.ms_since(t.plus_ms(500)), 0);
    }

    #[test]
    fn formats_rfc3339_with_millis_and_z() {
        assert_eq!(Timestamp::EPOCH.to_rfc3339(), "1970-01-01T00:00:00.000Z");
        let t = Timestamp::from_unix_ms(1_795_310_624_123);
        assert_eq!(t.to_rfc3339(), "2026-11-22T01:23:44.123Z");
        assert_eq!(t.to_string(), t.to_rfc3339());
        assert_eq!(Timestamp::MAX.to_rfc3339(), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_utc_with_or_without_fraction() {
        let parse = |s| Timestamp::parse_rfc3339(s).unwrap().unix_ms();
        assert_eq!(parse("2026-11-22T01:23:44.123Z"), 1_795_310_624_123);
        assert_eq!(parse("2026-11-22T01:23:44Z"), 1_795_310_624_000);
        assert_eq!(parse("2026-11-22T01:23:44.1Z"), 1_795_310_624_100);
        assert_eq!(parse("2026-11-22T01:23:44.123999999Z"), 1_795_310_624_123);
        assert_eq!(parse("1970-01-01T00:00:00Z"), 0);
        assert_eq!(parse("9999-12-31T23:59:59.999999Z"), Timestamp::MAX.unix_ms());
    }

    #[test]
    fn offsets_give_the_same_instant_in_utc() {
        let parse = |s| Timestamp::parse_rfc3339(s).unwrap().unix_ms();
        let utc = parse("2026-11-22T01:23:44.123Z");
        assert_eq!(parse("2026-11-22T01:23:44.123+00:00"), utc);
        assert_eq!(parse("2026-11-22T01:23:44.123-00:00"), utc);
        assert_eq!(parse("2026-11-22T02:23:44.123+01:00"), utc);
        assert_eq!(parse("2026-11-21T20:23:44.123-05:00"), utc);
        assert_eq!(parse("2026-11-22T06:53:44.123+05:30"), utc);
        assert_eq!(parse("2026-11-22t01:23:44.123z"), utc, "RFC 3339 allows t and z");
        assert_eq!(parse("1970-01-01T01:00:00+01:00"), 0);
        assert!(Timestamp::parse_rfc3339("1970-01-01T00:59:59+01:00").is_err(), "before 1970");
        assert!(Timestamp::parse_rfc3339("9999-12-31T23:59:59-01:00").is_err(), "past the last instant");
    }

    #[test]
    fn refuses_no_zone_bad_offsets_and_garbage() {
        for no_zone in ["2026-11-22T01:23:44", "2026-11-22T01:23:44.123"] {
            assert_eq!(Timestamp::parse_rfc3339(no_zone), Err(TimeError::NoZone(no_zone.to_string())), "{no_zone}");
        }
        for bad_offset in [
            "2026-11-22T01:23:44+24:00",
            "2026-11-22T01:23:44+01:60",
            "2026-11-22T01:23:44+0100",
            "2026-11-22T01:23:44+1:00",
        ] {
            assert!(Timestamp::parse_rfc3339(bad_offset).is_err(), "{bad_offset}");
        }
        for garbage in [
            "",
            "Z",
            "yesterday",
            "2026-11-22",
            "2026-11-22 01:23:44Z",
            "2026-13-22T01:23:44Z",
            "2026-02-30T01:23:44Z",
            "2026-11-22T25:23:44Z",
            "1969-12-31T23:59:59Z",
            "2026-11-22T01:23:44.Z",
            "2026-11-22T01:23:44.12aZ",
            "2026-11-22T01:23:44ZZ",
            "10000-01-01T00:00:00Z",
            "2026-11-22T01:23:4éZ",
            "2026-11-22T01:23:44.123ZZ",
            "2026-11-22T01:23:44Z.123Z",
        ] {
            assert!(
                matches!(Timestamp::parse_rfc3339(garbage), Err(TimeError::InvalidTimestamp { .. })),
                "{garbage}: {:?}",
                Timestamp::parse_rfc3339(garbage)
            );
        }
    }

    #[test]
    fn serde_round_trips_through_rfc3339() {
        let t = Timestamp::from_unix_ms(1_795_310_624_123);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2026-11-22T01:23:44.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
        // Text with an escape is read like any other once unescaped.
        assert_eq!(serde_json::from_str::<Timestamp>("\"2026-11-22T01:23:44.123\\u005a\"").unwrap(), t);
        let refused = serde_json::from_str::<Timestamp>("1795310624123").unwrap_err().to_string();
        assert!(refused.starts_with("invalid type: integer `1795310624123`, expected an RFC 3339"), "{refused}");
        assert_eq!(serde_json::from_str::<Timestamp>("\"2026-11-22T03:23:44.123+02:00\"").unwrap(), t);
        let refused = serde_json::from_str::<Timestamp>("\"2026-11-22T01:23:44\"").unwrap_err().to_string();
        assert!(refused.starts_with("timestamp `2026-11-22T01:23:44` must end with `Z` or an offset"), "{refused}");
    }

    #[test]
    fn parse_duration_ms_reads_settings() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("5s"), Ok(5_000));
        assert_eq!(parse_duration_ms("30m"), Ok(1_800_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("1h 30m"), Ok(5_400_000));
    }

    #[test]
    fn parse_duration_ms_refuses_garbage() {
        for bad in ["", "5", "five seconds", "-5s", "5 parsecs"] {
            assert!(matches!(parse_duration_ms(bad), Err(TimeError::InvalidDuration { .. })), "{bad}");
        }
    }
}
