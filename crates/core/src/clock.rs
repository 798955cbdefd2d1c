//! Time is injected: algorithms take `now` as an argument, stores ask a
//! [`Clock`]. The real clock is monotonic (it never jumps back when the wall
//! clock is adjusted) but anchored to the Unix epoch once, at start, so that
//! fixed windows line up with clock minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::Nanos;

/// A source of `now`, in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;

    /// True when readings never go backwards, across threads too: a store
    /// may then skip recording each key's latest time for the clamp.
    fn is_monotonic(&self) -> bool {
        false
    }
}

/// Monotonic time anchored to the Unix epoch when the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    start: Instant,
    epoch_at_start: Nanos,
}

impl SystemClock {
    /// Reads the wall clock once, then counts with [`Instant`].
    pub fn new() -> Self {
        let epoch_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX));
        Self {
            start: Instant::now(),
            epoch_at_start,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        let elapsed = Nanos::try_from(self.start.elapsed().as_nanos()).unwrap_or(Nanos::MAX);
        self.epoch_at_start.saturating_add(elapsed)
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock(Arc<AtomicU64>);

impl FakeClock {
    /// A fake clock reading `now`.
    pub fn at(now: Nanos) -> Self {
        Self(Arc::new(AtomicU64::new(now)))
    }

    /// Moves the clock forward by `by` nanoseconds.
    pub fn advance(&self, by: Nanos) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock, also backwards (to test the clamp).
    pub fn set(&self, now: Nanos) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_epoch_anchored_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        assert!(
            a > 1_600_000_000 * crate::NANOS_PER_SEC,
            "anchored to the Unix epoch"
        );
    }

    #[test]
    fn fake_clock_moves_when_told() {
        let clock = FakeClock::at(5);
        let shared = clock.clone();
        clock.advance(10);
        assert_eq!(shared.now(), 15);
        shared.set(1);
        assert_eq!(clock.now(), 1);
    }
}
