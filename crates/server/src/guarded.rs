//! A shared store behind its circuit breaker, with the in-process fallback:
//! itself a [`Store`]. A store error is never an exhausted bucket: a check
//! the store cannot answer is decided by its policy's `on_store_error` rule
//! (the local fallback, allow or deny), marked degraded and counted.

use std::sync::Arc;

use weir_core::store::{self, Check, Checked, Mode, OnStoreError, Store};
use weir_core::{AllDecision, Decision};
use weir_limiter::Limiter;
use weir_redis::RedisStore;

use crate::breaker::Remote;
use crate::metrics::Meters;
use crate::telemetry::Traced;

/// Redis behind the breaker, and the fallback: the limiter of the same
/// policies scaled by `fallback_share`.
#[derive(Debug)]
pub struct Guarded {
    /// The store and its breaker.
    pub remote: Arc<Remote>,
    /// The fallback.
    pub fallback: Arc<Limiter>,
}

impl Store for Guarded {
    /// Decides on Redis; when it cannot answer (down, slow, the breaker
    /// open), each check by its `on_store_error`: `deny` anywhere fails
    /// closed ([`store::Error::Denied`]), a check without a rule leaves it
    /// to the caller ([`store::Error::Unavailable`]), `local` checks are
    /// decided all-or-nothing by the fallback and `allow` admits without
    /// counting.
    async fn decide(&self, checks: &[Check<'_>], mode: Mode) -> Result<Checked, store::Error> {
        // Refuse what the store would refuse before trying it, so that an
        // invalid request is refused alike whether Redis is up or not.
        store::validate(checks, self.remote.max_key_len())?;
        let failure = match self.remote_decide(checks, mode).await {
            Ok(checked) => return Ok(checked),
            Err(e @ (store::Error::Invalid(_) | store::Error::Unsupported(_))) => return Err(e),
            Err(failure) => failure,
        };
        let _fallback = Traced::start("weir.fallback");
        self.fall_back(checks, mode, failure)
    }

    /// Whether the shared store holds the key (never the fallback's word).
    async fn exists(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        Store::exists(&*self.available()?, name, key).await
    }

    /// Forgets the key in the shared store and in the fallback; whether
    /// the shared store held it.
    async fn reset(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        Store::reset(&*self.fallback, name, key).await?;
        Store::reset(&*self.available()?, name, key).await
    }

    /// Lifts the ban in the shared store and in the fallback; whether the
    /// shared store held one.
    async fn lift_ban(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        Store::lift_ban(&*self.fallback, name, key).await?;
        Store::lift_ban(&*self.available()?, name, key).await
    }
}

impl Guarded {
    /// The connected store while the breaker is closed.
    fn available(&self) -> Result<Arc<RedisStore>, store::Error> {
        self.remote.available().ok_or(store::Error::Unavailable {
            kind: "circuit_open",
            reason: "the circuit breaker is open".to_owned(),
        })
    }

    /// The decision of Redis, through the breaker of the master serving
    /// the request's identity (on a cluster).
    async fn remote_decide(
        &self,
        checks: &[Check<'_>],
        mode: Mode,
    ) -> Result<Checked, store::Error> {
        let remote = &self.remote;
        let traced = Traced::start("weir.store");
        traced.set("db.system.name", "redis");
        let node = checks.first().and_then(|c| remote.node_for(c.check.key));
        let node = node.as_deref();
        if let Some(node) = node {
            traced.set("server.address", node.addr.clone());
        }
        let store = match self.available() {
            Ok(store) if node.is_none_or(|n| n.is_up()) => store,
            Ok(_) | Err(_) => {
                Meters::store_error("circuit_open");
                traced.error("the circuit breaker is open".to_owned());
                return Err(store::Error::Unavailable {
                    kind: "circuit_open",
                    reason: "the circuit breaker is open".to_owned(),
                });
            }
        };
        match traced
            .around(charged(&store, remote.replica_acks, checks, mode))
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
                Ok(checked)
            }
            Err(
                e @ (weir_redis::StoreError::Invalid(_) | weir_redis::StoreError::Unsupported(_)),
            ) => Err(e.into()),
            Err(e) => {
                remote.failed(node);
                let e = store::Error::from(e);
                if let store::Error::Unavailable { kind, reason } = &e {
                    Meters::store_error(kind);
                    tracing::debug!(error = %reason, "store call failed");
                    traced.error(reason.clone());
                }
                Err(e)
            }
        }
    }

    /// Decides without the store, by each check's `on_store_error`.
    fn fall_back(
        &self,
        checks: &[Check<'_>],
        mode: Mode,
        failure: store::Error,
    ) -> Result<Checked, store::Error> {
        let rules: Vec<Option<OnStoreError>> = checks.iter().map(|c| c.on_error).collect();
        if rules.contains(&Some(OnStoreError::Deny)) {
            return Err(store::Error::Denied);
        }
        if rules.contains(&None) {
            return Err(failure);
        }
        let local: Vec<Check<'_>> = checks
            .iter()
            .filter(|c| c.on_error == Some(OnStoreError::Local))
            .copied()
            .collect();
        let checked = match local.is_empty() {
            true => Checked::default(),
            false => self.fallback.decide_now(&local, mode)?,
        };
        let allowed = local.is_empty() || checked.all.allowed;
        let mut local_decisions = checked.all.decisions.into_iter();
        let decisions = checks
            .iter()
            .map(|check| match check.on_error {
                Some(OnStoreError::Local) => local_decisions.next().unwrap_or_default(),
                _ => Decision {
                    allowed: true,
                    remaining: self.fallback_limit(&check.check),
                    ..Decision::default()
                },
            })
            .collect();
        Ok(Checked {
            all: AllDecision { allowed, decisions },
            degraded: true,
            ..Checked::default()
        })
    }

    /// The limit the fallback shows for a check's policy: its own (scaled)
    /// policy of that name, else the check's.
    fn fallback_limit(&self, check: &weir_core::Check<'_>) -> u64 {
        let policy = self
            .fallback
            .parameters(check.name)
            .unwrap_or(*check.policy);
        policy.quota().0
    }
}

/// One call on Redis; with `replica_acks`, an admission is not answered
/// before that many replicas hold it.
async fn charged(
    store: &RedisStore,
    replica_acks: u32,
    checks: &[Check<'_>],
    mode: Mode,
) -> Result<Checked, weir_redis::StoreError> {
    let checked = store.decide(checks, None, mode).await?;
    let charged =
        mode != Mode::Peek && checked.all.allowed && checks.iter().any(|c| c.check.cost > 0);
    if let (true, Some(first)) = (replica_acks > 0 && charged, checks.first()) {
        // Boxed: its future is large (~3 kB), and would otherwise make every
        // store call's future that large, copied on each call.
        let acked = Box::pin(store.wait_replicas(first.check.key, replica_acks)).await?;
        if acked < u64::from(replica_acks) {
            return Err(weir_redis::StoreError::Replication {
                acked,
                wanted: replica_acks,
            });
        }
    }
    Ok(checked)
}
