//! The one flat answer every algorithm gives.

use crate::Nanos;

/// A lease's identity: chosen by the store, unique per key.
pub type LeaseId = u64;

/// What a check decided, with every duration measured from the time the
/// check was evaluated at (`max(now, last_seen)`), in nanoseconds.
///
/// Durations are exact values rounded **up** to the nanosecond; `remaining`
/// is rounded **down** to a whole token or request and never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Decision {
    /// Whether the request is admitted (and charged).
    pub allowed: bool,
    /// Whole tokens (or requests, or queue slots) left after this decision.
    pub remaining: u64,
    /// 0 when allowed; otherwise the earliest wait after which the same
    /// request would be allowed if nothing else arrived.
    pub retry_after: Nanos,
    /// The wait until the key is back to idle, fully available, if nothing
    /// else arrived.
    pub reset: Nanos,
    /// The wait before an admitted request is released: only the leaky
    /// bucket delays; 0 everywhere else and for every rejection.
    pub delay: Nanos,
    /// The lease an admitted check of a concurrency policy took (its
    /// holder releases or renews it by this identity); `None` everywhere
    /// else, and for a check of cost 0.
    pub lease: Option<LeaseId>,
    /// The wait until the key's ban ends (docs/SPEC.md, "Penalties"): 0
    /// when it is not banned, or its policy has no penalty.
    pub banned: Nanos,
    /// This decision began the ban (a refusal under a penalty).
    pub new_ban: bool,
}

impl Decision {
    #[inline]
    pub(crate) fn rejected(remaining: u64, retry_after: Nanos, reset: Nanos) -> Self {
        Self {
            allowed: false,
            remaining,
            retry_after,
            reset,
            delay: 0,
            lease: None,
            banned: 0,
            new_ban: false,
        }
    }

    #[inline]
    pub(crate) fn allowed(remaining: u64, reset: Nanos) -> Self {
        Self {
            allowed: true,
            remaining,
            retry_after: 0,
            reset,
            delay: 0,
            lease: None,
            banned: 0,
            new_ban: false,
        }
    }
}

/// The longest wait a decision reports: `i64::MAX` ns (292 years), so that
/// every store, the Redis script's signed replies included, reports the same
/// number for a wait beyond it.
pub const MAX_WAIT: Nanos = i64::MAX as Nanos;

/// `ceil(a / b)` as nanoseconds, at most [`MAX_WAIT`]; `b > 0`.
///
/// Most policies keep every quantity below 2^64, so the 64-bit division
/// (several times faster than a 128-bit one) is the path taken.
pub(crate) fn ceil_div(a: u128, b: u128) -> Nanos {
    match (u64::try_from(a), u64::try_from(b)) {
        // Most rates reduce to one token per period: no division at all.
        (Ok(a), Ok(1)) => a.min(MAX_WAIT),
        (Ok(a), Ok(b)) => a.div_ceil(b).min(MAX_WAIT),
        _ => Nanos::try_from(a.div_ceil(b)).map_or(MAX_WAIT, |w| w.min(MAX_WAIT)),
    }
}

/// `floor(a / b)` as a count; `b > 0`. Saturates instead of wrapping.
pub(crate) fn floor_div(a: u128, b: u128) -> u64 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => a / b,
        _ => u64::try_from(a / b).unwrap_or(u64::MAX),
    }
}
