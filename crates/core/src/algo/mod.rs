//! The algorithms of docs/SPEC.md, each a pure transition over
//! `(state, now, cost)`: no clock reads, no I/O, no allocation except the
//! sliding log's entries and the concurrency limit's leases.

mod lease;
mod level;
mod log;
mod window;

pub use lease::{Concurrency, Lease, LeaseId, LeaseState, new_lease_id};
pub use level::{LeakyBucket, LevelState, TokenBucket};
pub use log::{Entries, LogState, SlidingLog};
pub use window::{FixedWindow, FixedWindowState, SlidingCounter, SlidingCounterState};
