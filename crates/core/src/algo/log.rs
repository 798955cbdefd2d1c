//! Sliding-window log: every admission is remembered until it leaves the
//! window, so the limit holds over *every* window, not only aligned ones.
//!
//! It is the memory-hungry algorithm, so the log is packed: each entry is one
//! LEB128 varint of `gap << 1 | (cost != 1)`, where `gap` is the time since
//! the previous entry in nanoseconds, followed by a varint of the cost only
//! when it is not 1. A burst at one instant costs one byte an entry, one a
//! millisecond three, one every half second five, instead of the sixteen of a
//! `(u64, u64)`. The buffer is compacted as entries expire and grows by a
//! quarter at a time, so it holds little more than the live entries.

use crate::Nanos;
use crate::decision::{Decision, ceil_div};

/// Sliding-window log: at most `limit` admitted cost in any window of
/// length `window` (an admission at `a` is live at `t` while `a > t - W`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    pub(crate) limit: u64,
    pub(crate) window: Nanos,
}

/// The packed log of one key; the default value is a new key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LogState {
    /// The latest time this key has seen.
    seen: Nanos,
    /// Packed `(gap, cost)` entries; those before `head` are already dropped.
    bytes: Vec<u8>,
    head: usize,
    /// The time the gap of the entry at `head` is counted from: the first
    /// entry's own time, or the last dropped entry's.
    base: Nanos,
    /// The time of the newest entry (meaningful while the log is non-empty).
    newest: Nanos,
    /// Sum of the costs from `head` on.
    total: u64,
}

impl LogState {
    /// The latest time this key has seen.
    pub fn seen(&self) -> Nanos {
        self.seen
    }

    /// Entries `(admitted_at, cost)`, oldest first, including any that have
    /// expired but were not dropped yet.
    pub fn entries(&self) -> Entries<'_> {
        Entries {
            bytes: &self.bytes[self.head..],
            time: self.base,
        }
    }

    /// Bytes held for the entries (for memory accounting).
    pub fn packed_len(&self) -> usize {
        self.bytes.len() - self.head
    }

    /// Whether every entry has expired at `t`.
    pub fn is_idle(&self, t: Nanos, window: Nanos) -> bool {
        self.is_empty() || expired(self.newest, t, window)
    }

    fn is_empty(&self) -> bool {
        self.head == self.bytes.len()
    }

    /// Drops entries that are no longer live at `t`.
    fn expire(&mut self, t: Nanos, window: Nanos) {
        while !self.is_empty() {
            let mut rest = Entries {
                bytes: &self.bytes[self.head..],
                time: self.base,
            };
            let Some((at, cost)) = rest.next() else { break };
            if !expired(at, t, window) {
                break;
            }
            self.head = self.bytes.len() - rest.bytes.len();
            self.base = at;
            self.total -= cost;
        }
        if self.is_empty() {
            self.bytes.clear();
            self.head = 0;
        } else if self.head >= 32 && self.head * 4 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
    }

    fn push(&mut self, at: Nanos, cost: u64) {
        if self.is_empty() {
            self.base = at;
            self.newest = at;
        }
        if self.bytes.capacity() - self.bytes.len() < 2 * MAX_VARINT {
            self.bytes
                .reserve_exact(self.bytes.len() / 4 + 2 * MAX_VARINT);
        }
        // Live entries are less than a window (< 2^55 ns) apart: the shift
        // cannot overflow.
        let gap = at - self.newest;
        write_varint(&mut self.bytes, gap << 1 | u64::from(cost != 1));
        if cost != 1 {
            write_varint(&mut self.bytes, cost);
        }
        self.newest = at;
        self.total += cost;
    }
}

/// `a` is live at `t` while `a > t - W`, that is `a + W > t`.
fn expired(at: Nanos, t: Nanos, window: Nanos) -> bool {
    u128::from(at) + u128::from(window) <= u128::from(t)
}

/// Iterator over a packed log's `(admitted_at, cost)` entries.
#[derive(Debug, Clone)]
pub struct Entries<'a> {
    bytes: &'a [u8],
    time: Nanos,
}

impl Iterator for Entries<'_> {
    type Item = (Nanos, u64);

    fn next(&mut self) -> Option<Self::Item> {
        let head = read_varint(&mut self.bytes)?;
        let cost = if head & 1 == 1 {
            read_varint(&mut self.bytes)?
        } else {
            1
        };
        self.time = self.time.saturating_add(head >> 1);
        Some((self.time, cost))
    }
}

const MAX_VARINT: usize = 10;

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

impl SlidingLog {
    /// Admitted cost allowed in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// The transition, in place: drops expired entries, decides, and appends
    /// `(t, cost)` when allowed. `cost` must be in `0..=limit` (0 appends
    /// nothing).
    pub fn check(&self, state: &mut LogState, now: Nanos, cost: u64) -> Decision {
        let t = now.max(state.seen);
        state.seen = t;
        state.expire(t, self.window);
        let newest = (!state.is_empty()).then_some(state.newest);
        let decision = self.decide(t, state.total, state.entries(), newest, cost);
        if decision.allowed && cost > 0 {
            state.push(t, cost);
        }
        decision
    }

    /// Appends `(t, cost)` whatever the live cost (a report), the cost cut
    /// so that the live cost stays at most `ceiling` (the largest report).
    pub(crate) fn charge(&self, state: &mut LogState, t: Nanos, cost: u64, ceiling: u64) {
        state.seen = t;
        state.expire(t, self.window);
        let cost = cost.min(ceiling.saturating_sub(state.total));
        if cost > 0 {
            state.push(t, cost);
        }
    }

    /// The decision [`SlidingLog::check`] would make, without changing the
    /// state (for all-or-nothing checks over several policies).
    pub fn peek(&self, state: &LogState, now: Nanos, cost: u64) -> Decision {
        let t = now.max(state.seen);
        let live = state
            .entries()
            .filter(|&(at, _)| !expired(at, t, self.window));
        let count = live.clone().map(|(_, cost)| cost).sum();
        // Entries are in time order: the newest is live if any is.
        let newest = (count > 0).then_some(state.newest);
        self.decide(t, count, live, newest, cost)
    }

    /// Decides at `t` from the live entries (oldest first), their sum and
    /// the newest one's time (none: no live entry).
    fn decide(
        &self,
        t: Nanos,
        count: u64,
        live: impl Iterator<Item = (Nanos, u64)>,
        newest: Option<Nanos>,
        cost: u64,
    ) -> Decision {
        let until_gone =
            |at: Nanos| ceil_div(u128::from(at) + u128::from(self.window) - u128::from(t), 1);
        let need = u128::from(count) + u128::from(cost);
        let newest = newest.map_or(0, until_gone);
        if need <= u128::from(self.limit) {
            // The newest live entry is this admission itself, made at `t` —
            // unless it charges nothing.
            let reset = if cost == 0 { newest } else { until_gone(t) };
            return Decision::allowed(self.limit - (count + cost), reset);
        }
        // The oldest admission at which the cumulative cost reaches the excess.
        let excess = need - u128::from(self.limit);
        let mut sum = 0u128;
        let retry = live
            .map(|(at, cost)| {
                sum += u128::from(cost);
                (at, sum)
            })
            .find(|&(_, sum)| sum >= excess)
            .map_or(0, |(at, _)| until_gone(at));
        Decision::rejected(self.limit.saturating_sub(count), retry, newest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    #[test]
    fn spec_example() {
        let log = SlidingLog {
            limit: 3,
            window: 60 * S,
        };
        let mut s = LogState::default();
        for at in [0, S / 1000, 30 * S] {
            assert!(log.check(&mut s, at, 1).allowed);
        }
        let d = log.check(&mut s, 59 * S, 1);
        assert!(!d.allowed);
        assert_eq!((d.retry_after, d.reset), (S, 31 * S));
        assert_eq!(
            log.peek(&s, 60 * S, 1),
            log.check(&mut s.clone(), 60 * S, 1)
        );
        assert!(log.check(&mut s, 60 * S, 1).allowed);
        assert!(log.check(&mut s, 60 * S + S / 1000, 1).allowed);
        assert!(!log.check(&mut s, 60 * S + S / 1000, 1).allowed);
    }

    #[test]
    fn packs_compactly_and_compacts() {
        let log = SlidingLog {
            limit: 1_000_000,
            window: S,
        };
        let mut s = LogState::default();
        for i in 0..1000 {
            assert!(log.check(&mut s, i * 1_000_000, 1).allowed);
        }
        // The first entry is 1 byte, then 1 ms gaps take 3.
        assert_eq!(s.packed_len(), 1 + 3 * 999);
        assert!(s.bytes.capacity() <= s.bytes.len() * 5 / 4 + 2 * MAX_VARINT);
        assert_eq!(s.total, 1000);
        assert!(log.check(&mut s, 10 * S, 1).allowed);
        assert_eq!(s.entries().collect::<Vec<_>>(), vec![(10 * S, 1)]);
        assert!(s.bytes.len() < 16);
    }

    #[test]
    fn costs_other_than_one_are_kept() {
        let log = SlidingLog {
            limit: 100,
            window: S,
        };
        let mut s = LogState::default();
        for (at, cost) in [(5, 1), (5, 7), (9, 1), (S + 6, 40)] {
            assert!(log.check(&mut s, at, cost).allowed);
        }
        assert_eq!(s.entries().collect::<Vec<_>>(), vec![(9, 1), (S + 6, 40)]);
        assert_eq!(s.total, 41);
    }

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            let mut slice = out.as_slice();
            assert_eq!(read_varint(&mut slice), Some(v));
            assert!(slice.is_empty());
        }
    }
}
