//! The two counting windows: fixed (aligned to multiples of the window, so
//! with the real clock a `60s` window is a clock minute) and sliding counter
//! (the previous window's count, weighted by how much of it still overlaps).

use crate::algo::Calendar;
use crate::decision::{ceil_div, floor_div};
use crate::{Decision, Nanos};

/// `(index, offset)` of `t` in aligned windows of length `w`: `(t / w, t % w)`.
/// A check mostly lands in the window of the key's last one (`known`) or the
/// next, which a multiplication finds without a division.
#[inline(always)]
fn locate(t: Nanos, w: Nanos, known: u64) -> (u64, Nanos) {
    if let Some(offset) = known.checked_mul(w).and_then(|start| t.checked_sub(start)) {
        if offset < w {
            return (known, offset);
        }
        if offset - w < w {
            return (known + 1, offset - w);
        }
    }
    (t / w, t % w)
}

/// Fixed window: at most `limit` admitted cost per aligned `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    pub(crate) limit: u64,
    /// The window's length (a calendar's nominal length).
    pub(crate) window: Nanos,
    /// Windows of a calendar instead of multiples of `window`.
    pub(crate) calendar: Option<Calendar>,
}

/// The state of one fixed-window key; the default value is a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FixedWindowState {
    /// The latest time this key has seen.
    pub seen: Nanos,
    /// The window `count` belongs to: its index (`floor(t / window)`),
    /// or a calendar window's start (Unix ns).
    pub index: u64,
    /// Admitted cost in that window.
    pub count: u64,
}

impl FixedWindow {
    /// Admitted cost allowed per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length (a calendar's nominal length: 1, 7, 30 or 365
    /// days).
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// The calendar whose windows these are, if any.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The window holding `t` (its index, or a calendar window's start) and
    /// the time from `t` to its end; `known`, the key's last window, finds
    /// an aligned one without a division.
    #[inline(always)]
    fn place(&self, t: Nanos, known: u64) -> (u64, Nanos) {
        match &self.calendar {
            None => {
                let (index, offset) = locate(t, self.window, known);
                (index, self.window - offset)
            }
            Some(calendar) => {
                let (start, end) = calendar.window(t);
                (start, end - t)
            }
        }
    }

    /// The window holding `t`, as [`FixedWindowState::index`] names it.
    pub fn index_of(&self, t: Nanos) -> u64 {
        self.place(t, 0).0
    }

    /// Charges `cost` at `t`, whatever the count (a report), up to a count
    /// of `ceiling` (the largest report).
    pub(crate) fn charge(
        &self,
        state: FixedWindowState,
        t: Nanos,
        cost: u64,
        ceiling: u64,
    ) -> FixedWindowState {
        let (index, _) = self.place(t, state.index);
        let count = if index == state.index { state.count } else { 0 };
        FixedWindowState {
            seen: t,
            index,
            count: count.saturating_add(cost).min(ceiling),
        }
    }

    /// The pure transition: `(state, now, cost) → (decision, new state)`.
    /// `cost` must be in `1..=limit`.
    #[inline(always)]
    pub fn check(
        &self,
        state: FixedWindowState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, FixedWindowState) {
        let t = now.max(state.seen);
        let (index, to_end) = self.place(t, state.index);
        let count = if index == state.index { state.count } else { 0 };
        let allowed = u128::from(count) + u128::from(cost) <= u128::from(self.limit);
        let count = if allowed { count + cost } else { count };
        let reset = if count > 0 { to_end } else { 0 };
        let remaining = self.limit.saturating_sub(count);
        let decision = if allowed {
            Decision::allowed(remaining, reset)
        } else {
            Decision::rejected(remaining, to_end, reset)
        };
        (
            decision,
            FixedWindowState {
                seen: t,
                index,
                count,
            },
        )
    }
}

/// Sliding-window counter: the current window's count plus the previous
/// window's, weighted by the share of it still inside the sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingCounter {
    pub(crate) limit: u64,
    pub(crate) window: Nanos,
}

/// The state of one sliding-counter key; the default value is a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SlidingCounterState {
    /// The latest time this key has seen.
    pub seen: Nanos,
    /// Index of the window `current` belongs to.
    pub index: u64,
    /// Admitted cost in window `index`.
    pub current: u64,
    /// Admitted cost in window `index - 1`.
    pub previous: u64,
}

impl SlidingCounter {
    /// The limit of the weighted estimate.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// The evaluation time, the window index, and the current and previous
    /// windows' counts at `now` (the state rolled forward).
    #[inline(always)]
    fn roll(&self, state: SlidingCounterState, now: Nanos) -> (Nanos, u64, u64, u64, Nanos) {
        let t = now.max(state.seen);
        let (index, offset) = locate(t, self.window, state.index);
        let (cur, prev) = match index.checked_sub(state.index) {
            Some(0) => (state.current, state.previous),
            Some(1) => (0, state.current),
            _ => (0, 0),
        };
        (t, index, cur, prev, offset)
    }

    /// `(remaining, reset)` with `cur` and `prev` at `t`.
    #[inline(always)]
    fn standing(&self, offset: Nanos, cur: u64, prev: u64) -> (u64, Nanos) {
        let w = u128::from(self.window);
        let left = w - u128::from(offset);
        let used = u128::from(cur) * w + u128::from(prev) * left;
        let remaining = floor_div((u128::from(self.limit) * w).saturating_sub(used), w);
        let reset = match (cur, prev) {
            (0, 0) => 0,
            (0, _) => ceil_div(left, 1),
            _ => ceil_div(left + w, 1),
        };
        (remaining, reset)
    }

    /// Charges `cost` at `t`, whatever the estimate (a report), up to a
    /// current count of `ceiling` (the largest report).
    pub(crate) fn charge(
        &self,
        state: SlidingCounterState,
        t: Nanos,
        cost: u64,
        ceiling: u64,
    ) -> SlidingCounterState {
        let (t, index, cur, prev, _) = self.roll(state, t);
        SlidingCounterState {
            seen: t,
            index,
            current: cur.saturating_add(cost).min(ceiling),
            previous: prev,
        }
    }

    /// `(remaining, reset)` at `now` with no request.
    pub fn status(&self, state: SlidingCounterState, now: Nanos) -> (u64, Nanos) {
        let (_, _, cur, prev, offset) = self.roll(state, now);
        self.standing(offset, cur, prev)
    }

    /// The pure transition: `(state, now, cost) → (decision, new state)`.
    /// `cost` must be in `1..=limit`.
    ///
    /// All comparisons are multiplied through by the window, so that
    /// `cur*W + prev*(W-e) + cost*W <= L*W` decides with integers only.
    #[inline(always)]
    pub fn check(
        &self,
        state: SlidingCounterState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, SlidingCounterState) {
        let (t, index, cur, prev, offset) = self.roll(state, now);
        let w = u128::from(self.window);
        let left = w - u128::from(offset); // W - e, in 1..=W
        let (l, c, cur128, prev128) = (
            u128::from(self.limit),
            u128::from(cost),
            u128::from(cur),
            u128::from(prev),
        );
        let allowed = (cur128 + c) * w + prev128 * left <= l * w;
        let cur = if allowed { cur + cost } else { cur };
        let (remaining, reset) = self.standing(offset, cur, prev);
        let next = SlidingCounterState {
            seen: t,
            index,
            current: cur,
            previous: prev,
        };
        if allowed {
            return (Decision::allowed(remaining, reset), next);
        }
        // Earliest wait at which the estimate leaves room, with no further
        // admissions: within this window while the previous window's weight
        // falls (possible only if `cur + cost <= L`), else in the next one,
        // where `cur` becomes the previous window.
        let retry = if cur128 + c <= l {
            // prev*(left - d) <= (L - cur - cost)*W; prev > 0 or we were allowed.
            left - u128::from(floor_div((l - cur128 - c) * w, prev128))
        } else {
            // cur*(W - e') <= (L - cost)*W with e' = d - left; cur > L - cost >= 0.
            left + w - u128::from(floor_div((l - c) * w, cur128))
        };
        (
            Decision::rejected(remaining, ceil_div(retry, 1), reset),
            next,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    #[test]
    fn fixed_window_double_burst() {
        let f = FixedWindow {
            limit: 120,
            window: 60 * S,
            calendar: None,
        };
        let mut s = FixedWindowState::default();
        for at in [59_900_000_000, 60_100_000_000] {
            for _ in 0..120 {
                let (d, next) = f.check(s, at, 1);
                assert!(d.allowed);
                s = next;
            }
        }
        let (d, _) = f.check(s, 60_100_000_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, 59_900_000_000);
    }

    #[test]
    fn sliding_counter_estimate() {
        // prev = 120, cur = 20, e = 30 s: estimate 80, so 40 more fit.
        let c = SlidingCounter {
            limit: 120,
            window: 60 * S,
        };
        let s = SlidingCounterState {
            seen: 120 * S,
            index: 2,
            current: 20,
            previous: 120,
        };
        let at = 150 * S;
        let (d, _) = c.check(s, at, 40);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        let (d, _) = c.check(s, at, 41);
        assert!(!d.allowed);
        // 20 + 41 + 120 * (W - e - d) / W <= 120 once W - e - d <= 29.5 s.
        assert_eq!(d.retry_after, S / 2);
        assert_eq!(d.reset, 90 * S);
    }

    #[test]
    fn sliding_counter_retry_in_next_window() {
        let c = SlidingCounter {
            limit: 10,
            window: 10 * S,
        };
        let (d, s) = c.check(SlidingCounterState::default(), 5 * S, 10);
        assert!(d.allowed);
        let (d, _) = c.check(s, 5 * S, 1);
        assert!(!d.allowed);
        // Next window starts at 10 s with prev = 10; room for 1 when its
        // weight is 9/10, i.e. 1 s into that window.
        assert_eq!(d.retry_after, 6 * S);
        assert_eq!(d.reset, 15 * S);
    }
}
