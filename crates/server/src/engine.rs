//! The decision pipeline every face calls: a face turns its input into an
//! [`Ask`] and the [`Verdict`] into its answer. Here, once: the new-key
//! guard (`[server] new_keys_per_ip`), the store call with its fallback
//! and overrides ([`Backend::decide`](crate::backend::Backend::decide)),
//! the keys created counted against the client's share, and the leases
//! taken booked.

use std::net::IpAddr;

use weir_core::store::OnStoreError;
use weir_core::{Decision, NANOS_PER_SEC, Nanos};

use crate::backend::{Check, NewKeys, Undecided, Verdict};
use crate::state::{NEW_KEYS, Shared};

/// What a face asks of the pipeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// The request's checks, its overrides resolved.
    pub(crate) checks: &'a [Check<'a>],
    /// The client's address, for its share of new keys (`None`: no share
    /// applies, as for Envoy, whose clients are proxies).
    pub(crate) client: Option<IpAddr>,
    /// The longest shaper delay the caller accepts.
    pub(crate) max_delay: Nanos,
    /// The rule of a policy without `on_store_error` (`None`: the face
    /// decides, told by [`Undecided::Unavailable`]).
    pub(crate) on_store_error: Option<OnStoreError>,
}

impl Shared {
    /// Decides `ask` all-or-nothing: a client that has created its share
    /// of new keys may only use the keys it has; the keys the decision
    /// created are counted against its share; the leases it took are
    /// booked in their policies.
    pub(crate) async fn decide(&self, ask: Ask<'_>) -> Result<Verdict, Undecided> {
        let new_keys = self.may_create(ask.client);
        let verdict = (self.backend)
            .decide(
                &self.table,
                &self.meters,
                ask.checks,
                ask.max_delay,
                ask.on_store_error,
                new_keys,
            )
            .await?;
        self.created(ask.client, verdict.created);
        for (check, decision) in ask.checks.iter().zip(verdict.decisions()) {
            if let Some(lease) = decision.lease {
                self.table.get(check.policy).lease_taken(lease);
            }
        }
        Ok(verdict)
    }

    /// Charges usage after the fact (docs/SPEC.md's reports), under the
    /// same new-key guard as a check: each check's standing after it.
    pub(crate) async fn report(
        &self,
        checks: &[Check<'_>],
        client: Option<IpAddr>,
    ) -> Result<Vec<Decision>, Undecided> {
        let new_keys = self.may_create(client);
        let (decided, created) = self.backend.report(&self.table, checks, new_keys).await?;
        self.created(client, created);
        Ok(decided)
    }

    /// Whether `client` may store new keys (`[server] new_keys_per_ip`):
    /// while its share lasts, it may; the keys it creates are counted after
    /// (by [`Shared::created`]). Without a share left, the store refuses a
    /// request that would create a key ([`NewKeys::Refused`]), storing
    /// nothing; its known keys are decided as ever.
    fn may_create(&self, client: Option<IpAddr>) -> NewKeys {
        let (Some(new_keys), Some(client)) = (&self.new_keys, client) else {
            return NewKeys::Allowed;
        };
        let client = self.config.server.limits.client(client).to_string();
        let share = (new_keys.policy(NEW_KEYS))
            .and_then(|id| new_keys.peek(weir_limiter::Check::new(id, &client)));
        match share {
            Ok((d, _)) if d.allowed => NewKeys::Allowed,
            Ok((d, _)) => NewKeys::Refused(d.retry_after),
            // Too many clients tracked at once: refuse, never wave through.
            Err(_) => NewKeys::Refused(NANOS_PER_SEC),
        }
    }

    /// Counts the keys a decision for `client` created against its
    /// `new_keys_per_ip` share.
    fn created(&self, client: Option<IpAddr>, created: usize) {
        if let (Some(new_keys), Some(client), 1..) = (&self.new_keys, client, created) {
            let client = self.config.server.limits.client(client).to_string();
            if let Ok(id) = new_keys.policy(NEW_KEYS) {
                let check = weir_limiter::Check::new(id, &client);
                let _ = new_keys.report(check.cost(created as u64));
            }
        }
    }
}
