//! Token bucket (and GCRA) and the leaky-bucket shaper share one state: a
//! *level* that drains at the policy's rate and never goes below zero.
//!
//! With the rate reduced to `n` tokens per `p` nanoseconds, a level counted in
//! units of `1/p` token drains by exactly `n` units each nanosecond, so every
//! quantity is an integer: a token bucket's deficit (`capacity − tokens`), or
//! a shaper's backlog (`next − t`), is `level / n` nanoseconds of refill and
//! `level / p` tokens. This is GCRA's theoretical arrival time seen from `t`.

use crate::decision::{ceil_div, floor_div};
use crate::{Decision, Nanos, Rate};

/// The state of one token-bucket, GCRA or leaky-bucket key. The default
/// value is a new key: full bucket, empty queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LevelState {
    /// The latest time this key has seen (docs/SPEC.md's `last_seen`).
    pub seen: Nanos,
    /// Deficit (token bucket) or backlog (shaper) at `seen`, in `1/p` token:
    /// at most the largest report and cost times `p`, below 2^106.
    pub level: u128,
}

impl LevelState {
    /// The evaluation time `t = max(now, seen)` and the level drained to it.
    #[inline]
    pub fn at(self, now: Nanos, rate: Rate) -> (Nanos, u128) {
        let t = now.max(self.seen);
        let drained = u128::from(t - self.seen) * u128::from(rate.tokens());
        (t, self.level.saturating_sub(drained))
    }

    /// Charges `cost` tokens (or slots) at `t`, whatever the level: a
    /// report, which may put a bucket into debt, but never deeper than a
    /// charge of `ceiling` would leave an empty level (docs/SPEC.md's ceiling on
    /// debt: `ceiling` is the largest report).
    pub(crate) fn charge(&mut self, t: Nanos, rate: Rate, cost: u64, ceiling: u64) {
        let (t, level) = self.at(t, rate);
        let period = u128::from(rate.period());
        let charged = level + u128::from(cost) * period;
        *self = Self::new(t, charged.min(u128::from(ceiling) * period));
    }

    fn new(t: Nanos, level: u128) -> Self {
        Self { seen: t, level }
    }
}

/// Token bucket: `capacity` tokens, refilled at `rate`; a new key starts full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    pub(crate) capacity: u64,
    pub(crate) rate: Rate,
}

impl TokenBucket {
    /// The bucket's size.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The pure transition: `(state, now, cost) → (decision, new state)`.
    /// `cost` must be in `1..=capacity` (see [`crate::Policy::check`]).
    ///
    /// Always inlined, as are the other transitions and the stores' paths
    /// down to them: a decision returned through memory is written field by
    /// field and read back in wider words, and the failed store-to-load
    /// forwarding was a measurable part of a check (`docs/BENCHMARKS.md`).
    #[inline(always)]
    pub fn check(&self, state: LevelState, now: Nanos, cost: u64) -> (Decision, LevelState) {
        let (n, p) = (
            u128::from(self.rate.tokens()),
            u128::from(self.rate.period()),
        );
        let (t, deficit) = state.at(now, self.rate);
        let full = u128::from(self.capacity) * p;
        let need = deficit + u128::from(cost) * p;
        let (decision, deficit) = if need <= full {
            let d = Decision::allowed(floor_div(full - need, p), ceil_div(need, n));
            (d, need)
        } else {
            let d = Decision::rejected(
                floor_div(full - deficit.min(full), p),
                ceil_div(need - full, n),
                ceil_div(deficit, n),
            );
            (d, deficit)
        };
        (decision, LevelState::new(t, deficit))
    }
}

/// Leaky-bucket shaper: one slot every `period / tokens`, at most `queue`
/// slots of waiting; admitted work is delayed, never bursts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    pub(crate) rate: Rate,
    pub(crate) queue: u64,
}

impl LeakyBucket {
    /// The release pace.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How many slots may wait.
    pub fn queue(&self) -> u64 {
        self.queue
    }

    /// The pure transition: `(state, now, cost) → (decision, new state)`.
    /// `cost` (slots occupied) must be in `1..=queue`.
    #[inline(always)]
    pub fn check(&self, state: LevelState, now: Nanos, cost: u64) -> (Decision, LevelState) {
        let (n, p) = (
            u128::from(self.rate.tokens()),
            u128::from(self.rate.period()),
        );
        let (t, backlog) = state.at(now, self.rate);
        let bound = u128::from(self.queue) * p;
        let remaining = |backlog: u128| {
            floor_div(
                (u128::from(self.queue) + 1) * p - backlog.min((u128::from(self.queue) + 1) * p),
                p,
            )
        };
        if backlog <= bound {
            let after = backlog + u128::from(cost) * p;
            let decision = Decision {
                // A cost of 0 queues nothing, so it waits for nothing.
                delay: if cost == 0 { 0 } else { ceil_div(backlog, n) },
                ..Decision::allowed(remaining(after), ceil_div(after, n))
            };
            (decision, LevelState::new(t, after))
        } else {
            let decision = Decision::rejected(
                remaining(backlog),
                ceil_div(backlog - bound, n),
                ceil_div(backlog, n),
            );
            (decision, LevelState::new(t, backlog))
        }
    }
}

impl LeakyBucket {
    /// The state after an admitted request of `cost` is released at `start`,
    /// later than [`Self::check`]'s delay (a pacer holding it for other
    /// shapers too): its slots are taken from `start` on.
    pub fn released_at(
        &self,
        state: LevelState,
        now: Nanos,
        start: Nanos,
        cost: u64,
    ) -> LevelState {
        let t = now.max(state.seen);
        let (n, p) = (
            u128::from(self.rate.tokens()),
            u128::from(self.rate.period()),
        );
        LevelState::new(
            t,
            u128::from(start.saturating_sub(t)) * n + u128::from(cost) * p,
        )
    }
}

/// `floor(a · b / c)` without overflow for `a < 2^107` and `b, c < 2^64`,
/// whose quotient fits 128 bits: `(a / c) · b + (a mod c) · b / c`.
fn mul_div(a: u128, b: u64, c: u64, up: bool) -> u128 {
    let (b, c) = (u128::from(b), u128::from(c));
    let (q, r) = (a / c, a % c);
    let rest = r * b;
    let tail = if up { rest.div_ceil(c) } else { rest / c };
    q.saturating_mul(b).saturating_add(tail)
}

impl TokenBucket {
    /// A key's state from `old`'s parameters to these (docs/SPEC.md,
    /// "Changed parameters"): the tokens it held at its latest time, at most
    /// the new capacity; a debt (a report's) in tokens, at most as deep as a
    /// report could leave it now. Fractions of a token round down.
    pub(crate) fn carry(&self, old: &TokenBucket, state: LevelState, deepest: u64) -> LevelState {
        let (p_old, p_new) = (old.rate.period(), self.rate.period());
        let full_old = u128::from(old.capacity) * u128::from(p_old);
        let full_new = u128::from(self.capacity) * u128::from(p_new);
        let level = if state.level <= full_old {
            let tokens = mul_div(full_old - state.level, p_new, p_old, false);
            full_new.saturating_sub(tokens)
        } else {
            full_new + mul_div(state.level - full_old, p_new, p_old, true)
        };
        LevelState::new(
            state.seen,
            level.min(u128::from(deepest) * u128::from(p_new)),
        )
    }
}

impl LeakyBucket {
    /// A key's state from `old`'s parameters to these (docs/SPEC.md,
    /// "Changed parameters"): its backlog in time (`next − t`, rounded up to
    /// the new unit), at most as deep as a report could leave it now.
    pub(crate) fn carry(&self, old: &LeakyBucket, state: LevelState, deepest: u64) -> LevelState {
        let level = mul_div(state.level, self.rate.tokens(), old.rate.tokens(), true);
        let ceiling = u128::from(deepest) * u128::from(self.rate.period());
        LevelState::new(state.seen, level.min(ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    fn bucket(capacity: u64, rate: &str) -> TokenBucket {
        TokenBucket {
            capacity,
            rate: Rate::parse(rate).unwrap(),
        }
    }

    #[test]
    fn half_token_wait() {
        let b = bucket(10, "2/s");
        let mut s = LevelState::default();
        for _ in 0..10 {
            let (d, next) = b.check(s, 0, 1);
            assert!(d.allowed);
            s = next;
        }
        let (d, s) = b.check(s, S / 4, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, S / 4);
        assert_eq!(d.reset, 4 * S + 3 * S / 4);
        let (d, _) = b.check(s, S / 2, 1);
        assert!(d.allowed);
    }

    #[test]
    fn rational_rate_rounds_up() {
        // 3/s: one token every 333_333_333.33 ns.
        let b = bucket(1, "3/s");
        let (d, s) = b.check(LevelState::default(), 0, 1);
        assert!(d.allowed);
        assert_eq!(d.reset, 333_333_334);
        let (d, _) = b.check(s, 1, 1);
        assert_eq!(d.retry_after, 333_333_333);
        let (d, _) = b.check(s, 333_333_333, 1);
        assert!(!d.allowed, "one third of a nanosecond short");
        let (d, _) = b.check(s, 333_333_334, 1);
        assert!(d.allowed);
    }

    #[test]
    fn clock_going_back_is_clamped() {
        let b = bucket(1, "1/s");
        let (_, s) = b.check(LevelState::default(), 10 * S, 1);
        let (d, s2) = b.check(s, 5 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, S);
        assert_eq!(s2.seen, 10 * S);
    }

    #[test]
    fn shaper_queue_of_ten() {
        let l = LeakyBucket {
            rate: Rate::parse("2/s").unwrap(),
            queue: 10,
        };
        let mut s = LevelState::default();
        for k in 0..11 {
            let (d, next) = l.check(s, 0, 1);
            assert!(d.allowed);
            assert_eq!(d.delay, k * S / 2);
            s = next;
        }
        let (d, _) = l.check(s, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, S / 2);
        assert_eq!(d.delay, 0);
    }
}
