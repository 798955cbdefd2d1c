//! The decision pipeline every face calls: a face turns its input into an
//! [`Ask`] and the [`Verdict`] into its answer. Here, once: the new-key
//! guard (`[server] new_keys_per_ip`), unlimited overrides answered without
//! a store call, the table's checks made store checks with their rules, the
//! store's answer (its fallback's, when degraded) made a verdict, every
//! outcome counted, the keys created counted against the client's share,
//! and the leases taken booked. Usage reports, the admin API's look and
//! reset, and a lease's release or renewal go through here as well.

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Instant;

use weir_core::store::{self, LeaseOp, Mode, OnStoreError, Store};
use weir_core::{AllDecision, Decision, NANOS_PER_SEC, Nanos};

use crate::backend::{Check, InlineVec, NewKeys, Undecided, Verdict};
use crate::config::TableId;
use crate::policy_meters::Outcome;
use crate::state::{NEW_KEYS, Shared};
use crate::table::PolicyTable;
use crate::telemetry::Traced;

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
    /// Probes (docs/SPEC.md): answered as the checks would be, charging
    /// nothing (a refusal under a penalty still bans).
    pub(crate) probe: bool,
}

impl Shared {
    /// Decides `ask` all-or-nothing: a client that has created its share
    /// of new keys may only use the keys it has; the keys the decision
    /// created are counted against its share; the leases it took are
    /// booked in their policies.
    pub(crate) async fn decide(&self, ask: Ask<'_>) -> Result<Verdict, Undecided> {
        let new_keys = self.may_create(ask.client);
        let verdict = (self.verdict(ask, new_keys)).await?;
        self.created(ask.client, verdict.created);
        for (check, decision) in ask.checks.iter().zip(verdict.decisions()) {
            if let Some(lease) = decision.lease {
                self.table.get(check.policy).meters.lease_taken(lease);
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
        let (decided, created) = self.charge_reports(checks, new_keys).await?;
        self.created(client, created);
        Ok(decided)
    }

    /// Decides `checks` all-or-nothing, refusing shaper waits over
    /// `max_delay`. A policy without an `on_store_error` rule follows
    /// `default`; with none, a store failure makes the request
    /// [`Undecided::Unavailable`]. Counts every policy's outcome.
    async fn verdict(&self, ask: Ask<'_>, new_keys: NewKeys) -> Result<Verdict, Undecided> {
        let (checks, max_delay, default) = (ask.checks, ask.max_delay, ask.on_store_error);
        let (table, meters) = (&self.table, &self.meters);
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
                let asked: InlineVec<store::Check<'_>> = (counted.iter())
                    .map(|c| store::Check {
                        no_new_key: new_keys != NewKeys::Allowed,
                        count_created: self.new_keys.is_some(),
                        on_error: table.get(c.policy).on_store_error.or(default),
                        probe: ask.probe,
                        ..store_check(table, c)
                    })
                    .collect();
                traced
                    .around(self.backend.decide(&asked, Mode::Charge { max_delay }))
                    .await
            }
        };
        if matches!(&decided, Ok(c) if c.degraded)
            || matches!(
                &decided,
                Err(store::Error::Unavailable { .. } | store::Error::Denied)
            )
        {
            counted
                .iter()
                .for_each(|c| table.get(c.policy).meters.fell_back());
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
                    entry.meters.count(outcome);
                    if d.new_ban {
                        entry.meters.banned(check.key, d.banned);
                    }
                    entry
                        .meters
                        .live
                        .count(outcome, verdict.degraded, check.key);
                    if outcome == Outcome::Allowed
                        && table.near_limit(entry, d.remaining, verdict.degraded)
                    {
                        entry.meters.near_limit();
                    }
                }
            }
            Err(_) => checks
                .iter()
                .for_each(|c| table.get(c.policy).meters.count(Outcome::Error)),
        }
        decided
    }

    /// Charges usage after the fact (docs/SPEC.md's reports): every check is
    /// charged, possibly into debt, after all are validated, in one store
    /// call; a store failure is [`Undecided::Unavailable`] (usage is never
    /// charged to a fallback).
    async fn charge_reports(
        &self,
        checks: &[Check<'_>],
        new_keys: NewKeys,
    ) -> Result<(Vec<Decision>, usize), Undecided> {
        let table = &self.table;
        let reports: InlineVec<store::Check<'_>> = checks
            .iter()
            .map(|c| store::Check {
                report: true,
                no_new_key: new_keys != NewKeys::Allowed,
                count_created: self.new_keys.is_some(),
                on_error: Some(OnStoreError::Deny),
                ..store_check(table, c)
            })
            .collect();
        let checked = self.backend.decide(&reports, Mode::CHARGE).await?;
        if let (true, NewKeys::Refused(wait)) = (checked.new_key_refused, new_keys) {
            return Err(Undecided::NewKeys(wait));
        }
        for c in checks {
            table.get(c.policy).meters.reported(c.cost);
        }
        Ok((checked.all.decisions, checked.created))
    }

    /// What a check of cost 1 of `key` would decide now, charging nothing,
    /// and whether the key is stored (the admin `GET`): the shared store's
    /// answer, never a fallback's.
    pub(crate) async fn peek(
        &self,
        policy: TableId,
        key: &str,
    ) -> Result<(Decision, bool), Undecided> {
        self.peek_cost(policy, key, 1).await
    }

    /// What a check of `cost` (0: the standing, refused only in debt or
    /// while banned) would decide now, charging nothing; whether the key
    /// has state.
    pub(crate) async fn peek_cost(
        &self,
        policy: TableId,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, bool), Undecided> {
        let table = &self.table;
        let check = Check { policy, key, cost };
        let asked = [store::Check {
            on_error: Some(OnStoreError::Deny),
            ..store_check(table, &check)
        }];
        let stored_as = &table.get(policy).stored_as;
        let (checked, exists) = tokio::join!(
            self.backend.decide(&asked, Mode::Peek),
            self.backend.exists(stored_as, key)
        );
        Ok((checked?.sole()?, exists?))
    }

    /// Releases or renews a concurrency policy's lease where it was taken:
    /// the shared store, or (`local`: taken while the store was down) the
    /// in-process fallback — in process, at once. `allowed` is whether it
    /// was live; the outcome is booked in the policy's lease book.
    pub(crate) async fn on_lease(
        &self,
        policy: TableId,
        key: &str,
        op: LeaseOp,
        local: bool,
    ) -> Result<Decision, Undecided> {
        let check = Check {
            policy,
            key,
            cost: 0,
        };
        let asked = [store::Check {
            lease: op,
            on_error: Some(OnStoreError::Deny),
            ..store::Check::from(core_check(&self.table, &check))
        }];
        let decided = match local || self.backend.remote().is_none() {
            true => self.backend.local().decide_now(&asked, Mode::CHARGE),
            false => self.backend.decide(&asked, Mode::CHARGE).await,
        };
        let entry = self.table.get(policy);
        let decided = decided.and_then(store::Checked::sole);
        match (op, &decided) {
            (LeaseOp::Release(lease), Ok(d)) => entry.meters.lease_released(lease, d.allowed),
            (LeaseOp::Renew(lease), Ok(d)) if d.allowed => entry.meters.lease_taken(lease),
            (LeaseOp::Renew(_), Ok(_)) => {
                tracing::debug!(policy = %entry.name, "a lease expired before its renewal");
            }
            (LeaseOp::Release(_), Err(_)) => {
                tracing::warn!(policy = %entry.name, "a lease could not be released: the store did not answer; it expires by itself");
            }
            (LeaseOp::Renew(_), Err(_)) => {
                tracing::warn!(policy = %entry.name, "a lease could not be renewed: the store did not answer");
            }
            (LeaseOp::Take(_), _) => {}
        }
        Ok(decided?)
    }

    /// Forgets `key` under `policy` (the admin `DELETE`), in the shared
    /// store and in the local fallback; whether the store held it.
    pub(crate) async fn reset(&self, policy: TableId, key: &str) -> Result<bool, Undecided> {
        let stored_as = &self.table.get(policy).stored_as;
        self.backend.reset(stored_as, key).await.map_err(|e| {
            tracing::warn!(error = %e, "admin reset failed");
            Undecided::from(e)
        })
    }

    /// Lifts the ban of `key` under `policy` (an admin's word); whether it
    /// had one.
    pub(crate) async fn lift_ban(&self, policy: TableId, key: &str) -> Result<bool, Undecided> {
        let stored_as = &self.table.get(policy).stored_as;
        self.backend.lift_ban(stored_as, key).await.map_err(|e| {
            tracing::warn!(error = %e, "lifting a ban failed");
            Undecided::from(e)
        })
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
        penalty: entry.penalty,
        ..store::Check::from(core_check(table, check))
    }
}
