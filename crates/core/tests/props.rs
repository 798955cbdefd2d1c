//! Property tests: every algorithm against the model over random traces
//! (bursts at one instant, arrivals exactly on refill and window boundaries
//! and one nanosecond either side, long idle gaps, clocks going backwards,
//! costs above 1, several keys), and the invariants docs/SPEC.md promises.

use std::collections::HashMap;

use proptest::prelude::*;
use weir_core::policy::MAX_WAIT;
use weir_core::{Decision, Nanos, Policy, Rate, State};

use crate::model::{Model, Spec, Verdict};

const PERIODS: [Nanos; 11] = [
    1,
    7,
    1_000,
    1_000_000,
    333_333_333,
    1_000_000_000,
    1_500_000_000,
    60_000_000_000,
    // An hour, and the longest span a policy may have (366 days), and an
    // odd one near it: beyond 2^53 ns.
    3_600_000_000_000,
    weir_core::policy::MAX_SPAN,
    31_536_000_000_000_001,
];

fn policy_strategy() -> impl Strategy<Value = (Policy, Spec)> {
    let rate = (1u64..=12, prop::sample::select(PERIODS.to_vec()));
    // Small sizes, where limits are reached often, and sizes users write
    // for token budgets, up to 2^32.
    let size = prop_oneof![8 => 1u64..=25, 1 => Just(100_000u64), 1 => Just(1u64 << 32)];
    prop_oneof![
        (size.clone(), rate.clone()).prop_map(|(c, (n, p))| {
            let spec = Spec::TokenBucket {
                capacity: c.into(),
                n: n.into(),
                p: p.into(),
            };
            (
                Policy::token_bucket(c, Rate::new(n, p).unwrap()).unwrap(),
                spec,
            )
        }),
        (size.clone(), rate.clone()).prop_map(|(c, (n, p))| {
            let spec = Spec::TokenBucket {
                capacity: c.into(),
                n: n.into(),
                p: p.into(),
            };
            (Policy::gcra(c, Rate::new(n, p).unwrap()).unwrap(), spec)
        }),
        (size.clone(), prop::sample::select(PERIODS.to_vec())).prop_map(|(l, w)| {
            (
                Policy::fixed_window(l, w).unwrap(),
                Spec::FixedWindow {
                    limit: l.into(),
                    window: w.into(),
                },
            )
        }),
        (size.clone(), prop::sample::select(PERIODS.to_vec())).prop_map(|(l, w)| {
            let l = l.min(weir_core::policy::MAX_LOG_LIMIT);
            (
                Policy::sliding_log(l, w).unwrap(),
                Spec::SlidingLog {
                    limit: l.into(),
                    window: w.into(),
                },
            )
        }),
        (size.clone(), prop::sample::select(PERIODS.to_vec())).prop_map(|(l, w)| {
            (
                Policy::sliding_counter(l, w).unwrap(),
                Spec::SlidingCounter {
                    limit: l.into(),
                    window: w.into(),
                },
            )
        }),
        (size, rate).prop_map(|(q, (n, p))| {
            let spec = Spec::LeakyBucket {
                n: n.into(),
                p: p.into(),
                queue: q.into(),
            };
            (
                Policy::leaky_bucket(Rate::new(n, p).unwrap(), q).unwrap(),
                spec,
            )
        }),
    ]
}

/// A policy's parameters before and after a change: half the time another
/// size (and rate) of the same algorithm and window, else any other.
fn change_strategy() -> impl Strategy<Value = ((Policy, Spec), (Policy, Spec))> {
    let size = prop_oneof![8 => 1u64..=25, 1 => Just(100_000u64)];
    let rate = (1u64..=12, prop::sample::select(PERIODS.to_vec()));
    (
        policy_strategy(),
        policy_strategy(),
        any::<bool>(),
        size,
        rate,
    )
        .prop_map(|(before, other, same, size, (n, p))| {
            if !same {
                return (before, other);
            }
            let rate = Rate::new(n, p).unwrap();
            let (n, p) = (i128::from(n), i128::from(p));
            let after = match before.1 {
                Spec::TokenBucket { .. } => (
                    Policy::token_bucket(size, rate).unwrap(),
                    Spec::TokenBucket {
                        capacity: size.into(),
                        n,
                        p,
                    },
                ),
                Spec::LeakyBucket { .. } => (
                    Policy::leaky_bucket(rate, size).unwrap(),
                    Spec::LeakyBucket {
                        n,
                        p,
                        queue: size.into(),
                    },
                ),
                Spec::FixedWindow { window, .. } => (
                    Policy::fixed_window(size, window as Nanos).unwrap(),
                    Spec::FixedWindow {
                        limit: size.into(),
                        window,
                    },
                ),
                Spec::SlidingCounter { window, .. } => (
                    Policy::sliding_counter(size, window as Nanos).unwrap(),
                    Spec::SlidingCounter {
                        limit: size.into(),
                        window,
                    },
                ),
                Spec::SlidingLog { window, .. } => (
                    Policy::sliding_log(size, window as Nanos).unwrap(),
                    Spec::SlidingLog {
                        limit: size.into(),
                        window,
                    },
                ),
            };
            (before, after)
        })
}

/// How the clock moves before an arrival.
#[derive(Debug, Clone, Copy)]
enum Step {
    Same,
    Tiny(Nanos),
    Fraction(u32),
    /// To the next multiple of the policy's grain (window, or reduced period).
    Boundary,
    /// One nanosecond before or after where the clock is.
    Nudge(bool),
    Idle(u32),
    Back(u32),
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Same),
        2 => (1u64..=3).prop_map(Step::Tiny),
        4 => (1u32..=400).prop_map(Step::Fraction),
        3 => Just(Step::Boundary),
        2 => any::<bool>().prop_map(Step::Nudge),
        1 => (1u32..=5).prop_map(Step::Idle),
        1 => (1u32..=300).prop_map(Step::Back),
    ]
}

type Trace = Vec<(Step, usize, u64)>;

fn trace_strategy() -> impl Strategy<Value = Trace> {
    prop::collection::vec(
        (
            step_strategy(),
            0usize..3,
            prop_oneof![6 => Just(1u64), 3 => 1u64..=4, 1 => Just(u64::MAX)],
        ),
        1..80,
    )
}

/// The policy's natural time grain: its window, or the time for `n` tokens.
fn grain(policy: &Policy) -> Nanos {
    match policy {
        Policy::TokenBucket(b) | Policy::Gcra(b) => b.rate().period(),
        Policy::LeakyBucket(l) => l.rate().period(),
        Policy::FixedWindow(w) => w.window(),
        Policy::SlidingLog(l) => l.window(),
        Policy::SlidingCounter(c) => c.window(),
        Policy::Concurrency(c) => c.lease(),
    }
}

/// Turns a random trace into concrete `(now, key, cost)` arrivals.
fn arrivals(policy: &Policy, trace: &Trace) -> Vec<(Nanos, String, u64)> {
    let g = grain(policy);
    let max_cost = policy.max_cost().0;
    let mut now: Nanos = 1_000 * g.min(1_000_000_000);
    trace
        .iter()
        .map(|&(step, key, cost)| {
            now = match step {
                Step::Same => now,
                Step::Tiny(d) => now + d,
                Step::Fraction(per_mille) => now + g * u64::from(per_mille) / 100,
                Step::Boundary => (now / g + 1) * g,
                Step::Nudge(up) => {
                    if up {
                        now + 1
                    } else {
                        now.saturating_sub(1)
                    }
                }
                Step::Idle(k) => now + u64::from(k) * 3 * g + 17,
                Step::Back(per_mille) => now.saturating_sub(g * u64::from(per_mille) / 100),
            };
            (now, format!("k{key}"), cost.min(max_cost))
        })
        .collect()
}

fn verdict(d: &Decision) -> Verdict {
    Verdict {
        allowed: d.allowed,
        remaining: d.remaining.into(),
        retry_after: d.retry_after.into(),
        reset: d.reset.into(),
        delay: d.delay.into(),
    }
}

/// One checked arrival: the state before it, its evaluation time, the decision.
struct Checked {
    key: String,
    before: State,
    now: Nanos,
    at: Nanos,
    cost: u64,
    decision: Decision,
}

fn run(policy: &Policy, arrivals: &[(Nanos, String, u64)]) -> Vec<Checked> {
    let mut keys: HashMap<String, State> = HashMap::new();
    arrivals
        .iter()
        .map(|(now, key, cost)| {
            let state = keys
                .entry(key.clone())
                .or_insert_with(|| policy.new_state());
            let before = state.clone();
            let peeked = policy.peek(state, *now, *cost).unwrap();
            let decision = policy.check(state, *now, *cost).unwrap();
            assert_eq!(peeked, decision, "peek and check disagree");
            let at = (*now).max(before.seen());
            Checked {
                key: key.clone(),
                before,
                now: *now,
                at,
                cost: *cost,
                decision,
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Checks mixed with reports (up to three times the capacity or limit,
    /// and the largest a report may be): debts, their `retry_after`, and
    /// checks while in debt, against the model.
    #[test]
    fn reports_and_debt_match_the_model(
        (policy, spec) in policy_strategy(),
        trace in trace_strategy(),
        reports in prop::collection::vec((prop::bool::weighted(0.3), 1u64..=75), 80),
    ) {
        let mut model = Model::new(spec);
        let mut keys: HashMap<String, State> = HashMap::new();
        let (max_cost, max_report) = (policy.max_cost().0, policy.max_report());
        for (i, ((now, key, cost), &(report, size))) in arrivals(&policy, &trace).iter().zip(&reports).enumerate() {
            let state = keys.entry(key.clone()).or_insert_with(|| policy.new_state());
            let (decision, (t, expected)) = if report {
                let cost = match size {
                    75 => max_report,
                    _ => size.min(3 * max_cost),
                };
                (policy.report(state, *now, cost).unwrap(), model.report(key, (*now).into(), cost.into()))
            } else {
                (policy.check(state, *now, *cost).unwrap(), model.check(key, (*now).into(), (*cost).into()))
            };
            prop_assert_eq!(i128::from(state.seen()), t);
            prop_assert_eq!(verdict(&decision), expected, "arrival {} (report {}) of {:?} under {}", i, report, trace, policy);
        }
    }

    /// A policy's parameters change between two traces (a reload): each
    /// key's state carried over by `Policy::carry`, then decided under the
    /// new ones, as the model says from the spec's words.
    #[test]
    fn changed_parameters_carry_over_as_the_model(
        ((before, old_spec), (after, new_spec)) in change_strategy(),
        first in trace_strategy(),
        then in trace_strategy(),
    ) {
        let mut model = Model::new(old_spec);
        let mut keys: HashMap<String, State> = HashMap::new();
        let mut last = 0;
        for (now, key, cost) in arrivals(&before, &first) {
            let state = keys.entry(key.clone()).or_insert_with(|| before.new_state());
            let decision = before.check(state, now, cost).unwrap();
            prop_assert_eq!(verdict(&decision), model.check(&key, now.into(), cost.into()).1);
            last = now;
        }
        keys = keys.into_iter().filter_map(|(k, s)| Some((k, after.carry(&before, &s)?))).collect();
        model.change(new_spec);
        let second = arrivals(&after, &then);
        let start = second[0].0;
        for (i, (now, key, cost)) in second.into_iter().enumerate() {
            let now = last + (now - start.min(now));
            let state = keys.entry(key.clone()).or_insert_with(|| after.new_state());
            let decision = after.check(state, now, cost).unwrap();
            prop_assert_eq!(verdict(&decision), model.check(&key, now.into(), cost.into()).1, "arrival {} after {} became {}", i, before, after);
        }
    }

    #[test]
    fn every_algorithm_matches_the_model((policy, spec) in policy_strategy(), trace in trace_strategy()) {
        let arrivals = arrivals(&policy, &trace);
        let mut model = Model::new(spec);
        for (i, checked) in run(&policy, &arrivals).iter().enumerate() {
            let (t, expected) = model.check(&checked.key, checked.now.into(), checked.cost.into());
            prop_assert_eq!(i128::from(checked.at), t);
            prop_assert_eq!(verdict(&checked.decision), expected, "arrival {} of {:?} under {}", i, arrivals, policy);
        }
    }

    #[test]
    fn retry_after_is_exact_and_reset_means_idle((policy, _) in policy_strategy(), trace in trace_strategy()) {
        let arrivals = arrivals(&policy, &trace);
        // A wait saturated at 292 years says only "longer than that".
        let exact = |c: &Checked| [c.decision.retry_after, c.decision.reset].iter().all(|&w| w < MAX_WAIT);
        for c in run(&policy, &arrivals).into_iter().filter(exact) {
            let d = c.decision;
            if !d.allowed {
                prop_assert!(d.retry_after > 0);
                let mut state = c.before.clone();
                policy.check(&mut state, c.now, c.cost).unwrap();
                let early = policy.peek(&state, c.at + d.retry_after - 1, c.cost).unwrap();
                prop_assert!(!early.allowed, "allowed 1 ns before retry_after under {}", policy);
                let on_time = policy.peek(&state, c.at + d.retry_after, c.cost).unwrap();
                prop_assert!(on_time.allowed, "rejected at retry_after under {}", policy);
            }
            // After `reset`, the key is indistinguishable from a new one, and
            // not a nanosecond before.
            let mut after = c.before.clone();
            policy.check(&mut after, c.now, c.cost).unwrap();
            let fresh = |at| policy.peek(&policy.new_state(), at, 1).unwrap();
            prop_assert_eq!(policy.peek(&after, c.at + d.reset, 1).unwrap(), fresh(c.at + d.reset));
            if d.reset > 0 {
                prop_assert_ne!(policy.peek(&after, c.at + d.reset - 1, 1).unwrap(), fresh(c.at + d.reset - 1));
            }
        }
    }

    #[test]
    fn admissions_stay_within_the_bound((policy, _) in policy_strategy(), trace in trace_strategy()) {
        let arrivals = arrivals(&policy, &trace);
        let checked = run(&policy, &arrivals);
        let mut by_key: HashMap<&str, Vec<(Nanos, u64)>> = HashMap::new();
        for c in checked.iter().filter(|c| c.decision.allowed && c.decision.delay < MAX_WAIT) {
            by_key.entry(&c.key).or_default().push((c.at + c.decision.delay, c.cost));
        }
        for admitted in by_key.values() {
            for (i, &(start, _)) in admitted.iter().enumerate() {
                let mut sum = 0u128;
                for &(at, cost) in &admitted[i..] {
                    sum += u128::from(cost);
                    let d = u128::from(at - start);
                    match policy {
                        // C + d·N/P over any interval of length d.
                        Policy::TokenBucket(b) | Policy::Gcra(b) => {
                            let (n, p) = (u128::from(b.rate().tokens()), u128::from(b.rate().period()));
                            prop_assert!(sum * p <= u128::from(b.capacity()) * p + d * n);
                        }
                        // At most L live in any window.
                        Policy::SlidingLog(l) if d < u128::from(l.window()) => {
                            prop_assert!(sum <= u128::from(l.limit()));
                        }
                        // One slot per T: all but the last request's slots are
                        // released before it. Release times are rounded up, so
                        // the exact gap is less than d + 1 ns.
                        Policy::LeakyBucket(l) => {
                            let (n, p) = (u128::from(l.rate().tokens()), u128::from(l.rate().period()));
                            prop_assert!((sum - u128::from(cost)) * p < (d + 1) * n);
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    #[test]
    fn idle_means_indistinguishable_from_new((policy, _) in policy_strategy(), trace in trace_strategy(), later in 0u64..3_000_000_000) {
        let arrivals = arrivals(&policy, &trace);
        for c in run(&policy, &arrivals) {
            let mut state = c.before.clone();
            policy.check(&mut state, c.now, c.cost).unwrap();
            for at in [c.at, c.at + 1, c.at + later % (2 * grain(&policy) + 1), c.at + c.decision.reset] {
                let same = policy.peek(&state, at, 1).unwrap() == policy.peek(&policy.new_state(), at, 1).unwrap();
                prop_assert_eq!(policy.is_idle(&state, at), same, "at {} under {}", at, policy);
            }
        }
    }

    #[test]
    fn status_is_the_standing_without_a_request((policy, _) in policy_strategy(), trace in trace_strategy()) {
        let arrivals = arrivals(&policy, &trace);
        for c in run(&policy, &arrivals) {
            // A rejection reports the standing unchanged: status must agree.
            if !c.decision.allowed {
                prop_assert_eq!(policy.status(&c.before, c.now), (c.decision.remaining, c.decision.reset), "{}", policy);
            }
        }
    }

    #[test]
    fn keys_are_independent((policy, _) in policy_strategy(), trace in trace_strategy()) {
        let arrivals = arrivals(&policy, &trace);
        let together = run(&policy, &arrivals);
        let alone: Vec<_> = arrivals.iter().filter(|(_, k, _)| k == "k0").cloned().collect();
        let alone = run(&policy, &alone);
        let k0: Vec<_> = together.iter().filter(|c| c.key == "k0").map(|c| c.decision).collect();
        prop_assert_eq!(k0, alone.iter().map(|c| c.decision).collect::<Vec<_>>());
    }
}
