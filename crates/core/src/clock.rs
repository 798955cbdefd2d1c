//! Time is injected: algorithms take `now` as an argument, stores ask a
//! [`Clock`]. The real clock never jumps back when the wall clock is adjusted,
//! and is anchored to the Unix epoch once, at start, so that
//! fixed windows line up with clock minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::Nanos;

/// A source of `now`, in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;
}

/// Time since the Unix epoch: the wall clock read once, at start, then
/// counted by a monotonic source.
///
/// The source is the CPU's time-stamp counter, scaled to nanoseconds by
/// [`quanta`] (a few nanoseconds a reading, against 20–30 for
/// `clock_gettime`), where quanta finds the counter invariant and, on
/// Linux, the kernel itself keeps time by it (`current_clocksource` is
/// `tsc`: the kernel has checked that the CPUs' counters agree); otherwise
/// the OS monotonic clock ([`Instant`]). An unfenced counter read may run
/// before the loads that precede it, so two threads' readings can disagree
/// by up to about a microsecond: the stores never depend on readings from
/// different threads being in order (each key keeps the latest time it was
/// decided at, docs/SPEC.md's clamp).
#[derive(Debug, Clone)]
pub struct SystemClock {
    source: Source,
    epoch_at_start: Nanos,
}

#[derive(Debug, Clone)]
enum Source {
    Tsc { clock: quanta::Clock, start: u64 },
    Os(Instant),
}

/// The calibrated counter, if it is safe to count time by on this machine.
fn trusted_tsc() -> Option<quanta::Clock> {
    let kernel_agrees = !cfg!(target_os = "linux")
        || std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|source| source.trim() == "tsc");
    if !kernel_agrees {
        return None;
    }
    // quanta scales counter ticks to nanoseconds; where it fell back to the
    // OS clock, its readings are nanoseconds already and it scales nothing.
    let clock = quanta::Clock::new();
    (clock.delta_as_nanos(0, 1 << 40) != 1 << 40).then_some(clock)
}

impl SystemClock {
    /// Reads the wall clock once, then counts with the fastest trusted
    /// monotonic source.
    pub fn new() -> Self {
        let source = match trusted_tsc() {
            Some(clock) => Source::Tsc {
                start: clock.raw(),
                clock,
            },
            None => Source::Os(Instant::now()),
        };
        let epoch_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX));
        Self {
            source,
            epoch_at_start,
        }
    }

    /// Whether this clock counts with the time-stamp counter.
    pub fn counts_cpu_ticks(&self) -> bool {
        matches!(self.source, Source::Tsc { .. })
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        let elapsed = match &self.source {
            Source::Tsc { clock, start } => clock.delta_as_nanos(*start, clock.raw()),
            Source::Os(start) => Nanos::try_from(start.elapsed().as_nanos()).unwrap_or(Nanos::MAX),
        };
        self.epoch_at_start.saturating_add(elapsed)
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
    fn system_clock_keeps_pace_with_the_os_clock() {
        let clock = SystemClock::new();
        let (start, os) = (clock.now(), Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (counted, real) = (clock.now() - start, os.elapsed().as_nanos() as u64);
        // Calibration error is parts per million; allow 1 %.
        assert!(counted.abs_diff(real) < real / 100, "{counted} vs {real}");
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
