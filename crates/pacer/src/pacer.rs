//! Pacing: wait until a request may go to its destination, on docs/SPEC.md's
//! leaky-bucket shaper, per destination and across all of them.
//!
//! A request takes a slot on **every** policy or on none (docs/SPEC.md, several
//! policies), all at one common start, the time it is released. Reserving
//! every policy at that common start is what keeps both promises on the wire:
//! a destination never sees two requests closer than its pace, and no two
//! requests anywhere are closer than the global pace. (Taking each policy's
//! own slot instead would let a request held back by the global cap go out
//! right next to its destination's following one.)
//!
//! - **Per destination**, each shaper is docs/SPEC.md's leaky bucket exactly: with
//!   only per-destination policies, a release is `now + delay` to the
//!   nanosecond. The shaper that sets the common start keeps its exact
//!   (fractional) `next`; the others are reserved from the release time.
//! - **Global** shapers keep their future reservations, so that a request
//!   whose destination is free may take a global slot *before* one reserved
//!   further ahead by a busy destination (a FIFO `next` would make every host
//!   wait behind the busiest one). The global pace holds between any two
//!   releases; the global queue bounds the slots reserved ahead
//!   (`queue` slots, as the shaper's `wait <= queue · T`). Global slots start
//!   on whole nanoseconds, so with a rate such as `3/s` a global shaper may
//!   run up to a nanosecond per request behind docs/SPEC.md's fractional `next`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;
use weir_core::algo::{LeakyBucket, LevelState};
use weir_core::{CostError, Nanos, Policy};

/// Why a request cannot be paced; nothing was charged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PaceError {
    /// A policy's queue is full: waiting would exceed it.
    #[error("the {scope} queue is full; a slot frees in {retry_after:?}")]
    QueueFull {
        /// `destination` or `global`.
        scope: &'static str,
        /// When the same request would fit.
        retry_after: Duration,
    },
    /// The wait would pass the caller's deadline.
    #[error("the wait of {wait:?} would pass the deadline")]
    Deadline {
        /// How long the request would have waited.
        wait: Duration,
    },
    /// A cost no policy could ever take.
    #[error("{0}")]
    Cost(CostError),
    /// A policy that is not a leaky bucket.
    #[error("a pacer needs leaky-bucket policies, not {0}")]
    NotAShaper(String),
}

/// A global shaper's reservations ahead: `(start, length)` in units of
/// `1/n` ns (the rate reduced to `n/p`; a slot of cost `c` is `c·p` long),
/// sorted by start.
#[derive(Debug, Default)]
struct Reservations(Vec<(u128, u128)>);

impl Reservations {
    /// Forgets reservations that ended by `now` (scaled).
    fn prune(&mut self, now: u128) {
        self.0.retain(|&(start, len)| start + len > now);
    }

    /// Slot length still reserved after `now` (scaled).
    fn pending(&self, now: u128) -> u128 {
        self.0
            .iter()
            .map(|&(start, len)| (start + len).saturating_sub(now.max(start)).min(len))
            .sum()
    }

    /// The earliest start `>= from` (scaled) where `len` fits between
    /// reservations.
    fn earliest(&self, from: u128, len: u128) -> u128 {
        let mut at = from;
        for &(start, taken) in &self.0 {
            if start + taken <= at {
                continue;
            }
            if start >= at + len {
                break;
            }
            at = start + taken;
        }
        at
    }

    fn insert(&mut self, start: u128, len: u128) {
        let i = self.0.partition_point(|&(s, _)| s < start);
        self.0.insert(i, (start, len));
    }
}

/// Builds a [`Pacer`].
#[derive(Debug, Default)]
pub struct PacerBuilder {
    per_destination: Vec<LeakyBucket>,
    global: Vec<LeakyBucket>,
}

fn shaper(policy: Policy) -> Result<LeakyBucket, PaceError> {
    match policy {
        Policy::LeakyBucket(l) => Ok(l),
        other => Err(PaceError::NotAShaper(other.to_string())),
    }
}

impl PacerBuilder {
    /// A shaper every destination gets its own copy of.
    pub fn per_destination(mut self, policy: Policy) -> Result<Self, PaceError> {
        self.per_destination.push(shaper(policy)?);
        Ok(self)
    }

    /// A shaper shared by all destinations.
    pub fn global(mut self, policy: Policy) -> Result<Self, PaceError> {
        self.global.push(shaper(policy)?);
        Ok(self)
    }

    /// The pacer; its clock starts now (tokio's clock, so tests can pause it).
    pub fn build(self) -> Pacer {
        let global = self
            .global
            .iter()
            .map(|_| Reservations::default())
            .collect();
        Pacer {
            per_destination: self.per_destination,
            global_policies: self.global,
            origin: Instant::now(),
            state: Mutex::new(State {
                not_before: HashMap::new(),
                global_not_before: None,
                destinations: HashMap::new(),
                global,
                sweep_at: 64,
            }),
        }
    }
}

#[derive(Debug)]
struct State {
    destinations: HashMap<String, Vec<LevelState>>,
    global: Vec<Reservations>,
    sweep_at: usize,
    /// When the next request may actually leave, per destination and
    /// globally, from the last one that did (see [`Pacer::acquire`]).
    not_before: HashMap<String, Instant>,
    global_not_before: Option<Instant>,
}

/// A shaper's rate as `(n, p)`, for its scaled units.
fn scale(policy: &LeakyBucket) -> (u128, u128) {
    (
        u128::from(policy.rate().tokens()),
        u128::from(policy.rate().period()),
    )
}

/// Per-destination pacing with optional global caps. Share it (`Arc`).
#[derive(Debug)]
pub struct Pacer {
    per_destination: Vec<LeakyBucket>,
    global_policies: Vec<LeakyBucket>,
    origin: Instant,
    state: Mutex<State>,
}

/// A granted slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// When the request may be sent.
    pub at: Instant,
    /// How long it waits from the moment it asked.
    pub wait: Duration,
}

impl Pacer {
    /// Starts building a pacer.
    pub fn builder() -> PacerBuilder {
        PacerBuilder::default()
    }

    fn now(&self) -> Nanos {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        Nanos::try_from(elapsed.as_nanos()).unwrap_or(Nanos::MAX)
    }

    /// Reserves a slot for `cost` on every policy and returns when it is,
    /// without waiting. Fails at once, charging nothing, when a queue is full
    /// or the slot is after `deadline`.
    pub fn reserve(
        &self,
        destination: &str,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Result<Slot, PaceError> {
        for &policy in self.per_destination.iter().chain(&self.global_policies) {
            Policy::LeakyBucket(policy)
                .validate_cost(cost)
                .map_err(PaceError::Cost)?;
        }
        let now = self.now();
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        let fresh = vec![LevelState::default(); self.per_destination.len()];
        let own = state.destinations.get(destination).unwrap_or(&fresh);
        // Each destination shaper alone: may it take the request, and when?
        let mut start = now;
        let mut releases = Vec::with_capacity(own.len());
        for (policy, level) in self.per_destination.iter().zip(own) {
            let (decision, _) = policy.check(*level, now, cost);
            if !decision.allowed {
                let retry_after = Duration::from_nanos(decision.retry_after);
                return Err(PaceError::QueueFull {
                    scope: "destination",
                    retry_after,
                });
            }
            let release = now.max(level.seen).saturating_add(decision.delay);
            releases.push(release);
            start = start.max(release);
        }
        // The global shapers: room in their queues, then the earliest whole
        // nanosecond from `start` where every one of them has a free slot.
        for (policy, reserved) in self.global_policies.iter().zip(state.global.iter_mut()) {
            let (n, p) = scale(policy);
            reserved.prune(u128::from(now) * n);
            let pending = reserved.pending(u128::from(now) * n);
            let bound = u128::from(policy.queue()) * p;
            if pending > bound {
                let retry_after = Duration::from_nanos(
                    u64::try_from((pending - bound).div_ceil(n)).unwrap_or(u64::MAX),
                );
                return Err(PaceError::QueueFull {
                    scope: "global",
                    retry_after,
                });
            }
        }
        loop {
            let mut moved = start;
            for (policy, reserved) in self.global_policies.iter().zip(&state.global) {
                let (n, p) = scale(policy);
                let at = reserved.earliest(u128::from(moved) * n, u128::from(cost) * p);
                moved = moved.max(u64::try_from(at.div_ceil(n)).unwrap_or(u64::MAX));
            }
            if moved == start {
                break;
            }
            start = moved;
        }
        let wait = Duration::from_nanos(start - now);
        let at = self.origin + Duration::from_nanos(start);
        if deadline.is_some_and(|deadline| at > deadline) {
            return Err(PaceError::Deadline { wait });
        }
        // Charge every policy at the common start.
        let own = state
            .destinations
            .entry(destination.to_owned())
            .or_insert(fresh);
        for ((policy, level), &release) in self
            .per_destination
            .iter()
            .zip(own.iter_mut())
            .zip(&releases)
        {
            *level = if release == start {
                policy.check(*level, now, cost).1
            } else {
                policy.released_at(*level, now, start, cost)
            };
        }
        for (policy, reserved) in self.global_policies.iter().zip(state.global.iter_mut()) {
            let (n, p) = scale(policy);
            reserved.insert(u128::from(start) * n, u128::from(cost) * p);
        }
        if state.destinations.len() >= state.sweep_at {
            self.sweep(state, now);
        }
        Ok(Slot { at, wait })
    }

    /// Waits until a request of `cost` may go to `destination` (see
    /// [`Pacer::reserve`] for the errors). Dropping the future while it waits
    /// is safe: the slot stays taken (docs/SPEC.md: not refunded), nothing leaks.
    ///
    /// Timers fire at or a little after their time (tokio's, by up to a
    /// millisecond), so on waking the request also waits, if need be, until
    /// one pace after the previous request that actually left for this
    /// destination (and globally): a late waker never puts the next request
    /// closer than the pace on the wire.
    pub async fn acquire(
        &self,
        destination: &str,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Result<Slot, PaceError> {
        let slot = self.reserve(destination, cost, deadline)?;
        tokio::time::sleep_until(slot.at).await;
        loop {
            let until = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                let not_before = state
                    .not_before
                    .get(destination)
                    .copied()
                    .max(state.global_not_before);
                match not_before {
                    Some(until) if until > now => Some(until),
                    _ => {
                        let gap = |policies: &[LeakyBucket]| {
                            let gaps = policies.iter().map(|p| {
                                let (n, period) = scale(p);
                                u64::try_from((u128::from(cost) * period).div_ceil(n))
                                    .unwrap_or(u64::MAX)
                            });
                            now + Duration::from_nanos(gaps.max().unwrap_or(0))
                        };
                        state
                            .not_before
                            .insert(destination.to_owned(), gap(&self.per_destination));
                        state.global_not_before = Some(gap(&self.global_policies));
                        None
                    }
                }
            };
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => return Ok(slot),
            }
        }
    }

    /// Destinations with state now (idle ones are dropped as more arrive).
    pub fn destinations(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .destinations
            .len()
    }

    /// Drops destinations whose every shaper is idle (docs/SPEC.md's idle rule).
    fn sweep(&self, state: &mut State, now: Nanos) {
        let policies = &self.per_destination;
        state.destinations.retain(|_, levels| {
            policies
                .iter()
                .zip(levels.iter())
                .any(|(p, level)| level.seen > now || level.at(now, p.rate()).1 > 0)
        });
        state.sweep_at = (2 * state.destinations.len()).max(64);
        let instant = self.origin + Duration::from_nanos(now);
        state.not_before.retain(|_, until| *until > instant);
    }
}
