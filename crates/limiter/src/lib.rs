//! weir's in-process limiter: named policies over a concurrent, sharded,
//! bounded store, making exactly the decisions of `weir-core` (docs/SPEC.md).
//!
//! ```
//! use weir_limiter::{Check, Limiter, Policy};
//!
//! let limiter = Limiter::builder()
//!     .policy("per-seller", Policy::parse("token-bucket capacity=10 rate=2/s")?)
//!     .policy("per-endpoint", Policy::parse("sliding-log limit=100 window=1m")?)
//!     .max_keys(1_000_000)
//!     .build()?;
//!
//! // Resolve each policy once; checks carry the handle, not the name.
//! let seller = limiter.policy("per-seller")?;
//! let endpoint = limiter.policy("per-endpoint")?;
//!
//! let d = limiter.check_one(Check::new(seller, "seller-842"))?;
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 9);
//!
//! // Several policies at once: all are charged, or none.
//! let all = limiter.check_all(&[
//!     Check::new(seller, "seller-842").cost(2),
//!     Check::new(endpoint, "stock-read"),
//! ])?;
//! assert!(all.allowed);
//! assert_eq!(all.decisions[0].remaining, 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Tests drive time by hand with a [`FakeClock`] (`Limiter::builder()
//! .clock(FakeClock::at(0))`): there are no explicit-time variants.
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

mod as_store;
mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use thiserror::Error;
pub use weir_core::algo::LeaseId;
pub use weir_core::{
    AllDecision, CheckError, Clock, CostError, Decision, FakeClock, Nanos, Penalty, Policy,
    SystemClock,
};

use store::{Budget, Full, Op, Store};

/// The default bound on stored keys, across every policy.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The default of [`Builder::max_leases`]: with [`LEASE_BYTES`] each, at
/// most 48 MB of leases.
pub const DEFAULT_MAX_LEASES: usize = 1_000_000;

/// The most memory one lease takes: 24 bytes in its key's queue, which may
/// hold up to twice the live leases as capacity.
pub const LEASE_BYTES: usize = 48;

/// The most policies [`Limiter::ad_hoc`] adds.
pub const AD_HOC: usize = 512;

/// The default bound on a key's length, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = weir_core::MAX_IDENTITY;

/// After a full sweep that freed nothing, the next waits this long (so a
/// flood of new identities at the cap costs a rejection, not a sweep, each).
const FULL_SWEEP_INTERVAL: Nanos = 100_000_000;

/// Why a check could not be decided. A rejection is not an error: it is a
/// [`Decision`] with `allowed: false`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    /// The request can never be decided as given (unknown policy, cost,
    /// key length, a pair named twice): nothing was charged.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// The key budget is spent and no key is idle: new keys are refused
    /// (known keys are still decided). Never a reason to let a request in.
    #[error(
        "the limiter holds its maximum of {max} keys and none is idle; new keys are refused until some are"
    )]
    TooManyKeys {
        /// The configured maximum.
        max: usize,
    },
    /// Two policies with one name, or none at all.
    #[error("{0}")]
    Config(String),
}

/// A policy of one [`Limiter`], resolved once by [`Limiter::policy`]: no
/// name is looked up on the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyId(usize);

impl PolicyId {
    /// The policy's position among the limiter's, in the order added.
    pub fn index(self) -> usize {
        self.0
    }
}

/// One check: a policy, a key and a cost (a cost of 0 reports the key's
/// standing, charging and refusing nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check<'a> {
    /// The policy.
    pub policy: PolicyId,
    /// Whose allowance.
    pub key: &'a str,
    /// The charge.
    pub cost: u64,
    /// Decided and charged as if enforced, but never a reason to refuse
    /// the request: a shadow check that would refuse charges nothing and
    /// keeps its refusal in its decision.
    pub shadow: bool,
    /// A probe (docs/SPEC.md): answered as this check would be, charging
    /// nothing but the key's latest time (and a ban, when refused under a
    /// penalty). A request's checks are all probes or none.
    pub probe: bool,
}

impl<'a> Check<'a> {
    /// A check of cost 1.
    pub fn new(policy: PolicyId, key: &'a str) -> Self {
        Self {
            policy,
            key,
            cost: 1,
            shadow: false,
            probe: false,
        }
    }

    /// This check with another cost.
    pub fn cost(self, cost: u64) -> Self {
        Self { cost, ..self }
    }

    /// This check as a probe (see [`Check::probe`]).
    pub fn probe(self) -> Self {
        Self {
            probe: true,
            ..self
        }
    }

    /// This check in shadow mode (see [`Check::shadow`]).
    pub fn shadow(self) -> Self {
        Self {
            shadow: true,
            ..self
        }
    }
}

#[derive(Debug)]
struct Named {
    name: String,
    /// Shared with the limiter this one was rebuilt from, when the policy
    /// is the same ([`Builder::keep_state_of`]).
    store: Arc<Store>,
    /// The policy's own key budget, within the limiter's.
    budget: Budget,
}

/// Builds a [`Limiter`].
#[derive(Debug)]
pub struct Builder<C = SystemClock> {
    policies: Vec<(String, Policy)>,
    /// Per policy (by name), its penalty.
    penalties: HashMap<String, Penalty>,
    max_keys: usize,
    /// Per policy (by name), a key budget of its own.
    policy_max_keys: HashMap<String, usize>,
    max_leases: usize,
    max_key_len: usize,
    shards: usize,
    clock: C,
    kept: Vec<(String, Arc<Store>)>,
}

impl Builder<SystemClock> {
    fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, usize::from);
        Self {
            policies: Vec::new(),
            penalties: HashMap::new(),
            max_keys: DEFAULT_MAX_KEYS,
            policy_max_keys: HashMap::new(),
            max_leases: DEFAULT_MAX_LEASES,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            shards: (cores * 16).next_power_of_two(),
            clock: SystemClock::new(),
            kept: Vec::new(),
        }
    }
}

impl<C: Clock> Builder<C> {
    /// Adds a named policy. The first one added is the one [`Limiter::check`] uses.
    pub fn policy(mut self, name: impl Into<String>, policy: Policy) -> Self {
        self.policies.push((name.into(), policy));
        self
    }

    /// Gives the named policy a penalty (docs/SPEC.md, "Penalties"): a
    /// check or probe it refuses bans the key, longer each time.
    pub fn penalty(mut self, policy: impl Into<String>, penalty: Penalty) -> Self {
        self.penalties.insert(policy.into(), penalty);
        self
    }

    /// The most keys stored at once, across every policy (default 1,000,000).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// The most keys the named policy may store. A policy without one gets
    /// an equal share of what the others' leave of `max_keys`, as do the
    /// ad-hoc policies together ([`Limiter::ad_hoc`]): the shares add up to
    /// at most `max_keys`, so a flood of identities on one policy never
    /// refuses new identities on another.
    pub fn policy_max_keys(mut self, policy: impl Into<String>, max: usize) -> Self {
        self.policy_max_keys.insert(policy.into(), max);
        self
    }

    /// The most leases the concurrency policies may hold at once, together
    /// (default [`DEFAULT_MAX_LEASES`]): each of the `n` concurrency
    /// policies stores at most `max_leases / n / limit` keys (at least one),
    /// whatever its key budget, since a key holds up to `limit` leases. A
    /// lease takes at most [`LEASE_BYTES`], so this bounds their memory.
    pub fn max_leases(mut self, max: usize) -> Self {
        self.max_leases = max.max(1);
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
            penalties: self.penalties,
            max_keys: self.max_keys,
            policy_max_keys: self.policy_max_keys,
            max_leases: self.max_leases,
            max_key_len: self.max_key_len,
            shards: self.shards,
            clock,
            kept: Vec::new(),
        }
    }

    /// Keeps the keys of `previous` for every policy defined here with the
    /// same name (a configuration reload): with the same parameters the two
    /// limiters share that policy's state; with others each key's state is
    /// carried over where it still means the same ([`Policy::carry`]).
    /// Other policies start afresh.
    pub fn keep_state_of<D>(mut self, previous: &Limiter<D>) -> Self {
        self.kept = previous
            .policies
            .iter()
            .map(|p| (p.name.clone(), p.store.clone()))
            .collect();
        self
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
        let index = self
            .policies
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let kept = self.kept;
        let global = Arc::new(Budget::new(self.max_keys, None));
        let own = self.policy_max_keys;
        let named = |name: &String| own.get(name).copied();
        let explicit = (self.policies.iter().filter_map(|(n, _)| named(n)))
            .fold(0usize, usize::saturating_add);
        let unbudgeted = self
            .policies
            .iter()
            .filter(|(n, _)| named(n).is_none())
            .count();
        // One share more: the ad-hoc policies' pool.
        let share = self.max_keys.saturating_sub(explicit) / (unbudgeted + 1);
        let leased = (self.policies.iter())
            .filter(|(_, p)| matches!(p, Policy::Concurrency(_)))
            .count();
        let leases_each = (self.max_leases / leased.max(1)) as u64;
        let policies: Vec<Named> = self
            .policies
            .into_iter()
            .map(|(name, policy)| {
                let penalty = self.penalties.get(&name).copied();
                let store = match kept.iter().find(|(n, _)| *n == name) {
                    Some((_, s)) if *s.policy() == policy && s.penalty() == penalty => s.clone(),
                    Some((_, s)) => Arc::new(Store::carried(policy, penalty, self.shards, s)),
                    None => Arc::new(Store::new(policy, penalty, self.shards)),
                };
                let mut max = named(&name).unwrap_or(share);
                if let Policy::Concurrency(c) = &policy {
                    let keys = (leases_each / c.limit()).max(1);
                    max = max.min(usize::try_from(keys).unwrap_or(usize::MAX));
                }
                let budget = Budget::new(max, Some(global.clone()));
                // Kept keys count against the new budgets from the start.
                budget.add(store.len());
                Named {
                    name,
                    store,
                    budget,
                }
            })
            .collect();
        Limiter {
            policies,
            index,
            ad_hoc: (0..AD_HOC).map(|_| OnceLock::new()).collect(),
            ad_hoc_names: Mutex::default(),
            ad_hoc_budget: Arc::new(Budget::new(share, Some(global.clone()))),
            budget: global,
            max_key_len: self.max_key_len,
            shards: self.shards,
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
    /// Policies by name (foldhash: a name is looked up per check on the
    /// `Store` face).
    index: HashMap<String, usize, foldhash::fast::RandomState>,
    /// Policies added by name after the build ([`Limiter::ad_hoc`]).
    ad_hoc: Box<[OnceLock<Named>]>,
    ad_hoc_names: Mutex<HashMap<String, usize>>,
    /// The ad-hoc policies' share of the budget, together.
    ad_hoc_budget: Arc<Budget>,
    budget: Arc<Budget>,
    max_key_len: usize,
    shards: usize,
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
    /// The handle of the named policy, to build [`Check`]s with.
    pub fn policy(&self, name: &str) -> Result<PolicyId, Error> {
        self.index
            .get(name)
            .map(|&i| PolicyId(i))
            .ok_or_else(|| CheckError::UnknownPolicy(name.to_owned()).into())
    }

    /// The parameters of the policy called `name` (built in or ad hoc).
    pub fn parameters(&self, name: &str) -> Option<Policy> {
        let index = match self.index.get(name) {
            Some(&i) => i,
            None => {
                let names = self.ad_hoc_names.lock();
                self.policies.len() + *names.unwrap_or_else(PoisonError::into_inner).get(name)?
            }
        };
        self.get(index).map(|named| *named.store.policy())
    }

    /// Lifts the ban of `key` under `policy` (its allowance left as it is);
    /// whether it had one.
    pub fn lift_ban(&self, policy: PolicyId, key: &str) -> Result<bool, Error> {
        Ok(self.named(policy)?.store.lift_ban(key))
    }

    /// The penalty of the policy called `name`, if it has one.
    pub fn penalty(&self, name: &str) -> Option<Penalty> {
        let &index = self.index.get(name)?;
        self.get(index)?.store.penalty()
    }

    /// Checks `key` against the first policy added, at the clock's time.
    #[inline]
    pub fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_one(Check::new(PolicyId(0), key).cost(cost))
    }

    /// Decides one check at the clock's time.
    ///
    /// Always inlined into its caller, as the store's path beneath it is:
    /// called, it returns the decision through memory, and the caller
    /// reads back what it just wrote, measurably on a hot key's check
    /// (`docs/BENCHMARKS.md`).
    #[inline(always)]
    pub fn check_one(&self, check: Check<'_>) -> Result<Decision, Error> {
        let named = self.validate(check)?;
        let op = if check.probe { Op::Probe } else { Op::Check };
        self.charge(named, check, op)
    }

    /// Charges usage known only after the fact (docs/SPEC.md, a *report*): always
    /// charged — possibly into debt, which later checks are refused for
    /// until it is paid back — and answered `allowed`, with `retry_after`
    /// the wait until a check of cost 1 would be allowed. The cost may be up
    /// to 1,000 times the policy's capacity (or limit, or queue).
    ///
    /// The LLM pattern: admit with [`Limiter::check_one`] of the expected
    /// cost (or 1, or 0 to refuse only while in debt), then report the
    /// actual cost minus what the check charged.
    pub fn report(&self, check: Check<'_>) -> Result<Decision, Error> {
        let named = self.validate_report(check)?;
        self.charge(named, check, Op::Report)
    }

    /// Reports usage to several policies at once (one request's tokens
    /// against a per-minute and a per-day budget, say): every report is
    /// validated before any is charged, then every one is charged.
    pub fn report_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, Error> {
        let named = checks
            .iter()
            .map(|&c| self.validate_report(c))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, a) in checks.iter().enumerate() {
            if checks[..i]
                .iter()
                .any(|b| b.policy == a.policy && b.key == a.key)
            {
                return Err(CheckError::DuplicateCheck {
                    policy: named[i].name.clone(),
                    key: a.key.to_owned(),
                }
                .into());
            }
        }
        named
            .into_iter()
            .zip(checks)
            .map(|(named, &check)| self.charge(named, check, Op::Report))
            .collect()
    }

    /// The policy of a report, once its key and cost are valid.
    fn validate_report(&self, check: Check<'_>) -> Result<&Named, Error> {
        let named = self.named(check.policy)?;
        weir_core::check::check_key(check.key, self.max_key_len)?;
        (named.store.policy().validate_report(check.cost)).map_err(|e| cost_error(named, e))?;
        Ok(named)
    }

    /// Decides one check. The common path is inlined into the caller and
    /// hands the decision back in registers; the rest is out of line.
    #[inline(always)]
    fn charge(&self, named: &Named, check: Check<'_>, op: Op) -> Result<Decision, Error> {
        // Read before the key's lookup, so that the clock's latency overlaps it.
        let now = self.clock.now();
        match named
            .store
            .check(check.key, check.cost, now, &named.budget, op)
        {
            Ok(Ok(decision)) => Ok(decision),
            Ok(Err(error)) => Err(cost_error(named, error)),
            Err(Full) => self.charge_when_full(named, check, op),
        }
    }

    /// [`Self::charge`] when the key budget was spent: sweeps idle keys,
    /// then tries once more.
    #[cold]
    #[inline(never)]
    fn charge_when_full(&self, named: &Named, check: Check<'_>, op: Op) -> Result<Decision, Error> {
        let now = self.clock.now();
        self.sweep_when_full(now, &named.budget)?;
        match named
            .store
            .check(check.key, check.cost, now, &named.budget, op)
        {
            Ok(result) => result.map_err(|error| cost_error(named, error)),
            Err(Full) => Err(Error::TooManyKeys {
                max: named.budget.spent().unwrap_or(self.budget.max()),
            }),
        }
    }

    /// Decides several checks as one request, at the clock's time: allowed
    /// only if every policy allows, and then every policy is charged;
    /// otherwise none is (docs/SPEC.md, several policies). A check of cost 0
    /// reports its key's standing without refusing the request.
    pub fn check_all(&self, checks: &[Check<'_>]) -> Result<AllDecision, Error> {
        self.check_all_within(checks, Nanos::MAX)
    }

    /// [`Limiter::check_all`] for a caller that will not wait longer than
    /// `max_delay` for a shaper: a request that would is rejected like any
    /// other (nothing charged; its decisions show the delays it would have).
    pub fn check_all_within(
        &self,
        checks: &[Check<'_>],
        max_delay: Nanos,
    ) -> Result<AllDecision, Error> {
        // One check that charges, and that no shaper bound can refuse, is
        // decided as a single check: the same decision and state, without
        // write-locking its shard.
        if let [check] = checks
            && check.cost > 0
            && (max_delay == Nanos::MAX
                || !matches!(
                    self.named(check.policy)?.store.policy(),
                    Policy::LeakyBucket(_)
                ))
        {
            let decision = self.check_one(*check)?;
            return Ok(AllDecision {
                allowed: decision.allowed || check.shadow,
                decisions: vec![decision],
            });
        }
        self.decide_all(checks, max_delay)
    }

    /// The decision the check would make now, charging nothing (for
    /// inspection); `None` when the key is not stored (it would be decided
    /// as a new key: its full allowance).
    pub fn peek(&self, check: Check<'_>) -> Result<(Decision, bool), Error> {
        let named = self.validate(Check {
            cost: check.cost.max(1),
            ..check
        })?;
        let now = self.clock.now();
        let cost = check.cost.max(1);
        let stored = named.store.contains(check.key);
        let decision =
            named
                .store
                .peek(check.key, cost, now)
                .map_err(|error| CheckError::Cost {
                    policy: named.name.clone(),
                    error,
                })?;
        Ok((decision, stored))
    }

    /// Whether `key` has state under `policy`.
    pub fn contains(&self, policy: PolicyId, key: &str) -> bool {
        self.named(policy)
            .is_ok_and(|named| named.store.contains(key))
    }

    /// Forgets `key` under `policy`, which **grants it a fresh allowance**;
    /// returns whether it was stored.
    pub fn reset(&self, policy: PolicyId, key: &str) -> Result<bool, Error> {
        let named = self.named(policy)?;
        Ok(named.store.remove(key, &named.budget))
    }

    /// Removes every key that is idle now (by the limiter's clock); returns
    /// how many. Checks sweep as they go; call this to reclaim memory sooner.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.all().map(|p| p.store.sweep(now, &p.budget)).sum()
    }

    /// Keys stored now, across every policy.
    pub fn len(&self) -> usize {
        self.all().map(|p| p.store.len()).sum()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the named policy shares its keys with `other` (one was built
    /// from the other with [`Builder::keep_state_of`] and kept them).
    pub fn shares_state_with<D>(&self, other: &Limiter<D>, policy: &str) -> bool {
        let store = |l: &[Named]| l.iter().find(|p| p.name == policy).map(|p| p.store.clone());
        match (store(&self.policies), store(&other.policies)) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a, &b),
            _ => false,
        }
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

    fn named(&self, policy: PolicyId) -> Result<&Named, Error> {
        self.get(policy.0)
            .ok_or_else(|| CheckError::UnknownPolicy(format!("#{}", policy.0)).into())
    }

    /// A policy by index: those built in, then the ad-hoc ones.
    fn get(&self, index: usize) -> Option<&Named> {
        match index.checked_sub(self.policies.len()) {
            None => self.policies.get(index),
            Some(i) => self.ad_hoc.get(i)?.get(),
        }
    }

    /// A policy known to exist (checked by `named` when resolving).
    fn at(&self, index: usize) -> &Named {
        // Every index reaching here was resolved by `named` first.
        self.get(index).unwrap_or(&self.policies[0])
    }

    /// Every policy: those built in, then the ad-hoc ones.
    fn all(&self) -> impl Iterator<Item = &Named> {
        self.policies
            .iter()
            .chain(self.ad_hoc.iter().filter_map(OnceLock::get))
    }

    /// The policy called `name`, added if it is new: for limits known only
    /// when a request names them (Envoy's per-descriptor `limit`). The same
    /// name is always the same policy and state; at most [`AD_HOC`] of them,
    /// each with its keys in the limiter's budget.
    pub fn ad_hoc(&self, name: &str, policy: Policy) -> Result<PolicyId, Error> {
        self.ad_hoc_with(name, policy, None, None)
    }

    /// [`Limiter::ad_hoc`] under `penalty` (a per-key limit of a penalised
    /// policy bans as the policy does).
    pub fn ad_hoc_penalized(
        &self,
        name: &str,
        policy: Policy,
        penalty: Option<Penalty>,
    ) -> Result<PolicyId, Error> {
        self.ad_hoc_with(name, policy, penalty, None)
    }

    /// [`Limiter::ad_hoc`] for the ad-hoc policy `name` of `previous` (an
    /// earlier limiter of the same configuration), with its keys: the two
    /// share its state from now on. Nothing when `previous` has none.
    pub fn adopt_ad_hoc<D>(&self, name: &str, previous: &Limiter<D>) -> Option<PolicyId> {
        let named = previous
            .ad_hoc
            .iter()
            .filter_map(OnceLock::get)
            .find(|n| n.name == name)?;
        let policy = *named.store.policy();
        self.ad_hoc_with(name, policy, None, Some(named.store.clone()))
            .ok()
    }

    fn ad_hoc_with(
        &self,
        name: &str,
        policy: Policy,
        penalty: Option<Penalty>,
        store: Option<Arc<Store>>,
    ) -> Result<PolicyId, Error> {
        if let Some(&i) = self.index.get(name) {
            return Ok(PolicyId(i));
        }
        let mut names = self
            .ad_hoc_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(&slot) = names.get(name) {
            return Ok(PolicyId(self.policies.len() + slot));
        }
        let slot = names.len();
        let cell = self.ad_hoc.get(slot).ok_or_else(|| {
            Error::Config(format!(
                "at most {AD_HOC} ad-hoc policies; `{name}` is one more"
            ))
        })?;
        let store = store.unwrap_or_else(|| Arc::new(Store::new(policy, penalty, self.shards)));
        let budget = Budget::new(usize::MAX, Some(self.ad_hoc_budget.clone()));
        // Kept keys count against the budget from the start.
        budget.add(store.len());
        let _ = cell.set(Named {
            name: name.to_owned(),
            store,
            budget,
        });
        names.insert(name.to_owned(), slot);
        Ok(PolicyId(self.policies.len() + slot))
    }

    /// Releases the lease `lease` of `key` under a concurrency policy
    /// (docs/SPEC.md): `allowed` is whether it was live, with the standing
    /// after it. A lease is released once; an identity that is not a live
    /// lease of this key (expired, released, or another key's) frees
    /// nothing.
    pub fn release(&self, policy: PolicyId, key: &str, lease: LeaseId) -> Result<Decision, Error> {
        self.on_lease(policy, key, Op::Release(lease))
    }

    /// Extends the live lease `lease` of `key` to the policy's full lease
    /// from now; `allowed` is whether it was live (an expired lease is not
    /// brought back).
    pub fn renew(&self, policy: PolicyId, key: &str, lease: LeaseId) -> Result<Decision, Error> {
        self.on_lease(policy, key, Op::Renew(lease))
    }

    /// [`Limiter::check_all`], with a guard for every lease the admission
    /// took (its concurrency policies'): each is released when its guard
    /// drops — when the work ends, however it ends.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use weir_limiter::{Check, Limiter, Policy};
    ///
    /// let limiter = Arc::new(Limiter::new(Policy::parse("concurrency limit=2 lease=10m")?));
    /// let jobs = limiter.policy("default")?;
    /// let (first, guards) = limiter.acquire(&[Check::new(jobs, "tenant-7")])?;
    /// assert!(first.allowed && guards.len() == 1);
    /// let (_, _second) = limiter.acquire(&[Check::new(jobs, "tenant-7")])?;
    /// assert!(!limiter.check_all(&[Check::new(jobs, "tenant-7")])?.allowed);
    /// drop(guards); // the first job ended
    /// assert!(limiter.check_all(&[Check::new(jobs, "tenant-7").cost(0)])?.decisions[0].remaining == 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(
        self: &Arc<Self>,
        checks: &[Check<'_>],
    ) -> Result<(AllDecision, Vec<LeaseGuard<C>>), Error> {
        let all = self.check_all(checks)?;
        let guards = checks
            .iter()
            .zip(&all.decisions)
            .filter_map(|(check, d)| {
                Some(LeaseGuard {
                    limiter: Arc::clone(self),
                    policy: check.policy,
                    key: check.key.to_owned(),
                    id: d.lease?,
                    done: false,
                })
            })
            .collect();
        Ok((all, guards))
    }

    fn on_lease(&self, policy: PolicyId, key: &str, op: Op) -> Result<Decision, Error> {
        let named = self.named(policy)?;
        weir_core::check::check_key(key, self.max_key_len)?;
        if !matches!(named.store.policy(), Policy::Concurrency(_)) {
            return Err(cost_error(named, weir_core::CostError::NoLeases));
        }
        self.charge(named, Check::new(policy, key).cost(0), op)
    }

    /// The check as `weir-core` validates it, with its policy's name.
    fn resolve<'a>(&'a self, check: &Check<'a>) -> Result<weir_core::Check<'a>, Error> {
        let named = self.named(check.policy)?;
        Ok(weir_core::Check {
            name: &named.name,
            policy: named.store.policy(),
            key: check.key,
            cost: check.cost,
        })
    }

    /// A single check, validated as `weir-core` validates one (a standing
    /// report, cost 0, is validated as cost 1).
    fn validate(&self, check: Check<'_>) -> Result<&Named, Error> {
        let named = self.named(check.policy)?;
        named
            .store
            .policy()
            .validate_cost(check.cost.max(1))
            .map_err(|e| cost_error(named, e))?;
        weir_core::check::check_key(check.key, self.max_key_len)?;
        Ok(named)
    }

    /// With the budget spent: sweep everything, unless a sweep ran very
    /// recently, and fail if nothing could be freed.
    fn sweep_when_full(&self, now: Nanos, budget: &Budget) -> Result<(), Error> {
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
            let freed: usize = self.all().map(|p| p.store.sweep(now, &p.budget)).sum();
            if freed > 0 {
                // Room again: the next exhaustion may sweep at once.
                self.next_full_sweep.store(0, Ordering::Release);
                return Ok(());
            }
        }
        match budget.spent() {
            None => Ok(()),
            Some(max) => Err(Error::TooManyKeys { max }),
        }
    }

    fn decide_all(&self, checks: &[Check<'_>], max_delay: Nanos) -> Result<AllDecision, Error> {
        // Validate everything first: an invalid request charges nothing.
        let resolved = checks
            .iter()
            .map(|c| self.resolve(c))
            .collect::<Result<Vec<_>, _>>()?;
        weir_core::check::validate(&resolved, self.max_key_len)?;
        let mut targets: Vec<(usize, usize, store::Hashed<'_>, u64)> = checks
            .iter()
            .map(|c| {
                let store = &self.at(c.policy.0).store;
                let hashed = store.hashed(c.key);
                (c.policy.0, store.shard_of(hashed), hashed, c.cost)
            })
            .collect();
        // Lock the shards involved in one global order (no deadlock), for
        // writing: no other check of these keys runs until we are done.
        let mut order: Vec<(usize, usize)> = targets.iter().map(|&(p, s, _, _)| (p, s)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<_> = order
            .iter()
            .map(|&(p, s)| self.at(p).store.lock(s))
            .collect();
        let now = self.clock.now();
        let guard_of = |p: usize, s: usize| order.binary_search(&(p, s)).unwrap_or(0);
        let mut decisions = targets
            .iter()
            .map(|&(p, s, key, cost)| {
                let named = self.at(p);
                let guard = &guards[guard_of(p, s)];
                (named.store.decide_locked(guard, key, cost, now)).map_err(|e| cost_error(named, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A probe waits for no shaper and takes no lease.
        for (decision, check) in decisions.iter_mut().zip(checks) {
            if check.probe {
                (decision.delay, decision.lease) = (0, None);
            }
        }
        let refuses = |d: &Decision| !d.allowed || d.delay > max_delay;
        let enforced_refuse = decisions
            .iter()
            .zip(checks)
            .any(|(d, c)| !c.shadow && refuses(d));
        if enforced_refuse {
            // Nothing is charged: the policies that would have allowed report
            // their standing as it is; a policy with a penalty that refused
            // bans its key (docs/SPEC.md, "Penalties").
            for (decision, &(p, s, key, cost)) in decisions.iter_mut().zip(&targets) {
                let store = &self.at(p).store;
                if !decision.allowed && decision.banned == 0 && store.penalty().is_some() {
                    let guard = &guards[guard_of(p, s)];
                    *decision = (store.check_locked(guard, key, cost, now))
                        .map_err(|e| cost_error(self.at(p), e))?;
                } else if decision.allowed {
                    let store = &self.at(p).store;
                    (decision.remaining, decision.reset) =
                        store.status_locked(&guards[guard_of(p, s)], key, now);
                }
            }
            return Ok(AllDecision {
                allowed: false,
                decisions,
            });
        }
        // A shadow check that would refuse charges nothing (a penalty bans
        // as if enforced), and a probe nothing ever (cost 0 below: the
        // key's latest time moves).
        for ((target, decision), check) in targets.iter_mut().zip(&mut decisions).zip(checks) {
            if check.shadow && refuses(decision) {
                let (p, s, key, cost) = *target;
                let store = &self.at(p).store;
                if !decision.allowed && decision.banned == 0 && store.penalty().is_some() {
                    *decision = (store.check_locked(&guards[guard_of(p, s)], key, cost, now))
                        .map_err(|e| cost_error(self.at(p), e))?;
                }
                target.3 = 0;
            }
            if check.probe {
                target.3 = 0;
            }
        }
        for &(p, s, key, _) in targets.iter().filter(|t| t.3 > 0) {
            let named = self.at(p);
            if named
                .store
                .insert_locked(&mut guards[guard_of(p, s)], key, now, &named.budget)
                .is_err()
            {
                // Nothing charged yet (inserting a new key grants nothing).
                return Err(Error::TooManyKeys {
                    max: named.budget.spent().unwrap_or(self.budget.max()),
                });
            }
        }
        for (decision, &(p, s, key, cost)) in decisions.iter_mut().zip(&targets) {
            let named = self.at(p);
            let charged = (named.store)
                .check_locked(&guards[guard_of(p, s)], key, cost, now)
                .map_err(|e| cost_error(named, e))?;
            // A standing (cost 0) charges nothing but moves the key's latest
            // time, as any check does; its answer is the standing above.
            if cost > 0 {
                *decision = charged;
            }
        }
        Ok(AllDecision {
            allowed: true,
            decisions,
        })
    }
}

/// A concurrency policy's lease ([`Limiter::acquire`]): released when
/// dropped, or by [`LeaseGuard::release`]; renewed by
/// [`LeaseGuard::renew`] while the work outlasts the policy's lease.
#[derive(Debug)]
pub struct LeaseGuard<C: Clock = SystemClock> {
    limiter: Arc<Limiter<C>>,
    policy: PolicyId,
    key: String,
    id: LeaseId,
    done: bool,
}

impl<C: Clock> LeaseGuard<C> {
    /// The lease's identity.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// Extends the lease to the policy's full lease from now; `allowed` is
    /// whether it was still live (an expired lease is not brought back).
    pub fn renew(&self) -> Result<Decision, Error> {
        self.limiter.renew(self.policy, &self.key, self.id)
    }

    /// Releases the lease now, answering whether it was still live.
    pub fn release(mut self) -> Result<Decision, Error> {
        self.done = true;
        self.limiter.release(self.policy, &self.key, self.id)
    }
}

impl<C: Clock> Drop for LeaseGuard<C> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.limiter.release(self.policy, &self.key, self.id);
        }
    }
}

/// A cost the policy cannot take, named by the policy.
#[cold]
fn cost_error(named: &Named, error: weir_core::CostError) -> Error {
    Error::from(CheckError::Cost {
        policy: named.name.clone(),
        error,
    })
}
