//! The concurrency limit against a naive model of docs/SPEC.md's formulas:
//! a map of named leases scanned whole at every operation, over random
//! checks, releases and renewals (on expiry boundaries and one nanosecond
//! either side, clocks going backwards, leases released twice or never
//! taken).

use std::collections::HashMap;

use proptest::prelude::*;
use weir_core::Nanos;
use weir_core::algo::{Concurrency, LeaseState};

/// The model's answer: allowed, remaining, retry_after, reset.
type Verdict = (bool, i128, i128, i128);

#[derive(Default)]
struct Model {
    seen: i128,
    /// Name → (cost, expires).
    leases: HashMap<u64, (i128, i128)>,
}

impl Model {
    /// The leases live at `t`, by expiry.
    fn live(&self, t: i128) -> Vec<(i128, i128)> {
        let mut live: Vec<(i128, i128)> = self
            .leases
            .values()
            .filter(|&&(_, expires)| expires > t)
            .copied()
            .collect();
        live.sort_by_key(|&(_, expires)| expires);
        live
    }

    /// The standing at `t`, and the wait a check of `cost` would get.
    fn standing(&self, t: i128, limit: i128, cost: i128) -> Verdict {
        let live = self.live(t);
        let used: i128 = live.iter().map(|l| l.0).sum();
        let reset = live.last().map_or(0, |l| l.1 - t);
        let mut retry = 0;
        if used + cost > limit {
            let mut freed = 0;
            for (c, expires) in &live {
                freed += c;
                if freed >= used + cost - limit {
                    retry = expires - t;
                    break;
                }
            }
        }
        (used + cost <= limit, limit - used, retry, reset)
    }

    fn apply(&mut self, op: Op, now: i128, limit: i128, lease: i128) -> Verdict {
        let t = now.max(self.seen);
        self.seen = t;
        match op {
            Op::Check { cost, name } => {
                let verdict = self.standing(t, limit, cost);
                if !verdict.0 {
                    return verdict;
                }
                if cost > 0 {
                    self.leases.insert(name, (cost, t + lease));
                }
                self.standing(t, limit, 0)
            }
            Op::Release(name) => {
                let live = self.leases.get(&name).is_some_and(|l| l.1 > t);
                self.leases.remove(&name);
                let (_, remaining, retry, reset) = self.standing(t, limit, 1);
                (live, remaining, retry, reset)
            }
            Op::Renew(name) => {
                let live = self.leases.get(&name).is_some_and(|l| l.1 > t);
                if live {
                    self.leases.get_mut(&name).unwrap().1 = t + lease;
                }
                let (_, remaining, retry, reset) = self.standing(t, limit, 1);
                (live, remaining, retry, reset)
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Check { cost: i128, name: u64 },
    Release(u64),
    Renew(u64),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_concurrency_limit_matches_the_model(
        limit in 1u64..6,
        lease in prop::sample::select(vec![1u64, 7, 1_000, 1_000_000_000, 30_000_000_000]),
        steps in prop::collection::vec((0u8..3, 0u64..8, 0u64..4, -2i64..3, 0u8..4), 1..60),
    ) {
        let policy = Concurrency::new(limit, lease).unwrap();
        let mut state = LeaseState::default();
        let mut model = Model::default();
        let mut now: Nanos = 0;
        // Each check takes a new name (a name is used by one check at most);
        // releases and renewals name one taken before, or never taken.
        let mut next = 100;
        for (i, &(kind, cost, which, nudge, gap)) in steps.iter().enumerate() {
            // Steps of a lease, of a fraction of one, or none; then one
            // nanosecond either side; sometimes back in time.
            let step = match gap { 0 => 0, 1 => lease, 2 => lease / 3, _ => 2 * lease };
            now = now.saturating_add(step).saturating_add_signed(nudge);
            if i % 7 == 6 { now = now.saturating_sub(lease); }
            let cost = cost.min(limit);
            let op = match kind {
                0 => { next += 1; Op::Check { cost: cost.into(), name: next } }
                1 => Op::Release(next - which),
                _ => Op::Renew(next - which),
            };
            let d = match op {
                Op::Check { name, .. } => policy.check(&mut state, now, cost, name),
                Op::Release(name) => policy.release(&mut state, now, name),
                Op::Renew(name) => policy.renew(&mut state, now, name),
            };
            let expected = model.apply(op, now.into(), limit.into(), lease.into());
            let got = (d.allowed, i128::from(d.remaining), i128::from(d.retry_after), i128::from(d.reset));
            prop_assert_eq!(got, expected, "step {} ({:?} at {}) of {:?}", i, op, now, steps);
            prop_assert_eq!(d.delay, 0);
            prop_assert_eq!(i128::from(state.seen()), model.seen);
        }
    }
}
