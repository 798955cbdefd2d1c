//! Where decisions are made: the in-process limiter, or Redis with a circuit
//! breaker and each policy's store-error rule in front of a local fallback.
//!
//! Guarantees (docs/RELIABILITY.md): no request waits on the store longer
//! than `[store] timeout`; after [`OPEN_AFTER`] failures in a row the breaker
//! opens and requests stop waiting at all; a background probe closes it
//! within [`PROBE_EVERY`] of Redis answering again. A store error is never
//! an exhausted bucket: it is decided by the policy's `on_store_error` rule,
//! marked degraded and counted.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use metrics::Gauge;
use weir_limiter::{AllDecision, Decision, Error, Nanos};
use weir_redis::{Check, Mode, RedisStore, StoreError};

use crate::config::{OnStoreError, Rules};
use crate::state::{Outcome, Shared};

/// Consecutive store failures that open the breaker.
pub const OPEN_AFTER: u32 = 3;
/// How often an open breaker (or a store never reached) is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

/// A shared Redis store behind a circuit breaker.
#[derive(Debug)]
pub struct Remote {
    url: String,
    timeout: Duration,
    store: ArcSwapOption<RedisStore>,
    failures: AtomicU32,
    up: AtomicBool,
    gauge: Gauge,
}

impl Remote {
    /// A store for `url`, connected (and probed when down) by a background
    /// task that ends with the last reference.
    pub fn new(url: &str, timeout: Duration) -> Arc<Self> {
        let remote = Arc::new(Self {
            url: url.to_owned(),
            timeout,
            store: ArcSwapOption::empty(),
            failures: AtomicU32::new(0),
            up: AtomicBool::new(false),
            gauge: metrics::gauge!("weir_store_up"),
        });
        remote.gauge.set(0.0);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(supervise(Arc::downgrade(&remote)));
        }
        remote
    }

    /// Whether this store serves `url` with `timeout` (kept across reloads).
    pub(crate) fn serves(&self, url: &str, timeout: Duration) -> bool {
        self.url == url && self.timeout == timeout
    }

    /// Whether requests go to Redis (the breaker is closed).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Waits until connected or `within` has passed; whether it is up.
    pub async fn wait_up(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_up() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.is_up()
    }

    /// The connected store while the breaker is closed.
    pub(crate) fn available(&self) -> Option<Arc<RedisStore>> {
        self.store.load_full().filter(|_| self.is_up())
    }

    fn set_up(&self, up: bool) {
        if self.up.swap(up, Ordering::AcqRel) != up {
            self.gauge.set(if up { 1.0 } else { 0.0 });
            if up {
                tracing::info!(url = %self.url, "store up: decisions go to Redis again");
            } else {
                tracing::warn!(url = %self.url, "store down: circuit open, policies decide by on_store_error");
            }
        }
    }

    pub(crate) fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    pub(crate) fn failed(&self) {
        if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= OPEN_AFTER {
            self.set_up(false);
        }
    }
}

/// Connects, then probes whenever the breaker is open.
async fn supervise(remote: Weak<Remote>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = String::new();
    loop {
        tick.tick().await;
        let Some(remote) = remote.upgrade() else {
            return;
        };
        if remote.is_up() {
            continue;
        }
        let store = match remote.store.load_full() {
            Some(store) => store,
            None => {
                let connect = RedisStore::connect(&remote.url);
                match tokio::time::timeout(Duration::from_secs(1), connect).await {
                    Ok(Ok(store)) => {
                        let store = Arc::new(store.with_timeout(remote.timeout).with_marker(true));
                        remote.store.store(Some(store.clone()));
                        store
                    }
                    Ok(Err(e)) => {
                        // Said once per new reason, not every probe.
                        let error = e.to_string();
                        if error != last_error {
                            tracing::warn!(url = %remote.url, %error, "cannot connect to the store; policies decide by on_store_error");
                            last_error = error;
                        }
                        continue;
                    }
                    Err(_) => continue,
                }
            }
        };
        if store.ping().await.is_ok() {
            remote.succeeded();
            remote.set_up(true);
        }
    }
}

/// Why a request could not be decided.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The request is invalid (unknown policy, cost, key…): nothing charged.
    Invalid(Error),
    /// The store cannot decide this request (a Redis Cluster and checks of
    /// several identities): nothing charged.
    Unsupported(String),
    /// The store failed and a policy's rule (or the face's default) is to
    /// refuse: fail closed, or let the caller decide (Envoy).
    Unavailable {
        /// A policy ruled `deny`; otherwise no rule was set.
        denied: bool,
    },
}

/// A request's decision.
#[derive(Debug)]
pub(crate) struct Verdict<'a> {
    pub(crate) all: AllDecision,
    /// Each policy's decision, by name.
    pub(crate) decided: Vec<(&'a str, Decision)>,
    /// Decided without the shared store (by `on_store_error`).
    pub(crate) degraded: bool,
}

/// Decides `pairs` (policy, key, cost) all-or-nothing, refusing shaper
/// waits over `max_delay`; a cost of 0 reports a key's standing. A policy
/// without an `on_store_error` rule follows `default`; with none, a store
/// failure makes the request [`Refusal::Unavailable`].
pub(crate) async fn decide<'a>(
    shared: &Shared,
    pairs: &[(&'a str, &str, u64)],
    max_delay: Nanos,
    default: Option<OnStoreError>,
) -> Result<Verdict<'a>, Refusal> {
    let started = Instant::now();
    let verdict = match &shared.remote {
        None => shared
            .limiter
            .check_each_within(pairs, max_delay)
            .map(|all| verdict(pairs, all, false))
            .map_err(Refusal::Invalid),
        Some(remote) => decide_remote(shared, remote, pairs, max_delay, default).await,
    };
    shared.meters.observe(started);
    match &verdict {
        Ok(v) => {
            for (policy, d) in &v.decided {
                let outcome = match (v.all.allowed, d.allowed) {
                    (true, _) => Outcome::Allowed,
                    (false, true) => Outcome::Uncharged,
                    (false, false) => Outcome::Rejected,
                };
                shared.meters.count(policy, outcome);
                shared.meters.queue(policy, d.remaining);
            }
        }
        Err(_) => pairs
            .iter()
            .for_each(|(p, _, _)| shared.meters.count(p, Outcome::Error)),
    }
    verdict
}

fn verdict<'a>(pairs: &[(&'a str, &str, u64)], all: AllDecision, degraded: bool) -> Verdict<'a> {
    let decided = pairs
        .iter()
        .map(|(p, _, _)| *p)
        .zip(all.decisions.iter().copied())
        .collect();
    Verdict {
        all,
        decided,
        degraded,
    }
}

async fn decide_remote<'a>(
    shared: &Shared,
    remote: &Remote,
    pairs: &[(&'a str, &str, u64)],
    max_delay: Nanos,
    default: Option<OnStoreError>,
) -> Result<Verdict<'a>, Refusal> {
    let checks = validate(shared, pairs).map_err(Refusal::Invalid)?;
    match remote.available() {
        Some(store) => {
            let mode = Mode::Charge { max_delay };
            match store.decide(&checks, 1, None, mode).await {
                Ok(checked) => {
                    remote.succeeded();
                    if checked.state_lost {
                        shared.meters.state_lost();
                        tracing::warn!(
                            "the store lost its state (restarted empty, flushed or evicted): on_state_loss applies"
                        );
                    }
                    let all = AllDecision {
                        allowed: checked.allowed,
                        decisions: checked.decisions,
                    };
                    return Ok(verdict(pairs, all, false));
                }
                Err(StoreError::Invalid(message)) => return Err(Refusal::Unsupported(message)),
                Err(e) => {
                    remote.failed();
                    shared.meters.store_error(match e {
                        StoreError::Timeout(_) => "timeout",
                        StoreError::Reply => "reply",
                        _ => "redis",
                    });
                    tracing::debug!(error = %e, "store call failed");
                }
            }
        }
        None => shared.meters.store_error("circuit_open"),
    }
    fall_back(shared, pairs, max_delay, default)
}

/// Checks what the in-process limiter would refuse, so that both stores
/// refuse the same requests with the same errors; the store's checks.
fn validate<'s>(
    shared: &'s Shared,
    pairs: &[(&'s str, &'s str, u64)],
) -> Result<Vec<Check<'s>>, Error> {
    let mut checks: Vec<Check<'s>> = Vec::with_capacity(pairs.len());
    for &(name, key, cost) in pairs {
        let Some((name, policy)) = shared.config.policies.iter().find(|(n, _)| n == name) else {
            return Err(Error::UnknownPolicy(name.to_owned()));
        };
        policy
            .validate_cost(cost.max(1))
            .map_err(|error| Error::Cost {
                policy: name.clone(),
                error,
            })?;
        if key.len() > weir_redis::MAX_IDENTITY {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max: weir_redis::MAX_IDENTITY,
            });
        }
        if checks.iter().any(|c| c.name == name && c.identity == key) {
            return Err(Error::DuplicateCheck {
                policy: name.clone(),
                key: key.to_owned(),
            });
        }
        let rules = shared.config.rules.get(name).copied().unwrap_or_default();
        checks.push(Check {
            name,
            policy,
            identity: key,
            on_loss: rules.on_state_loss,
            cost: Some(cost),
        });
    }
    Ok(checks)
}

/// Decides without the store: `deny` anywhere refuses; `local` policies are
/// checked all-or-nothing by the scaled in-process limiter; `allow` admits
/// without counting (reporting the full limit as remaining).
fn fall_back<'a>(
    shared: &Shared,
    pairs: &[(&'a str, &str, u64)],
    max_delay: Nanos,
    default: Option<OnStoreError>,
) -> Result<Verdict<'a>, Refusal> {
    let rule = |policy: &str| {
        shared
            .config
            .rules
            .get(policy)
            .and_then(|r: &Rules| r.on_store_error)
            .or(default)
    };
    for (policy, _, _) in pairs {
        shared.meters.fallback(policy);
    }
    let rules: Vec<Option<OnStoreError>> = pairs.iter().map(|(p, _, _)| rule(p)).collect();
    if rules.contains(&Some(OnStoreError::Deny)) {
        return Err(Refusal::Unavailable { denied: true });
    }
    if rules.contains(&None) {
        return Err(Refusal::Unavailable { denied: false });
    }
    let local: Vec<(&str, &str, u64)> = pairs
        .iter()
        .zip(&rules)
        .filter(|(_, r)| **r == Some(OnStoreError::Local))
        .map(|(p, _)| *p)
        .collect();
    let checked = if local.is_empty() {
        AllDecision {
            allowed: true,
            decisions: Vec::new(),
        }
    } else {
        shared
            .limiter
            .check_each_within(&local, max_delay)
            .map_err(Refusal::Invalid)?
    };
    let mut local_decisions = checked.decisions.into_iter();
    let decisions = rules
        .iter()
        .zip(pairs)
        .map(|(rule, (policy, _, _))| match rule {
            Some(OnStoreError::Local) => local_decisions.next().unwrap_or_default(),
            _ => Decision {
                allowed: true,
                remaining: shared.limit(policy),
                ..Decision::default()
            },
        })
        .collect();
    let all = AllDecision {
        allowed: checked.allowed,
        decisions,
    };
    Ok(verdict(pairs, all, true))
}

/// What a check of cost 1 of `key` would decide now, charging nothing (the
/// admin `GET`): the shared store's answer, never a fallback's.
pub(crate) async fn peek(shared: &Shared, policy: &str, key: &str) -> Result<Decision, Refusal> {
    let Some(remote) = &shared.remote else {
        return shared
            .limiter
            .peek_policy(policy, key, 1)
            .map_err(Refusal::Invalid);
    };
    let checks = validate(shared, &[(policy, key, 1)]).map_err(Refusal::Invalid)?;
    let store = remote
        .available()
        .ok_or(Refusal::Unavailable { denied: true })?;
    match store.decide(&checks, 1, None, Mode::Peek).await {
        Ok(checked) => checked
            .decisions
            .first()
            .copied()
            .ok_or(Refusal::Unavailable { denied: true }),
        Err(StoreError::Invalid(m)) => Err(Refusal::Unsupported(m)),
        Err(_) => Err(Refusal::Unavailable { denied: true }),
    }
}

/// Forgets `key` under `policy` (the admin `DELETE`), in the shared store
/// and in the local fallback; whether the store held it.
pub(crate) async fn reset(shared: &Shared, policy: &str, key: &str) -> Result<bool, Refusal> {
    let local = shared
        .limiter
        .reset(policy, key)
        .map_err(Refusal::Invalid)?;
    let Some(remote) = &shared.remote else {
        return Ok(local);
    };
    let store = remote
        .available()
        .ok_or(Refusal::Unavailable { denied: true })?;
    store.reset(policy, key).await.map_err(|e| {
        tracing::warn!(error = %e, "admin reset failed");
        Refusal::Unavailable { denied: true }
    })
}
