//! Fleet grants against docs/SPEC.md's bound: random bookings, renewals,
//! replacements and per-request checks on one key, with every client
//! spending its grants as greedily as its local buckets allow, never admit
//! more than one bucket would over any window: `C + L·N/P`.

use proptest::prelude::*;
use weir_core::algo::grants::{Fleet, FleetState, Grant, SCALE};
use weir_core::{Nanos, Policy, Rate};

const S: Nanos = 1_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Advance(Nanos),
    Book {
        client: u64,
        capacity: u64,
        rate: u64,
    },
    Check(u64),
    Spend(u64),
}

/// A client's local bucket for one grant, as a data plane runs it: starts
/// full, fills at its rate, usable until the grant's `until`.
#[derive(Debug, Clone)]
struct Local {
    grant: Grant,
    level: u128,
    at: Nanos,
}

fn ops(capacity: u64, rate: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        (0..S / 2).prop_map(Op::Advance),
        (0..3u64, 1..=capacity, 0..=rate * SCALE).prop_map(|(client, capacity, rate)| Op::Book {
            client,
            capacity,
            rate
        }),
        (1..=capacity).prop_map(Op::Check),
        (0..3u64).prop_map(Op::Spend),
    ];
    proptest::collection::vec(op, 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn a_fleet_admits_no_more_than_one_bucket(
        (capacity, rate, ttl_ms, ops) in (2..40u64, 1..6u64).prop_flat_map(|(c, n)| {
            // The longest ttl whose booking of one token at the whole rate fits.
            let most = (c - 1) * 1000 / n;
            (Just(c), Just(n), 1..=most, ops(c, n))
        })
    ) {
        let Policy::TokenBucket(bucket) =
            Policy::token_bucket(capacity, Rate::new(rate, S).unwrap()).unwrap()
        else {
            unreachable!()
        };
        let fleet = Fleet::new(bucket, ttl_ms * 1_000_000).unwrap();
        let (n, p) = (u128::from(bucket.rate().tokens()), u128::from(bucket.rate().period()));
        let unit = p * u128::from(SCALE);
        let mut state = FleetState::default();
        let mut locals: Vec<Local> = Vec::new();
        let mut admitted: Vec<(Nanos, u64)> = Vec::new();
        let mut now: Nanos = 0;
        for op in ops {
            match op {
                Op::Advance(dt) => now += dt,
                Op::Book { client, capacity, rate } => {
                    if let Some(grant) = fleet.book(&mut state, now, client, capacity, rate) {
                        match locals.iter_mut().find(|l| {
                            l.grant.client == client
                                && l.grant.capacity == capacity
                                && l.grant.rate == rate
                                && l.grant.until > now
                        }) {
                            // A renewal: the same bucket, for longer.
                            Some(local) => local.grant.until = grant.until,
                            None => locals.push(Local {
                                grant,
                                level: u128::from(capacity) * unit,
                                at: grant.until - fleet.ttl(),
                            }),
                        }
                    }
                }
                Op::Check(cost) => {
                    let decision = fleet.check(&mut state, now, cost);
                    if decision.allowed {
                        admitted.push((now, cost));
                    } else {
                        // retry_after is the earliest wait that admits it.
                        let wait = decision.retry_after;
                        prop_assert!(fleet.check(&mut state.clone(), now + wait, cost).allowed, "not after {wait}");
                        if wait > 0 {
                            let early = fleet.check(&mut state.clone(), now + wait - 1, cost);
                            prop_assert!(!early.allowed, "already 1 ns before {wait}");
                        }
                    }
                }
                Op::Spend(client) => {
                    for local in locals.iter_mut().filter(|l| l.grant.client == client && l.grant.until > now) {
                        let filled = local.level + u128::from(local.grant.rate) * u128::from(now.saturating_sub(local.at));
                        local.level = filled.min(u128::from(local.grant.capacity) * unit);
                        local.at = local.at.max(now);
                        let whole = u64::try_from(local.level / unit).unwrap();
                        if whole > 0 {
                            local.level -= u128::from(whole) * unit;
                            admitted.push((now, whole));
                        }
                    }
                }
            }
        }
        // Every window between two admissions: at most C + L·N/P.
        for (i, &(a, _)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(b, cost) in &admitted[i..] {
                sum += u128::from(cost);
                let bound = u128::from(capacity) * p + n * u128::from(b - a);
                prop_assert!(
                    sum * p <= bound,
                    "{sum} admitted in [{a}, {b}]: more than {capacity} + {}·{n}/{p}",
                    b - a
                );
            }
        }
    }
}
