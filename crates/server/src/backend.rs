//! Where decisions are made: the configured [`Backend`] (a [`Store`]:
//! in process, or Redis guarded by its breaker and fallback), and the words
//! of a decision in the server — a [`Check`] by `TableId`, the `Verdict`
//! over a request's policies, why a request was `Undecided`, the one
//! identity bound (`scoped_key`). The pipeline that asks it is
//! `engine.rs`.

use std::sync::Arc;
use std::time::Duration;

use weir_core::store::{self, Mode, Store};
use weir_core::{AllDecision, CheckError, Decision, MAX_IDENTITY, Nanos};
use weir_limiter::Limiter;

use crate::breaker::Remote;
use crate::config::{Config, StoreUrl, TableId};
use crate::guarded::Guarded;
use crate::table::PolicyTable;
use weir_tower::Part;

/// A request's policies, checks or parts: a few, kept on the stack (a
/// route or a call names up to four without allocating).
pub(crate) type InlineVec<T> = smallvec::SmallVec<[T; 4]>;

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
/// use the keys it has. The store tells a missing key (`no_new_key`): the
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
    pub(crate) max_delay: Nanos,
    /// Per check: its policy is in shadow mode.
    pub(crate) shadow: InlineVec<bool>,
    /// Keys this decision stored that did not exist before.
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
    pub(crate) fn with_unlimited(self, table: &PolicyTable, checks: &[Check<'_>]) -> Self {
        let mut decided = self.all.decisions.into_iter();
        let mut shadows = self.shadow.into_iter();
        let mut decisions = Vec::with_capacity(checks.len());
        let mut shadow = InlineVec::with_capacity(checks.len());
        for check in checks {
            let entry = table.get(check.policy);
            if entry.unlimited {
                decisions.push(Decision {
                    allowed: true,
                    remaining: entry.shown.limit(false),
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
    pub(crate) fn visible<'t>(
        &self,
        table: &'t PolicyTable,
        ids: &[TableId],
    ) -> InlineVec<Part<'t>> {
        ids.iter()
            .zip(self.decisions())
            .enumerate()
            .filter(|(i, _)| !self.is_shadow(*i))
            .map(|(_, (id, d))| {
                let entry = table.get(*id);
                entry.shown.part(&entry.name, d, self.degraded)
            })
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

    async fn lift_ban(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        match self {
            Self::Memory(limiter) => Store::lift_ban(&**limiter, name, key).await,
            Self::Redis(guarded) => guarded.lift_ban(name, key).await,
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
        if let Some(penalty) = entry.penalty {
            builder = builder.penalty(entry.stored_as.clone(), penalty);
        }
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
    pub async fn wait_up(&self, within: Duration) -> bool {
        match self.remote() {
            Some(remote) => remote.wait_up(within).await,
            None => true,
        }
    }
}

/// The scope of keys a caller names itself: the decision API's, and the
/// Redis protocol's `WEIR.*` commands (one key, whichever face asks).
pub(crate) const API_SCOPE: &str = "api";

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
