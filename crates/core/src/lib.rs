//! weir's core: rate-limiting policies and their exact decisions.
//!
//! Every algorithm of weir's docs/SPEC.md — token bucket, GCRA, fixed window,
//! sliding-window log, sliding-window counter, the leaky-bucket shaper, and
//! the concurrency limit (`Policy::Concurrency`, whose leases a release or
//! renewal acts on) —
//! is a pure transition over `(state, now, cost)`: integer nanoseconds, no
//! floating point, no clock reads, no I/O. Stores (in-process, Redis) and
//! faces (simulator, HTTP, Envoy) are shells around these functions, which is
//! why they all make the same decisions to the nanosecond.
//!
//! ```
//! use weir_core::{Policy, NANOS_PER_SEC};
//!
//! let policy = Policy::parse("token-bucket capacity=10 rate=2/s")?;
//! let mut state = policy.new_state();
//! for _ in 0..10 {
//!     assert!(policy.check(&mut state, 0, 1)?.allowed);
//! }
//! // Empty at t = 0; a quarter second later it holds half a token.
//! let d = policy.check(&mut state, NANOS_PER_SEC / 4, 1)?;
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after, NANOS_PER_SEC / 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See [`policy`] for the bounds within which decisions are exact.

pub mod algo;
pub mod check;
pub mod clock;
mod decision;
pub mod penalty;
pub mod policy;
pub mod store;
pub mod units;

pub use check::{AllDecision, Check, CheckError, MAX_IDENTITY};
pub use clock::{Clock, FakeClock, SystemClock};
pub use decision::Decision;
pub use penalty::{Ban, Penalty};
pub use policy::{Algorithm, CostError, Policy, PolicyError, State};
pub use units::{NANOS_PER_SEC, Nanos, Rate};
