//! Durations and rates as docs/SPEC.md writes them (`1500ms`, `60s`, `2/s`, `10/1500ms`).
//!
//! Everything is an integer number of nanoseconds. A rate is kept as the
//! reduced fraction `n / p` (tokens per nanosecond), so that a balance counted
//! in units of `1/p` token is always a whole number and no decision needs a
//! floating-point value.

use std::fmt;

use thiserror::Error;

/// A point in time or a duration, in nanoseconds.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

const UNITS: [(&str, Nanos); 7] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("d", 86_400 * NANOS_PER_SEC),
];

/// Why a duration, rate or count could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UnitError {
    /// The text is empty.
    #[error("it is empty")]
    Empty,
    /// A duration without a unit.
    #[error("a duration needs a unit (ns, us, ms, s, m, h, d), for example 60s or 1500ms")]
    MissingUnit,
    /// A unit weir does not know.
    #[error("`{0}` is not a unit (valid units: ns, us, ms, s, m, h, d)")]
    UnknownUnit(String),
    /// The number part is not a positive integer.
    #[error("`{0}` is not a positive whole number")]
    NotPositive(String),
    /// The value does not fit in 64-bit nanoseconds.
    #[error("it is too large (at most {max} nanoseconds)")]
    TooLarge {
        /// The largest value allowed.
        max: u64,
    },
    /// A rate without the `/`.
    #[error("a rate is written N/DURATION or N/UNIT, for example 2/s, 120/m or 10/1500ms")]
    NotARate,
}

/// Reads a positive integer (`1`, `120`); zero, signs, fractions and
/// exponents are refused.
pub fn parse_count(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UnitError::Empty);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UnitError::NotPositive(text.to_owned()));
    }
    match text.parse::<u64>() {
        Ok(0) => Err(UnitError::NotPositive(text.to_owned())),
        Ok(n) => Ok(n),
        Err(_) => Err(UnitError::TooLarge { max: u64::MAX }),
    }
}

/// Reads a positive duration: an integer and a unit (`60s`, `1500ms`, `1m`).
pub fn parse_duration(text: &str) -> Result<Nanos, UnitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UnitError::Empty);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(UnitError::NotPositive(text.to_owned()));
    }
    if unit.is_empty() {
        return Err(UnitError::MissingUnit);
    }
    let scale = unit_nanos(unit)?;
    parse_count(number)?
        .checked_mul(scale)
        .ok_or(UnitError::TooLarge { max: u64::MAX })
}

fn unit_nanos(unit: &str) -> Result<Nanos, UnitError> {
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, scale)| scale)
        .ok_or_else(|| UnitError::UnknownUnit(unit.to_owned()))
}

/// `N` tokens (or slots) every `P` nanoseconds, stored reduced to lowest
/// terms: `per_ns()` tokens per nanosecond is exactly `tokens / period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    tokens: u64,
    period: Nanos,
    written_tokens: u64,
    written_period: Nanos,
}

impl Rate {
    /// `tokens` per `period` nanoseconds; `None` if either is zero.
    pub fn new(tokens: u64, period: Nanos) -> Option<Self> {
        if tokens == 0 || period == 0 {
            return None;
        }
        let g = gcd(tokens, period);
        Some(Self {
            tokens: tokens / g,
            period: period / g,
            written_tokens: tokens,
            written_period: period,
        })
    }

    /// `tokens` per second.
    pub fn per_second(tokens: u64) -> Option<Self> {
        Self::new(tokens, NANOS_PER_SEC)
    }

    /// Reads `N/DURATION` or `N/UNIT` (`2/s`, `120/m`, `10/1500ms`).
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(UnitError::Empty);
        }
        let (tokens, per) = text.split_once('/').ok_or(UnitError::NotARate)?;
        let tokens = parse_count(tokens)?;
        let per = per.trim();
        let period = if per.starts_with(|c: char| c.is_ascii_digit()) {
            parse_duration(per)?
        } else {
            unit_nanos(per)?
        };
        Self::new(tokens, period).ok_or(UnitError::NotARate)
    }

    /// Numerator of the reduced rate: tokens gained every [`Rate::period`].
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Denominator of the reduced rate, in nanoseconds. One token is worth
    /// `period()` units of the scaled balances the algorithms keep.
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The rate as written: (N, P in nanoseconds), not reduced.
    pub fn as_written(&self) -> (u64, Nanos) {
        (self.written_tokens, self.written_period)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match UNITS
            .iter()
            .find(|(_, scale)| *scale == self.written_period)
        {
            Some((unit, _)) => write!(f, "{}/{unit}", self.written_tokens),
            None => write!(
                f,
                "{}/{}",
                self.written_tokens,
                DisplayDuration(self.written_period)
            ),
        }
    }
}

/// Writes a duration in the largest unit that divides it (`60000ms` → `1m`).
#[derive(Debug, Clone, Copy)]
pub struct DisplayDuration(pub Nanos);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, scale) = UNITS
            .iter()
            .rev()
            .find(|(_, scale)| self.0 % scale == 0)
            .copied()
            .unwrap_or(("ns", 1));
        write!(f, "{}{}", self.0 / scale, name)
    }
}

/// Writes nanoseconds as seconds with exactly nine decimals (`0.500000000`).
#[derive(Debug, Clone, Copy)]
pub struct Seconds(pub Nanos);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}",
            self.0 / NANOS_PER_SEC,
            self.0 % NANOS_PER_SEC
        )
    }
}

/// Reads seconds written as a decimal with at most nine fractional digits
/// (`0`, `59.9`, `1.000000001`) into nanoseconds, exactly.
pub fn parse_seconds(text: &str) -> Result<Nanos, SecondsError> {
    let text = text.trim();
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || (text.ends_with('.')) {
        return Err(SecondsError::NotADecimal);
    }
    if frac.len() > 9 {
        return Err(SecondsError::TooPrecise);
    }
    let whole: u64 = whole.parse().map_err(|_| SecondsError::TooLarge)?;
    let mut fraction: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| SecondsError::NotADecimal)?
    };
    for _ in frac.len()..9 {
        fraction *= 10;
    }
    whole
        .checked_mul(NANOS_PER_SEC)
        .and_then(|n| n.checked_add(fraction))
        .ok_or(SecondsError::TooLarge)
}

/// Why a time in seconds could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SecondsError {
    /// Not digits with an optional `.` and digits.
    #[error("expected seconds as a non-negative decimal such as 0, 12 or 59.9")]
    NotADecimal,
    /// More than nine digits after the point.
    #[error("at most 9 digits may follow the decimal point (nanoseconds)")]
    TooPrecise,
    /// Beyond what 64-bit nanoseconds hold.
    #[error("too large (at most 18446744073.709551615 seconds)")]
    TooLarge,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(60 * NANOS_PER_SEC));
        assert_eq!(parse_duration("1500ms"), Ok(1_500_000_000));
        assert_eq!(parse_duration("1m"), Ok(60 * NANOS_PER_SEC));
        assert_eq!(parse_duration("7ns"), Ok(7));
        assert_eq!(parse_duration("2d"), Ok(172_800 * NANOS_PER_SEC));
        assert!(matches!(
            parse_duration("0s"),
            Err(UnitError::NotPositive(_))
        ));
        assert!(matches!(
            parse_duration("-1s"),
            Err(UnitError::NotPositive(_))
        ));
        assert_eq!(parse_duration("60"), Err(UnitError::MissingUnit));
        assert!(matches!(
            parse_duration("60x"),
            Err(UnitError::UnknownUnit(_))
        ));
        assert!(matches!(
            parse_duration("s"),
            Err(UnitError::NotPositive(_))
        ));
        assert!(matches!(
            parse_duration("1.5s"),
            Err(UnitError::UnknownUnit(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999d"),
            Err(UnitError::TooLarge { .. })
        ));
        assert_eq!(parse_duration(""), Err(UnitError::Empty));
    }

    #[test]
    fn rates_are_reduced() {
        let r = Rate::parse("2/s").unwrap();
        assert_eq!((r.tokens(), r.period()), (1, 500_000_000));
        let r = Rate::parse("120/m").unwrap();
        assert_eq!((r.tokens(), r.period()), (1, 500_000_000));
        let r = Rate::parse("10/1500ms").unwrap();
        assert_eq!((r.tokens(), r.period()), (1, 150_000_000));
        let r = Rate::parse("3/s").unwrap();
        assert_eq!((r.tokens(), r.period()), (3, NANOS_PER_SEC));
        assert_eq!(r.to_string(), "3/s");
        assert_eq!(Rate::parse("120/60s").unwrap().to_string(), "120/m");
        assert_eq!(Rate::parse("7/1500ms").unwrap().to_string(), "7/1500ms");
        assert_eq!(Rate::parse("2"), Err(UnitError::NotARate));
        assert!(Rate::parse("0/s").is_err());
        assert!(Rate::parse("2/0s").is_err());
        assert!(Rate::parse("2/fortnight").is_err());
        assert!(Rate::parse("-2/s").is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0"), Ok(0));
        assert_eq!(parse_seconds("59.9"), Ok(59_900_000_000));
        assert_eq!(parse_seconds("1.000000001"), Ok(1_000_000_001));
        assert_eq!(parse_seconds("1.0000000001"), Err(SecondsError::TooPrecise));
        assert_eq!(parse_seconds("-1"), Err(SecondsError::NotADecimal));
        assert_eq!(parse_seconds("1e3"), Err(SecondsError::NotADecimal));
        assert_eq!(parse_seconds(".5"), Err(SecondsError::NotADecimal));
        assert_eq!(parse_seconds("5."), Err(SecondsError::NotADecimal));
        assert_eq!(parse_seconds(""), Err(SecondsError::NotADecimal));
        assert_eq!(parse_seconds("18446744074"), Err(SecondsError::TooLarge));
        assert_eq!(Seconds(500_000_000).to_string(), "0.500000000");
        assert_eq!(Seconds(59_900_000_000).to_string(), "59.900000000");
        assert_eq!(DisplayDuration(60_000_000_000).to_string(), "1m");
        assert_eq!(DisplayDuration(1_500_000_000).to_string(), "1500ms");
    }
}
