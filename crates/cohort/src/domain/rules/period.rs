//! Retention durations: parsing (`"30d"`, `"7y"`, `"18mo"`, `"1d12h"`),
//! limits, display, and the one place a duration is subtracted from a time.
//!
//! Years and months are calendar units, as a person means them and as
//! PostgreSQL's interval arithmetic computes them: `7y` before
//! 2031-03-01 is 2024-03-01, never a fixed count of days. Days, hours,
//! minutes and seconds are fixed lengths (Cohort computes every cutoff in
//! UTC, where a day is always 86 400 seconds).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Months, TimeDelta, Utc};

/// The longest duration Cohort accepts: 1000 years of 365 days (a calendar
/// month counting as a twelfth of such a year for this limit). Anything
/// longer is almost certainly a typo, and keeps cutoff arithmetic far from
/// overflow.
pub const MAX_PERIOD_SECONDS: i64 = 1000 * 365 * 86_400;

/// The length a calendar month counts for in [`MAX_PERIOD_SECONDS`] and in
/// [`Period::as_seconds`]: a twelfth of a 365-day year.
const MONTH_FOR_LIMIT_SECONDS: i64 = 365 * 86_400 / 12;

/// A non-negative retention duration: whole calendar months plus whole
/// seconds, at most [`MAX_PERIOD_SECONDS`] long.
///
/// Two periods are equal when they are written in the same calendar and
/// fixed parts (`1y` equals `12mo`; `1y` does not equal `365d`). Periods
/// with calendar units have no fixed length, so they are compared through
/// the cutoffs they give at one time ([`Period::before`]), never by size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Period {
    months: i32,
    seconds: i64,
}

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeriodError {
    /// Negative durations make no sense for retention.
    #[error("a retention duration cannot be negative")]
    Negative,
    /// Longer than [`MAX_PERIOD_SECONDS`].
    #[error("a retention duration cannot exceed 1000 years")]
    TooLong,
    /// The text is not `<number><unit>` pieces with the accepted units.
    #[error("invalid duration {0:?}: expected pieces like \"7y\", \"18mo\", \"30d\", \"1d12h30m\", each unit once and in this order: y (calendar years), mo (calendar months), d (days), h (hours), m (minutes), s (seconds)")]
    Syntax(String),
    /// A setting that measures elapsed time (a timeout, an interval) was
    /// given calendar years or months, which have no fixed length.
    #[error("{0:?} uses calendar years or months, which have no fixed length; write this duration in d, h, m or s")]
    Calendar(String),
}

impl Period {
    /// Zero: rows are eligible as soon as they exist.
    pub const ZERO: Period = Period {
        months: 0,
        seconds: 0,
    };

    fn checked(months: i64, seconds: i64) -> Result<Self, PeriodError> {
        if months < 0 || seconds < 0 {
            return Err(PeriodError::Negative);
        }
        let length = months
            .checked_mul(MONTH_FOR_LIMIT_SECONDS)
            .and_then(|m| m.checked_add(seconds))
            .ok_or(PeriodError::TooLong)?;
        if length > MAX_PERIOD_SECONDS {
            return Err(PeriodError::TooLong);
        }
        Ok(Period {
            months: months as i32,
            seconds,
        })
    }

    /// As a wait between batches (`max_replica_lag`): a fixed period of
    /// at least a second. A calendar month has no fixed length, and zero
    /// would wait after every batch for every standby to replay it.
    pub(crate) fn as_replica_lag(self) -> Result<std::time::Duration, &'static str> {
        if self.months != 0 {
            return Err("a fixed period (s, m, h, d), not calendar months or years");
        }
        if self.seconds < 1 {
            return Err("at least 1s (leave it out to not wait for standbys)");
        }
        Ok(std::time::Duration::from_secs(self.seconds as u64))
    }

    /// A duration of whole seconds.
    pub fn from_seconds(seconds: i64) -> Result<Self, PeriodError> {
        Self::checked(0, seconds)
    }

    /// A duration of whole days (fixed 86 400-second days).
    pub fn from_days(days: i64) -> Result<Self, PeriodError> {
        Self::from_seconds(days.checked_mul(86_400).ok_or(PeriodError::TooLong)?)
    }

    /// A duration of whole calendar months.
    pub fn from_months(months: i64) -> Result<Self, PeriodError> {
        Self::checked(months, 0)
    }

    /// A duration of whole calendar years.
    pub fn from_years(years: i64) -> Result<Self, PeriodError> {
        Self::from_months(years.checked_mul(12).ok_or(PeriodError::TooLong)?)
    }

    /// Calendar months plus fixed seconds, as PostgreSQL's interval holds
    /// them (its days are folded into seconds: Cohort works in UTC).
    pub fn from_parts(months: i64, seconds: i64) -> Result<Self, PeriodError> {
        Self::checked(months, seconds)
    }

    /// The calendar part, in months (a year is 12).
    pub fn months(self) -> i32 {
        self.months
    }

    /// The fixed part, in seconds.
    pub fn fixed_seconds(self) -> i64 {
        self.seconds
    }

    /// Whether the period has calendar years or months.
    pub fn is_calendar(self) -> bool {
        self.months != 0
    }

    /// Whether the period is zero.
    pub fn is_zero(self) -> bool {
        self.months == 0 && self.seconds == 0
    }

    /// The duration in seconds, for settings that measure elapsed time
    /// (timeouts, intervals; these refuse calendar units when loaded, see
    /// [`Period::require_fixed`]). A calendar month counts as a twelfth of
    /// a 365-day year here; cutoffs never use this: see [`Period::before`].
    pub fn as_seconds(self) -> i64 {
        i64::from(self.months) * MONTH_FOR_LIMIT_SECONDS + self.seconds
    }

    /// The duration as a chrono delta (the same length as [`Period::as_seconds`]).
    pub fn as_time_delta(self) -> TimeDelta {
        TimeDelta::seconds(self.as_seconds())
    }

    /// Refuses calendar units, for settings that measure elapsed time.
    pub fn require_fixed(self) -> Result<Self, PeriodError> {
        if self.is_calendar() {
            Err(PeriodError::Calendar(self.to_string()))
        } else {
            Ok(self)
        }
    }

    /// `time - self`, the way PostgreSQL computes `timestamptz - interval`
    /// in a UTC session: the calendar months first (a day past the end of
    /// the target month becomes its last day, so 2024-03-31 minus `1mo` is
    /// 2024-02-29), then the fixed seconds. `None` when outside chrono's
    /// range.
    pub fn before(self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let months = u32::try_from(self.months).ok()?;
        time.checked_sub_months(Months::new(months))?
            .checked_sub_signed(TimeDelta::seconds(self.seconds))
    }
}

impl Period {
    /// `time + self`, the mirror of [`Period::before`]: the calendar
    /// months first, then the fixed seconds. `None` when outside chrono's
    /// range.
    ///
    /// ```
    /// use cohort::rules::Period;
    /// let at = chrono::DateTime::parse_from_rfc3339("2026-04-01T00:00:00Z").unwrap().to_utc();
    /// let later = "35d".parse::<Period>().unwrap().after(at).unwrap();
    /// assert_eq!(later.to_rfc3339(), "2026-05-06T00:00:00+00:00");
    /// ```
    pub fn after(self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let months = u32::try_from(self.months).ok()?;
        time.checked_add_months(Months::new(months))?
            .checked_add_signed(TimeDelta::seconds(self.seconds))
    }
}

impl FromStr for Period {
    type Err = PeriodError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.starts_with('-') {
            return Err(PeriodError::Negative);
        }
        let syntax = || PeriodError::Syntax(text.to_owned());
        if trimmed.is_empty() {
            return Err(syntax());
        }
        // (unit, index in the required order, months, seconds)
        const UNITS: [(&str, usize, i64, i64); 6] = [
            ("y", 0, 12, 0),
            ("mo", 1, 1, 0),
            ("d", 2, 0, 86_400),
            ("h", 3, 0, 3_600),
            ("m", 4, 0, 60),
            ("s", 5, 0, 1),
        ];
        let mut months: i64 = 0;
        let mut seconds: i64 = 0;
        let mut last: Option<usize> = None;
        let mut rest = trimmed;
        while !rest.is_empty() {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                return Err(syntax());
            }
            let n: i64 = rest[..digits].parse().map_err(|_| PeriodError::TooLong)?;
            rest = &rest[digits..];
            let letters = rest.len()
                - rest
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .len();
            let unit = &rest[..letters];
            rest = &rest[letters..];
            let Some(&(_, index, per_months, per_seconds)) =
                UNITS.iter().find(|(name, ..)| *name == unit)
            else {
                return Err(syntax());
            };
            // Units must appear once each and in y, mo, d, h, m, s order.
            if last.is_some_and(|l| l >= index) {
                return Err(syntax());
            }
            last = Some(index);
            months = n
                .checked_mul(per_months)
                .and_then(|v| months.checked_add(v))
                .ok_or(PeriodError::TooLong)?;
            seconds = n
                .checked_mul(per_seconds)
                .and_then(|v| seconds.checked_add(v))
                .ok_or(PeriodError::TooLong)?;
        }
        Period::checked(months, seconds)
    }
}

impl fmt::Display for Period {
    /// The units it was written in: calendar years and months stay years
    /// and months (`7y`, `1y6mo`), the fixed part its shortest `d h m s`
    /// form (`1d12h`); zero displays as `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0s");
        }
        let (years, months) = (self.months / 12, self.months % 12);
        if years > 0 {
            write!(f, "{years}y")?;
        }
        if months > 0 {
            write!(f, "{months}mo")?;
        }
        let mut rest = self.seconds;
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            let n = rest / size;
            rest %= size;
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

impl serde::Serialize for Period {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Period {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn years_are_twelve_months_and_deltas_match_seconds() {
        assert_eq!(
            Period::from_years(2).unwrap(),
            Period::from_months(24).unwrap()
        );
        assert!(Period::from_years(i64::MAX).is_err());
        let p = Period::from_parts(1, 3_600).unwrap();
        assert_eq!(p.as_time_delta(), TimeDelta::seconds(p.as_seconds()));
    }

    #[test]
    fn parsing_table() {
        let ok = [
            ("0d", 0),
            ("0s", 0),
            ("30d", 30 * 86_400),
            ("12h", 12 * 3_600),
            ("1d12h", 86_400 + 12 * 3_600),
            ("1d12h30m15s", 86_400 + 12 * 3_600 + 30 * 60 + 15),
            ("90m", 5_400),
            (" 7d ", 7 * 86_400),
            ("365000d", MAX_PERIOD_SECONDS),
        ];
        for (text, seconds) in ok {
            assert_eq!(
                text.parse::<Period>().unwrap().as_seconds(),
                seconds,
                "{text}"
            );
        }
        let bad = [
            ("", PeriodError::Syntax(String::new())),
            ("-5d", PeriodError::Negative),
            ("30", PeriodError::Syntax("30".into())),
            ("d", PeriodError::Syntax("d".into())),
            ("5w", PeriodError::Syntax("5w".into())),
            ("1h1d", PeriodError::Syntax("1h1d".into())),
            ("1d1d", PeriodError::Syntax("1d1d".into())),
            ("1.5d", PeriodError::Syntax("1.5d".into())),
            ("365001d", PeriodError::TooLong),
            ("99999999999999999999d", PeriodError::TooLong),
        ];
        for (text, err) in bad {
            assert_eq!(text.parse::<Period>().unwrap_err(), err, "{text:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["0s", "30d", "1d12h", "1d12h30m15s", "45m", "7s"] {
            let p: Period = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        assert_eq!("90m".parse::<Period>().unwrap().to_string(), "1h30m");
    }

    #[test]
    fn constructors_reject_out_of_range() {
        assert_eq!(Period::from_seconds(-1), Err(PeriodError::Negative));
        assert_eq!(Period::from_days(i64::MAX), Err(PeriodError::TooLong));
        assert_eq!(Period::from_days(2).unwrap().as_seconds(), 172_800);
    }

    #[test]
    fn years_and_months_are_calendar_units() {
        let p = |s: &str| s.parse::<Period>().unwrap();
        assert_eq!(p("6y"), Period::from_months(72).unwrap());
        assert_ne!(p("6y"), Period::from_days(2190).unwrap());
        assert_eq!(p("1y"), p("12mo"));
        assert_eq!(p("18mo").to_string(), "1y6mo");
        assert_eq!(p("7y").to_string(), "7y");
        assert_eq!(p("1y1d").to_string(), "1y1d");
        assert_eq!(p("2y3mo4d5h6m7s").to_string(), "2y3mo4d5h6m7s");
        assert!("1d1y".parse::<Period>().is_err(), "units in order");
        assert!("1m1mo".parse::<Period>().is_err(), "minutes after months");
        assert!("1mo1y".parse::<Period>().is_err(), "units in order");
        assert!("1001y".parse::<Period>().is_err(), "over 1000 years");
        assert!("1000y".parse::<Period>().is_ok());
        assert!("1000y1s".parse::<Period>().is_err());
        assert!("12001mo".parse::<Period>().is_err());
        assert!("5M".parse::<Period>().is_err(), "units are lower case");
        assert!("5mon".parse::<Period>().is_err());
        let err = "5w".parse::<Period>().unwrap_err().to_string();
        for unit in ["y (", "mo (", "d (", "h (", "m (", "s ("] {
            assert!(err.contains(unit), "{err} lists {unit}");
        }
        assert_eq!(
            p("1mo").require_fixed(),
            Err(PeriodError::Calendar("1mo".into()))
        );
        assert_eq!(p("30d").require_fixed(), Ok(p("30d")));
    }

    #[test]
    fn subtraction_follows_postgres_interval_arithmetic() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        let p = |s: &str| s.parse::<Period>().unwrap();
        // (time, period, time - period as PostgreSQL gives it in UTC)
        let cases = [
            ("2031-03-01T00:00:00Z", "7y", "2024-03-01T00:00:00Z"),
            ("2031-02-28T12:00:00Z", "7y", "2024-02-28T12:00:00Z"),
            ("2024-02-29T00:00:00Z", "1y", "2023-02-28T00:00:00Z"),
            ("2024-03-31T10:00:00Z", "1mo", "2024-02-29T10:00:00Z"),
            ("2023-03-31T10:00:00Z", "1mo", "2023-02-28T10:00:00Z"),
            ("2024-05-31T00:00:00Z", "18mo", "2022-11-30T00:00:00Z"),
            ("2024-03-01T00:00:00Z", "1mo1d", "2024-01-31T00:00:00Z"),
            ("2024-03-01T00:00:00Z", "30d", "2024-01-31T00:00:00Z"),
        ];
        for (time, period, want) in cases {
            assert_eq!(
                p(period).before(at(time)),
                Some(at(want)),
                "{time} - {period}"
            );
        }
        // 7 calendar years always reach at least as far back as 2555 days.
        let now = at("2031-03-01T00:00:00Z");
        assert!(p("7y").before(now).unwrap() < p("2555d").before(now).unwrap());
    }
}
