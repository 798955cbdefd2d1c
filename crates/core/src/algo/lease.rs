//! Concurrency limit: at most `limit` cost in flight at once. Each admission
//! is a lease that its holder releases when the work ends, renews while the
//! work goes on, and that expires `lease` after it was taken or last renewed
//! whatever happens, so a holder that crashed cannot keep capacity.
//!
//! The leases are kept in order of expiry: every lease taken or renewed at
//! `t` expires at `t + D`, and `t` never goes back (it is clamped to the
//! latest time the key has seen), so the newest is always the last.

use std::collections::VecDeque;
use std::collections::vec_deque::Iter;

use crate::Nanos;
use crate::decision::Decision;

/// Concurrency limit: at most `limit` cost held by live leases, each live
/// for `lease` after it was taken or last renewed (live at `t` while
/// `expires > t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Concurrency {
    limit: u64,
    lease: Nanos,
}

pub use crate::decision::LeaseId;

/// The identity a store gives a new lease: random, so that an identity from
/// another key, another policy or an earlier life of this key (deleted once
/// idle) finds nothing to act on; never 0.
pub fn new_lease_id() -> LeaseId {
    fastrand::u64(1..)
}

/// One lease: the cost it holds until it is released or `expires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Its identity.
    pub id: LeaseId,
    /// The cost it holds.
    pub cost: u64,
    /// When it stops holding it, if not released or renewed before.
    pub expires: Nanos,
}

/// The leases of one key; the default value is a new key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LeaseState {
    /// The latest time this key has seen.
    seen: Nanos,
    /// In order of expiry, oldest first; some may have expired and not been
    /// dropped yet.
    leases: VecDeque<Lease>,
    /// The cost of `leases`.
    used: u64,
}

impl LeaseState {
    /// The latest time this key has seen.
    pub fn seen(&self) -> Nanos {
        self.seen
    }

    /// The leases, in order of expiry, including any that have expired but
    /// were not dropped yet.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.iter()
    }

    /// Whether no lease is live at `t`.
    pub fn is_idle(&self, t: Nanos) -> bool {
        self.leases.back().is_none_or(|l| l.expires <= t)
    }

    /// Moves to `now` (clamped) and drops the leases expired by then; the
    /// time of the operation.
    fn advance(&mut self, now: Nanos) -> Nanos {
        let t = now.max(self.seen);
        self.seen = t;
        while let Some(gone) = self.leases.front().filter(|l| l.expires <= t) {
            self.used -= gone.cost;
            self.leases.pop_front();
        }
        t
    }

    /// Removes the live lease `id`.
    fn take(&mut self, id: LeaseId) -> Option<Lease> {
        let at = self.leases.iter().position(|l| l.id == id)?;
        let lease = self.leases.remove(at)?;
        self.used -= lease.cost;
        Some(lease)
    }

    /// Adds a lease that expires after every other.
    fn push(&mut self, lease: Lease) {
        self.used += lease.cost;
        self.leases.push_back(lease);
    }
}

impl Concurrency {
    /// A limit of `limit` cost in flight, leases of `lease`; None if either
    /// is 0.
    pub fn new(limit: u64, lease: Nanos) -> Option<Self> {
        (limit > 0 && lease > 0).then_some(Self { limit, lease })
    }

    /// The most cost in flight at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a lease lives unless renewed.
    pub fn lease(&self) -> Nanos {
        self.lease
    }

    /// Admits `cost` if it fits beside the live leases, as the lease `id`
    /// (none for cost 0). `cost` must be in `0..=limit`.
    pub fn check(&self, state: &mut LeaseState, now: Nanos, cost: u64, id: LeaseId) -> Decision {
        let t = state.advance(now);
        let decision = self.decide(t, state.used, state.leases.iter(), cost, true);
        if decision.allowed && cost > 0 {
            state.push(Lease {
                id,
                cost,
                expires: t.saturating_add(self.lease),
            });
        }
        decision
    }

    /// Frees the lease `id`; allowed is whether it was live.
    pub fn release(&self, state: &mut LeaseState, now: Nanos, id: LeaseId) -> Decision {
        let t = state.advance(now);
        let live = state.take(id).is_some();
        self.answer(t, state, live)
    }

    /// Extends the lease `id` to `lease` from now; allowed is whether it was
    /// live (an expired lease is not brought back).
    pub fn renew(&self, state: &mut LeaseState, now: Nanos, id: LeaseId) -> Decision {
        let t = state.advance(now);
        let live = match state.take(id) {
            Some(lease) => {
                state.push(Lease {
                    expires: t.saturating_add(self.lease),
                    ..lease
                });
                true
            }
            None => false,
        };
        self.answer(t, state, live)
    }

    /// The decision [`Concurrency::check`] would make, without changing the
    /// state (for all-or-nothing checks over several policies).
    pub fn peek(&self, state: &LeaseState, now: Nanos, cost: u64) -> Decision {
        let t = now.max(state.seen);
        let gone = state.leases.iter().take_while(|l| l.expires <= t);
        let (count, cost_gone) = gone.fold((0, 0), |(n, c), l| (n + 1, c + l.cost));
        let live = state.leases.range(count..);
        self.decide(t, state.used - cost_gone, live, cost, true)
    }

    /// A release's or a renewal's answer: the standing after it, with the
    /// wait a check of cost 1 would get.
    fn answer(&self, t: Nanos, state: &LeaseState, live: bool) -> Decision {
        let standing = self.decide(t, state.used, state.leases.iter(), 1, false);
        Decision {
            allowed: live,
            ..standing
        }
    }

    /// Decides a check of `cost` at `t` beside the `live` leases (in order
    /// of expiry, costing `used` in all), answering the standing after it;
    /// with `charge` false, the standing as it is, with the wait a check of
    /// `cost` would get. Only a refusal walks the leases.
    fn decide(
        &self,
        t: Nanos,
        used: u64,
        live: Iter<'_, Lease>,
        cost: u64,
        charge: bool,
    ) -> Decision {
        let used = u128::from(used);
        let reset = live.clone().next_back().map_or(0, |l| l.expires - t);
        let remaining = u64::try_from(u128::from(self.limit).saturating_sub(used)).unwrap_or(0);
        let need = used + u128::from(cost);
        if need <= u128::from(self.limit) && !charge {
            return Decision::rejected(remaining, 0, reset);
        }
        if need <= u128::from(self.limit) {
            // The standing after the admission: its lease is the last to go.
            let reset = match cost {
                0 => reset,
                _ => t.saturating_add(self.lease) - t,
            };
            return Decision::allowed(remaining - cost, reset);
        }
        // The first expiry at which the freed cost reaches the excess.
        let excess = need - u128::from(self.limit);
        let mut freed = 0u128;
        let retry = live
            .map(|l| {
                freed += u128::from(l.cost);
                (l.expires, freed)
            })
            .find(|&(_, freed)| freed >= excess)
            .map_or(0, |(expires, _)| expires - t);
        Decision::rejected(remaining, retry, reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC as S;

    /// Seconds as written in a vector (`29.500000000`), in nanoseconds.
    fn nanos(seconds: &str) -> Nanos {
        let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
        let fraction = format!("{fraction:0<9}");
        whole.parse::<Nanos>().unwrap() * S + fraction.parse::<Nanos>().unwrap()
    }

    /// testdata/vectors/concurrency.expected.csv, line by line: limit 3,
    /// leases of 30 s.
    #[test]
    fn the_worked_example() {
        let policy = Concurrency::new(3, 30 * S).unwrap();
        let mut state = LeaseState::default();
        let expected = include_str!("../../../../testdata/vectors/concurrency.expected.csv");
        let mut names = Vec::new();
        for line in expected.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let id = match names.iter().position(|n| *n == f[4]) {
                Some(at) => at as LeaseId,
                None => {
                    names.push(f[4]);
                    (names.len() - 1) as LeaseId
                }
            };
            let now = nanos(f[0]);
            let d = match f[3] {
                "check" => policy.check(&mut state, now, f[2].parse().unwrap(), id),
                "release" => policy.release(&mut state, now, id),
                "renew" => policy.renew(&mut state, now, id),
                op => panic!("{op}"),
            };
            let got = (
                d.allowed.to_string(),
                d.remaining.to_string(),
                d.retry_after,
                d.reset,
                d.delay,
            );
            let want = (
                f[5].to_owned(),
                f[6].to_owned(),
                nanos(f[7]),
                nanos(f[8]),
                nanos(f[9]),
            );
            assert_eq!(got, want, "{line}");
        }
    }

    #[test]
    fn peek_is_check_without_the_lease() {
        let policy = Concurrency::new(2, 10 * S).unwrap();
        let mut state = LeaseState::default();
        policy.check(&mut state, 0, 1, 1);
        policy.check(&mut state, S, 1, 2);
        for (now, cost) in [(5 * S, 1), (10 * S, 1), (11 * S, 2), (20 * S, 0)] {
            let peeked = policy.peek(&state, now, cost);
            assert_eq!(peeked, policy.check(&mut state.clone(), now, cost, 9));
        }
    }

    #[test]
    fn an_expired_lease_is_neither_released_nor_renewed() {
        let policy = Concurrency::new(1, 10 * S).unwrap();
        let mut state = LeaseState::default();
        assert!(policy.check(&mut state, 0, 1, 7).allowed);
        assert!(!policy.check(&mut state, 9 * S, 1, 8).allowed);
        assert!(!policy.renew(&mut state, 10 * S, 7).allowed);
        assert!(!policy.release(&mut state, 10 * S, 7).allowed);
        assert!(state.is_idle(10 * S));
        assert!(policy.check(&mut state, 10 * S, 1, 8).allowed);
        assert!(policy.renew(&mut state, 15 * S, 8).allowed);
        assert_eq!(policy.peek(&state, 24 * S, 1).retry_after, S);
        assert!(Concurrency::new(0, S).is_none() && Concurrency::new(1, 0).is_none());
    }
}
