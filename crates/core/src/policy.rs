//! Policies: an algorithm and its parameters, validated once so that an
//! invalid policy cannot be built and every decision it makes is exact.
//!
//! # Bounds of exactness
//!
//! Decisions use integers only: the in-process store computes in `u128`, the
//! Redis store in doubles where every quantity of a check stays below 2^51
//! and in wider integers where it does not (`crates/redis/src/weir.lua`).
//! Both are exact for every policy these bounds admit:
//!
//! | bound | value |
//! |---|---|
//! | every capacity, burst, limit and queue, and a rate's tokens | at most [`MAX_SIZE`] = 2^50 |
//! | every window, and a rate's period in lowest terms | at most [`MAX_SPAN`] = 366 days |
//! | a sliding log's limit | at most [`MAX_LOG_LIMIT`] = 1,000,000 (one entry per admission) |
//! | a concurrency limit's lease | at most [`MAX_LEASE`] = 7 days |
//! | a concurrency limit's limit | at most [`MAX_IN_FLIGHT`] = 10,000 (a lease each, at most) |
//!
//! A wait too long for a signed 64-bit count of nanoseconds (292 years) is
//! reported as [`MAX_WAIT`].

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::algo::calendar::CalendarError;
use crate::algo::{
    Calendar, Concurrency, FixedWindow, FixedWindowState, LeakyBucket, LeaseId, LeaseState,
    LevelState, LogState, Parameters, SlidingCounter, SlidingCounterState, SlidingLog, TokenBucket,
};
use crate::decision::{ceil_div, floor_div};
use crate::units::{DisplayDuration, UnitError, parse_count, parse_duration};
use crate::{Decision, Nanos, Rate};

/// The largest capacity, burst, limit or queue, and the most tokens a rate
/// may give per its period: 2^50.
pub const MAX_SIZE: u64 = 1 << 50;

/// The longest window, and the longest period of a rate in lowest terms:
/// 366 days.
pub const MAX_SPAN: Nanos = 366 * 86_400 * crate::NANOS_PER_SEC;

pub use crate::decision::MAX_WAIT;

/// The longest lease of a concurrency limit: 7 days (a holder whose work
/// runs longer renews its lease).
pub const MAX_LEASE: Nanos = 7 * 86_400 * crate::NANOS_PER_SEC;

/// The largest concurrency limit: a key keeps a lease per admission in
/// flight, and every operation on it reads them (on Redis, as text).
pub const MAX_IN_FLIGHT: u64 = 10_000;

/// The largest sliding-log limit: the log keeps one entry per admission.
pub const MAX_LOG_LIMIT: u64 = 1_000_000;

/// The algorithms of docs/SPEC.md, by their names in configs and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `token-bucket`: `capacity`, `rate`.
    TokenBucket,
    /// `gcra`: `burst`, `rate` (the token bucket as one timestamp).
    Gcra,
    /// `fixed-window`: `limit`, `window`.
    FixedWindow,
    /// `sliding-log`: `limit`, `window`.
    SlidingLog,
    /// `sliding-counter`: `limit`, `window`.
    SlidingCounter,
    /// `leaky-bucket`: `rate`, `queue`.
    LeakyBucket,
    /// `concurrency`: `limit`, `lease` (cost in flight, not a rate).
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in docs/SPEC.md's order.
    pub const ALL: [Self; 7] = [
        Self::TokenBucket,
        Self::Gcra,
        Self::FixedWindow,
        Self::SlidingLog,
        Self::SlidingCounter,
        Self::LeakyBucket,
        Self::Concurrency,
    ];

    /// The name used in configs, flags and output.
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token-bucket",
            Self::Gcra => "gcra",
            Self::FixedWindow => "fixed-window",
            Self::SlidingLog => "sliding-log",
            Self::SlidingCounter => "sliding-counter",
            Self::LeakyBucket => "leaky-bucket",
            Self::Concurrency => "concurrency",
        }
    }

    /// Every algorithm's name, as an error lists the valid ones.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The parameters this algorithm takes, all required.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            Self::TokenBucket => &["capacity", "rate"],
            Self::Gcra => &["burst", "rate"],
            Self::FixedWindow | Self::SlidingLog | Self::SlidingCounter => &["limit", "window"],
            Self::LeakyBucket => &["rate", "queue"],
            Self::Concurrency => &["limit", "lease"],
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = PolicyError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name.trim())
            .ok_or_else(|| {
                PolicyError::new(
                    "algorithm",
                    PolicyErrorKind::UnknownAlgorithm(name.to_owned()),
                )
            })
    }
}

/// A policy that cannot be built, naming the parameter that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{field}`: {kind}")]
pub struct PolicyError {
    /// The parameter (`capacity`, `rate`, …) or `algorithm`.
    pub field: String,
    /// What is wrong with it.
    pub kind: PolicyErrorKind,
}

impl PolicyError {
    fn new(field: &str, kind: PolicyErrorKind) -> Self {
        Self {
            field: field.to_owned(),
            kind,
        }
    }
}

/// What is wrong with a policy parameter.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyErrorKind {
    /// No such algorithm.
    #[error(
        "unknown algorithm `{0}` (valid: {valid})", valid = Algorithm::names()
    )]
    UnknownAlgorithm(String),
    /// A required parameter is absent.
    #[error("missing ({algorithm} takes {takes})")]
    Missing {
        /// The algorithm's name.
        algorithm: &'static str,
        /// Its parameters.
        takes: String,
    },
    /// A parameter the algorithm does not take.
    #[error("not a parameter of {algorithm} (it takes {takes})")]
    NotAParameter {
        /// The algorithm's name.
        algorithm: &'static str,
        /// Its parameters.
        takes: String,
    },
    /// The same parameter given twice.
    #[error("given more than once")]
    Duplicate,
    /// A value that does not parse.
    #[error("`{value}` is not valid: {source}")]
    Invalid {
        /// The text given.
        value: String,
        /// Why it does not parse.
        source: UnitError,
    },
    /// A value outside the bounds of exact decisions.
    #[error("{0}")]
    OutOfBounds(String),
    /// A `key=value` policy spec that is not `key=value`.
    #[error("`{0}` is not key=value")]
    NotKeyValue(String),
}

/// A request that can never be decided under a policy: an error, not a
/// rejection (docs/SPEC.md: a cost larger than the capacity can never succeed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CostError {
    /// Cost 0.
    #[error("cost must be a positive whole number")]
    Zero,
    /// More than the policy could ever admit at once.
    #[error("cost {cost} can never be admitted: it is larger than the policy's {field} ({max})")]
    TooLarge {
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy admits.
        max: u64,
        /// The parameter that bounds it.
        field: &'static str,
    },
    /// A usage report on a concurrency policy: what it bounds is released,
    /// not reported.
    #[error(
        "a concurrency policy takes no usage reports: its holders release their leases instead"
    )]
    NoReports,
    /// A release or renewal on a policy other than a concurrency limit.
    #[error("only a concurrency policy has leases to release or renew")]
    NoLeases,
}

/// A validated policy: an algorithm with its parameters.
///
/// Not `#[non_exhaustive]` on purpose: every crate matches it exhaustively,
/// so a new algorithm fails to compile wherever it is not handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Token bucket.
    TokenBucket(TokenBucket),
    /// GCRA: the token bucket with capacity = burst.
    Gcra(TokenBucket),
    /// Fixed window.
    FixedWindow(FixedWindow),
    /// Sliding-window log.
    SlidingLog(SlidingLog),
    /// Sliding-window counter.
    SlidingCounter(SlidingCounter),
    /// Leaky-bucket shaper.
    LeakyBucket(LeakyBucket),
    /// Concurrency limit: leases, not a rate.
    Concurrency(Concurrency),
}

/// The state of one key under one policy. [`Policy::new_state`] makes a new
/// key's; a state of the wrong kind is treated as a new key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Token bucket, GCRA, leaky bucket.
    Level(LevelState),
    /// Fixed window.
    FixedWindow(FixedWindowState),
    /// Sliding counter.
    SlidingCounter(SlidingCounterState),
    /// Sliding log (boxed: it is the large one, and stores keep many small
    /// states of the other kinds side by side).
    Log(Box<LogState>),
    /// Concurrency limit: its live leases.
    Lease(Box<LeaseState>),
}

impl State {
    /// The latest time the key has seen: checks are evaluated at
    /// `max(now, seen)`.
    pub fn seen(&self) -> Nanos {
        match self {
            Self::Level(s) => s.seen,
            Self::FixedWindow(s) => s.seen,
            Self::SlidingCounter(s) => s.seen,
            Self::Log(s) => s.seen(),
            Self::Lease(s) => s.seen(),
        }
    }
}

fn out_of_bounds(field: &str, message: String) -> PolicyError {
    PolicyError::new(field, PolicyErrorKind::OutOfBounds(message))
}

fn positive(field: &str, value: u64) -> Result<u64, PolicyError> {
    if value == 0 {
        return Err(out_of_bounds(field, "must be at least 1".to_owned()));
    }
    Ok(value)
}

fn check_size(field: &str, size: u64, max: u64) -> Result<u64, PolicyError> {
    positive(field, size)?;
    if size > max {
        return Err(out_of_bounds(field, format!("{size} is more than {max}")));
    }
    Ok(size)
}

fn check_rate(rate: Rate) -> Result<(), PolicyError> {
    if rate.tokens() > MAX_SIZE {
        return Err(out_of_bounds(
            "rate",
            format!("{rate} is too fine: write it with at most 2^50 tokens per its period"),
        ));
    }
    if rate.period() > MAX_SPAN {
        return Err(out_of_bounds(
            "rate",
            format!(
                "{rate} is slower than a year allows: its period ({}) must be at most {}",
                DisplayDuration(rate.period()),
                DisplayDuration(MAX_SPAN)
            ),
        ));
    }
    Ok(())
}

fn check_window(window: Nanos) -> Result<(), PolicyError> {
    positive("window", window)?;
    if window > MAX_SPAN {
        return Err(out_of_bounds(
            "window",
            format!(
                "{} is longer than {}",
                DisplayDuration(window),
                DisplayDuration(MAX_SPAN)
            ),
        ));
    }
    Ok(())
}

impl Policy {
    /// `capacity` tokens refilled at `rate`.
    pub fn token_bucket(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        Self::bucket("capacity", capacity, rate).map(Self::TokenBucket)
    }

    /// GCRA allowing bursts of `burst`, at `rate`.
    pub fn gcra(burst: u64, rate: Rate) -> Result<Self, PolicyError> {
        Self::bucket("burst", burst, rate).map(Self::Gcra)
    }

    fn bucket(field: &str, capacity: u64, rate: Rate) -> Result<TokenBucket, PolicyError> {
        check_size(field, capacity, MAX_SIZE)?;
        check_rate(rate)?;
        Ok(TokenBucket { capacity, rate })
    }

    /// At most `limit` per aligned `window`.
    pub fn fixed_window(limit: u64, window: Nanos) -> Result<Self, PolicyError> {
        check_size("limit", limit, MAX_SIZE)?;
        check_window(window)?;
        Ok(Self::FixedWindow(FixedWindow {
            limit,
            window,
            calendar: None,
        }))
    }

    /// At most `limit` per window of `calendar` (docs/SPEC.md, "Calendar
    /// windows"): the days, weeks, months or years of a time zone.
    pub fn calendar_window(limit: u64, calendar: Calendar) -> Result<Self, PolicyError> {
        check_size("limit", limit, MAX_SIZE)?;
        Ok(Self::FixedWindow(FixedWindow {
            limit,
            window: calendar.nominal(),
            calendar: Some(calendar),
        }))
    }

    /// `fixed-window` with `calendar` (and `zone`, `anchor`) in place of
    /// `window`.
    fn calendar_from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, PolicyError> {
        let (mut limit, mut period, mut zone, mut anchor) = (None, None, None, None);
        for (name, value) in params {
            let slot = match name {
                "limit" => &mut limit,
                "calendar" => &mut period,
                "zone" => &mut zone,
                "anchor" => &mut anchor,
                _ => {
                    return Err(PolicyError::new(
                        name,
                        PolicyErrorKind::NotAParameter {
                            algorithm: "fixed-window",
                            takes: "limit, calendar, zone, anchor (with a calendar)".to_owned(),
                        },
                    ));
                }
            };
            if slot.replace(value).is_some() {
                return Err(PolicyError::new(name, PolicyErrorKind::Duplicate));
            }
        }
        let count = |field: &str, value: Option<&str>| -> Result<Option<u64>, PolicyError> {
            value
                .map(|v| {
                    parse_count(v).map_err(|source| {
                        PolicyError::new(
                            field,
                            PolicyErrorKind::Invalid {
                                value: v.to_owned(),
                                source,
                            },
                        )
                    })
                })
                .transpose()
        };
        let limit = count("limit", limit)?.ok_or_else(|| {
            PolicyError::new(
                "limit",
                PolicyErrorKind::Missing {
                    algorithm: "fixed-window",
                    takes: "limit, calendar, zone, anchor (with a calendar)".to_owned(),
                },
            )
        })?;
        let anchor = count("anchor", anchor)?;
        let calendar = Calendar::new(period.unwrap_or_default(), zone, anchor).map_err(|e| {
            let field = match e {
                CalendarError::Period(_) => "calendar",
                CalendarError::Zone(..) => "zone",
                CalendarError::Anchor(_) => "anchor",
            };
            out_of_bounds(field, e.to_string())
        })?;
        Self::calendar_window(limit, calendar)
    }

    /// At most `limit` in any `window`, exactly.
    pub fn sliding_log(limit: u64, window: Nanos) -> Result<Self, PolicyError> {
        check_size("limit", limit, MAX_LOG_LIMIT)?;
        check_window(window)?;
        Ok(Self::SlidingLog(SlidingLog { limit, window }))
    }

    /// At most `limit` in the weighted two-window estimate.
    pub fn sliding_counter(limit: u64, window: Nanos) -> Result<Self, PolicyError> {
        check_size("limit", limit, MAX_SIZE)?;
        check_window(window)?;
        Ok(Self::SlidingCounter(SlidingCounter { limit, window }))
    }

    /// Releases at `rate`, with up to `queue` slots waiting.
    pub fn leaky_bucket(rate: Rate, queue: u64) -> Result<Self, PolicyError> {
        check_size("queue", queue, MAX_SIZE)?;
        check_rate(rate)?;
        Ok(Self::LeakyBucket(LeakyBucket { rate, queue }))
    }

    /// At most `limit` cost in flight, each lease held at most `lease`
    /// unless renewed.
    pub fn concurrency(limit: u64, lease: Nanos) -> Result<Self, PolicyError> {
        check_size("limit", limit, MAX_IN_FLIGHT)?;
        positive("lease", lease)?;
        if lease > MAX_LEASE {
            return Err(out_of_bounds(
                "lease",
                format!(
                    "{} is longer than 7 days: a holder whose work runs longer renews its lease",
                    DisplayDuration(lease)
                ),
            ));
        }
        Concurrency::new(limit, lease)
            .map(Self::Concurrency)
            .ok_or_else(|| out_of_bounds("limit", "must be at least 1".to_owned()))
    }

    /// Builds a policy from an algorithm name and `(parameter, value)` text
    /// pairs, as configs and flags give them; every parameter is required
    /// and none other is accepted.
    pub fn from_params<'a>(
        algorithm: &str,
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, PolicyError> {
        let algorithm: Algorithm = algorithm.parse()?;
        let params: Vec<(&str, &str)> = params.into_iter().collect();
        if algorithm == Algorithm::FixedWindow && params.iter().any(|(k, _)| *k == "calendar") {
            return Self::calendar_from_params(params);
        }
        let takes = algorithm.params();
        let mut values: [Option<&str>; 2] = [None, None];
        for (name, value) in params {
            let Some(slot) = takes.iter().position(|t| *t == name) else {
                return Err(PolicyError::new(
                    name,
                    PolicyErrorKind::NotAParameter {
                        algorithm: algorithm.name(),
                        takes: takes.join(", "),
                    },
                ));
            };
            if values[slot].replace(value).is_some() {
                return Err(PolicyError::new(name, PolicyErrorKind::Duplicate));
            }
        }
        let get = |slot: usize| {
            values[slot].ok_or_else(|| {
                PolicyError::new(
                    takes[slot],
                    PolicyErrorKind::Missing {
                        algorithm: algorithm.name(),
                        takes: takes.join(", "),
                    },
                )
            })
        };
        let parsed = |slot: usize, parse: fn(&str) -> Result<u64, UnitError>| {
            let value = get(slot)?;
            parse(value).map_err(|source| {
                PolicyError::new(
                    takes[slot],
                    PolicyErrorKind::Invalid {
                        value: value.to_owned(),
                        source,
                    },
                )
            })
        };
        let count = |slot| parsed(slot, parse_count);
        let duration = |slot| parsed(slot, parse_duration);
        let rate = |slot: usize| {
            let value = get(slot)?;
            Rate::parse(value).map_err(|source| {
                PolicyError::new(
                    takes[slot],
                    PolicyErrorKind::Invalid {
                        value: value.to_owned(),
                        source,
                    },
                )
            })
        };
        match algorithm {
            Algorithm::TokenBucket => Self::token_bucket(count(0)?, rate(1)?),
            Algorithm::Gcra => Self::gcra(count(0)?, rate(1)?),
            Algorithm::FixedWindow => Self::fixed_window(count(0)?, duration(1)?),
            Algorithm::SlidingLog => Self::sliding_log(count(0)?, duration(1)?),
            Algorithm::SlidingCounter => Self::sliding_counter(count(0)?, duration(1)?),
            Algorithm::LeakyBucket => Self::leaky_bucket(rate(0)?, count(1)?),
            Algorithm::Concurrency => Self::concurrency(count(0)?, duration(1)?),
        }
    }

    /// This policy with its limit scaled by `num/den` (at most 1): a
    /// bucket's capacity and rate, a shaper's rate and queue, a window's
    /// limit — rounded down, but never below one. For a local fallback that
    /// holds one instance to its share of a limit shared by several.
    pub fn scaled(&self, num: u64, den: u64) -> Result<Self, PolicyError> {
        self.rescaled(num.min(den), den, |x| x)
    }

    /// This policy with its limit multiplied by `num/den` (more or less
    /// than 1): a bucket's capacity and rate, a shaper's rate and queue, a
    /// window's or a concurrency limit's count — rounded down, never below
    /// one; an error where a count would pass its algorithm's bound. A
    /// per-key `multiplier` (a temporary boost).
    pub fn multiplied(&self, num: u64, den: u64) -> Result<Self, PolicyError> {
        self.rescaled(num, den, |_| u64::MAX)
    }

    fn rescaled(&self, num: u64, den: u64, cap: fn(u64) -> u64) -> Result<Self, PolicyError> {
        let part = |x: u64| {
            let scaled = u128::from(x) * u128::from(num) / u128::from(den.max(1));
            u64::try_from(scaled)
                .unwrap_or(u64::MAX)
                .clamp(1, cap(x).max(1))
        };
        let rate = |r: Rate| {
            let (n, p) = (
                u128::from(r.tokens()) * u128::from(num),
                u128::from(r.period()) * u128::from(den),
            );
            let g = gcd128(n, p);
            match (u64::try_from(n / g), u64::try_from(p / g)) {
                (Ok(n), Ok(p)) => {
                    Rate::new(n, p).ok_or_else(|| out_of_bounds("rate", "scales to zero".into()))
                }
                _ => Err(out_of_bounds(
                    "rate",
                    format!(
                        "{}/{} ns cannot be scaled by {num}/{den} exactly",
                        r.tokens(),
                        r.period()
                    ),
                )),
            }
        };
        match *self {
            Self::TokenBucket(b) => Self::token_bucket(part(b.capacity), rate(b.rate)?),
            Self::Gcra(b) => Self::gcra(part(b.capacity), rate(b.rate)?),
            Self::LeakyBucket(l) => Self::leaky_bucket(rate(l.rate)?, part(l.queue)),
            Self::FixedWindow(w) => match w.calendar {
                Some(calendar) => Self::calendar_window(part(w.limit), calendar),
                None => Self::fixed_window(part(w.limit), w.window),
            },
            Self::SlidingLog(l) => Self::sliding_log(part(l.limit), l.window),
            Self::SlidingCounter(c) => Self::sliding_counter(part(c.limit), c.window),
            Self::Concurrency(c) => Self::concurrency(part(c.limit()), c.lease()),
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Self::TokenBucket(_) => Algorithm::TokenBucket,
            Self::Gcra(_) => Algorithm::Gcra,
            Self::FixedWindow(_) => Algorithm::FixedWindow,
            Self::SlidingLog(_) => Algorithm::SlidingLog,
            Self::SlidingCounter(_) => Algorithm::SlidingCounter,
            Self::LeakyBucket(_) => Algorithm::LeakyBucket,
            Self::Concurrency(_) => Algorithm::Concurrency,
        }
    }

    /// The algorithm's own parameters: the one place `Policy` dispatches
    /// what an algorithm knows of itself.
    pub fn parameters(&self) -> &dyn Parameters {
        match self {
            Self::TokenBucket(b) | Self::Gcra(b) => b,
            Self::FixedWindow(w) => w,
            Self::SlidingLog(l) => l,
            Self::SlidingCounter(c) => c,
            Self::LeakyBucket(l) => l,
            Self::Concurrency(c) => c,
        }
    }

    /// The quota `q` per window `w` (ns) that `RateLimit-Policy` shows: a
    /// token bucket's capacity over the time to refill it from empty; a
    /// window's limit per window; a shaper's queue and the slot being served
    /// over the time to drain them; a concurrency limit's limit per lease.
    /// `w` is rounded down to the nanosecond.
    pub fn quota(&self) -> (u64, Nanos) {
        self.parameters().quota()
    }

    /// This algorithm with its quota replaced by `count` per `period`: a
    /// bucket's capacity and rate, a window's limit per window of `period`,
    /// a shaper's rate (its queue kept); `None` for a concurrency limit,
    /// which has no quota per period.
    pub fn with_quota(&self, count: u64, period: Nanos) -> Option<Result<Self, PolicyError>> {
        let rate = || {
            Rate::new(count, period).ok_or_else(|| {
                PolicyError::new(
                    "limit",
                    PolicyErrorKind::OutOfBounds("at least 1 per period".to_owned()),
                )
            })
        };
        Some(match self {
            Self::FixedWindow(_) => Self::fixed_window(count, period),
            Self::TokenBucket(_) => rate().and_then(|r| Self::token_bucket(count, r)),
            Self::Gcra(_) => rate().and_then(|r| Self::gcra(count, r)),
            Self::SlidingLog(_) => Self::sliding_log(count, period),
            Self::SlidingCounter(_) => Self::sliding_counter(count, period),
            Self::LeakyBucket(l) => rate().and_then(|r| Self::leaky_bucket(r, l.queue())),
            Self::Concurrency(_) => return None,
        })
    }

    /// The sustained rate: `count` per `period` ns (a bucket's or shaper's
    /// rate, a window's limit per window), as Envoy's `requests_per_unit`;
    /// a concurrency limit's limit per lease (no rate: starts are bounded
    /// only by releases).
    pub fn sustained(&self) -> (u64, Nanos) {
        self.parameters().sustained()
    }

    /// The window of a windowed algorithm (fixed window, sliding log,
    /// sliding counter); `None` for the buckets, the shaper and the
    /// concurrency limit.
    pub fn window(&self) -> Option<Nanos> {
        self.parameters().window()
    }

    /// The window of an algorithm whose windows are aligned to multiples of
    /// it (fixed window, sliding counter): where its boundaries fall.
    pub fn aligned_window(&self) -> Option<Nanos> {
        self.parameters().aligned_window()
    }

    /// What one request costs under this policy: `cost`, except that a
    /// concurrency policy holds `slots` (one slot when `None`) whatever the
    /// request's cost — a request is one thing in flight.
    #[inline]
    pub fn request_cost(&self, cost: u64, slots: Option<u64>) -> u64 {
        match self {
            Self::Concurrency(_) => slots.unwrap_or(1),
            _ => cost,
        }
    }

    /// The largest cost one request may have, and the parameter bounding
    /// it (dispatched statically: every check validates its cost).
    #[inline]
    pub fn max_cost(&self) -> (u64, &'static str) {
        match self {
            Self::TokenBucket(b) => (b.max_cost(), "capacity"),
            Self::Gcra(b) => (b.max_cost(), "burst"),
            Self::LeakyBucket(l) => (l.max_cost(), "queue"),
            Self::FixedWindow(w) => (w.max_cost(), "limit"),
            Self::SlidingLog(l) => (l.max_cost(), "limit"),
            Self::SlidingCounter(c) => (c.max_cost(), "limit"),
            Self::Concurrency(c) => (c.max_cost(), "limit"),
        }
    }

    /// `Ok` when `cost` could ever be admitted.
    pub fn validate_cost(&self, cost: u64) -> Result<(), CostError> {
        let (max, field) = self.max_cost();
        match cost {
            0 => Err(CostError::Zero),
            c if c > max => Err(CostError::TooLarge { cost, max, field }),
            _ => Ok(()),
        }
    }

    /// A new key's state: full bucket, empty windows, idle shaper.
    pub fn new_state(&self) -> State {
        match self {
            Self::TokenBucket(_) | Self::Gcra(_) | Self::LeakyBucket(_) => {
                State::Level(LevelState::default())
            }
            Self::FixedWindow(_) => State::FixedWindow(FixedWindowState::default()),
            Self::SlidingCounter(_) => State::SlidingCounter(SlidingCounterState::default()),
            Self::SlidingLog(_) => State::Log(Box::default()),
            Self::Concurrency(_) => State::Lease(Box::default()),
        }
    }

    /// The most one report may charge: 1,000 times the capacity (or burst,
    /// limit, queue), as docs/SPEC.md bounds it, and at most [`MAX_SIZE`]
    /// (so that every count stays exact in the Redis store's doubles).
    pub fn max_report(&self) -> u64 {
        self.max_cost().0.saturating_mul(1_000).min(MAX_SIZE)
    }

    /// Whether a report of `cost` is valid: at most [`Policy::max_report`]
    /// (a report's own bound, where a check's is [`Policy::max_cost`]).
    pub fn validate_report(&self, cost: u64) -> Result<(), CostError> {
        if let Self::Concurrency(_) = self {
            return Err(CostError::NoReports);
        }
        let max = self.max_report();
        match cost > max {
            true => Err(CostError::TooLarge {
                cost,
                max,
                field: self.max_cost().1,
            }),
            false => Ok(()),
        }
    }

    /// Charges `cost` after the fact (docs/SPEC.md, "Usage reported after the
    /// fact"): always charged, possibly into debt; answered `allowed` with
    /// `remaining` and `reset` of the new state, and `retry_after` the wait
    /// until a check of cost 1 would be allowed.
    pub fn report(&self, state: &mut State, now: Nanos, cost: u64) -> Result<Decision, CostError> {
        self.validate_report(cost)?;
        let max = self.max_report();
        let t = now.max(state.seen());
        match (self, &mut *state) {
            (Self::TokenBucket(b) | Self::Gcra(b), State::Level(s)) => {
                s.charge(t, b.rate(), cost, max);
            }
            (Self::LeakyBucket(l), State::Level(s)) => s.charge(t, l.rate(), cost, max),
            (Self::FixedWindow(w), State::FixedWindow(s)) => *s = w.charge(*s, t, cost, max),
            (Self::SlidingCounter(c), State::SlidingCounter(s)) => {
                *s = c.charge(*s, t, cost, max);
            }
            (Self::SlidingLog(l), State::Log(s)) => l.charge(s, t, cost, max),
            // Refused by `validate_report` above.
            (Self::Concurrency(_), _) => return Err(CostError::NoReports),
            _ => {
                *state = self.new_state();
                return self.report(state, now, cost);
            }
        }
        let (remaining, reset) = self.status(state, t);
        let probe = self.peek(state, t, 1)?;
        Ok(Decision {
            allowed: true,
            remaining,
            retry_after: if probe.allowed { 0 } else { probe.retry_after },
            reset,
            delay: 0,
            lease: None,
            banned: 0,
            new_ban: false,
        })
    }

    /// Decides a request of `cost` at `now` and updates `state`: charged
    /// when allowed; a rejection only refreshes the key's accounting. A
    /// cost of 0 charges nothing and is allowed unless the key is in debt
    /// (after a report); it is never delayed.
    ///
    /// An admission by a concurrency policy takes a lease; its identity is
    /// 0 (see [`Policy::acquire`] to choose it).
    #[inline(always)]
    pub fn check(&self, state: &mut State, now: Nanos, cost: u64) -> Result<Decision, CostError> {
        self.acquire(state, now, cost, 0)
    }

    /// [`Policy::check`], naming the lease an admission by a concurrency
    /// policy takes `lease` (its store chooses it, unique per key); for
    /// every other policy, the same as [`Policy::check`].
    #[inline(always)]
    pub fn acquire(
        &self,
        state: &mut State,
        now: Nanos,
        cost: u64,
        lease: LeaseId,
    ) -> Result<Decision, CostError> {
        if cost > 0 {
            self.validate_cost(cost)?;
        }
        fn apply<S: Copy>(s: &mut S, step: impl FnOnce(S) -> (Decision, S)) -> Decision {
            let (decision, next) = step(*s);
            *s = next;
            decision
        }
        Ok(match (self, &mut *state) {
            (Self::TokenBucket(b) | Self::Gcra(b), State::Level(s)) => {
                apply(s, |s| b.check(s, now, cost))
            }
            (Self::LeakyBucket(l), State::Level(s)) => apply(s, |s| l.check(s, now, cost)),
            (Self::FixedWindow(w), State::FixedWindow(s)) => apply(s, |s| w.check(s, now, cost)),
            (Self::SlidingCounter(c), State::SlidingCounter(s)) => {
                apply(s, |s| c.check(s, now, cost))
            }
            (Self::SlidingLog(l), State::Log(s)) => l.check(s, now, cost),
            (Self::Concurrency(c), State::Lease(s)) => {
                let decision = c.check(s, now, cost, lease);
                Decision {
                    lease: (decision.allowed && cost > 0).then_some(lease),
                    ..decision
                }
            }
            _ => {
                *state = self.new_state();
                return self.acquire(state, now, cost, lease);
            }
        })
    }

    /// Answers as a check of `cost` would (docs/SPEC.md's probe) — allowed,
    /// `retry_after`, and `remaining` and `reset` as if charged — with no
    /// delay, and changes nothing but the key's latest time: it charges
    /// nothing, takes no lease and no queue slot.
    pub fn probe(&self, state: &mut State, now: Nanos, cost: u64) -> Result<Decision, CostError> {
        let t = now.max(state.seen());
        let decision = self.peek(state, t, cost)?;
        self.check(state, t, 0)?;
        Ok(Decision {
            delay: 0,
            lease: None,
            ..decision
        })
    }

    /// Frees the lease `lease` of a concurrency policy (docs/SPEC.md):
    /// allowed is whether it was live; the standing after it, with the wait
    /// a check of cost 1 would get. Any other policy has no leases.
    pub fn release(
        &self,
        state: &mut State,
        now: Nanos,
        lease: LeaseId,
    ) -> Result<Decision, CostError> {
        self.on_lease(state, now, lease, Concurrency::release)
    }

    /// Extends the live lease `lease` of a concurrency policy to its full
    /// duration from now; allowed is whether it was live (an expired lease
    /// stays expired).
    pub fn renew(
        &self,
        state: &mut State,
        now: Nanos,
        lease: LeaseId,
    ) -> Result<Decision, CostError> {
        self.on_lease(state, now, lease, Concurrency::renew)
    }

    fn on_lease(
        &self,
        state: &mut State,
        now: Nanos,
        lease: LeaseId,
        op: fn(&Concurrency, &mut LeaseState, Nanos, LeaseId) -> Decision,
    ) -> Result<Decision, CostError> {
        let Self::Concurrency(c) = self else {
            return Err(CostError::NoLeases);
        };
        if !matches!(state, State::Lease(_)) {
            *state = self.new_state();
        }
        match state {
            State::Lease(s) => Ok(op(c, s, now, lease)),
            _ => Err(CostError::NoLeases),
        }
    }

    /// A key's state under these parameters, from its state under `old`
    /// (the same policy name with other parameters: a configuration
    /// reload), or `None` where it no longer means the same and the key
    /// starts over. docs/SPEC.md, "Changed parameters": a bucket keeps its
    /// tokens (at most the new capacity), a shaper its backlog in time, a
    /// window its counts while its length is unchanged, a log its entries
    /// and a concurrency limit its leases; another algorithm starts over.
    pub fn carry(&self, old: &Policy, state: &State) -> Option<State> {
        let deepest = self.max_report();
        match (old, self, state) {
            (
                Self::TokenBucket(o) | Self::Gcra(o),
                Self::TokenBucket(b) | Self::Gcra(b),
                State::Level(s),
            ) => Some(State::Level(b.carry(o, *s, deepest))),
            (Self::LeakyBucket(o), Self::LeakyBucket(l), State::Level(s)) => {
                Some(State::Level(l.carry(o, *s, deepest)))
            }
            (Self::FixedWindow(o), Self::FixedWindow(w), State::FixedWindow(_))
                if o.window() == w.window() && o.calendar() == w.calendar() =>
            {
                Some(state.clone())
            }
            (Self::SlidingCounter(o), Self::SlidingCounter(c), State::SlidingCounter(_))
                if o.window() == c.window() =>
            {
                Some(state.clone())
            }
            (Self::SlidingLog(_), Self::SlidingLog(_), State::Log(_))
            | (Self::Concurrency(_), Self::Concurrency(_), State::Lease(_)) => Some(state.clone()),
            _ => None,
        }
    }

    /// Whether the key is back to its idle, fully available state at `now`
    /// (evaluated at `max(now, seen)`): deleting it then grants nothing
    /// (docs/SPEC.md's idle rule), so a store may drop it.
    pub fn is_idle(&self, state: &State, now: Nanos) -> bool {
        let t = now.max(state.seen());
        match (self, state) {
            (Self::TokenBucket(b) | Self::Gcra(b), State::Level(s)) => s.at(t, b.rate()).1 == 0,
            (Self::LeakyBucket(l), State::Level(s)) => s.at(t, l.rate()).1 == 0,
            (Self::FixedWindow(w), State::FixedWindow(s)) => {
                s.count == 0 || w.index_of(t) != s.index
            }
            (Self::SlidingCounter(c), State::SlidingCounter(s)) => {
                match (t / c.window()).saturating_sub(s.index) {
                    0 => s.current == 0 && s.previous == 0,
                    1 => s.current == 0,
                    _ => true,
                }
            }
            (Self::SlidingLog(l), State::Log(s)) => s.is_idle(t, l.window()),
            (Self::Concurrency(_), State::Lease(s)) => s.is_idle(t),
            _ => true,
        }
    }

    /// The key's standing at `now` with no request: `(remaining, reset)` as
    /// a decision would report them (for a check over several policies that
    /// was refused elsewhere and so charged nothing here).
    pub fn status(&self, state: &State, now: Nanos) -> (u64, Nanos) {
        let level = |s: &LevelState, rate: Rate, size: u64, leaky: bool| {
            let (_, level) = s.at(now, rate);
            let (n, p) = (u128::from(rate.tokens()), u128::from(rate.period()));
            let full = (u128::from(size) + u128::from(leaky)) * p;
            (floor_div(full.saturating_sub(level), p), ceil_div(level, n))
        };
        match (self, state) {
            (Self::TokenBucket(b) | Self::Gcra(b), State::Level(s)) => {
                level(s, b.rate(), b.capacity(), false)
            }
            (Self::LeakyBucket(l), State::Level(s)) => level(s, l.rate(), l.queue(), true),
            // A windowed check too large to ever pass changes nothing and
            // reports the standing as it is.
            _ => {
                let never = self.max_cost().0.saturating_add(1);
                let mut copy = state.clone();
                let decision = match (self, &mut copy) {
                    (Self::FixedWindow(w), State::FixedWindow(s)) => w.check(*s, now, never).0,
                    (Self::SlidingCounter(c), State::SlidingCounter(s)) => {
                        return c.status(*s, now);
                    }
                    (Self::SlidingLog(l), State::Log(s)) => l.peek(s, now, never),
                    (Self::Concurrency(c), State::Lease(s)) => c.peek(s, now, 0),
                    _ => return self.status(&self.new_state(), now),
                };
                (decision.remaining, decision.reset)
            }
        }
    }

    /// The decision [`Policy::check`] would make, changing nothing.
    pub fn peek(&self, state: &State, now: Nanos, cost: u64) -> Result<Decision, CostError> {
        match (self, state) {
            (Self::SlidingLog(l), State::Log(s)) => {
                if cost > 0 {
                    self.validate_cost(cost)?;
                }
                Ok(l.peek(s, now, cost))
            }
            (Self::Concurrency(c), State::Lease(s)) => {
                if cost > 0 {
                    self.validate_cost(cost)?;
                }
                Ok(c.peek(s, now, cost))
            }
            (Self::SlidingLog(_) | Self::Concurrency(_), _) => {
                self.check(&mut self.new_state(), now, cost)
            }
            _ => self.check(&mut state.clone(), now, cost),
        }
    }

    /// Parses `ALGORITHM key=value …`, e.g. `token-bucket capacity=10 rate=2/s`.
    pub fn parse(spec: &str) -> Result<Self, PolicyError> {
        let mut words = spec.split_whitespace();
        let algorithm = words.next().unwrap_or_default();
        let params = words
            .map(|word| {
                word.split_once('=').ok_or_else(|| {
                    PolicyError::new(word, PolicyErrorKind::NotKeyValue(word.to_owned()))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_params(algorithm, params)
    }
}

impl fmt::Display for Policy {
    /// The form [`Policy::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.algorithm().name();
        match self {
            Self::TokenBucket(b) => write!(f, "{name} capacity={} rate={}", b.capacity(), b.rate()),
            Self::Gcra(b) => write!(f, "{name} burst={} rate={}", b.capacity(), b.rate()),
            Self::FixedWindow(w) => match w.calendar() {
                Some(calendar) => write!(f, "{name} limit={} {calendar}", w.limit()),
                None => write!(
                    f,
                    "{name} limit={} window={}",
                    w.limit(),
                    DisplayDuration(w.window())
                ),
            },
            Self::SlidingLog(l) => write!(
                f,
                "{name} limit={} window={}",
                l.limit(),
                DisplayDuration(l.window())
            ),
            Self::SlidingCounter(c) => {
                write!(
                    f,
                    "{name} limit={} window={}",
                    c.limit(),
                    DisplayDuration(c.window())
                )
            }
            Self::LeakyBucket(l) => write!(f, "{name} rate={} queue={}", l.rate(), l.queue()),
            Self::Concurrency(c) => write!(
                f,
                "{name} limit={} lease={}",
                c.limit(),
                DisplayDuration(c.lease())
            ),
        }
    }
}

fn gcd128(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_policies_keep_their_share_of_the_limit() {
        let scaled = |spec: &str, num, den| {
            Policy::parse(spec)
                .unwrap()
                .scaled(num, den)
                .unwrap()
                .to_string()
        };
        assert_eq!(
            scaled("token-bucket capacity=10 rate=2/s", 1, 4),
            Policy::parse("token-bucket capacity=2 rate=1/2s")
                .unwrap()
                .to_string()
        );
        assert_eq!(
            scaled("leaky-bucket rate=3/s queue=5", 1, 3),
            Policy::parse("leaky-bucket rate=1/s queue=1")
                .unwrap()
                .to_string()
        );
        assert_eq!(
            scaled("sliding-log limit=2 window=1s", 1, 4),
            Policy::parse("sliding-log limit=1 window=1s")
                .unwrap()
                .to_string()
        );
        assert_eq!(
            scaled("fixed-window limit=100 window=1m", 1, 1),
            Policy::parse("fixed-window limit=100 window=1m")
                .unwrap()
                .to_string()
        );
        let quarter = Policy::parse("gcra burst=4 rate=1/h")
            .unwrap()
            .scaled(250_000, 1_000_000)
            .unwrap();
        let Policy::Gcra(b) = quarter else {
            panic!("{quarter}")
        };
        assert_eq!(
            (b.capacity(), b.rate().tokens(), b.rate().period()),
            (1, 1, 4 * 3_600_000_000_000)
        );
    }

    fn err(algorithm: &str, params: &[(&str, &str)]) -> String {
        Policy::from_params(algorithm, params.iter().copied())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn builds_every_algorithm_and_prints_it_back() {
        for spec in [
            "token-bucket capacity=10 rate=2/s",
            "gcra burst=10 rate=7/1500ms",
            "fixed-window limit=120 window=1m",
            "sliding-log limit=3 window=60s",
            "sliding-counter limit=120 window=1m",
            "leaky-bucket rate=2/s queue=10",
        ] {
            let p = Policy::parse(spec).unwrap();
            assert_eq!(Policy::parse(&p.to_string()).unwrap(), p, "{spec}");
        }
        assert_eq!(
            Policy::parse("sliding-log limit=3 window=60s")
                .unwrap()
                .to_string(),
            "sliding-log limit=3 window=1m"
        );
    }

    #[test]
    fn errors_name_the_field_and_what_is_valid() {
        assert_eq!(
            err("token-bucket", &[("capacity", "0"), ("rate", "2/s")]),
            "`capacity`: `0` is not valid: `0` is not a positive whole number"
        );
        assert_eq!(
            err("token-bucket", &[("capacity", "10")]),
            "`rate`: missing (token-bucket takes capacity, rate)"
        );
        assert_eq!(
            err(
                "token-bucket",
                &[("capacity", "10"), ("rate", "2/s"), ("limit", "3")]
            ),
            "`limit`: not a parameter of token-bucket (it takes capacity, rate)"
        );
        assert!(
            err("token-bucket", &[("capacity", "10"), ("rate", "2/x")])
                .contains("`x` is not a unit")
        );
        assert!(err("fixed-window", &[("limit", "10"), ("window", "-5s")]).starts_with("`window`"));
        assert!(err("sliding-counter", &[("limit", "10000"), ("window", "367d")]).contains("366d"));
        assert!(err("token-bucket", &[("capacity", "10"), ("rate", "1/367d")]).contains("366d"));
        assert!(
            err(
                "fixed-window",
                &[("limit", "1125899906842625"), ("window", "1s")]
            )
            .contains("more than 1125899906842624")
        );
        assert!(err("nope", &[]).contains("valid: token-bucket"));
        assert!(
            err(
                "leaky-bucket",
                &[("rate", "1/s"), ("queue", "1"), ("queue", "2")]
            )
            .contains("more than once")
        );
    }

    #[test]
    fn bounds_are_at_the_edge() {
        // What users write: LLM token budgets and slow refills, at any size
        // up to 2^50 and any window or period up to 366 days.
        for spec in [
            "sliding-counter limit=100000 window=1h",
            "sliding-counter limit=1125899906842624 window=366d",
            "token-bucket capacity=5000 rate=1/h",
            "gcra burst=1125899906842624 rate=1/366d",
            "leaky-bucket rate=7/h queue=1125899906842624",
            "sliding-log limit=1000000 window=366d",
            "fixed-window limit=1125899906842624 window=366d",
        ] {
            assert!(Policy::parse(spec).is_ok(), "{spec}");
        }
        assert!(Policy::fixed_window(MAX_SIZE + 1, 1).is_err());
        assert!(Policy::fixed_window(1, MAX_SPAN + 1).is_err());
        assert!(Policy::sliding_log(MAX_LOG_LIMIT + 1, 1).is_err());
        assert!(Policy::concurrency(MAX_IN_FLIGHT, 1).is_ok());
        assert!(Policy::concurrency(MAX_IN_FLIGHT + 1, 1).is_err());
        assert!(Policy::token_bucket(1, Rate::new(1, MAX_SPAN + 1).unwrap()).is_err());
        assert!(Policy::token_bucket(1, Rate::new(MAX_SIZE + 1, 1).unwrap()).is_err());
        // The period is bounded in lowest terms: two tokens per 732 days
        // are one per 366.
        assert!(Policy::token_bucket(1, Rate::new(2, 2 * MAX_SPAN).unwrap()).is_ok());
    }

    #[test]
    fn cost_errors() {
        let p = Policy::parse("token-bucket capacity=10 rate=2/s").unwrap();
        assert_eq!(p.validate_cost(0), Err(CostError::Zero));
        assert_eq!(
            p.validate_cost(11).unwrap_err().to_string(),
            "cost 11 can never be admitted: it is larger than the policy's capacity (10)"
        );
        let mut s = p.new_state();
        assert!(p.check(&mut s, 0, 11).is_err());
        assert_eq!(s, p.new_state(), "an invalid request changes nothing");
    }

    #[test]
    fn wrong_state_kind_is_a_new_key() {
        let p = Policy::parse("fixed-window limit=1 window=1s").unwrap();
        let mut s = State::Log(Box::default());
        assert!(p.check(&mut s, 0, 1).unwrap().allowed);
        assert!(matches!(s, State::FixedWindow(_)));
    }

    #[test]
    fn reports_go_into_debt_and_checks_of_cost_0_refuse_only_then() {
        const S: Nanos = crate::NANOS_PER_SEC;
        let p = Policy::parse("token-bucket capacity=10 rate=2/s").unwrap();
        let mut s = p.new_state();
        assert!(p.check(&mut s, 0, 0).unwrap().allowed, "no debt: admitted");
        let d = p.report(&mut s, 0, 25).unwrap();
        assert!(d.allowed && d.remaining == 0 && d.delay == 0);
        assert_eq!(
            d.retry_after,
            8 * S,
            "15 tokens of debt and 1 to spend, at 2/s"
        );
        assert!(!p.check(&mut s, S, 0).unwrap().allowed, "in debt: refused");
        assert_eq!(p.report(&mut s, S, 10_000).map(|d| d.allowed), Ok(true));
        assert!(matches!(
            p.report(&mut s, S, 10_001),
            Err(CostError::TooLarge { max: 10_000, .. })
        ));
        let shaper = Policy::parse("leaky-bucket rate=2/s queue=10").unwrap();
        let mut s = shaper.new_state();
        shaper.check(&mut s, 0, 3).unwrap();
        let zero = shaper.check(&mut s, 0, 0).unwrap();
        assert!(
            zero.allowed && zero.delay == 0,
            "a cost of 0 waits for nothing"
        );
    }
}
