//! The refusal cache: a refusal from Redis is a promise about the future.
//!
//! A check of cost 1 refused with `retry_after = d` means the key has less
//! than one unit of allowance until `d` has passed, and nothing but time can
//! give it more: no instance can be admitted meanwhile (every check costs at
//! least 1), so every check of cost 1 of that policy and key until then is
//! refused — with `remaining` 0, `retry_after` the rest of `d` and `reset`
//! the rest of the refusal's `reset` — and is answered here, without a call.
//! The wait is measured from when the request was *sent*: Redis decided it
//! no earlier, so the promise can only end later than the cache assumes.
//! (Refusals of other costs are not cached: the contract suite found
//! answers of a cached cost above 1 that Redis would not give; the script
//! still says how long such a refusal's `remaining` stays 0, for when that
//! is settled.)
//!
//! What the cache does not see: a reset by an admin (every instance hears
//! of it through Redis pub/sub, [`CHANNEL`], and forgets the key; one that
//! missed the message refuses until `d` at most), a report of usage by
//! another instance (Redis's wait grows; the cached one does not, so the
//! cached `retry_after` is then a lower bound), and a loss of Redis's state
//! (the key starts over in Redis; the cache refuses until `d`, stricter
//! than Redis, never more lenient). Other costs, several policies at once,
//! shadow checks, reports, peeks and concurrency limits (a release frees
//! room before the wait) always go to Redis.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use weir_core::{Decision, Nanos, Policy};

/// The pub/sub channel of resets: the message is the reset key.
pub const CHANNEL: &str = "rl:v1:resets";

/// The most keys refused at once that the cache remembers; past that it
/// sweeps out expired refusals, and caches nothing new if none expired.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// Whether the cache may answer a request: one charged check of cost 1,
/// neither a shadow nor a report (the others always go to Redis).
pub(crate) fn cacheable(checks: &[crate::Check<'_>], mode: crate::Mode) -> bool {
    matches!(mode, crate::Mode::Charge { .. })
        && matches!(checks, [c] if c.check.cost == 1 && !(c.report || c.shadow))
        // A concurrency refusal's wait is an upper bound: a release frees
        // room before it.
        && !matches!(checks[0].check.policy, Policy::Concurrency(_))
}

/// Which clock a time is on: Redis's (read locally as elapsed time since
/// the store connected) or an explicit one given with each check (replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    Local,
    Explicit,
}

#[derive(Debug, Clone)]
struct Refusal {
    policy: Policy,
    clock: Clock,
    /// The cost refused.
    cost: u64,
    /// The latest time the key was checked at (docs/SPEC.md's clamp).
    seen: Nanos,
    /// When `cost` units are available again.
    until: Nanos,
    /// When one unit is (until then `remaining` is 0).
    unit_until: Nanos,
    /// When the key is fully available again.
    idle_at: Nanos,
    /// When the key's ban ends (0: not banned). A banned key's refusals are
    /// answered here until then, never after: once a ban is over, a refusal
    /// starts the next one, which only the store may decide.
    banned_until: Nanos,
}

/// What Redis answered to a check of one cost, for the cache to keep.
pub(crate) struct Refused<'a> {
    pub(crate) cost: u64,
    pub(crate) decision: &'a Decision,
    /// For a cost above 1 refused, the wait until a check of cost 1 fits.
    pub(crate) unit_wait: Nanos,
}

/// Refusals still in force, by store key.
#[derive(Debug)]
pub(crate) struct Refusals {
    entries: Mutex<HashMap<String, Refusal>>,
    /// The origin of the local clock.
    start: Instant,
}

impl Default for Refusals {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
            start: Instant::now(),
        }
    }
}

impl Refusals {
    /// Now on the local clock.
    pub(crate) fn local_now(&self) -> Nanos {
        Nanos::try_from(self.start.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Refusal>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The refusal of a check of `cost` of `key` at `now`, if one is
    /// promised.
    pub(crate) fn answer(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        clock: Clock,
        now: Nanos,
    ) -> Option<Decision> {
        let mut entries = self.entries();
        let refusal = entries.get_mut(key)?;
        if refusal.clock != clock || refusal.policy != *policy || refusal.cost != cost {
            return None;
        }
        let at = now.max(refusal.seen);
        if at >= refusal.until.min(refusal.unit_until)
            || (refusal.banned_until > 0 && at >= refusal.banned_until)
        {
            return None;
        }
        refusal.seen = at;
        Some(Decision {
            allowed: false,
            remaining: 0,
            retry_after: refusal.until - at,
            reset: refusal.idle_at.saturating_sub(at),
            delay: 0,
            lease: None,
            banned: refusal.banned_until.saturating_sub(at),
            new_ban: false,
        })
    }

    /// Forgets the refusal of `key`, which is about to go to Redis; the time
    /// the call should be made at on the explicit clock: not before a
    /// refusal answered here (which moved the key's latest time, as any
    /// check does).
    pub(crate) fn take(&self, key: &str, clock: Clock, now: Nanos) -> Nanos {
        match self.entries().remove(key) {
            Some(r) if r.clock == clock && clock == Clock::Explicit => now.max(r.seen),
            _ => now,
        }
    }

    /// Remembers the answer of Redis to a check of `key` sent at `sent`,
    /// if it was a refusal with `remaining` 0.
    pub(crate) fn record(
        &self,
        key: &str,
        policy: &Policy,
        clock: Clock,
        sent: Nanos,
        refused: &Refused<'_>,
    ) {
        let decision = refused.decision;
        // A wait saturated at the longest (weir-core's MAX_WAIT) is not a
        // time that passes: answered by Redis, never counted down here.
        let saturated = decision.retry_after.max(decision.reset) >= weir_core::policy::MAX_WAIT;
        if decision.allowed || decision.retry_after == 0 || decision.remaining != 0 || saturated {
            return;
        }
        let until = sent.saturating_add(decision.retry_after);
        let refusal = Refusal {
            policy: *policy,
            clock,
            cost: refused.cost,
            seen: sent,
            until,
            unit_until: match refused.cost {
                1 => until,
                _ => sent.saturating_add(refused.unit_wait),
            },
            idle_at: sent.saturating_add(decision.reset),
            banned_until: match decision.banned {
                0 => 0,
                wait => sent.saturating_add(wait),
            },
        };
        let mut entries = self.entries();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(key) {
            // Local-clock refusals are swept by `sent`, the latest time seen.
            entries.retain(|_, r| r.clock == Clock::Explicit || r.until > sent);
            if entries.len() >= MAX_ENTRIES {
                return;
            }
        }
        match entries.get_mut(key) {
            // Answers can come back out of order: the refusal decided last
            // promises the most (an admission between two refusals comes
            // after the first one's `until`).
            Some(held)
                if held.clock == clock && held.policy == *policy && held.cost == refusal.cost =>
            {
                held.seen = held.seen.max(refusal.seen);
                if refusal.until > held.until {
                    (held.until, held.unit_until, held.idle_at, held.banned_until) = (
                        refusal.until,
                        refusal.unit_until,
                        refusal.idle_at,
                        refusal.banned_until,
                    );
                }
            }
            _ => {
                entries.insert(key.to_owned(), refusal);
            }
        }
    }

    /// Forgets `key` (a reset, here or on another instance).
    pub(crate) fn forget(&self, key: &str) {
        self.entries().remove(key);
    }

    /// Refusals held.
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }
}

/// Forgets every key reset anywhere (a message on [`CHANNEL`]), for as long
/// as the cache lives; listens to the nodes in turn when one goes away.
pub(crate) async fn listen(refusals: Weak<Refusals>, nodes: Vec<redis::Client>) {
    for client in nodes.iter().cycle() {
        if refusals.strong_count() == 0 {
            return;
        }
        if let Ok(mut pubsub) = client.get_async_pubsub().await
            && pubsub.subscribe(CHANNEL).await.is_ok()
        {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(refusals) = refusals.upgrade() else {
                    return;
                };
                if let Ok(key) = std::str::from_utf8(message.get_payload_bytes()) {
                    refusals.forget(key);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
