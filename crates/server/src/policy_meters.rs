//! What is counted of one policy, made once per policy: its decisions by
//! outcome, near-limit admissions, fallbacks, reported usage, a shaper's
//! queue depth, a concurrency limit's lease book, and the dashboard's
//! live counts.

use metrics::{Counter, Gauge};
use weir_core::Policy;
use weir_core::algo::LeaseId;

pub(crate) use crate::live::Outcome;

/// One policy's meters.
#[derive(Debug)]
pub(crate) struct PolicyMeters {
    decisions: [Counter; 6],
    /// `weir_near_limit_total`: admissions that left less than the
    /// near-limit share (a part of `allowed`, counted apart so that the
    /// outcomes of `weir_decisions_total` add up to the decisions).
    near_limit: Counter,
    fallbacks: Counter,
    reported: Counter,
    /// `weir_bans_total`: bans begun (docs/SPEC.md's penalties).
    bans: Counter,
    /// What the dashboard reads.
    pub(crate) live: crate::live::Live,
    /// A shaper's `weir_queue_depth`: requests held in its delay now.
    queue: Option<Gauge>,
    /// A concurrency limit's leases granted here, for its metrics (kept
    /// across reloads that leave the policy as it was, as its keys are).
    leases: Option<std::sync::Arc<crate::lease_book::Book>>,
}

impl PolicyMeters {
    /// The meters of policy `name`.
    pub(crate) fn new(name: &str, policy: &Policy) -> Self {
        crate::metrics::handle(); // the recorder first, then the handles
        let counter = |outcome: &'static str| metrics::counter!(crate::metrics::DECISIONS, "policy" => name.to_owned(), "outcome" => outcome);
        Self {
            decisions: [
                counter("allowed"),
                counter("rejected"),
                counter("uncharged"),
                counter("error"),
                counter("shadow_limited"),
                counter("unlimited"),
            ],
            near_limit: metrics::counter!(crate::metrics::NEAR_LIMIT, "policy" => name.to_owned()),
            fallbacks: metrics::counter!(crate::metrics::FALLBACK_DECISIONS, "policy" => name.to_owned()),
            reported: metrics::counter!(crate::metrics::REPORTED_COST, "policy" => name.to_owned()),
            bans: metrics::counter!(crate::metrics::BANS, "policy" => name.to_owned()),
            live: crate::live::Live::default(),
            // Only a shaper holds requests in a queue.
            queue: matches!(policy, Policy::LeakyBucket(_))
                .then(|| metrics::gauge!(crate::metrics::QUEUE_DEPTH, "policy" => name.to_owned())),
            leases: crate::lease_book::Book::of(name, policy).map(std::sync::Arc::new),
        }
    }

    pub(crate) fn count(&self, outcome: Outcome) {
        self.decisions[outcome as usize].increment(1);
    }

    /// An admission that left less than the near-limit share.
    pub(crate) fn near_limit(&self) {
        self.near_limit.increment(1);
    }

    /// Usage reported after the fact.
    pub(crate) fn reported(&self, cost: u64) {
        self.reported.increment(cost);
    }

    /// A ban begun on `key`, for `wait` ns: counted, and marked on the
    /// dashboard's top keys until it ends.
    pub(crate) fn banned(&self, key: &str, wait: weir_core::Nanos) {
        self.bans.increment(1);
        self.live.banned(key, wait);
    }

    pub(crate) fn fell_back(&self) {
        self.fallbacks.increment(1);
    }

    /// A lease this weir granted, or renewed: live a lease from now.
    pub(crate) fn lease_taken(&self, lease: LeaseId) {
        if let Some(book) = &self.leases {
            book.taken(lease);
        }
    }

    /// A release the store answered: `live` whether it freed the lease.
    pub(crate) fn lease_released(&self, lease: LeaseId, live: bool) {
        if let Some(book) = &self.leases {
            book.released(lease, live);
        }
    }

    /// Counts the leases that expired unreleased by now.
    pub(crate) fn sweep_leases(&self) {
        if let Some(book) = &self.leases {
            book.sweep();
        }
    }

    /// Keeps the lease book of `old`, the same policy's meters before a
    /// reload (`name` and `policy` now): as it was when the policy is
    /// unchanged, continued when its parameters changed.
    pub(crate) fn keep_book_of(
        &mut self,
        old: &PolicyMeters,
        name: &str,
        unchanged: bool,
        policy: &Policy,
    ) {
        let (Some(book), Some(_)) = (&old.leases, &self.leases) else {
            return;
        };
        self.leases = match unchanged {
            true => Some(book.clone()),
            false => book.continued(name, policy).map(std::sync::Arc::new),
        };
    }

    /// Its lease book (a concurrency limit's).
    #[cfg(test)]
    pub(crate) fn book(&self) -> Option<std::sync::Arc<crate::lease_book::Book>> {
        self.leases.clone()
    }

    /// A request held in this shaper's delay, until the guard drops (it
    /// is released, or its client left): none for other algorithms.
    pub(crate) fn waiting(&self) -> Option<Waiting> {
        self.queue.as_ref().map(|gauge| {
            gauge.increment(1.0);
            Waiting(gauge.clone())
        })
    }
}

/// One request counted in a shaper's `weir_queue_depth` while it lives.
#[derive(Debug)]
pub(crate) struct Waiting(Gauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
