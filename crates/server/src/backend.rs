//! Where decisions are made: the configured [`Backend`] (a [`Store`]:
//! in process, or Redis guarded by its breaker and fallback), and the
//! decision pipeline every face calls — a table's checks made store checks,
//! unlimited overrides answered without a store call, the store's answer
//! made a [`Verdict`], every outcome counted.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::store::{self, LeaseOp, Mode, OnStoreError, Store};
use weir_core::{AllDecision, CheckError, Decision, MAX_IDENTITY, Nanos};
use weir_limiter::Limiter;

use crate::breaker::Remote;
use crate::config::{Config, StoreUrl, TableId};
use crate::guarded::Guarded;
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

impl From<store::Error> for Undecided {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::Invalid(e) => Self::Invalid(e),
            store::Error::Full { max } => Self::Full { max },
            store::Error::Unsupported(m) => Self::Unsupported(m),
            store::Error::Denied => Self::Unavailable { denied: true },
            // `store::Error` is open to more kinds: each is a failure to answer.
            _ => Self::Unavailable { denied: false },
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

/// Where a configuration's decisions are made: each arm a [`Store`], the
/// match only delegating.
#[derive(Debug)]
pub enum Backend {
    /// The in-process store.
    Memory(Arc<Limiter>),
    /// A shared Redis behind a circuit breaker, with an in-process fallback
    /// of the policies scaled by `fallback_share`.
    Redis(Guarded),
}

impl Store for Backend {
    async fn decide(
        &self,
        checks: &[store::Check<'_>],
        mode: Mode,
    ) -> Result<store::Checked, store::Error> {
        match self {
            Self::Memory(limiter) => limiter.decide_now(checks, mode),
            // Boxed: the remote call's future is large, and an in-process
            // decision should not move it around.
            Self::Redis(guarded) => Box::pin(guarded.decide(checks, mode)).await,
        }
    }

    async fn exists(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        match self {
            Self::Memory(limiter) => Store::exists(&**limiter, name, key).await,
            Self::Redis(guarded) => guarded.exists(name, key).await,
        }
    }

    async fn reset(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        match self {
            Self::Memory(limiter) => Store::reset(&**limiter, name, key).await,
            Self::Redis(guarded) => guarded.reset(name, key).await,
        }
    }
}

/// The in-process limiter of `table`'s policies (each `local`: with a
/// shared store, scaled by `fallback_share`), keeping `previous`'s keys of
/// every policy whose state still means the same.
fn limiter(
    table: &PolicyTable,
    store: &crate::config::StoreConfig,
    previous: Option<&Limiter>,
) -> Result<Limiter, weir_limiter::Error> {
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
        builder = builder.keep_state_of(previous);
    }
    let limiter = builder.build()?;
    if let Some(previous) = previous {
        let (changed, fresh): (Vec<&str>, Vec<&str>) = table
            .iter()
            .map(|(_, e)| e.stored_as.as_str())
            .filter(|name| !limiter.shares_state_with(previous, name))
            .partition(|name| previous.policy(name).is_ok());
        if !changed.is_empty() {
            tracing::info!(policies = ?changed, "reload: these policies' parameters changed: each key keeps its state where it still means the same (docs/SPEC.md, \"Changed parameters\")");
        }
        if !fresh.is_empty() {
            tracing::info!(policies = ?fresh, "reload: these policies are new and start afresh");
        }
    }
    Ok(limiter)
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
        let local = Arc::new(limiter(
            table,
            &config.store,
            previous.map(|p| &**p.local()),
        )?);
        Ok(match &config.store.url {
            StoreUrl::Memory => Self::Memory(local),
            StoreUrl::Redis(url) => {
                let kept = match previous {
                    Some(Self::Redis(guarded)) if guarded.remote.serves(url, &config.store) => {
                        Some(guarded.remote.clone())
                    }
                    _ => None,
                };
                let remote = kept.unwrap_or_else(|| Remote::new(url, &config.store, MAX_KEY));
                Self::Redis(Guarded {
                    remote,
                    fallback: local,
                })
            }
        })
    }

    /// The in-process limiter: the store, or the fallback.
    pub fn local(&self) -> &Arc<Limiter> {
        match self {
            Self::Memory(local)
            | Self::Redis(Guarded {
                fallback: local, ..
            }) => local,
        }
    }

    /// The shared store, when there is one.
    pub fn remote(&self) -> Option<&Arc<Remote>> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(guarded) => Some(&guarded.remote),
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
        let decided = match counted.is_empty() {
            true => Ok(store::Checked::default()),
            false => {
                let asked: Few<store::Check<'_>> = (counted.iter())
                    .map(|c| store::Check {
                        no_new_key: new_keys != NewKeys::Allowed,
                        on_error: table.get(c.policy).on_store_error.or(default),
                        ..store_check(table, c)
                    })
                    .collect();
                traced
                    .around(Store::decide(self, &asked, Mode::Charge { max_delay }))
                    .await
            }
        };
        if matches!(&decided, Ok(c) if c.degraded)
            || matches!(
                &decided,
                Err(store::Error::Unavailable { .. } | store::Error::Denied)
            )
        {
            counted.iter().for_each(|c| table.get(c.policy).fell_back());
        }
        let decided = match decided {
            Ok(checked) if checked.new_key_refused => Err(Undecided::NewKeys(match new_keys {
                NewKeys::Refused(wait) => wait,
                NewKeys::Allowed => 0,
            })),
            Ok(checked) => Ok(Verdict {
                all: AllDecision {
                    allowed: checked.all.allowed || counted.is_empty(),
                    decisions: checked.all.decisions,
                },
                degraded: checked.degraded,
                max_delay,
                shadow: counted.iter().map(|c| table.get(c.policy).shadow).collect(),
                created: checked.created,
            }),
            Err(e) => Err(Undecided::from(e)),
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
    /// charged, possibly into debt, after all are validated, in one store
    /// call; a store failure is [`Undecided::Unavailable`] (usage is never
    /// charged to a fallback).
    pub(crate) async fn report(
        &self,
        table: &PolicyTable,
        checks: &[Check<'_>],
        new_keys: NewKeys,
    ) -> Result<(Vec<Decision>, usize), Undecided> {
        let reports: Few<store::Check<'_>> = checks
            .iter()
            .map(|c| store::Check {
                report: true,
                no_new_key: new_keys != NewKeys::Allowed,
                on_error: Some(OnStoreError::Deny),
                ..store_check(table, c)
            })
            .collect();
        let checked = Store::decide(self, &reports, Mode::CHARGE).await?;
        if let (true, NewKeys::Refused(wait)) = (checked.new_key_refused, new_keys) {
            return Err(Undecided::NewKeys(wait));
        }
        for c in checks {
            table.get(c.policy).reported(c.cost);
        }
        Ok((checked.all.decisions, checked.created))
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
        let asked = [store::Check {
            on_error: Some(OnStoreError::Deny),
            ..store_check(table, &check)
        }];
        let stored_as = &table.get(policy).stored_as;
        let (checked, exists) = tokio::join!(
            Store::decide(self, &asked, Mode::Peek),
            self.exists(stored_as, key)
        );
        Ok((checked?.sole()?, exists?))
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
        match (self, local) {
            (Self::Redis(guarded), false) => {
                let remote = guarded.remote.available();
                let remote = remote.ok_or(Undecided::Unavailable { denied: true })?;
                Ok(Store::on_lease(&*remote, core_check(table, check), op).await?)
            }
            _ => self.on_local_lease(table, check, op),
        }
    }

    /// [`Backend::on_lease`] on the in-process store (or fallback), at
    /// once.
    pub(crate) fn on_local_lease(
        &self,
        table: &PolicyTable,
        check: &Check<'_>,
        op: LeaseOp,
    ) -> Result<Decision, Undecided> {
        let asked = store::Check {
            lease: op,
            ..store::Check::from(core_check(table, check))
        };
        Ok(self.local().decide_now(&[asked], Mode::CHARGE)?.sole()?)
    }

    /// Forgets `key` under `policy` (the admin `DELETE`), in the shared
    /// store and in the local fallback; whether the store held it.
    pub(crate) async fn reset(
        &self,
        table: &PolicyTable,
        policy: TableId,
        key: &str,
    ) -> Result<bool, Undecided> {
        let stored_as = &table.get(policy).stored_as;
        Store::reset(self, stored_as, key).await.map_err(|e| {
            tracing::warn!(error = %e, "admin reset failed");
            Undecided::from(e)
        })
    }
}

/// `check` as `weir-core` names it: the policy's stored name and parameters.
fn core_check<'a>(table: &'a PolicyTable, check: &Check<'a>) -> weir_core::Check<'a> {
    let entry = table.get(check.policy);
    weir_core::Check {
        name: &entry.stored_as,
        policy: &entry.policy,
        key: check.key,
        cost: check.cost,
    }
}

/// `check` as a store is asked it, with its policy's rules.
fn store_check<'a>(table: &'a PolicyTable, check: &Check<'a>) -> store::Check<'a> {
    let entry = table.get(check.policy);
    store::Check {
        on_loss: entry.on_state_loss,
        shadow: entry.shadow,
        ..store::Check::from(core_check(table, check))
    }
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
