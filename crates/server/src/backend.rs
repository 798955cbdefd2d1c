//! Where decisions are made: one [`Backend`], in process or on Redis. On
//! Redis, the circuit breaker and each policy's store-error rule live here:
//! a store error is never an exhausted bucket — it is decided by the
//! policy's `on_store_error` rule (the local fallback, allow or deny),
//! marked degraded and counted.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::{AllDecision, CheckError, Decision, MAX_IDENTITY, Nanos};
use weir_limiter::Limiter;
use weir_redis::LeaseOp;
use weir_redis::{Mode, StoreError};

use crate::breaker::Remote;
use crate::config::{Config, OnStoreError, StoreUrl, TableId};
use crate::metrics::Meters;
use crate::table::{Outcome, PolicyTable};
use crate::telemetry::Traced;
use weir_tower::Part;

/// A request's policies, checks or parts: a few, kept on the stack (a
/// route or a call names up to four without allocating).
pub(crate) type Few<T> = smallvec::SmallVec<[T; 4]>;

/// The longest stored key: a scope (`header:NAME:`, `path:PARAM:`,
/// `envoy:…`) and an identity of at most [`MAX_IDENTITY`] bytes, escaped
/// where it is (up to three bytes each).
pub const MAX_KEY: usize = 3 * MAX_IDENTITY + 256;

/// One check of a request, its policy resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check<'a> {
    /// The policy.
    pub policy: TableId,
    /// The stored key (scope and identity).
    pub key: &'a str,
    /// The charge; 0 reports the key's standing.
    pub cost: u64,
}

/// Why a request could not be decided — never a rate limit's refusal,
/// which is a decision (`allowed: false`).
#[derive(Debug)]
pub(crate) enum Undecided {
    /// The request is invalid (cost, key, a pair named twice): nothing
    /// charged.
    Invalid(CheckError),
    /// The in-process key budget is spent and no key is idle.
    Full { max: usize },
    /// The store cannot decide this request (a Redis Cluster and checks of
    /// several identities): nothing charged.
    Unsupported(&'static str),
    /// The store failed and a policy's rule (or the face's default) is to
    /// refuse: fail closed (`denied`), or let the caller decide (Envoy).
    Unavailable { denied: bool },
    /// The client has created its share of new keys and this request would
    /// create one (`[server] new_keys_per_ip`): wait this long.
    NewKeys(Nanos),
}

/// Whether a request may store keys that do not exist yet: a client that
/// has created its share of new keys (`[server] new_keys_per_ip`) may only
/// use the keys it has. On Redis, the script tells a missing key: the
/// request is then refused, storing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NewKeys {
    /// New keys may be stored.
    Allowed,
    /// Only existing keys; the client's share comes back after this long.
    Refused(Nanos),
}

impl From<weir_limiter::Error> for Undecided {
    fn from(e: weir_limiter::Error) -> Self {
        match e {
            weir_limiter::Error::Invalid(e) => Self::Invalid(e),
            weir_limiter::Error::TooManyKeys { max } => Self::Full { max },
            // A built limiter never reports its configuration again.
            other => Self::Invalid(CheckError::UnknownPolicy(other.to_string())),
        }
    }
}

/// A request's decision.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// Every policy's decision, in the request's order.
    pub(crate) all: AllDecision,
    /// Decided without the shared store (by `on_store_error`).
    pub(crate) degraded: bool,
    /// The longest shaper delay the caller accepted.
    max_delay: Nanos,
    /// Per check: its policy is in shadow mode.
    shadow: Few<bool>,
    /// Keys this decision stored that did not exist before (Redis only: in
    /// process, [`NewKeys`] is known before the decision).
    pub(crate) created: usize,
}

impl Verdict {
    /// Whether `decision` would refuse: its policy refused, or a shaper
    /// would delay longer than the caller accepts.
    fn would_refuse(&self, decision: &Decision) -> bool {
        !decision.allowed || decision.delay > self.max_delay
    }

    /// Whether check `i` is in shadow mode.
    pub(crate) fn is_shadow(&self, i: usize) -> bool {
        self.shadow.get(i).copied().unwrap_or(false)
    }

    /// Whether check `i` refuses the request (an enforced policy that
    /// would refuse).
    pub(crate) fn refuses(&self, i: usize) -> bool {
        !self.is_shadow(i)
            && self
                .all
                .decisions
                .get(i)
                .is_some_and(|d| self.would_refuse(d))
    }

    /// Whether check `i` is a shadow policy that would have refused.
    pub(crate) fn shadow_limited(&self, i: usize) -> bool {
        self.is_shadow(i)
            && self
                .all
                .decisions
                .get(i)
                .is_some_and(|d| self.would_refuse(d))
    }

    /// The index of the first refusing policy.
    pub(crate) fn refusing(&self) -> Option<usize> {
        (0..self.all.decisions.len()).find(|&i| self.refuses(i))
    }

    /// The earliest wait after which every refusing policy could admit: the
    /// largest among them (a shaper's: its delay beyond `max_delay`). The
    /// same in every face.
    pub(crate) fn retry_after(&self) -> Nanos {
        (0..self.all.decisions.len())
            .filter(|&i| self.refuses(i))
            .map(|i| {
                let d = &self.all.decisions[i];
                match d.allowed {
                    true => d.delay.saturating_sub(self.max_delay),
                    false => d.retry_after,
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// The longest delay an enforced shaper imposes (shadow policies never
    /// hold a request).
    pub(crate) fn delay(&self) -> Nanos {
        (0..self.all.decisions.len())
            .filter(|&i| !self.is_shadow(i))
            .map(|i| self.all.decisions[i].delay)
            .max()
            .unwrap_or(0)
    }

    /// This verdict over every check of `checks`: the unlimited overrides,
    /// left out of the store call, put back in their places, admitted with
    /// their full limit.
    fn with_unlimited(self, table: &PolicyTable, checks: &[Check<'_>]) -> Self {
        let mut decided = self.all.decisions.into_iter();
        let mut shadows = self.shadow.into_iter();
        let mut decisions = Vec::with_capacity(checks.len());
        let mut shadow = Few::with_capacity(checks.len());
        for check in checks {
            let entry = table.get(check.policy);
            if entry.unlimited {
                decisions.push(Decision {
                    allowed: true,
                    remaining: entry.limit(false),
                    ..Decision::default()
                });
                shadow.push(false);
            } else {
                decisions.push(decided.next().unwrap_or_default());
                shadow.push(shadows.next().unwrap_or(false));
            }
        }
        Self {
            all: AllDecision {
                allowed: self.all.allowed,
                decisions,
            },
            shadow,
            ..self
        }
    }

    /// The `RateLimit` parts of the enforced policies among `ids` (the
    /// request's, in order): shadow policies are not shown to clients.
    pub(crate) fn visible<'t>(&self, table: &'t PolicyTable, ids: &[TableId]) -> Few<Part<'t>> {
        ids.iter()
            .zip(self.decisions())
            .enumerate()
            .filter(|(i, _)| !self.is_shadow(*i))
            .map(|(_, (id, d))| table.get(*id).part(d, self.degraded))
            .collect()
    }

    /// The decisions as answered: a shaper that refused for its delay has
    /// no free slot to report.
    pub(crate) fn decisions(&self) -> impl Iterator<Item = Decision> + '_ {
        self.all.decisions.iter().map(|d| match self.all.allowed {
            false if d.allowed && d.delay > self.max_delay => Decision { remaining: 0, ..*d },
            _ => *d,
        })
    }
}

/// The in-process limiter and its handles, in policy-table order.
#[derive(Debug)]
pub struct Local {
    /// The limiter.
    pub limiter: Arc<Limiter>,
    ids: Vec<weir_limiter::PolicyId>,
}

impl Local {
    /// A limiter of `table`'s local policies, keeping `previous`'s keys of
    /// every policy that is unchanged.
    fn new(
        table: &PolicyTable,
        store: &crate::config::StoreConfig,
        previous: Option<&Local>,
    ) -> Result<Self, weir_limiter::Error> {
        let mut builder = Limiter::builder()
            .max_keys(store.max_keys)
            .max_leases(store.max_leases)
            .max_key_len(MAX_KEY);
        for (_, entry) in table.iter() {
            builder = builder.policy(entry.stored_as.clone(), entry.local);
            if let Some(max) = entry.max_keys {
                builder = builder.policy_max_keys(entry.stored_as.clone(), max);
            }
        }
        if let Some(previous) = previous {
            builder = builder.keep_state_of(&previous.limiter);
        }
        let limiter = builder.build()?;
        let ids = table
            .iter()
            .map(|(_, e)| limiter.policy(&e.stored_as))
            .collect::<Result<_, _>>()?;
        if let Some(previous) = previous {
            let (changed, fresh): (Vec<&str>, Vec<&str>) = table
                .iter()
                .map(|(_, e)| e.stored_as.as_str())
                .filter(|name| !limiter.shares_state_with(&previous.limiter, name))
                .partition(|name| previous.limiter.policy(name).is_ok());
            if !changed.is_empty() {
                tracing::info!(policies = ?changed, "reload: these policies' parameters changed: each key keeps its state where it still means the same (docs/SPEC.md, \"Changed parameters\")");
            }
            if !fresh.is_empty() {
                tracing::info!(policies = ?fresh, "reload: these policies are new and start afresh");
            }
        }
        Ok(Self {
            limiter: Arc::new(limiter),
            ids,
        })
    }

    /// Whether the check's key is stored.
    pub(crate) fn contains(&self, check: &Check<'_>) -> bool {
        self.ids
            .get(check.policy.0)
            .is_some_and(|&id| self.limiter.contains(id, check.key))
    }

    /// The limiter's check for `check`; an ad-hoc policy of the table (an
    /// Envoy descriptor's own `limit`) is added to the limiter by its name.
    fn check<'a>(
        &self,
        table: &PolicyTable,
        check: &Check<'a>,
    ) -> Result<weir_limiter::Check<'a>, Undecided> {
        let entry = table.get(check.policy);
        let policy = match self.ids.get(check.policy.0) {
            Some(&id) => id,
            None => self.limiter.ad_hoc(&entry.stored_as, entry.local)?,
        };
        Ok(weir_limiter::Check {
            policy,
            key: check.key,
            cost: check.cost,
            shadow: entry.shadow,
        })
    }

    fn decide(
        &self,
        table: &PolicyTable,
        checks: &[Check<'_>],
        max_delay: Nanos,
    ) -> Result<AllDecision, Undecided> {
        let checks = checks
            .iter()
            .map(|c| self.check(table, c))
            .collect::<Result<Few<_>, _>>()?;
        Ok(self.limiter.check_all_within(&checks, max_delay)?)
    }
}

/// Where a configuration's decisions are made.
#[derive(Debug)]
pub enum Backend {
    /// The in-process store.
    Memory(Local),
    /// A shared Redis behind a circuit breaker, with an in-process fallback
    /// of the policies scaled by `fallback_share`.
    Redis {
        /// The store and its breaker.
        remote: Arc<Remote>,
        /// The fallback.
        fallback: Local,
    },
}

impl Backend {
    /// The backend `config` asks for, keeping from `previous` the Redis
    /// connection (same URL and timeout) and the in-process keys of every
    /// unchanged policy. With Redis, call it within a tokio runtime.
    pub(crate) fn new(
        config: &Config,
        table: &PolicyTable,
        previous: Option<&Backend>,
    ) -> Result<Self, weir_limiter::Error> {
        let local = Local::new(table, &config.store, previous.map(Backend::local))?;
        Ok(match &config.store.url {
            StoreUrl::Memory => Self::Memory(local),
            StoreUrl::Redis(url) => {
                let kept = match previous {
                    Some(Self::Redis { remote, .. }) if remote.serves(url, &config.store) => {
                        Some(remote.clone())
                    }
                    _ => None,
                };
                let remote = kept.unwrap_or_else(|| Remote::new(url, &config.store, MAX_KEY));
                Self::Redis {
                    remote,
                    fallback: local,
                }
            }
        })
    }

    /// The in-process limiter: the store, or the fallback.
    pub fn local(&self) -> &Local {
        match self {
            Self::Memory(local)
            | Self::Redis {
                fallback: local, ..
            } => local,
        }
    }

    /// The shared store, when there is one.
    pub fn remote(&self) -> Option<&Arc<Remote>> {
        match self {
            Self::Memory(_) => None,
            Self::Redis { remote, .. } => Some(remote),
        }
    }

    /// Waits (at most `within`) for a shared store to be reachable.
    pub(crate) async fn wait_up(&self, within: Duration) -> bool {
        match self.remote() {
            Some(remote) => remote.wait_up(within).await,
            None => true,
        }
    }

    /// Decides `checks` all-or-nothing, refusing shaper waits over
    /// `max_delay`. A policy without an `on_store_error` rule follows
    /// `default`; with none, a store failure makes the request
    /// [`Undecided::Unavailable`]. Counts every policy's outcome.
    pub(crate) async fn decide(
        &self,
        table: &PolicyTable,
        meters: &Meters,
        checks: &[Check<'_>],
        max_delay: Nanos,
        default: Option<OnStoreError>,
        new_keys: NewKeys,
    ) -> Result<Verdict, Undecided> {
        let started = Instant::now();
        // Unlimited overrides are admitted without a store call.
        let unlimited = |c: &Check<'_>| table.get(c.policy).unlimited;
        // Copied only when an unlimited override is among them.
        let counted: Cow<'_, [Check<'_>]> = match checks.iter().any(unlimited) {
            true => checks.iter().filter(|c| !unlimited(c)).copied().collect(),
            false => Cow::Borrowed(checks),
        };
        let traced = Traced::start("weir.decide");
        if traced.is_recording() {
            let names: Vec<&str> = checks
                .iter()
                .map(|c| table.get(c.policy).name.as_str())
                .collect();
            traced.set("weir.policies", names.join(","));
            if let Some(first) = checks.first() {
                traced.set("weir.cost", i64::try_from(first.cost).unwrap_or(i64::MAX));
                traced.identity(first.key);
            }
        }
        let decided = match self {
            _ if counted.is_empty() => Ok(Verdict {
                all: AllDecision {
                    allowed: true,
                    decisions: Vec::new(),
                },
                degraded: false,
                max_delay,
                shadow: Few::new(),
                created: 0,
            }),
            Self::Memory(local) => local.decide(table, &counted, max_delay).map(|all| Verdict {
                all,
                degraded: false,
                max_delay,
                shadow: shadows(table, &counted),
                created: 0,
            }),
            Self::Redis { remote, fallback } => {
                let decided = decide_remote(
                    table, remote, fallback, &counted, max_delay, default, new_keys,
                );
                // Boxed: the remote call's future is large, and an
                // in-process decision should not move it around.
                Box::pin(traced.around(decided)).await
            }
        };
        let decided = match decided {
            Ok(verdict) if counted.len() < checks.len() => {
                Ok(verdict.with_unlimited(table, checks))
            }
            other => other,
        };
        meters.observe(started);
        if traced.is_recording() {
            match &decided {
                Ok(verdict) => {
                    traced.set("weir.allowed", verdict.all.allowed);
                    traced.set("weir.degraded", verdict.degraded);
                }
                Err(refusal) => traced.error(format!("{refusal:?}")),
            }
        }
        match &decided {
            Ok(verdict) => {
                for (i, (check, d)) in checks.iter().zip(&verdict.all.decisions).enumerate() {
                    let outcome = match (verdict.all.allowed, verdict.refuses(i)) {
                        _ if unlimited(check) => Outcome::Unlimited,
                        _ if verdict.shadow_limited(i) => Outcome::ShadowLimited,
                        (true, _) => Outcome::Allowed,
                        (false, false) => Outcome::Uncharged,
                        (false, true) => Outcome::Rejected,
                    };
                    let entry = table.get(check.policy);
                    entry.count(outcome);
                    entry.live.count(outcome, verdict.degraded, check.key);
                    if outcome == Outcome::Allowed
                        && table.near_limit(entry, d.remaining, verdict.degraded)
                    {
                        entry.near_limit();
                    }
                }
            }
            Err(_) => checks
                .iter()
                .for_each(|c| table.get(c.policy).count(Outcome::Error)),
        }
        decided
    }

    /// Charges usage after the fact (docs/SPEC.md's reports): every check is
    /// charged, possibly into debt, after all are validated. On Redis, one
    /// script call charges them together; a store failure is
    /// [`Undecided::Unavailable`] (usage is never charged to a fallback).
    pub(crate) async fn report(
        &self,
        table: &PolicyTable,
        checks: &[Check<'_>],
        new_keys: NewKeys,
    ) -> Result<(Vec<Decision>, usize), Undecided> {
        let reports: Vec<weir_redis::Check<'_>> = checks
            .iter()
            .map(|c| weir_redis::Check {
                report: true,
                no_new_key: new_keys != NewKeys::Allowed,
                ..redis_check(table, c)
            })
            .collect();
        // Keys, pairs named twice and the report's own bound on the cost.
        let core: Vec<weir_core::Check<'_>> = reports
            .iter()
            .map(|c| weir_core::Check { cost: 0, ..c.check })
            .collect();
        weir_core::check::validate(&core, MAX_KEY).map_err(Undecided::Invalid)?;
        for c in &reports {
            weir_core::check::validate_report(&c.check).map_err(Undecided::Invalid)?;
        }
        let (decided, created) = match self {
            Self::Memory(local) => {
                let checks = checks
                    .iter()
                    .map(|c| local.check(table, c))
                    .collect::<Result<Vec<_>, Undecided>>()?;
                (local.limiter.report_all(&checks)?, 0)
            }
            Self::Redis { remote, .. } => {
                let store = remote
                    .available()
                    .ok_or(Undecided::Unavailable { denied: true })?;
                let mode = Mode::Charge {
                    max_delay: Nanos::MAX,
                };
                let checked = store.decide(&reports, None, mode).await.map_err(refusal)?;
                if let (true, NewKeys::Refused(wait)) = (checked.new_key_refused, new_keys) {
                    return Err(Undecided::NewKeys(wait));
                }
                (checked.all.decisions, checked.created)
            }
        };
        for c in checks {
            table.get(c.policy).reported(c.cost);
        }
        Ok((decided, created))
    }

    /// What a check of cost 1 of `key` would decide now, charging nothing,
    /// and whether the key is stored (the admin `GET`): the shared store's
    /// answer, never a fallback's.
    pub(crate) async fn peek(
        &self,
        table: &PolicyTable,
        policy: TableId,
        key: &str,
    ) -> Result<(Decision, bool), Undecided> {
        let check = Check {
            policy,
            key,
            cost: 1,
        };
        match self {
            Self::Memory(local) => Ok(local.limiter.peek(local.check(table, &check)?)?),
            Self::Redis { remote, .. } => {
                let store = remote
                    .available()
                    .ok_or(Undecided::Unavailable { denied: true })?;
                let checks = [redis_check(table, &check)];
                let exists = store.exists(&table.get(policy).stored_as, key);
                let (checked, exists) =
                    tokio::join!(store.decide(&checks, None, Mode::Peek), exists);
                let decision = checked
                    .map_err(refusal)?
                    .all
                    .decisions
                    .first()
                    .copied()
                    .ok_or(Undecided::Unavailable { denied: true })?;
                Ok((decision, exists.map_err(refusal)?))
            }
        }
    }

    /// Releases or renews a concurrency policy's lease where it was taken:
    /// the shared store, or (`local`: taken while the store was down) the
    /// in-process fallback. `allowed` is whether it was live.
    pub(crate) async fn on_lease(
        &self,
        table: &PolicyTable,
        check: &Check<'_>,
        op: LeaseOp,
        local: bool,
    ) -> Result<Decision, Undecided> {
        let remote = match self {
            Self::Redis { remote, .. } if !local => remote,
            _ => return self.on_local_lease(table, check, op),
        };
        let store = remote
            .available()
            .ok_or(Undecided::Unavailable { denied: true })?;
        let entry = table.get(check.policy);
        let decided = store
            .on_lease(&entry.stored_as, &entry.policy, check.key, op, None)
            .await;
        decided.map_err(refusal)
    }

    /// [`Backend::on_lease`] on the in-process store (or fallback), at
    /// once.
    pub(crate) fn on_local_lease(
        &self,
        table: &PolicyTable,
        check: &Check<'_>,
        op: LeaseOp,
    ) -> Result<Decision, Undecided> {
        let local = self.local();
        let id = local.check(table, check)?.policy;
        Ok(match op {
            LeaseOp::Release(lease) => local.limiter.release(id, check.key, lease),
            LeaseOp::Renew(lease) => local.limiter.renew(id, check.key, lease),
            LeaseOp::Take(_) => local.limiter.release(id, check.key, 0),
        }?)
    }

    /// Forgets `key` under `policy` (the admin `DELETE`), in the shared
    /// store and in the local fallback; whether the store held it.
    pub(crate) async fn reset(
        &self,
        table: &PolicyTable,
        policy: TableId,
        key: &str,
    ) -> Result<bool, Undecided> {
        let local = self.local();
        let here = local.limiter.reset(local.ids[policy.0], key)?;
        let Some(remote) = self.remote() else {
            return Ok(here);
        };
        let store = remote
            .available()
            .ok_or(Undecided::Unavailable { denied: true })?;
        store
            .reset(&table.get(policy).stored_as, key)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "admin reset failed");
                Undecided::Unavailable { denied: true }
            })
    }
}

fn refusal(e: StoreError) -> Undecided {
    match e {
        StoreError::Invalid(e) => Undecided::Invalid(e),
        StoreError::Unsupported(m) => Undecided::Unsupported(m),
        _ => Undecided::Unavailable { denied: true },
    }
}

fn shadows(table: &PolicyTable, checks: &[Check<'_>]) -> Few<bool> {
    checks.iter().map(|c| table.get(c.policy).shadow).collect()
}

fn redis_check<'a>(table: &'a PolicyTable, check: &Check<'a>) -> weir_redis::Check<'a> {
    let entry = table.get(check.policy);
    weir_redis::Check {
        on_loss: entry.on_state_loss,
        shadow: entry.shadow,
        ..weir_redis::Check::from(weir_core::Check {
            name: &entry.stored_as,
            policy: &entry.policy,
            key: check.key,
            cost: check.cost,
        })
    }
}

/// One charge on Redis; with `replica_acks`, an admission is not answered
/// before that many replicas hold it.
async fn charged(
    store: &weir_redis::RedisStore,
    replica_acks: u32,
    checks: &[weir_redis::Check<'_>],
    max_delay: Nanos,
) -> Result<weir_redis::Checked, StoreError> {
    let checked = store
        .decide(checks, None, Mode::Charge { max_delay })
        .await?;
    let charged = checked.all.allowed && checks.iter().any(|c| c.check.cost > 0);
    if let (true, Some(first)) = (replica_acks > 0 && charged, checks.first()) {
        // Boxed: its future is large (~3 kB), and would otherwise make every
        // store call's future that large, copied on each call.
        let acked = Box::pin(store.wait_replicas(first.check.key, replica_acks)).await?;
        if acked < u64::from(replica_acks) {
            return Err(StoreError::Replication {
                acked,
                wanted: replica_acks,
            });
        }
    }
    Ok(checked)
}

async fn decide_remote(
    table: &PolicyTable,
    remote: &Remote,
    fallback: &Local,
    checks: &[Check<'_>],
    max_delay: Nanos,
    default: Option<OnStoreError>,
    new_keys: NewKeys,
) -> Result<Verdict, Undecided> {
    let redis: Vec<weir_redis::Check<'_>> = (checks.iter())
        .map(|c| weir_redis::Check {
            no_new_key: new_keys != NewKeys::Allowed,
            ..redis_check(table, c)
        })
        .collect();
    // Refuse what the store would refuse before trying it, so that an
    // invalid request is refused alike whether Redis is up or not.
    let core: Vec<weir_core::Check<'_>> = redis.iter().map(|c| c.check).collect();
    weir_core::check::validate(&core, MAX_KEY).map_err(Undecided::Invalid)?;
    let traced = Traced::start("weir.store");
    traced.set("db.system.name", "redis");
    // On a cluster, the breaker of the master serving this identity.
    let node = checks.first().and_then(|c| remote.node_for(c.key));
    let node = node.as_deref();
    if let Some(node) = node {
        traced.set("server.address", node.addr.clone());
    }
    match remote
        .available()
        .filter(|_| node.is_none_or(|n| n.is_up()))
    {
        Some(store) => match traced
            .around(charged(&store, remote.replica_acks, &redis, max_delay))
            .await
        {
            Ok(checked) => {
                remote.succeeded(node);
                if checked.state_lost {
                    Meters::state_lost();
                    tracing::warn!(
                        "the store lost its state (restarted empty, flushed or evicted): on_state_loss applies"
                    );
                }
                if checked.new_key_refused {
                    return Err(match new_keys {
                        NewKeys::Refused(wait) => Undecided::NewKeys(wait),
                        NewKeys::Allowed => Undecided::NewKeys(0),
                    });
                }
                return Ok(Verdict {
                    all: checked.all,
                    degraded: false,
                    max_delay,
                    shadow: shadows(table, checks),
                    created: checked.created,
                });
            }
            Err(StoreError::Invalid(e)) => return Err(Undecided::Invalid(e)),
            Err(StoreError::Unsupported(m)) => return Err(Undecided::Unsupported(m)),
            Err(e) => {
                remote.failed(node);
                Meters::store_error(match e {
                    StoreError::Timeout(_) => "timeout",
                    StoreError::Reply => "reply",
                    StoreError::Replication { .. } => "replication",
                    _ => "redis",
                });
                tracing::debug!(error = %e, "store call failed");
                traced.error(e.to_string());
            }
        },
        None => {
            Meters::store_error("circuit_open");
            traced.error("the circuit breaker is open".to_owned());
        }
    }
    drop(traced);
    let _fallback = Traced::start("weir.fallback");
    fall_back(table, fallback, checks, max_delay, default)
}

/// Decides without the store: `deny` anywhere refuses; `local` policies are
/// checked all-or-nothing by the scaled in-process limiter; `allow` admits
/// without counting (reporting the full limit as remaining).
fn fall_back(
    table: &PolicyTable,
    fallback: &Local,
    checks: &[Check<'_>],
    max_delay: Nanos,
    default: Option<OnStoreError>,
) -> Result<Verdict, Undecided> {
    let rules: Vec<Option<OnStoreError>> = checks
        .iter()
        .map(|c| {
            let entry = table.get(c.policy);
            entry.fell_back();
            entry.on_store_error.or(default)
        })
        .collect();
    if rules.contains(&Some(OnStoreError::Deny)) {
        return Err(Undecided::Unavailable { denied: true });
    }
    if rules.contains(&None) {
        return Err(Undecided::Unavailable { denied: false });
    }
    let local: Vec<Check<'_>> = checks
        .iter()
        .zip(&rules)
        .filter(|(_, r)| **r == Some(OnStoreError::Local))
        .map(|(c, _)| *c)
        .collect();
    let checked = match local.is_empty() {
        true => AllDecision {
            allowed: true,
            decisions: Vec::new(),
        },
        false => fallback.decide(table, &local, max_delay)?,
    };
    let mut local_decisions = checked.decisions.into_iter();
    let decisions = rules
        .iter()
        .zip(checks)
        .map(|(rule, check)| match rule {
            Some(OnStoreError::Local) => local_decisions.next().unwrap_or_default(),
            _ => Decision {
                allowed: true,
                remaining: table.get(check.policy).limit(true),
                ..Decision::default()
            },
        })
        .collect();
    Ok(Verdict {
        all: AllDecision {
            allowed: checked.allowed,
            decisions,
        },
        degraded: true,
        max_delay,
        shadow: shadows(table, checks),
        created: 0,
    })
}

/// The stored key of a client's `identity` under `scope` (`api`,
/// `header:x-seller-id`, `path:seller`, `peer`): the identity is bounded
/// here, once, by [`MAX_IDENTITY`] bytes as the client sent it — whatever
/// its source. Scopes contain no `:` after their kind, so no two (scope,
/// identity) pairs share a key.
pub(crate) fn scoped_key(scope: &str, identity: &str) -> Result<String, CheckError> {
    weir_core::check::check_key(identity, MAX_IDENTITY)?;
    let mut key = String::with_capacity(scope.len() + 1 + identity.len());
    key.push_str(scope);
    key.push(':');
    key.push_str(identity);
    Ok(key)
}
