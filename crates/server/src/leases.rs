//! The leases the gateway holds for a request it forwards: from admission
//! until the answer's body has ended, the client has gone away or the
//! upstream has failed — whichever comes first — renewed at half the lease
//! while a long answer is still streaming. Held by `weir_tower`'s [`Held`]
//! (the tower layer's own) over [`Booked`]: the store that took them, each
//! outcome booked in its policy's lease book.

use std::sync::Arc;

use weir_core::store::{self, Check, Checked, Mode, Store};
use weir_core::{AllDecision, CheckError, Policy};
use weir_tower::Held;

use crate::backend::Verdict;
use crate::config::TableId;
use crate::state::Shared;

/// Where an admission's leases live: the shared store, or (`local`: taken
/// while it was down) the in-process fallback; every release and renewal
/// is booked in its policy's lease book ([`Shared::on_lease`]).
#[derive(Debug, Clone)]
pub(crate) struct Booked {
    shared: Arc<Shared>,
    local: bool,
}

impl Store for Booked {
    /// A release or a renewal ([`Shared::on_lease`]); nothing else is
    /// asked of the leases' store.
    async fn decide(&self, checks: &[Check<'_>], _: Mode) -> Result<Checked, store::Error> {
        let shared = &self.shared;
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            let policy = (shared.table.iter())
                .find(|(_, e)| e.stored_as == check.check.name)
                .map(|(id, _)| id)
                .ok_or_else(|| CheckError::UnknownPolicy(check.check.name.to_owned()))?;
            let decided = shared.on_lease(policy, check.check.key, check.lease, self.local);
            decisions.push(decided.await.map_err(|_| store::Error::Unavailable {
                kind: "lease",
                reason: "the lease's store did not answer".to_owned(),
            })?);
        }
        Ok(Checked {
            all: AllDecision {
                allowed: decisions.iter().all(|d| d.allowed),
                decisions,
            },
            ..Checked::default()
        })
    }

    async fn exists(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        self.shared.backend.exists(name, key).await
    }

    async fn reset(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        self.shared.backend.reset(name, key).await
    }

    async fn lift_ban(&self, name: &str, key: &str) -> Result<bool, store::Error> {
        self.shared.backend.lift_ban(name, key).await
    }
}

/// The leases `verdict` took for the checks of `ids` on `key`, held and
/// renewed until dropped; `None` when it took none.
pub(crate) fn held(
    shared: &Arc<Shared>,
    key: &str,
    ids: &[TableId],
    verdict: &Verdict,
) -> Option<Held<Booked>> {
    let leases: Vec<(String, Policy, u64)> = ids
        .iter()
        .zip(verdict.decisions())
        .filter_map(|(&id, d)| {
            let entry = shared.table.get(id);
            Some((entry.stored_as.clone(), entry.policy, d.lease?))
        })
        .collect();
    let store = Booked {
        shared: shared.clone(),
        local: verdict.degraded,
    };
    Held::new(store, key, leases, true)
}
