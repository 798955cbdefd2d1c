//! The algorithms of docs/SPEC.md, each a pure transition over
//! `(state, now, cost)`: no clock reads, no I/O, no allocation except the
//! sliding log's entries and the concurrency limit's leases.

pub mod calendar;
pub mod grants;
mod lease;
mod level;
mod log;
mod window;

pub use calendar::Calendar;
pub use lease::{Concurrency, Lease, LeaseId, LeaseState, new_lease_id};
pub use level::{LeakyBucket, LevelState, TokenBucket};
pub use log::{Entries, LogState, SlidingLog};
pub use window::{FixedWindow, FixedWindowState, SlidingCounter, SlidingCounterState};

use crate::{Nanos, Rate};

/// What an algorithm knows of its own parameters, beside its transition:
/// each algorithm's type answers for itself, and `Policy` only delegates
/// ([`crate::Policy::parameters`]).
pub trait Parameters {
    /// The quota `q` per window `w` (ns) that `RateLimit-Policy` shows.
    fn quota(&self) -> (u64, Nanos);
    /// The sustained rate: `count` per `period` ns (Envoy's
    /// `requests_per_unit`).
    fn sustained(&self) -> (u64, Nanos);
    /// The largest cost one request may have.
    fn max_cost(&self) -> u64;
    /// The window of a windowed algorithm.
    fn window(&self) -> Option<Nanos> {
        None
    }
    /// The window, for an algorithm whose windows are aligned to multiples
    /// of it.
    fn aligned_window(&self) -> Option<Nanos> {
        None
    }
}

/// `size` units drained at `rate`: the size over the time to drain it,
/// rounded down to the nanosecond.
fn level_quota(size: u64, rate: Rate) -> (u64, Nanos) {
    let window = u128::from(size) * u128::from(rate.period()) / u128::from(rate.tokens());
    (size, Nanos::try_from(window).unwrap_or(Nanos::MAX))
}

/// A token bucket's quota is its capacity over the time to refill it from
/// empty.
impl Parameters for TokenBucket {
    fn quota(&self) -> (u64, Nanos) {
        level_quota(self.capacity, self.rate)
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.rate.tokens(), self.rate.period())
    }
    fn max_cost(&self) -> u64 {
        self.capacity
    }
}

/// A shaper's quota is its queue and the slot being served over the time
/// to drain them.
impl Parameters for LeakyBucket {
    fn quota(&self) -> (u64, Nanos) {
        level_quota(self.queue + 1, self.rate)
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.rate.tokens(), self.rate.period())
    }
    fn max_cost(&self) -> u64 {
        self.queue
    }
}

impl Parameters for FixedWindow {
    fn quota(&self) -> (u64, Nanos) {
        (self.limit, self.window)
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.limit, self.window)
    }
    fn max_cost(&self) -> u64 {
        self.limit
    }
    fn window(&self) -> Option<Nanos> {
        Some(self.window)
    }
    fn aligned_window(&self) -> Option<Nanos> {
        // A calendar's windows are not multiples of one length.
        self.calendar.is_none().then_some(self.window)
    }
}

impl Parameters for SlidingCounter {
    fn quota(&self) -> (u64, Nanos) {
        (self.limit(), self.window())
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.limit(), self.window())
    }
    fn max_cost(&self) -> u64 {
        self.limit()
    }
    fn window(&self) -> Option<Nanos> {
        Some(SlidingCounter::window(self))
    }
    fn aligned_window(&self) -> Option<Nanos> {
        Some(SlidingCounter::window(self))
    }
}

impl Parameters for SlidingLog {
    fn quota(&self) -> (u64, Nanos) {
        (self.limit(), self.window())
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.limit(), self.window())
    }
    fn max_cost(&self) -> u64 {
        self.limit()
    }
    fn window(&self) -> Option<Nanos> {
        Some(SlidingLog::window(self))
    }
}

/// A concurrency limit's quota is its limit per lease (no rate: starts are
/// bounded only by releases).
impl Parameters for Concurrency {
    fn quota(&self) -> (u64, Nanos) {
        (self.limit(), self.lease())
    }
    fn sustained(&self) -> (u64, Nanos) {
        (self.limit(), self.lease())
    }
    fn max_cost(&self) -> u64 {
        self.limit()
    }
}
