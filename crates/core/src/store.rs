//! The store boundary: what every store — the in-process limiter, Redis, a
//! wrapper with a fallback — is asked, and what it answers. A store makes
//! the decisions of docs/SPEC.md for several checks at once, all-or-nothing;
//! the faces above it never know which store decides.
//!
//! One method does the work ([`Store::decide`]): a check, a report
//! ([`Check::report`]), a lease's release or renewal ([`Check::lease`]) and
//! a look that charges nothing ([`Mode::Peek`]) are all calls of it.

use std::future::Future;

use thiserror::Error;

use crate::algo::LeaseId;
use crate::{AllDecision, CheckError, Decision, Nanos, Policy};

/// What a key lost with the store's state counts as (`on_state_loss`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLoss {
    /// A new key: its full allowance (as if never seen).
    #[default]
    Full,
    /// Used up at the moment the loss was found; it refills from there.
    Empty,
}

/// What a policy does when its store cannot answer (`on_store_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// Decide in process, with the policy scaled by `fallback_share`.
    Local,
    /// Admit without counting (fail open).
    Allow,
    /// Refuse (fail closed).
    Deny,
}

/// Names and their values, for `FromStr` and `Display` alike.
macro_rules! words {
    ($type:ident { $($variant:ident = $word:literal),+ }) => {
        impl $type {
            /// The valid values, as a config error lists them.
            pub const VALID: &'static str = concat!($("\"", $word, "\" "),+);
        }
        impl std::str::FromStr for $type {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($word => Ok(Self::$variant),)+
                    _ => Err(format!("`{s}` is not valid (valid: {})", Self::VALID.trim_end())),
                }
            }
        }
        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $(Self::$variant => $word,)+ })
            }
        }
    };
}

words!(OnLoss { Full = "full", Empty = "empty" });
words!(OnStoreError { Local = "local", Allow = "allow", Deny = "deny" });

/// What a check does with a concurrency policy's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    /// A check: an admission takes this lease (random, so that identities
    /// are unique across every weir sharing a store, and an identity from
    /// another key or an earlier life of this one finds nothing; never 0).
    Take(LeaseId),
    /// Frees this lease if it is live (docs/SPEC.md's release).
    Release(LeaseId),
    /// Extends this lease if it is live (docs/SPEC.md's renew).
    Renew(LeaseId),
}

/// What a call does with its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Charge when every check allows and no shaper would delay by more
    /// than `max_delay` ns.
    Charge {
        /// The longest delay accepted.
        max_delay: Nanos,
    },
    /// Decide as a check would, writing nothing.
    Peek,
}

impl Mode {
    /// Charge, whatever a shaper's delay.
    pub const CHARGE: Self = Self::Charge {
        max_delay: Nanos::MAX,
    };
}

/// One check of a request as a store is asked it: `weir-core`'s check
/// (policy, key, cost; a cost of 0 reports the key's standing) and how it
/// is to be decided.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The policy, key and cost.
    pub check: crate::Check<'a>,
    /// What the key counts as when the store lost its state.
    pub on_loss: OnLoss,
    /// What the policy does when the store cannot answer (`None`: the
    /// caller decides, told by [`Error::Unavailable`]).
    pub on_error: Option<OnStoreError>,
    /// Decided and charged as if enforced, but never refusing the request
    /// (a shadow check that would refuse charges nothing).
    pub shadow: bool,
    /// Usage after the fact (docs/SPEC.md's report): always charged, possibly
    /// into debt; answered allowed with the wait of a check of cost 1. A
    /// request's checks are all reports or none.
    pub report: bool,
    /// A probe (docs/SPEC.md): answered as the check would be, charging
    /// nothing but the key's latest time (and a ban, when refused). A
    /// request's checks are all probes or none.
    pub probe: bool,
    /// The policy's penalty (docs/SPEC.md, "Penalties"), for a store that
    /// is told it with every check (Redis); a store that keeps its own
    /// policies decides by its own policy's penalty.
    pub penalty: Option<crate::Penalty>,
    /// The key must not be created: when it does not exist, the request
    /// is refused, storing nothing ([`Checked::new_key_refused`]) — for a
    /// client that has created its share of new keys.
    pub no_new_key: bool,
    /// Whether the caller counts the keys the request creates
    /// ([`Checked::created`]); when no check asks, a store may answer 0
    /// (the in-process store then looks no key up first).
    pub count_created: bool,
    /// On a concurrency policy: the lease an admission takes (chosen by
    /// [`Check::from`], random), or the lease a release or renewal acts on
    /// (then the request's only check).
    pub lease: LeaseOp,
}

impl<'a> From<crate::Check<'a>> for Check<'a> {
    fn from(check: crate::Check<'a>) -> Self {
        Self {
            check,
            on_loss: OnLoss::Full,
            on_error: None,
            shadow: false,
            report: false,
            probe: false,
            penalty: None,
            no_new_key: false,
            count_created: true,
            lease: LeaseOp::Take(match check.policy {
                Policy::Concurrency(_) => crate::algo::new_lease_id(),
                _ => 0,
            }),
        }
    }
}

impl Check<'_> {
    /// Whether it releases or renews a lease rather than deciding.
    pub fn is_lease_op(&self) -> bool {
        !matches!(self.lease, LeaseOp::Take(_))
    }
}

/// Validates a request as every store does before deciding it
/// ([`crate::check::validate`]; a report's cost by the report's own bound,
/// not the capacity): an invalid request is refused alike by every store,
/// and whether the store is up or not.
pub fn validate(checks: &[Check<'_>], max_key_len: usize) -> Result<(), CheckError> {
    let core: Vec<crate::Check<'_>> = checks
        .iter()
        .map(|c| crate::Check {
            cost: if c.report { 0 } else { c.check.cost },
            ..c.check
        })
        .collect();
    crate::check::validate(&core, max_key_len)?;
    checks
        .iter()
        .filter(|c| c.report)
        .try_for_each(|c| crate::check::validate_report(&c.check))
}

/// A decided request: the all-or-nothing decision every store gives, and
/// what the store noticed while making it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// The decision.
    pub all: AllDecision,
    /// The store found its state lost (restarted empty, flushed, evicted):
    /// `on_state_loss` applied.
    pub state_lost: bool,
    /// Keys this call stored that did not exist before.
    pub created: usize,
    /// A check marked [`Check::no_new_key`] found its key missing: the
    /// request was refused and nothing stored.
    pub new_key_refused: bool,
    /// Decided without the shared store, by the policies' `on_store_error`.
    pub degraded: bool,
}

impl Checked {
    /// The only decision of a call of one check.
    pub fn sole(self) -> Result<Decision, Error> {
        match self.all.decisions.as_slice() {
            [decision] => Ok(*decision),
            _ => Err(Error::Unavailable {
                kind: "reply",
                reason: "the store answered a call of one check with another number of decisions"
                    .into(),
            }),
        }
    }
}

/// Why a store gave no decision — never a rate limit's refusal, which is a
/// decision (`allowed: false`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    /// The request can never be decided as given (cost, key, a pair named
    /// twice): nothing charged, in every store alike.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// This store cannot decide this request as one atomic call (on a Redis
    /// Cluster, checks of several identities): nothing charged.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The in-process key budget is spent and no key is idle.
    #[error("the store holds its most keys ({max}) and none is idle")]
    Full {
        /// The budget.
        max: usize,
    },
    /// The store did not answer (transient: trying later may succeed), and
    /// no policy's `on_store_error` decided instead.
    #[error("the store did not answer ({kind}): {reason}")]
    Unavailable {
        /// What failed, as the store-error metric labels it (`timeout`,
        /// `reply`, `replication`, `redis`, `circuit_open`).
        kind: &'static str,
        /// What happened, for the log.
        reason: String,
    },
    /// The store did not answer and a policy's `on_store_error` is `deny`:
    /// the request is refused (fail closed).
    #[error("the store did not answer and a policy fails closed (on_store_error = \"deny\")")]
    Denied,
}

/// A store: decides requests of several checks all-or-nothing, exactly as
/// docs/SPEC.md says, whoever asks. The in-process limiter
/// (`weir_limiter::Limiter`) and Redis (`weir_redis::RedisStore`) are
/// stores; so is a wrapper that guards one with a fallback.
///
/// A check names its policy by name and carries its parameters: a store
/// that keeps its own policies (the in-process limiter) decides by its own
/// policy of that name, and adds a policy it does not know from the
/// check's (Envoy's per-descriptor limits).
pub trait Store: Send + Sync {
    /// Decides `checks` as one request: all-or-nothing in [`Mode::Charge`],
    /// charging nothing in [`Mode::Peek`]; a request of reports charges
    /// them all; a request of one lease operation releases or renews it
    /// (`allowed`: it was live).
    fn decide(
        &self,
        checks: &[Check<'_>],
        mode: Mode,
    ) -> impl Future<Output = Result<Checked, Error>> + Send;

    /// Whether `key` has state under the policy `name`.
    fn exists(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Forgets `key` under the policy `name`, which grants it a fresh
    /// allowance; whether it was stored.
    fn reset(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Lifts the ban of `key` under the policy `name` (docs/SPEC.md's
    /// penalties): its ban and the memory of its level are forgotten, its
    /// allowance left as it is; whether it had a ban to lift.
    fn lift_ban(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The parameters of the policy this store keeps under `name`, for a
    /// store that keeps its own policies (the in-process limiter); `None`
    /// for one that is told them with every check (Redis).
    fn parameters(&self, name: &str) -> Option<Policy> {
        let _ = name;
        None
    }

    /// Releases or renews the lease `op` names of `check`'s key under its
    /// concurrency policy: allowed is whether it was live, with the
    /// standing after it.
    fn on_lease(
        &self,
        check: crate::Check<'_>,
        op: LeaseOp,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        let check = Check {
            lease: op,
            ..Check::from(crate::Check { cost: 0, ..check })
        };
        async move { self.decide(&[check], Mode::CHARGE).await?.sole() }
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn decide(
        &self,
        checks: &[Check<'_>],
        mode: Mode,
    ) -> impl Future<Output = Result<Checked, Error>> + Send {
        (**self).decide(checks, mode)
    }

    fn exists(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        (**self).exists(name, key)
    }

    fn reset(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        (**self).reset(name, key)
    }

    fn lift_ban(&self, name: &str, key: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        (**self).lift_ban(name, key)
    }

    fn parameters(&self, name: &str) -> Option<Policy> {
        (**self).parameters(name)
    }
}
