//! weir's in-process limiter: named policies over a concurrent, sharded,
//! bounded store, making exactly the decisions of `weir-core` (SPEC.md).
//!
//! ```
//! use weir_limiter::{Limiter, Policy};
//!
//! let limiter = Limiter::builder()
//!     .policy("per-seller", Policy::parse("token-bucket capacity=10 rate=2/s")?)
//!     .policy("per-endpoint", Policy::parse("sliding-log limit=100 window=1m")?)
//!     .max_keys(1_000_000)
//!     .build()?;
//!
//! // One policy, the real clock.
//! let d = limiter.check_policy("per-seller", "seller-842", 1)?;
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 9);
//!
//! // Several policies at once: all are charged, or none.
//! let all = limiter.check_all(&[("per-seller", "seller-842"), ("per-endpoint", "stock-read")], 1)?;
//! assert!(all.allowed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Concurrency.** Every decision equals the decision of some serial order
//! of the same checks: a check's time is read after it has the key's state,
//! and its update is a compare-and-swap (token bucket, GCRA, leaky bucket) or
//! made under the key's own lock. There is no global lock.
//!
//! **Memory.** A key whose state is back to fully available is removed (it
//! can grant nothing a new key would not), by sweeps that run as shards grow
//! and when the key budget (`max_keys`) runs out. A key that is still limited
//! is **never** evicted to make room — that would reset its allowance and
//! turn a flood of identities into a bypass. When the budget is spent and no
//! key is idle, checks of *new* keys fail with [`Error::TooManyKeys`] (a
//! server should answer them as limited), while known keys go on as before.

mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;
pub use weir_core::{Clock, CostError, Decision, FakeClock, Nanos, Policy, SystemClock};

use store::{Budget, Full, Store};

/// The default bound on stored keys, across every policy.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The default bound on a key's length, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

/// After a full sweep that freed nothing, the next waits this long (so a
/// flood of new identities at the cap costs a rejection, not a sweep, each).
const FULL_SWEEP_INTERVAL: Nanos = 100_000_000;

/// Why a check could not be decided. A rejection is not an error: it is a
/// [`Decision`] with `allowed: false`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    /// No policy has this name.
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    /// The cost can never be admitted under the policy.
    #[error("policy `{policy}`: {error}")]
    Cost {
        /// The policy's name.
        policy: String,
        /// What is wrong with the cost.
        error: CostError,
    },
    /// The key is longer than the limiter accepts.
    #[error("key of {len} bytes is longer than the limit of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The key budget is spent and no key is idle: new keys are refused
    /// (known keys are still decided). Never a reason to let a request in.
    #[error(
        "the limiter holds its maximum of {max} keys and none is idle; new keys are refused until some are"
    )]
    TooManyKeys {
        /// The configured maximum.
        max: usize,
    },
    /// The same (policy, key) pair appears twice in one `check_all`.
    #[error("policy `{policy}` and key `{key}` appear twice in one check")]
    DuplicateCheck {
        /// The policy's name.
        policy: String,
        /// The key.
        key: String,
    },
    /// Two policies with one name, or none at all.
    #[error("{0}")]
    Config(String),
}

/// The outcome of a check over several policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllDecision {
    /// True when every policy allowed, and so every policy was charged.
    pub allowed: bool,
    /// One decision per `(policy, key)` pair, in order. When the request was
    /// rejected, nothing was charged: the policies that refused report their
    /// rejection, and the others `allowed: true` with their `remaining` and
    /// `reset` as they stand (and the `delay` they would have imposed).
    pub decisions: Vec<Decision>,
}

impl AllDecision {
    /// The largest `retry_after` among the rejecting policies (0 if allowed).
    pub fn retry_after(&self) -> Nanos {
        self.decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after)
            .max()
            .unwrap_or(0)
    }
}

#[derive(Debug)]
struct Named {
    name: String,
    store: Store,
}

/// Builds a [`Limiter`].
#[derive(Debug)]
pub struct Builder<C = SystemClock> {
    policies: Vec<(String, Policy)>,
    max_keys: usize,
    max_key_len: usize,
    shards: usize,
    clock: C,
}

impl Builder<SystemClock> {
    fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, usize::from);
        Self {
            policies: Vec::new(),
            max_keys: DEFAULT_MAX_KEYS,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            shards: (cores * 16).next_power_of_two(),
            clock: SystemClock::new(),
        }
    }
}

impl<C: Clock> Builder<C> {
    /// Adds a named policy. The first one added is the one [`Limiter::check`] uses.
    pub fn policy(mut self, name: impl Into<String>, policy: Policy) -> Self {
        self.policies.push((name.into(), policy));
        self
    }

    /// The most keys stored at once, across every policy (default 1,000,000).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// The longest key accepted, in bytes (default 256).
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Shards per policy (rounded up to a power of two; default 16 per core).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// The time source (default: [`SystemClock`]; [`FakeClock`] for tests).
    pub fn clock<D: Clock>(self, clock: D) -> Builder<D> {
        Builder {
            policies: self.policies,
            max_keys: self.max_keys,
            max_key_len: self.max_key_len,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the limiter; fails on no policy or on two with one name.
    pub fn build(self) -> Result<Limiter<C>, Error> {
        if self.policies.is_empty() {
            return Err(Error::Config("a limiter needs at least one policy".into()));
        }
        let mut names = std::collections::HashSet::new();
        if let Some((name, _)) = self.policies.iter().find(|(name, _)| !names.insert(name)) {
            return Err(Error::Config(format!("policy `{name}` is defined twice")));
        }
        Ok(self.assemble())
    }

    /// The limiter, once the policies are known to be valid.
    fn assemble(self) -> Limiter<C> {
        let monotonic = self.clock.is_monotonic();
        let index = self
            .policies
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let policies = self
            .policies
            .into_iter()
            .map(|(name, policy)| Named {
                name,
                store: Store::new(policy, self.shards, monotonic),
            })
            .collect();
        Limiter {
            policies,
            index,
            budget: Budget::new(self.max_keys),
            max_key_len: self.max_key_len,
            clock: self.clock,
            next_full_sweep: AtomicU64::new(0),
        }
    }
}

/// A rate limiter over one or more named policies, safe to share between
/// threads (`Arc<Limiter>`).
#[derive(Debug)]
pub struct Limiter<C = SystemClock> {
    policies: Vec<Named>,
    index: HashMap<String, usize>,
    budget: Budget,
    max_key_len: usize,
    clock: C,
    /// The earliest time a sweep for room may run again.
    next_full_sweep: AtomicU64,
}

impl Limiter<SystemClock> {
    /// A limiter with one policy, named `default`, on the system clock.
    pub fn new(policy: Policy) -> Self {
        Builder::new().policy("default", policy).assemble()
    }

    /// Starts building a limiter with several policies or other settings.
    pub fn builder() -> Builder<SystemClock> {
        Builder::new()
    }
}

impl<C: Clock> Limiter<C> {
    /// Checks `key` against the first policy, at the clock's time.
    pub fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.decide(0, key, cost, &|| self.clock.now())
    }

    /// Checks `key` against the first policy at an explicit time `now` (for
    /// tests and replay; idle keys are still swept at the times given, so keep
    /// them roughly in order).
    pub fn check_at(&self, key: &str, cost: u64, now: Nanos) -> Result<Decision, Error> {
        self.decide(0, key, cost, &|| now)
    }

    /// Checks `key` against the named policy, at the clock's time.
    pub fn check_policy(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.decide(self.find(policy)?, key, cost, &|| self.clock.now())
    }

    /// Checks `key` against the named policy at an explicit time.
    pub fn check_policy_at(
        &self,
        policy: &str,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, Error> {
        self.decide(self.find(policy)?, key, cost, &|| now)
    }

    /// Checks several `(policy, key)` pairs as one request, at the clock's
    /// time: allowed only if every policy allows, and then every policy is
    /// charged; otherwise none is (SPEC.md, several policies).
    pub fn check_all(&self, checks: &[(&str, &str)], cost: u64) -> Result<AllDecision, Error> {
        self.decide_all(checks.iter().map(|&(p, k)| (p, k, cost)), None, Nanos::MAX)
    }

    /// [`Limiter::check_all`] for a caller that will not wait longer than
    /// `max_delay` for a shaper: a request that would is rejected like any
    /// other (nothing charged; its decisions show the delays it would have).
    pub fn check_all_within(
        &self,
        checks: &[(&str, &str)],
        cost: u64,
        max_delay: Nanos,
    ) -> Result<AllDecision, Error> {
        self.decide_all(checks.iter().map(|&(p, k)| (p, k, cost)), None, max_delay)
    }

    /// [`Limiter::check_all_within`] with a cost per `(policy, key, cost)`
    /// check. A cost of 0 charges nothing and reports the key's standing
    /// (`allowed: true`, `remaining`, `reset`) without refusing the request.
    pub fn check_each_within(
        &self,
        checks: &[(&str, &str, u64)],
        max_delay: Nanos,
    ) -> Result<AllDecision, Error> {
        self.decide_all(checks.iter().copied(), None, max_delay)
    }

    /// [`Limiter::check_all`] at an explicit time.
    pub fn check_all_at(
        &self,
        checks: &[(&str, &str)],
        cost: u64,
        now: Nanos,
    ) -> Result<AllDecision, Error> {
        self.decide_all(
            checks.iter().map(|&(p, k)| (p, k, cost)),
            Some(now),
            Nanos::MAX,
        )
    }

    /// The decision checking `key` under the named policy would make now,
    /// charging nothing (for inspection).
    pub fn peek_policy(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        let named = self.validate(self.find(policy)?, key, cost)?;
        let now = self.clock.now();
        named
            .store
            .peek(key, cost, now)
            .map_err(|error| Error::Cost {
                policy: named.name.clone(),
                error,
            })
    }

    /// Forgets `key` under the named policy, which **grants it a fresh
    /// allowance**; returns whether it was stored.
    pub fn reset(&self, policy: &str, key: &str) -> Result<bool, Error> {
        let named = &self.policies[self.find(policy)?];
        Ok(named.store.remove(key, &self.budget))
    }

    /// Removes every key that is idle now (by the limiter's clock); returns
    /// how many. Checks sweep as they go; call this to reclaim memory sooner.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.policies
            .iter()
            .map(|p| p.store.sweep(now, &self.budget))
            .sum()
    }

    /// Keys stored now, across every policy.
    pub fn len(&self) -> usize {
        self.policies.iter().map(|p| p.store.len()).sum()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policies, by name, in the order they were added.
    pub fn policies(&self) -> impl Iterator<Item = (&str, &Policy)> {
        self.policies
            .iter()
            .map(|p| (p.name.as_str(), p.store.policy()))
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn find(&self, policy: &str) -> Result<usize, Error> {
        self.index
            .get(policy)
            .copied()
            .ok_or_else(|| Error::UnknownPolicy(policy.to_owned()))
    }

    fn validate(&self, index: usize, key: &str, cost: u64) -> Result<&Named, Error> {
        let named = &self.policies[index];
        if key.len() > self.max_key_len {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max: self.max_key_len,
            });
        }
        named
            .store
            .policy()
            .validate_cost(cost)
            .map_err(|error| Error::Cost {
                policy: named.name.clone(),
                error,
            })?;
        Ok(named)
    }

    fn decide(
        &self,
        index: usize,
        key: &str,
        cost: u64,
        now: &impl Fn() -> Nanos,
    ) -> Result<Decision, Error> {
        let named = self.validate(index, key, cost)?;
        let cost_error = |error| Error::Cost {
            policy: named.name.clone(),
            error,
        };
        match named.store.check(key, cost, now, &self.budget) {
            Ok(result) => result.map_err(cost_error),
            Err(Full) => {
                self.sweep_when_full(now())?;
                match named.store.check(key, cost, now, &self.budget) {
                    Ok(result) => result.map_err(cost_error),
                    Err(Full) => Err(Error::TooManyKeys {
                        max: self.budget.max(),
                    }),
                }
            }
        }
    }

    /// With the budget spent: sweep everything, unless a sweep ran very
    /// recently, and fail if nothing could be freed.
    fn sweep_when_full(&self, now: Nanos) -> Result<(), Error> {
        let next = self.next_full_sweep.load(Ordering::Acquire);
        // Due, or the clock went back far behind the last sweep.
        let due = now >= next || next - now > FULL_SWEEP_INTERVAL;
        let after = now.saturating_add(FULL_SWEEP_INTERVAL);
        if due
            && self
                .next_full_sweep
                .compare_exchange(next, after, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let freed: usize = self
                .policies
                .iter()
                .map(|p| p.store.sweep(now, &self.budget))
                .sum();
            if freed > 0 {
                // Room again: the next exhaustion may sweep at once.
                self.next_full_sweep.store(0, Ordering::Release);
                return Ok(());
            }
        }
        if self.budget.used() < self.budget.max() {
            return Ok(());
        }
        Err(Error::TooManyKeys {
            max: self.budget.max(),
        })
    }

    fn decide_all<'k>(
        &self,
        checks: impl ExactSizeIterator<Item = (&'k str, &'k str, u64)>,
        at: Option<Nanos>,
        max_delay: Nanos,
    ) -> Result<AllDecision, Error> {
        // Validate everything first: an invalid request charges nothing.
        let mut targets: Vec<(usize, usize, store::Hashed<'_>, u64)> =
            Vec::with_capacity(checks.len());
        for (policy, key, cost) in checks {
            let index = self.find(policy)?;
            // A cost of 0 asks for the standing: any cost is valid for that.
            let named = self.validate(index, key, cost.max(1))?;
            if targets
                .iter()
                .any(|(i, _, k, _)| *i == index && k.key() == key)
            {
                return Err(Error::DuplicateCheck {
                    policy: policy.to_owned(),
                    key: key.to_owned(),
                });
            }
            let hashed = named.store.hashed(key);
            targets.push((index, named.store.shard_of(hashed), hashed, cost));
        }
        // Lock the shards involved in one global order (no deadlock), for
        // writing: no other check of these keys runs until we are done.
        let mut order: Vec<(usize, usize)> = targets.iter().map(|&(p, s, _, _)| (p, s)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<_> = order
            .iter()
            .map(|&(p, s)| self.policies[p].store.lock(s))
            .collect();
        let now = at.unwrap_or_else(|| self.clock.now());
        let guard_of = |p: usize, s: usize| order.binary_search(&(p, s)).unwrap_or(0);
        let cost_error = |p: usize| {
            move |error| Error::Cost {
                policy: self.policies[p].name.clone(),
                error,
            }
        };

        let mut decisions = Vec::with_capacity(targets.len());
        for &(p, s, key, cost) in &targets {
            let store = &self.policies[p].store;
            let guard = &guards[guard_of(p, s)];
            decisions.push(if cost == 0 {
                let (remaining, reset) = store.status_locked(guard, key, now);
                Decision {
                    allowed: true,
                    remaining,
                    reset,
                    ..Decision::default()
                }
            } else {
                store
                    .peek_locked(guard, key, cost, now)
                    .map_err(cost_error(p))?
            });
        }
        if !decisions.iter().all(|d| d.allowed && d.delay <= max_delay) {
            // Nothing is charged: the policies that would have allowed report
            // their standing as it is.
            for (decision, &(p, s, key, _)) in decisions.iter_mut().zip(&targets) {
                if decision.allowed {
                    let store = &self.policies[p].store;
                    (decision.remaining, decision.reset) =
                        store.status_locked(&guards[guard_of(p, s)], key, now);
                }
            }
            return Ok(AllDecision {
                allowed: false,
                decisions,
            });
        }
        for &(p, s, key, _) in targets.iter().filter(|t| t.3 > 0) {
            let store = &self.policies[p].store;
            if store
                .insert_locked(&mut guards[guard_of(p, s)], key, now, &self.budget)
                .is_err()
            {
                // Nothing charged yet (inserting a new key grants nothing).
                return Err(Error::TooManyKeys {
                    max: self.budget.max(),
                });
            }
        }
        for (decision, &(p, s, key, cost)) in decisions.iter_mut().zip(&targets) {
            if cost > 0 {
                let store = &self.policies[p].store;
                *decision = store
                    .check_locked(&guards[guard_of(p, s)], key, cost, now)
                    .map_err(cost_error(p))?;
            }
        }
        Ok(AllDecision {
            allowed: true,
            decisions,
        })
    }
}
