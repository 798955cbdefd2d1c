//! Calendar windows (docs/SPEC.md, "Calendar windows"): the fixed window
//! whose windows are the days, weeks (from Monday), months (from an anchor
//! day, clamped to a month's last day) or years of an IANA time zone,
//! daylight-saving days included.
//!
//! The zone's rules come from the time-zone database bundled with `jiff`
//! (no file is read: the same rules wherever weir runs). A local midnight
//! that does not exist (it falls in a gap) is the instant the clocks jump;
//! one that exists twice is its first occurrence.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use jiff::civil::{Date, DateTime, Weekday};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use crate::Nanos;

/// The calendar period a window spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// Local midnight to the next.
    Day,
    /// Monday's local midnight to the next Monday's.
    Week,
    /// The anchor day's local midnight to the next month's.
    Month,
    /// January 1st's local midnight to the next one's.
    Year,
}

impl Period {
    /// Every period, by its name in configs and flags.
    pub const ALL: [(&'static str, Self); 4] = [
        ("day", Self::Day),
        ("week", Self::Week),
        ("month", Self::Month),
        ("year", Self::Year),
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }
}

/// A time zone, by its IANA name, made once per name and kept for the
/// process's life (at most the database's few hundred names).
#[derive(Debug)]
pub struct Zone {
    name: String,
    tz: TimeZone,
}

/// Why a calendar cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalendarError {
    /// Not `day`, `week`, `month` or `year`.
    Period(String),
    /// No zone of that name; the nearest names.
    Zone(String, Vec<String>),
    /// An anchor outside 1..=31, or one for another period than a month.
    Anchor(String),
}

impl fmt::Display for CalendarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Period(p) => write!(
                f,
                "`{p}` is not a calendar period (valid: day, week, month, year)"
            ),
            Self::Zone(z, near) if near.is_empty() => write!(
                f,
                "no time zone `{z}` (an IANA name such as \"Europe/Paris\" or \"UTC\")"
            ),
            Self::Zone(z, near) => write!(
                f,
                "no time zone `{z}` (did you mean {}?)",
                near.iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Self::Anchor(why) => f.write_str(why),
        }
    }
}

impl Zone {
    /// The zone called `name` (as the database spells it, case aside).
    pub fn get(name: &str) -> Result<&'static Zone, CalendarError> {
        static ZONES: OnceLock<Mutex<HashMap<String, &'static Zone>>> = OnceLock::new();
        let zones = ZONES.get_or_init(Mutex::default);
        let mut zones = zones.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(zone) = zones.get(name) {
            return Ok(zone);
        }
        let tz =
            TimeZone::get(name).map_err(|_| CalendarError::Zone(name.to_owned(), nearest(name)))?;
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        let zone: &'static Zone = Box::leak(Box::new(Zone {
            name: canonical,
            tz,
        }));
        zones.insert(name.to_owned(), zone);
        Ok(zone)
    }

    /// Its IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The database's names nearest to `name` (by edit distance, case aside).
fn nearest(name: &str) -> Vec<String> {
    let wanted = name.to_ascii_lowercase();
    let mut scored: Vec<(usize, String)> = jiff::tz::db()
        .available()
        .map(|n| {
            let n = n.as_str().to_owned();
            (distance(&wanted, &n.to_ascii_lowercase()), n)
        })
        .collect();
    scored.sort();
    let best = scored.first().map_or(usize::MAX, |s| s.0);
    scored
        .into_iter()
        .take_while(|(d, _)| *d <= best.max(1) && *d <= name.len() / 2 + 1)
        .take(3)
        .map(|(_, n)| n)
        .collect()
}

/// Levenshtein distance, for suggestions only.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let next = (row[j + 1] + 1).min(row[j] + 1).min(prev + cost);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A calendar: a period, a zone and (for a month) its anchor day.
#[derive(Debug, Clone, Copy)]
pub struct Calendar {
    period: Period,
    zone: &'static Zone,
    anchor: i8,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.period == other.period
            && self.zone.name == other.zone.name
            && self.anchor == other.anchor
    }
}

impl Eq for Calendar {}

impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.period, &self.zone.name, self.anchor).hash(state);
    }
}

impl Calendar {
    /// `period` in `zone` (`UTC` when none), from `anchor` (a month's
    /// first day when none; only months take one).
    pub fn new(
        period: &str,
        zone: Option<&str>,
        anchor: Option<u64>,
    ) -> Result<Self, CalendarError> {
        let period = Period::ALL
            .iter()
            .find(|(n, _)| *n == period.trim())
            .map(|&(_, p)| p)
            .ok_or_else(|| CalendarError::Period(period.to_owned()))?;
        let zone = Zone::get(zone.unwrap_or("UTC").trim())?;
        let anchor = match (period, anchor) {
            (_, None) => 1,
            (Period::Month, Some(a @ 1..=31)) => a as i8,
            (Period::Month, Some(a)) => {
                return Err(CalendarError::Anchor(format!(
                    "{a} is not a day of a month (1 to 31; 31 is each month's last day)"
                )));
            }
            (p, Some(_)) => {
                return Err(CalendarError::Anchor(format!(
                    "only a month has an anchor day, not a {}",
                    p.name()
                )));
            }
        };
        Ok(Self {
            period,
            zone,
            anchor,
        })
    }

    /// The period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The zone.
    pub fn zone(&self) -> &'static Zone {
        self.zone
    }

    /// The anchor day (1 for every period but a month's own).
    pub fn anchor(&self) -> u64 {
        self.anchor as u64
    }

    /// A nominal length, for what shows a quota per period
    /// (`RateLimit-Policy`'s `w`): 1, 7, 30 or 365 days. Decisions use the
    /// real windows.
    pub fn nominal(&self) -> Nanos {
        let days: Nanos = match self.period {
            Period::Day => 1,
            Period::Week => 7,
            Period::Month => 30,
            Period::Year => 365,
        };
        days * 86_400 * crate::NANOS_PER_SEC
    }

    /// The window holding `t` (Unix ns): its start (inclusive) and end.
    pub fn window(&self, t: Nanos) -> (Nanos, Nanos) {
        let at = Timestamp::from_nanosecond(i128::from(t)).unwrap_or(Timestamp::MAX);
        let today = self.zone.tz.to_datetime(at).date();
        let mut start = self.period_start(today);
        let mut begins = self.midnight(start);
        // The anchor day of this month may not have come yet (or a gap in
        // the rules put midnight after `t`): the period before.
        while begins > t {
            start = self.period_start(start.yesterday().unwrap_or(start));
            begins = self.midnight(start);
        }
        let mut end = self.next_start(start);
        let mut ends = self.midnight(end);
        while ends <= t {
            begins = ends;
            end = self.next_start(end);
            ends = self.midnight(end);
        }
        (begins, ends)
    }

    /// The first day of the period holding `date`.
    fn period_start(&self, date: Date) -> Date {
        match self.period {
            Period::Day => date,
            Period::Week => {
                let back = i64::from(date.weekday().since(Weekday::Monday));
                date.checked_sub(back.days()).unwrap_or(date)
            }
            Period::Year => date.first_of_year(),
            Period::Month => {
                let here = self.anchored(date.first_of_month());
                match here > date {
                    true => {
                        self.anchored(date.first_of_month().checked_sub(1.month()).unwrap_or(date))
                    }
                    false => here,
                }
            }
        }
    }

    /// The first day of the period after the one starting on `start`.
    fn next_start(&self, start: Date) -> Date {
        let next = match self.period {
            Period::Day => start.tomorrow().ok(),
            Period::Week => start.checked_add(7.days()).ok(),
            Period::Year => start.first_of_year().checked_add(1.year()).ok(),
            Period::Month => start
                .first_of_month()
                .checked_add(1.month())
                .ok()
                .map(|m| self.anchored(m)),
        };
        next.unwrap_or(start)
    }

    /// The anchor day of the month starting on `first`, clamped to its last day.
    fn anchored(&self, first: Date) -> Date {
        let day = self.anchor.min(first.days_in_month());
        first.with().day(day).build().unwrap_or(first)
    }

    /// The instant of `date`'s local midnight: the first one when it occurs
    /// twice, the instant the clocks jump when it does not occur.
    fn midnight(&self, date: Date) -> Nanos {
        let civil: DateTime = date.to_datetime(jiff::civil::Time::midnight());
        let tz = &self.zone.tz;
        let instant = match tz.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset }
            | AmbiguousOffset::Fold { before: offset, .. } => offset.to_timestamp(civil).ok(),
            AmbiguousOffset::Gap { before, .. } => {
                // Read with the offset before the jump, the midnight lies
                // past the jump: the transition before it is the jump.
                let past = before.to_timestamp(civil).ok();
                past.and_then(|p| {
                    let after = p.checked_add(jiff::SignedDuration::from_nanos(1)).ok()?;
                    tz.preceding(after).next().map(|tr| tr.timestamp())
                })
            }
        };
        instant.map_or(0, |i| Nanos::try_from(i.as_nanosecond()).unwrap_or(0))
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "calendar={} zone={}", self.period.name(), self.zone.name)?;
        if self.period == Period::Month && self.anchor != 1 {
            write!(f, " anchor={}", self.anchor)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = crate::NANOS_PER_SEC;

    /// Unix ns of an RFC 3339 instant.
    fn at(text: &str) -> Nanos {
        Nanos::try_from(text.parse::<Timestamp>().unwrap().as_nanosecond()).unwrap()
    }

    fn window(period: &str, zone: &str, anchor: Option<u64>, t: &str) -> (Nanos, Nanos) {
        Calendar::new(period, Some(zone), anchor)
            .unwrap()
            .window(at(t))
    }

    #[test]
    fn days_weeks_months_and_years() {
        assert_eq!(
            window("day", "UTC", None, "2026-03-07T13:00:00Z"),
            (at("2026-03-07T00:00:00Z"), at("2026-03-08T00:00:00Z"))
        );
        // 2026-12-07 is a Monday.
        assert_eq!(
            window("week", "UTC", None, "2026-12-13T23:59:59Z"),
            (at("2026-12-07T00:00:00Z"), at("2026-12-14T00:00:00Z"))
        );
        assert_eq!(
            window("year", "UTC", None, "2026-12-31T23:59:59.999999999Z"),
            (at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        // Anchored on the 15th, Paris time (UTC+1 in winter, +2 in summer).
        assert_eq!(
            window("month", "Europe/Paris", Some(15), "2026-03-14T22:59:59Z"),
            (at("2026-02-14T23:00:00Z"), at("2026-03-14T23:00:00Z"))
        );
        assert_eq!(
            window("month", "Europe/Paris", Some(15), "2026-03-14T23:00:00Z"),
            (at("2026-03-14T23:00:00Z"), at("2026-04-14T22:00:00Z"))
        );
        // Anchor 31: each month's last day.
        assert_eq!(
            window("month", "UTC", Some(31), "2026-03-01T00:00:00Z"),
            (at("2026-02-28T00:00:00Z"), at("2026-03-31T00:00:00Z"))
        );
        assert_eq!(
            window("month", "UTC", Some(31), "2028-02-29T12:00:00Z"),
            (at("2028-02-29T00:00:00Z"), at("2028-03-31T00:00:00Z"))
        );
        assert_eq!(
            window("month", "UTC", Some(31), "2026-01-30T00:00:00Z"),
            (at("2025-12-31T00:00:00Z"), at("2026-01-31T00:00:00Z"))
        );
    }

    #[test]
    fn daylight_saving_days_are_23_and_25_hours() {
        let (s, e) = window("day", "Europe/Paris", None, "2026-03-29T12:00:00Z");
        assert_eq!(e - s, 23 * 3600 * S);
        let (s, e) = window("day", "Europe/Paris", None, "2026-10-25T12:00:00Z");
        assert_eq!(e - s, 25 * 3600 * S);
    }

    /// America/Santiago skips midnight (00:00 becomes 01:00) in September,
    /// the Azores in March: the day starts when the clocks jump. The
    /// Azores fall back from 01:00 to 00:00 in October: midnight exists
    /// twice, and the day starts at the first (tzdata 2026f, bundled).
    #[test]
    fn a_midnight_that_does_not_exist_or_exists_twice() {
        // 2026-09-06 00:00 in Santiago does not exist (UTC-4 → UTC-3 at 04:00Z).
        let (s, _) = window("day", "America/Santiago", None, "2026-09-06T12:00:00Z");
        assert_eq!(s, at("2026-09-06T04:00:00Z"));
        let (s, e) = window("day", "Atlantic/Azores", None, "2026-03-29T12:00:00Z");
        assert_eq!(
            (s, e),
            (at("2026-03-29T01:00:00Z"), at("2026-03-30T00:00:00Z"))
        );
        let (s, e) = window("day", "Atlantic/Azores", None, "2026-10-25T12:00:00Z");
        assert_eq!(
            (s, e),
            (at("2026-10-25T00:00:00Z"), at("2026-10-26T01:00:00Z"))
        );
        // The instant before the jump is still the day before.
        let (_, e) = window(
            "day",
            "Atlantic/Azores",
            None,
            "2026-03-29T00:59:59.999999999Z",
        );
        assert_eq!(e, at("2026-03-29T01:00:00Z"));
    }

    #[test]
    fn errors_say_what_is_valid() {
        let e = Calendar::new("month", Some("Europe/Pariss"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"Europe/Paris\""), "{e}");
        assert!(
            Calendar::new("fortnight", None, None)
                .unwrap_err()
                .to_string()
                .contains("day, week, month, year")
        );
        assert!(Calendar::new("day", None, Some(3)).is_err());
        assert!(Calendar::new("month", None, Some(32)).is_err());
    }
}
