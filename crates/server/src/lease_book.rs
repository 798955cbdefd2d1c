//! A concurrency policy's book of the leases this weir granted, for its
//! metrics; the policy table keeps one per concurrency policy.

use std::time::Duration;

use weir_core::Policy;
use weir_core::algo::LeaseId;

/// The most leases one policy's book keeps: past it, new leases go
/// uncounted in `weir_leases_in_use` (the store still holds them).
const MAX_BOOKED: usize = 100_000;

/// The leases of one concurrency policy this weir granted and that are
/// neither released nor expired, for its metrics: `weir_leases_in_use`,
/// `weir_leases_expired_total` (a holder that crashed or forgot) and
/// `weir_lease_releases_total` (`released`, or `not_live`: too late).
#[derive(Debug)]
pub(crate) struct Book {
    lease: Duration,
    /// Shared with the book of the same policy before its parameters
    /// changed: its leases carry over (`Policy::carry`).
    open: std::sync::Arc<std::sync::Mutex<Open>>,
    in_use: metrics::Gauge,
    expired: metrics::Counter,
    released: metrics::Counter,
    not_live: metrics::Counter,
}

#[derive(Debug, Default)]
struct Open {
    expires: std::collections::HashMap<LeaseId, std::time::Instant>,
    by_expiry: std::collections::BTreeSet<(std::time::Instant, LeaseId)>,
}

impl Book {
    /// The book of `policy` if it is a concurrency limit.
    pub(crate) fn of(name: &str, policy: &Policy) -> Option<Self> {
        let Policy::Concurrency(c) = policy else {
            return None;
        };
        let label = name.to_owned();
        let releases = |outcome: &'static str| metrics::counter!(crate::metrics::LEASE_RELEASES, "policy" => label.clone(), "outcome" => outcome);
        Some(Self {
            lease: Duration::from_nanos(c.lease()),
            open: std::sync::Arc::default(),
            in_use: metrics::gauge!(crate::metrics::LEASES_IN_USE, "policy" => label.clone()),
            expired: metrics::counter!(crate::metrics::LEASES_EXPIRED, "policy" => label.clone()),
            released: releases("released"),
            not_live: releases("not_live"),
        })
    }

    /// This policy's book under new parameters (`policy`, a concurrency
    /// limit too): the same open leases, the new lease length for renewals.
    pub(crate) fn continued(&self, name: &str, policy: &Policy) -> Option<Self> {
        let mut book = Self::of(name, policy)?;
        book.open = self.open.clone();
        Some(book)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Open) -> T) -> T {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        let mut gone = 0;
        while let Some(&(at, id)) = open.by_expiry.first().filter(|(at, _)| *at <= now) {
            open.by_expiry.remove(&(at, id));
            open.expires.remove(&id);
            gone += 1;
        }
        self.expired.increment(gone);
        let out = f(&mut open);
        self.in_use.set(open.expires.len() as f64);
        out
    }

    /// A lease granted now (or renewed now: it expires a lease from now).
    pub(crate) fn taken(&self, id: LeaseId) {
        let at = std::time::Instant::now() + self.lease;
        self.with(|open| {
            if let Some(before) = open.expires.insert(id, at) {
                open.by_expiry.remove(&(before, id));
            } else if open.expires.len() > MAX_BOOKED {
                open.expires.remove(&id);
                return;
            }
            open.by_expiry.insert((at, id));
        });
    }

    /// A release the store answered: `live` whether it freed the lease.
    pub(crate) fn released(&self, id: LeaseId, live: bool) {
        match live {
            true => self.released.increment(1),
            false => self.not_live.increment(1),
        }
        self.with(|open| {
            if let Some(at) = open.expires.remove(&id) {
                open.by_expiry.remove(&(at, id));
            }
        });
    }

    /// Counts the leases that expired by now.
    pub(crate) fn sweep(&self) {
        self.with(|_| ());
    }

    #[cfg(test)]
    pub(crate) fn open_leases(&self) -> usize {
        self.with(|open| open.expires.len())
    }
}
