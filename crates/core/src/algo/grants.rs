//! Fleet grants (docs/SPEC.md, "Fleet grants"): a token-bucket key that
//! hands data-plane clients local buckets of their own — a grant (c, ρ, x)
//! — booked in the key's bucket before they are sent, and reserved while
//! they live, so that over any window of length L the fleet admits at most
//! `C + L·N/P`, exactly as one bucket would, per-request checks beside the
//! grants included.
//!
//! Everything is an integer in **units** of `1/(P·SCALE)` token (P the
//! policy's rate period): a grant's rate `m` is in thousandths of a token
//! per P (ρ = m/(P·SCALE) token per ns, so ρ·Δt is `m·Δt` units exactly),
//! and the policy's own rate is `N·SCALE` of them. A fleet's rates sum to
//! at most `N·SCALE` (see [`split`]).

use crate::{Decision, Nanos};

use super::TokenBucket;

/// The units of a grant's rate per token of the policy's: rates are in
/// thousandths of a token per the policy's period.
pub const SCALE: u64 = 1_000;

/// The most live grants one key holds (replaced ones included until
/// their own expiry): a booking past it is refused.
pub const MAX_GRANTS: usize = 64;

/// A token-bucket policy that hands out grants valid for `ttl` (D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fleet {
    bucket: TokenBucket,
    ttl: Nanos,
}

/// One grant: a local bucket of `capacity` tokens that starts full and
/// fills at `rate` thousandths of a token per the policy's period, usable
/// until `until` (exclusive), held by `client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Who holds it (a stream, a weir instance).
    pub client: u64,
    /// c, whole tokens (at least 1).
    pub capacity: u64,
    /// m: ρ in thousandths of a token per the policy's period.
    pub rate: u64,
    /// x: the first instant it may not be used.
    pub until: Nanos,
}

/// A key's state: its bucket's deficit and its live grants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetState {
    /// The latest time the key has seen.
    pub seen: Nanos,
    /// What the bucket lacks of full at `seen`, in units.
    pub deficit: u128,
    /// Its grants whose `until` is after `seen`.
    pub grants: Vec<Grant>,
}

/// Why a fleet's parameters cannot hand out grants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a grant of 1 token at the whole rate for {ttl} ns books 1 + {booked} tokens, more than the capacity {capacity}: raise the capacity to hold the rate over the grant's ttl, or shorten the ttl"
)]
pub struct TooSmall {
    ttl: Nanos,
    booked: String,
    capacity: u64,
}

impl Fleet {
    /// Grants of `ttl` on `bucket`: refused when even one grant of a single
    /// token at the policy's whole rate cannot be booked in a full bucket
    /// (`1 + N·D/P > C`).
    pub fn new(bucket: TokenBucket, ttl: Nanos) -> Result<Self, TooSmall> {
        let (n, p) = (bucket.rate.tokens(), bucket.rate.period());
        let fleet = Self { bucket, ttl };
        let booked = u128::from(n) * u128::from(ttl);
        if fleet.unit() + booked * u128::from(SCALE) > fleet.full() {
            return Err(TooSmall {
                ttl,
                booked: format!("{}/{p}", booked),
                capacity: bucket.capacity,
            });
        }
        Ok(fleet)
    }

    /// D, how long a grant lives.
    pub fn ttl(&self) -> Nanos {
        self.ttl
    }

    /// The policy's rate in grant-rate units (`N·SCALE` per P).
    pub fn total_rate(&self) -> u64 {
        self.bucket.rate.tokens().saturating_mul(SCALE)
    }

    /// The policy's rate period P (ns), the unit grant rates are counted in.
    pub fn period(&self) -> Nanos {
        self.bucket.rate.period()
    }

    /// The capacity of a grant of `rate` (of [`Fleet::total_rate`]): the
    /// same share of what the whole rate's booking over the ttl leaves of
    /// the capacity, at least one token — so that grants whose rates add
    /// up to the policy's fit in a full bucket together.
    pub fn grant_capacity(&self, rate: u64) -> u64 {
        let spare = self
            .full()
            .saturating_sub(self.drain() * u128::from(self.ttl));
        let share = spare * u128::from(rate) / u128::from(self.total_rate().max(1));
        u64::try_from(share / self.unit())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// What a new grant of `capacity` at `rate` books: `c + ρ·D`, in units.
    fn booking(&self, capacity: u64, rate: u64) -> u128 {
        u128::from(capacity) * self.unit() + u128::from(rate) * u128::from(self.ttl)
    }

    /// One token, in units.
    fn unit(&self) -> u128 {
        u128::from(self.bucket.rate.period()) * u128::from(SCALE)
    }

    /// C tokens, in units.
    fn full(&self) -> u128 {
        u128::from(self.bucket.capacity) * self.unit()
    }

    /// What the bucket refills per ns, in units.
    fn drain(&self) -> u128 {
        u128::from(self.bucket.rate.tokens()) * u128::from(SCALE)
    }

    /// The reservation R at `t`, in units: what the live grants may still
    /// hold or mint.
    pub fn reserved(&self, grants: &[Grant], t: Nanos) -> u128 {
        grants
            .iter()
            .filter(|g| g.until > t)
            .map(|g| {
                u128::from(g.capacity) * self.unit() + u128::from(g.rate) * u128::from(g.until - t)
            })
            .sum()
    }

    /// The reservation just before `x`: the grants live then, `x` their
    /// own expiry included.
    fn reserved_before(&self, grants: &[Grant], x: Nanos) -> u128 {
        grants
            .iter()
            .filter(|g| g.until >= x)
            .map(|g| {
                u128::from(g.capacity) * self.unit() + u128::from(g.rate) * u128::from(g.until - x)
            })
            .sum()
    }

    /// The evaluation time, the deficit at it and the grants still live at
    /// it. The bucket holds at most `C − R(s)` at **every** instant s, not
    /// only when a decision looks: refilled from `seen`, it is capped at
    /// each instant R may be highest for what came after — `seen`, just
    /// before and at each grant's expiry (between them R is linear) — and
    /// at `t`. Evaluated only at `t`, a grant that
    /// expired meanwhile would hand the bucket the tokens it had capped
    /// (docs/SEMANTICS.md, "Fleet grants").
    fn settle(&self, state: &mut FleetState, now: Nanos) -> (Nanos, u128) {
        let (u, t) = (state.seen, now.max(state.seen));
        let after = |s: Nanos, held: u128| held.saturating_sub(u128::from(t - s) * self.drain());
        let mut deficit = after(u, state.deficit.max(self.reserved(&state.grants, u)));
        for g in state.grants.iter().filter(|g| g.until <= t) {
            let x = g.until.max(u);
            let (before, at) = (
                self.reserved_before(&state.grants, x),
                self.reserved(&state.grants, x),
            );
            deficit = deficit.max(after(x, before)).max(after(x, at));
        }
        state.grants.retain(|g| g.until > t);
        (t, deficit.max(self.reserved(&state.grants, t)))
    }

    /// What a check or a booking may take at `t`: `C − max(R, d)`, and
    /// `max(R, d)`.
    fn available(&self, state: &FleetState, t: Nanos, deficit: u128) -> (u128, u128) {
        let held = self.reserved(&state.grants, t).max(deficit);
        (self.full().saturating_sub(held), held)
    }

    /// Books a grant of `capacity` tokens at `rate` for `client` at `now`,
    /// all-or-nothing: a renewal when the client holds a live grant of the
    /// same terms (its `until` moves to `t + D`, booking `ρ·(x' − x)`), a new
    /// grant otherwise (booking `c + ρ·D`; a grant of other terms stays
    /// reserved until its own expiry). `None`: refused (or [`MAX_GRANTS`]
    /// live), nothing booked.
    pub fn book(
        &self,
        state: &mut FleetState,
        now: Nanos,
        client: u64,
        capacity: u64,
        rate: u64,
    ) -> Option<Grant> {
        let (t, deficit) = self.settle(state, now);
        state.seen = t;
        state.deficit = deficit;
        if capacity == 0 {
            return None;
        }
        let until = t.saturating_add(self.ttl);
        let (avail, held) = self.available(state, t, deficit);
        let live = (state.grants.iter())
            .enumerate()
            .filter(|(_, g)| g.client == client && g.capacity == capacity && g.rate == rate)
            .max_by_key(|(_, g)| g.until)
            .map(|(i, _)| i);
        let cost = match live {
            Some(i) => u128::from(rate) * u128::from(until.saturating_sub(state.grants[i].until)),
            None if state.grants.len() >= MAX_GRANTS => return None,
            None => self.booking(capacity, rate),
        };
        if avail < cost {
            return None;
        }
        state.deficit = held + cost;
        let grant = match live {
            Some(i) => {
                let g = &mut state.grants[i];
                g.until = g.until.max(until);
                *g
            }
            None => {
                let grant = Grant {
                    client,
                    capacity,
                    rate,
                    until,
                };
                state.grants.push(grant);
                grant
            }
        };
        Some(grant)
    }

    /// [`Fleet::book`], or a smaller grant that fits when that is refused:
    /// both terms scaled down by what is available (a grant of at least one
    /// token), or none.
    pub fn book_within(
        &self,
        state: &mut FleetState,
        now: Nanos,
        client: u64,
        capacity: u64,
        rate: u64,
    ) -> Option<Grant> {
        if let Some(grant) = self.book(state, now, client, capacity, rate) {
            return Some(grant);
        }
        let (t, deficit) = self.settle(state, now);
        let (avail, _) = self.available(state, t, deficit);
        let cost = self.booking(capacity, rate);
        let scale = |x: u64| u64::try_from(u128::from(x) * avail / cost.max(1)).unwrap_or(0);
        let (c, m) = (scale(capacity), scale(rate));
        (c >= 1 && (c, m) != (capacity, rate))
            .then(|| self.book(state, now, client, c, m))
            .flatten()
    }

    /// A per-request check of `cost` beside the grants: the token bucket's
    /// decision with C replaced by `C − R(t)`.
    pub fn check(&self, state: &mut FleetState, now: Nanos, cost: u64) -> Decision {
        let (t, deficit) = self.settle(state, now);
        state.seen = t;
        let (avail, held) = self.available(state, t, deficit);
        let need = u128::from(cost) * self.unit();
        let allowed = avail >= need;
        state.deficit = if allowed { held + need } else { deficit };
        let (left, _) = self.available(state, t, state.deficit);
        let remaining = u64::try_from(left / self.unit()).unwrap_or(u64::MAX);
        let reset = self.wait_for(state, t, self.full());
        if allowed {
            return Decision::allowed(remaining, reset);
        }
        Decision::rejected(remaining, self.wait_for(state, t, need), reset)
    }

    /// The wait from `t` until `need` units are available, if nothing else
    /// arrived: until the deficit has drained to `C − need` and the
    /// reservation has fallen to it (it falls as grants are used up and
    /// expire), rounded up to the ns.
    fn wait_for(&self, state: &FleetState, t: Nanos, need: u128) -> Nanos {
        let target = self.full().saturating_sub(need);
        let drain = self.drain().max(1);
        let after = |held: u128| {
            u64::try_from(held.saturating_sub(target).div_ceil(drain)).unwrap_or(Nanos::MAX)
        };
        let by_deficit = after(state.deficit);
        // The bucket capped just before each expiry refills from there.
        let by_expiry = (state.grants.iter())
            .map(|g| match self.reserved_before(&state.grants, g.until) {
                held if held <= target => 0,
                held => (g.until - t).saturating_add(after(held)),
            })
            .max()
            .unwrap_or(0);
        // R is non-increasing in time: the least wait that brings it down.
        let last = state.grants.iter().map(|g| g.until - t).max().unwrap_or(0);
        let (mut low, mut high) = (0, last);
        while low < high {
            let mid = low + (high - low) / 2;
            match self.reserved(&state.grants, t + mid) <= target {
                true => high = mid,
                false => low = mid + 1,
            }
        }
        by_deficit.max(by_expiry).max(low)
    }
}

/// `total` split max-min fairly by `demands`: no one gets more than it asks
/// while another gets less than an equal share of what is left; integer
/// remainders are not handed out (the fleet admits less, never more).
pub fn split(total: u64, demands: &[u64]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| demands[i]);
    let mut shares = vec![0; demands.len()];
    let mut left = total;
    for (done, &i) in order.iter().enumerate() {
        let others = (demands.len() - done) as u64;
        let share = demands[i].min(left / others);
        shares[i] = share;
        left -= share;
    }
    shares
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Policy, Rate};

    fn fleet(capacity: u64, per_second: u64, ttl: Nanos) -> Fleet {
        let Policy::TokenBucket(b) =
            Policy::token_bucket(capacity, Rate::per_second(per_second).unwrap()).unwrap()
        else {
            unreachable!()
        };
        Fleet::new(b, ttl).unwrap()
    }

    const S: Nanos = 1_000_000_000;

    #[test]
    fn a_capacity_that_cannot_hold_one_grant_is_refused() {
        let Policy::TokenBucket(b) =
            Policy::token_bucket(10, Rate::per_second(10).unwrap()).unwrap()
        else {
            unreachable!()
        };
        let e = Fleet::new(b, 2 * S).unwrap_err();
        assert!(e.to_string().contains("raise the capacity"), "{e}");
        assert!(Fleet::new(b, S / 2).is_ok());
    }

    /// A booking takes `c + ρ·D` from the bucket and reserves it; a
    /// renewal takes `ρ·(x' − x)`; a per-request check sees `C − R`.
    #[test]
    fn bookings_renewals_and_checks_share_one_bucket() {
        let f = fleet(100, 3, S); // C 100, 3/s, D 1 s
        let mut state = FleetState::default();
        // c 20, ρ 2/s (2000 thousandths a second): books 20 + 2 = 22.
        let g = f.book(&mut state, 0, 1, 20, 2_000).unwrap();
        assert_eq!(g.until, S);
        assert!(f.check(&mut state.clone(), 0, 78).allowed);
        assert!(!f.check(&mut state.clone(), 0, 79).allowed);
        // Half a second on: R = 20 + 1 = 21; the bucket's deficit is
        // 22 − 1.5 = 20.5, under R: 79 available.
        let d = f.check(&mut state.clone(), S / 2, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 78);
        // A renewal at 0.5 s to 1.5 s books 2·0.5 = 1 more.
        let renewed = f.book(&mut state, S / 2, 1, 20, 2_000).unwrap();
        assert_eq!(renewed.until, 3 * S / 2);
        assert_eq!(state.grants.len(), 1);
        assert!(f.check(&mut state.clone(), S / 2, 78).allowed);
        assert!(!f.check(&mut state.clone(), S / 2, 79).allowed);
        // Other terms: a new grant, the old one still reserved.
        f.book(&mut state, S / 2, 1, 10, 2_000).unwrap();
        assert_eq!(state.grants.len(), 2);
    }

    #[test]
    fn a_refused_booking_books_nothing_and_a_smaller_one_may_fit() {
        let f = fleet(10, 1, S);
        let mut state = FleetState::default();
        assert!(f.book(&mut state, 0, 1, 9, 1_000).is_some()); // 9 + 1
        let before = state.clone();
        assert!(f.book(&mut state, 0, 2, 1, 0).is_none());
        assert_eq!(state, before);
        // A second on: the grant expired, the bucket refilled 1.
        let fits = f.book_within(&mut state, S, 2, 20, 0).unwrap();
        assert_eq!(fits.capacity, 1, "only 1 token has come back");
        assert!(f.book_within(&mut state, S, 3, 1, 0).is_none());
    }

    #[test]
    fn splits_are_max_min_fair() {
        assert_eq!(split(100, &[10, 80, 80]), [10, 45, 45]);
        assert_eq!(split(100, &[0, 200]), [0, 100]);
        assert_eq!(
            split(10, &[5, 5, 5]),
            [3, 3, 4],
            "the last takes what the others left"
        );
        assert_eq!(split(10, &[]), Vec::<u64>::new());
        assert!(split(7, &[9, 1, 4]).iter().sum::<u64>() <= 7);
    }
}
