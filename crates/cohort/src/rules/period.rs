//! Retention durations: parsing (`"30d"`, `"1d12h"`), limits and display.

use std::fmt;
use std::str::FromStr;

use chrono::TimeDelta;

/// The longest duration Cohort accepts: 1000 years of 365 days. Anything
/// longer is almost certainly a typo, and keeps cutoff arithmetic far from
/// overflow.
pub const MAX_PERIOD_SECONDS: i64 = 1000 * 365 * 86_400;

/// A non-negative retention duration, whole seconds, at most
/// [`MAX_PERIOD_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Period(i64);

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
    /// The text is not `<number><unit>` pieces with units d, h, m, s.
    #[error("invalid duration {0:?}: expected pieces like \"30d\", \"12h\", \"1d12h30m\" (units d, h, m, s)")]
    Syntax(String),
}

impl Period {
    /// Zero: rows are eligible as soon as they exist.
    pub const ZERO: Period = Period(0);

    /// A duration of whole seconds.
    pub fn from_seconds(seconds: i64) -> Result<Self, PeriodError> {
        if seconds < 0 {
            Err(PeriodError::Negative)
        } else if seconds > MAX_PERIOD_SECONDS {
            Err(PeriodError::TooLong)
        } else {
            Ok(Period(seconds))
        }
    }

    /// A duration of whole days.
    pub fn from_days(days: i64) -> Result<Self, PeriodError> {
        Self::from_seconds(days.checked_mul(86_400).ok_or(PeriodError::TooLong)?)
    }

    /// The duration in seconds.
    pub fn as_seconds(self) -> i64 {
        self.0
    }

    /// The duration as a chrono delta.
    pub fn as_time_delta(self) -> TimeDelta {
        TimeDelta::seconds(self.0)
    }
}

impl FromStr for Period {
    type Err = PeriodError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.starts_with('-') {
            return Err(PeriodError::Negative);
        }
        if trimmed.is_empty() {
            return Err(PeriodError::Syntax(text.to_owned()));
        }
        let mut total: i64 = 0;
        let mut digits = String::new();
        let mut seen_unit = [false; 5];
        for ch in trimmed.chars() {
            if ch.is_ascii_digit() {
                digits.push(ch);
                continue;
            }
            // A year is 365 days: a fixed length, like every Cohort period
            // (no calendar arithmetic, so `6y` is exactly `2190d`).
            let (index, unit) = match ch {
                'y' => (0, 365 * 86_400),
                'd' => (1, 86_400),
                'h' => (2, 3_600),
                'm' => (3, 60),
                's' => (4, 1),
                _ => return Err(PeriodError::Syntax(text.to_owned())),
            };
            // Units must appear once each and in y, d, h, m, s order.
            if digits.is_empty() || seen_unit[index..].iter().any(|s| *s) {
                return Err(PeriodError::Syntax(text.to_owned()));
            }
            seen_unit[index] = true;
            let n: i64 = digits.parse().map_err(|_| PeriodError::TooLong)?;
            digits.clear();
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or(PeriodError::TooLong)?;
        }
        if !digits.is_empty() {
            return Err(PeriodError::Syntax(text.to_owned()));
        }
        Period::from_seconds(total)
    }
}

impl fmt::Display for Period {
    /// Shortest `1d12h`-style form; zero displays as `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0s");
        }
        let mut rest = self.0;
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
    fn years_are_365_days() {
        assert_eq!(
            "6y".parse::<Period>().unwrap(),
            Period::from_days(2190).unwrap()
        );
        assert_eq!("1y1d".parse::<Period>().unwrap().to_string(), "366d");
        assert!("1d1y".parse::<Period>().is_err(), "units in order");
        assert!("1001y".parse::<Period>().is_err(), "over 1000 years");
    }
}
