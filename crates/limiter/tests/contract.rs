//! The in-process store makes exactly the core's decisions: every algorithm,
//! random traces, several keys, with sweeps running in between.

use std::collections::HashMap;

use proptest::prelude::*;
use weir_core::penalty::{self, Ban, Penalty};
use weir_core::{Nanos, State};
use weir_limiter::{Check, CheckError, Clock, Decision, Error, FakeClock, Limiter, Policy};

fn policies() -> impl Strategy<Value = Policy> {
    prop::sample::select(vec![
        "token-bucket capacity=5 rate=2/s",
        "token-bucket capacity=3 rate=3/s",
        "gcra burst=4 rate=1/100ms",
        "fixed-window limit=4 window=1s",
        "sliding-log limit=4 window=1s",
        "sliding-counter limit=5 window=1s",
        "leaky-bucket rate=2/s queue=3",
        "leaky-bucket rate=7/1500ms queue=2",
    ])
    .prop_map(|spec| Policy::parse(spec).unwrap())
}

/// What a step of a trace does to its key.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A check of this cost (capped at the policy's largest; 0 is a probe
    /// that passes unless the key is in debt).
    Check(u64),
    /// A report of this many times the policy's largest cost: into debt.
    Report(u64),
    /// A probe of this cost.
    Probe(u64),
}

/// (gap in time units, key, step); `back` makes some gaps negative; a
/// report charges up to `debt` times the policy's largest cost.
fn trace(back: bool, debt: u64) -> impl Strategy<Value = Vec<(i64, u8, Step)>> {
    let gap = if back { -300i64..700 } else { 0i64..700 };
    let step = prop_oneof![
        12 => (0u64..=3).prop_map(Step::Check),
        3 => (0u64..=3).prop_map(Step::Probe),
        1 => (1u64..=debt).prop_map(Step::Report),
    ];
    prop::collection::vec(
        (prop_oneof![3 => Just(0i64), 5 => gap], 0u8..40, step),
        1..200,
    )
}

/// Replays `trace` (gaps in milliseconds) on `limiter` and on the core.
fn compare(
    policy: Policy,
    trace: &[(i64, u8, Step)],
    limiter: &Limiter<FakeClock>,
) -> Result<(), TestCaseError> {
    compare_in(policy, trace, limiter, 1_000_000)
}

/// The core's states of a replay, and its time.
struct Model {
    states: HashMap<String, (State, Ban)>,
    now: Nanos,
    penalty: Option<Penalty>,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            states: HashMap::new(),
            now: 10_000_000_000,
            penalty: None,
        }
    }
}

/// Replays `trace`, its gaps in units of `unit` ns, on `limiter` and on the
/// core.
fn compare_in(
    policy: Policy,
    trace: &[(i64, u8, Step)],
    limiter: &Limiter<FakeClock>,
    unit: i64,
) -> Result<(), TestCaseError> {
    replay(&mut Model::default(), policy, trace, limiter, unit)
}

/// A penalty of `ban` ms (up to four times as long), `factor` and `memory` ms.
fn penalty_of(ban: u64, factor: u64, memory: u64) -> Penalty {
    let ms = 1_000_000;
    Penalty::new(
        ban * ms,
        Some(factor),
        Some(4 * ban * ms),
        Some(memory * ms),
    )
    .unwrap()
}

/// Replays `trace` from where `model` stands.
fn replay(
    model: &mut Model,
    policy: Policy,
    trace: &[(i64, u8, Step)],
    limiter: &Limiter<FakeClock>,
    unit: i64,
) -> Result<(), TestCaseError> {
    let name = limiter.policy("p").unwrap();
    for &(gap, key, step) in trace {
        model.now = model.now.saturating_add_signed(gap * unit + i64::from(key));
        let now = model.now;
        let key = format!("k{key}");
        let (state, ban) = model
            .states
            .entry(key.clone())
            .or_insert_with(|| (policy.new_state(), Ban::default()));
        limiter.clock().set(now);
        let core = |state: &mut State, ban: &mut Ban, cost, op| match (model.penalty, op) {
            (Some(p), op) => p.decide(&policy, state, ban, now, cost, op),
            (None, penalty::Op::Report) => policy.report(state, now, cost),
            (None, penalty::Op::Probe) => policy.probe(state, now, cost),
            (None, penalty::Op::Check(_)) => policy.check(state, now, cost),
        };
        let (expected, actual) = match step {
            Step::Check(cost) => {
                let cost = cost.min(policy.max_cost().0);
                let check = Check::new(name, &key).cost(cost);
                (
                    core(state, ban, cost, penalty::Op::Check(0)),
                    limiter.check_one(check),
                )
            }
            Step::Probe(cost) => {
                let cost = cost.min(policy.max_cost().0);
                let check = Check::new(name, &key).cost(cost).probe();
                (
                    core(state, ban, cost, penalty::Op::Probe),
                    limiter.check_one(check),
                )
            }
            Step::Report(times) => {
                let cost = (policy.max_cost().0.saturating_mul(times)).min(policy.max_report());
                let check = Check::new(name, &key).cost(cost);
                (
                    core(state, ban, cost, penalty::Op::Report),
                    limiter.report(check),
                )
            }
        };
        prop_assert_eq!(
            actual.unwrap(),
            expected.unwrap(),
            "{} at {}: {:?}",
            policy,
            now,
            step
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Under a penalty, probes and checks ban keys, longer each time, as
    /// the core says, with time going back at times.
    #[test]
    fn penalties_ban_as_the_core(
        policy in policies(),
        trace in trace(true, 3),
        (ban, factor, memory) in (1u64..2_000, 1u64..4, 1u64..5_000),
    ) {
        let penalty = penalty_of(ban, factor, memory);
        let limiter = Limiter::builder().policy("p", policy).penalty("p", penalty).clock(FakeClock::at(0)).build().unwrap();
        let mut model = Model { penalty: Some(penalty), ..Model::default() };
        replay(&mut model, policy, &trace, &limiter, 1_000_000)?;
    }

    /// Sweeps (one shard, a tight budget) forget no ban before its memory.
    #[test]
    fn penalties_outlive_sweeps(
        policy in policies(),
        trace in trace(false, 3),
        (ban, factor, memory) in (1u64..2_000, 1u64..4, 1u64..5_000),
    ) {
        let penalty = penalty_of(ban, factor, memory);
        let limiter = Limiter::builder().policy("p", policy).penalty("p", penalty).shards(1).max_keys(40).clock(FakeClock::at(0)).build().unwrap();
        let mut model = Model { penalty: Some(penalty), ..Model::default() };
        replay(&mut model, policy, &trace, &limiter, 1_000_000)?;
    }

    /// Forward time, one shard and a tight budget: sweeps run constantly and
    /// must never change a decision.
    #[test]
    fn same_decisions_as_the_core_while_sweeping(policy in policies(), trace in trace(false, 3)) {
        let limiter = Limiter::builder().policy("p", policy).shards(1).max_keys(40).clock(FakeClock::at(0)).build().unwrap();
        compare(policy, &trace, &limiter)?;
    }

    /// Clocks going backwards: the clamp to each key's latest time.
    #[test]
    fn same_decisions_as_the_core_with_time_going_back(policy in policies(), trace in trace(true, 3)) {
        let limiter = Limiter::builder().policy("p", policy).clock(FakeClock::at(0)).build().unwrap();
        compare(policy, &trace, &limiter)?;
    }

    /// Windows of nanoseconds and reports far into debt: the packed states
    /// cap their counts (a fixed window's at `limit + 1`, a sliding
    /// counter's at `limit·window + 1`), and every count past a cap must
    /// decide as the exact one does.
    #[test]
    fn counts_past_a_packed_cap_decide_as_the_core(
        policy in prop::sample::select(vec![
            "sliding-counter limit=2 window=40ns",
            "sliding-counter limit=3 window=7ns",
            "fixed-window limit=2 window=40ns",
        ]).prop_map(|spec| Policy::parse(spec).unwrap()),
        trace in trace(true, 100),
    ) {
        let limiter = Limiter::builder().policy("p", policy).clock(FakeClock::at(0)).build().unwrap();
        compare_in(policy, &trace, &limiter, 1)?;
    }

    /// Policies whose levels and products pass 2^64 (token budgets, slow
    /// refills, 366-day windows, sizes up to 2^50, deep debt), with gaps in
    /// thousandths of each one's window or refill.
    #[test]
    fn wide_policies_decide_as_the_core(
        policy in prop::sample::select(vec![
            "sliding-counter limit=100000 window=1h",
            "sliding-counter limit=1125899906842624 window=366d",
            "token-bucket capacity=5000 rate=3/h",
            "gcra burst=1125899906842624 rate=7/366d",
            "leaky-bucket rate=7/h queue=1251",
            "fixed-window limit=4294967296 window=366d",
            "sliding-log limit=5 window=300d",
        ]).prop_map(|spec| Policy::parse(spec).unwrap()),
        trace in trace(true, 1000),
    ) {
        let grain = policy.window().unwrap_or_else(|| match policy {
            Policy::TokenBucket(b) | Policy::Gcra(b) => b.rate().period() / b.rate().tokens(),
            Policy::LeakyBucket(l) => l.rate().period() / l.rate().tokens(),
            _ => unreachable!("windowed policies have a window"),
        });
        let limiter = Limiter::builder().policy("p", policy).clock(FakeClock::at(0)).build().unwrap();
        compare_in(policy, &trace, &limiter, i64::try_from(grain / 1000).unwrap())?;
    }

    /// A reload that changes a policy's parameters carries each key's state
    /// over or starts it over as the core's `Policy::carry` says (the Redis
    /// contract holds the script to the same), from one algorithm to
    /// another too, and from the one-word, 128-bit and locked states alike.
    #[test]
    fn changed_parameters_carry_over_as_the_core(
        before in changing(),
        after in changing(),
        first in trace(true, 3),
        then in trace(true, 3),
    ) {
        let build = |policy| Limiter::builder().policy("p", policy).clock(FakeClock::at(0));
        let old = build(before).build().unwrap();
        let mut model = Model::default();
        replay(&mut model, before, &first, &old, 1_000_000)?;
        let new = build(after).keep_state_of(&old).build().unwrap();
        model.states = std::mem::take(&mut model.states)
            .into_iter()
            .filter_map(|(key, (state, ban))| Some((key, (after.carry(&before, &state)?, ban))))
            .collect();
        replay(&mut model, after, &then, &new, 1_000_000)?;
    }
}

/// Policies to change from and to: pairs of one algorithm with other
/// parameters, beside the others.
fn changing() -> impl Strategy<Value = Policy> {
    prop::sample::select(vec![
        "token-bucket capacity=5 rate=2/s",
        "token-bucket capacity=12 rate=5/s",
        "gcra burst=4 rate=1/100ms",
        "token-bucket capacity=5000 rate=3/h",
        "fixed-window limit=4 window=1s",
        "fixed-window limit=2 window=1s",
        "fixed-window limit=3 window=1500ms",
        "sliding-log limit=4 window=1s",
        "sliding-log limit=2 window=3s",
        "sliding-counter limit=5 window=1s",
        "sliding-counter limit=2 window=1s",
        "sliding-counter limit=100000 window=1s",
        "leaky-bucket rate=2/s queue=3",
        "leaky-bucket rate=7/1500ms queue=2",
    ])
    .prop_map(|spec| Policy::parse(spec).unwrap())
}

#[test]
fn check_all_charges_every_policy_or_none() {
    let limiter = Limiter::builder()
        .policy(
            "seller",
            Policy::parse("token-bucket capacity=3 rate=1/h").unwrap(),
        )
        .policy(
            "endpoint",
            Policy::parse("fixed-window limit=2 window=1h").unwrap(),
        )
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    let (seller, endpoint) = (
        limiter.policy("seller").unwrap(),
        limiter.policy("endpoint").unwrap(),
    );
    let pair = [Check::new(seller, "842"), Check::new(endpoint, "stock")];
    assert!(limiter.check_all(&pair).unwrap().allowed);
    assert!(limiter.check_all(&pair).unwrap().allowed);
    // The endpoint window is full: rejected, and the seller is not charged.
    let third = limiter.check_all(&pair).unwrap();
    assert!(!third.allowed);
    assert_eq!(
        third.decisions[0].remaining, 1,
        "the seller, uncharged, as it stands"
    );
    assert!(third.decisions[0].allowed && !third.decisions[1].allowed);
    assert_eq!(third.retry_after(), 3_600_000_000_000);
    assert_eq!(
        limiter
            .check_one(Check::new(seller, "842"))
            .unwrap()
            .remaining,
        0,
        "one token left, uncharged by the rejection"
    );
    // Invalid requests charge nothing either.
    assert_eq!(
        limiter.policy("nope"),
        Err(Error::Invalid(CheckError::UnknownPolicy("nope".into())))
    );
    let nine = Check::new(seller, "9");
    assert!(matches!(
        limiter.check_all(&[nine, nine]),
        Err(Error::Invalid(CheckError::DuplicateCheck { .. }))
    ));
    assert!(matches!(
        limiter.check_all(&[nine.cost(3), Check::new(endpoint, "y").cost(3)]),
        Err(Error::Invalid(CheckError::Cost { .. }))
    ));
    assert_eq!(
        limiter.check_one(nine.cost(3)).unwrap().remaining,
        0,
        "seller 9 was never charged"
    );
}

#[test]
fn bad_input_is_an_error_not_a_decision() {
    let limiter = Limiter::new(Policy::parse("gcra burst=2 rate=1/s").unwrap());
    let invalid = |e: Result<Decision, Error>| match e {
        Err(Error::Invalid(e)) => e,
        other => panic!("{other:?}"),
    };
    // Cost 0 is not bad input (docs/SPEC.md): the standing, refused only in debt.
    let standing = limiter.check("k", 0).unwrap();
    assert!(standing.allowed && standing.remaining == 2, "{standing:?}");
    limiter
        .reset(limiter.policy("default").unwrap(), "k")
        .unwrap();
    assert!(matches!(
        invalid(limiter.check("k", 3)),
        CheckError::Cost { .. }
    ));
    assert_eq!(
        invalid(limiter.check(&"x".repeat(257), 1)),
        CheckError::KeyTooLong { len: 257, max: 256 }
    );
    assert!(limiter.check(&"x".repeat(256), 1).unwrap().allowed);
    limiter
        .reset(limiter.policy("default").unwrap(), &"x".repeat(256))
        .unwrap();
    assert!(limiter.is_empty(), "nothing stored for invalid requests");
    let twice = Limiter::builder().policy("a", Policy::parse("gcra burst=2 rate=1/s").unwrap());
    let twice = twice.policy("a", Policy::parse("gcra burst=2 rate=1/s").unwrap());
    assert!(matches!(twice.build(), Err(Error::Config(_))));
}

#[test]
fn peek_charges_nothing_and_reset_grants_afresh() {
    let limiter = Limiter::builder()
        .policy(
            "p",
            Policy::parse("fixed-window limit=2 window=1h").unwrap(),
        )
        .clock(FakeClock::at(5))
        .build()
        .unwrap();
    let p = limiter.policy("p").unwrap();
    let (fresh, stored) = limiter.peek(Check::new(p, "k")).unwrap();
    assert_eq!((fresh.remaining, stored), (1, false));
    assert!(limiter.is_empty(), "peeking stores nothing");
    limiter.check_one(Check::new(p, "k").cost(2)).unwrap();
    let (spent, stored) = limiter.peek(Check::new(p, "k")).unwrap();
    assert!(!spent.allowed && stored);
    assert_eq!(limiter.reset(p, "k"), Ok(true));
    assert_eq!(limiter.reset(p, "k"), Ok(false));
    assert!(
        limiter
            .check_one(Check::new(p, "k").cost(2))
            .unwrap()
            .allowed
    );
}

#[test]
fn a_cost_of_zero_reports_the_standing_and_charges_nothing() {
    let clock = FakeClock::at(1_000_000_000);
    let limiter = Limiter::builder()
        .policy(
            "bucket",
            Policy::parse("token-bucket capacity=3 rate=1/s").unwrap(),
        )
        .policy(
            "window",
            Policy::parse("fixed-window limit=1 window=1s").unwrap(),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let (bucket, window) = (
        limiter.policy("bucket").unwrap(),
        limiter.policy("window").unwrap(),
    );
    limiter.check_one(Check::new(window, "k")).unwrap();
    // The window is spent, but a 0-cost look does not refuse the request.
    let all = limiter
        .check_all(&[
            Check::new(bucket, "k").cost(2),
            Check::new(window, "k").cost(0),
        ])
        .unwrap();
    assert!(all.allowed);
    assert_eq!(
        (all.decisions[0].remaining, all.decisions[1].remaining),
        (1, 0)
    );
    assert_eq!(
        all.decisions[1].reset, 1_000_000_000,
        "the window's standing"
    );
    let (standing, _) = limiter.peek(Check::new(bucket, "k")).unwrap();
    assert_eq!(
        standing.remaining, 0,
        "the bucket was charged 2, and only that"
    );
    // A standing on a key never seen does not create it.
    let before = limiter.len();
    limiter
        .check_all(&[Check::new(bucket, "new").cost(0)])
        .unwrap();
    assert_eq!(limiter.len(), before);
}

#[test]
fn a_rebuilt_limiter_keeps_the_keys_of_its_policies() {
    let window = Policy::parse("fixed-window limit=1 window=1h").unwrap();
    let old = Limiter::builder()
        .policy("same", window)
        .policy("limit", window)
        .policy("length", window)
        .policy("algorithm", window)
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    for name in ["same", "limit", "length", "algorithm"] {
        let id = old.policy(name).unwrap();
        assert!(old.check_one(Check::new(id, "k")).unwrap().allowed);
    }
    let new = Limiter::builder()
        .policy("same", window)
        .policy(
            "limit",
            Policy::parse("fixed-window limit=3 window=1h").unwrap(),
        )
        .policy(
            "length",
            Policy::parse("fixed-window limit=3 window=2h").unwrap(),
        )
        .policy(
            "algorithm",
            Policy::parse("sliding-log limit=3 window=1h").unwrap(),
        )
        .clock(FakeClock::at(0))
        .keep_state_of(&old)
        .build()
        .unwrap();
    assert!(new.shares_state_with(&old, "same"));
    assert!(!new.shares_state_with(&old, "limit"));
    assert_eq!(
        new.len(),
        2,
        "the kept and carried keys count against the budget"
    );
    let check = |name| {
        new.check_one(Check::new(new.policy(name).unwrap(), "k"))
            .unwrap()
    };
    assert!(!check("same").allowed, "still limited");
    assert_eq!(
        check("limit").remaining,
        1,
        "its count kept under the new limit"
    );
    assert_eq!(
        check("length").remaining,
        2,
        "another window length starts over"
    );
    assert_eq!(
        check("algorithm").remaining,
        2,
        "another algorithm starts over"
    );
}

#[test]
fn a_shadow_policy_never_refuses_and_charges_only_what_it_would_admit() {
    let limiter = Limiter::builder()
        .policy(
            "enforced",
            Policy::parse("token-bucket capacity=5 rate=1/h").unwrap(),
        )
        .policy(
            "trial",
            Policy::parse("fixed-window limit=1 window=1h").unwrap(),
        )
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    let (enforced, trial) = (
        limiter.policy("enforced").unwrap(),
        limiter.policy("trial").unwrap(),
    );
    let request = [Check::new(enforced, "k"), Check::new(trial, "k").shadow()];
    let first = limiter.check_all(&request).unwrap();
    assert!(first.allowed && first.decisions[1].allowed);
    // The trial window is spent: it would refuse, but only the enforced
    // policy is charged and the request is admitted.
    let second = limiter.check_all(&request).unwrap();
    assert!(second.allowed && !second.decisions[1].allowed);
    assert_eq!(second.decisions[0].remaining, 3);
    assert_eq!(second.decisions[1].retry_after, 3_600_000_000_000);
    // An enforced refusal still refuses, and charges nothing.
    let big = [
        Check::new(enforced, "k").cost(5),
        Check::new(trial, "k").shadow(),
    ];
    assert!(!limiter.check_all(&big).unwrap().allowed);
    assert_eq!(
        limiter.check_all(&request).unwrap().decisions[0].remaining,
        2
    );
}

#[test]
fn ad_hoc_policies_are_found_by_name_and_decided_with_the_others() {
    let limiter = Limiter::builder()
        .policy(
            "base",
            Policy::parse("token-bucket capacity=5 rate=1/h").unwrap(),
        )
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    let one = Policy::parse("fixed-window limit=1 window=1m").unwrap();
    let id = limiter.ad_hoc("base@limit-1/minute", one).unwrap();
    assert_eq!(
        limiter.ad_hoc("base@limit-1/minute", one).unwrap(),
        id,
        "the same name, the same policy"
    );
    let base = limiter.policy("base").unwrap();
    let both = [Check::new(base, "k"), Check::new(id, "k")];
    assert!(limiter.check_all(&both).unwrap().allowed);
    let second = limiter.check_all(&both).unwrap();
    assert!(!second.allowed, "the ad-hoc window is spent");
    assert_eq!(
        second.decisions[0].remaining, 4,
        "and the base was not charged"
    );
    assert_eq!(limiter.len(), 2);
}

/// Checks (costs 0 to 3) and reports (up to 25) mixed on a few keys: the
/// store charges and answers exactly as the core, on both paths.
fn compare_reports(
    policy: Policy,
    trace: &[(i64, u8, u64, bool)],
    limiter: &Limiter<FakeClock>,
) -> Result<(), TestCaseError> {
    let mut reference: HashMap<String, State> = HashMap::new();
    let mut now: Nanos = 10_000_000_000;
    let id = limiter.policy("p").unwrap();
    for &(gap, key, cost, report) in trace {
        now = now.saturating_add_signed(gap * 1_000_000);
        let key = format!("k{key}");
        let state = reference
            .entry(key.clone())
            .or_insert_with(|| policy.new_state());
        limiter.clock().set(now);
        let check = Check::new(id, &key).cost(cost);
        if report {
            let expected = policy.report(state, now, cost).unwrap();
            prop_assert_eq!(
                limiter.report(check).unwrap(),
                expected,
                "report {} at {}",
                policy,
                now
            );
        } else {
            // Cost 0 included: refused only while in debt.
            let cost = cost.min(policy.max_cost().0);
            let expected = policy.check(state, now, cost).unwrap();
            let got = limiter.check_one(check.cost(cost)).unwrap();
            prop_assert_eq!(got, expected, "check {} at {}", policy, now);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn reports_charge_as_the_core(
        policy in policies(),
        trace in prop::collection::vec(
            (prop_oneof![3 => Just(0i64), 5 => 0i64..700], 0u8..4, 0u64..=25, prop::bool::weighted(0.3)),
            1..120,
        ),
    ) {
        let limiter = Limiter::builder().policy("p", policy).clock(FakeClock::at(0)).build().unwrap();
        compare_reports(policy, &trace, &limiter)?;
    }
}

/// One answer's tokens against a per-minute and a per-day budget: both
/// charged as the core would, or — when one report is invalid — neither.
#[test]
fn reports_to_several_policies_charge_all_or_none() {
    let clock = FakeClock::at(1_000_000_000);
    let (minute, day) = (
        Policy::parse("token-bucket capacity=100 rate=100/m").unwrap(),
        Policy::parse("fixed-window limit=1000 window=1d").unwrap(),
    );
    let limiter = Limiter::builder()
        .policy("minute", minute)
        .policy("day", day)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (m, d) = (
        limiter.policy("minute").unwrap(),
        limiter.policy("day").unwrap(),
    );
    let got = limiter
        .report_all(&[Check::new(m, "t").cost(250), Check::new(d, "t").cost(250)])
        .unwrap();
    let (mut sm, mut sd) = (minute.new_state(), day.new_state());
    let expected = [
        minute.report(&mut sm, 1_000_000_000, 250).unwrap(),
        day.report(&mut sd, 1_000_000_000, 250).unwrap(),
    ];
    assert_eq!(got, expected);
    assert!(!limiter.check_one(Check::new(m, "t")).unwrap().allowed);
    // Too large for the minute's bound: the day is not charged either.
    let refused =
        limiter.report_all(&[Check::new(d, "u").cost(5), Check::new(m, "u").cost(100_001)]);
    assert!(
        matches!(refused, Err(Error::Invalid(CheckError::Cost { .. }))),
        "{refused:?}"
    );
    let (_, stored) = limiter.peek(Check::new(d, "u")).unwrap();
    assert!(!stored, "the day was charged");
    let twice = limiter.report_all(&[Check::new(d, "v"), Check::new(d, "v")]);
    assert!(
        matches!(
            twice,
            Err(Error::Invalid(CheckError::DuplicateCheck { .. }))
        ),
        "{twice:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// A request of one check (decided as a single check) decides and
    /// charges as the same check within a larger request does (decided under
    /// its shard's write lock), shadow or not. Time only goes forward: a
    /// refused request of several checks moves no key's latest time (on
    /// Redis neither), a refused single check does (docs/SPEC.md).
    #[test]
    fn one_check_requests_decide_as_within_larger_ones(policy in policies(), trace in trace(false, 3), shadow: bool) {
        let standing = Policy::parse("fixed-window limit=1 window=1s").unwrap();
        let build = || Limiter::builder().policy("p", policy).policy("q", standing).clock(FakeClock::at(0)).build().unwrap();
        let (alone, within) = (build(), build());
        let (p, q) = (alone.policy("p").unwrap(), alone.policy("q").unwrap());
        let mut now: Nanos = 10_000_000_000;
        for &(gap, key, step) in &trace {
            now = now.saturating_add_signed(gap * 1_000_000 + i64::from(key));
            let key = format!("k{key}");
            let Step::Check(cost) = step else { continue };
            let cost = cost.clamp(1, policy.max_cost().0);
            alone.clock().set(now);
            within.clock().set(now);
            let mut check = Check::new(p, &key).cost(cost);
            if shadow {
                check = check.shadow();
            }
            let got = alone.check_all(&[check]).unwrap();
            // A standing of another policy: never refuses, charges nothing.
            let both = within.check_all(&[check, Check::new(q, "x").cost(0)]).unwrap();
            prop_assert_eq!(got.decisions[0], both.decisions[0]);
            prop_assert_eq!(got.allowed, both.allowed);
        }
    }
}

/// A concurrency trace step: a check of a cost, or a release or renewal of
/// the n-th lease taken so far (of any key: another key's finds nothing).
#[derive(Debug, Clone, Copy)]
enum LeaseStep {
    Check(u64),
    Release(usize),
    Renew(usize),
}

proptest! {
    /// Checks, releases and renewals decide as the core, with sweeps in
    /// between (a key with live leases is never swept; an idle one is).
    #[test]
    fn leases_decide_as_the_core(
        limit in 1u64..=4,
        trace in prop::collection::vec((0i64..700, 0u8..3, prop_oneof![
            4 => (0u64..=4).prop_map(LeaseStep::Check),
            2 => (0usize..40).prop_map(LeaseStep::Release),
            1 => (0usize..40).prop_map(LeaseStep::Renew),
        ]), 1..80),
    ) {
        let policy = Policy::parse(&format!("concurrency limit={limit} lease=1s")).unwrap();
        let clock = FakeClock::at(5_000_000_000);
        let limiter = Limiter::builder().policy("p", policy).clock(clock.clone()).build().unwrap();
        let id = limiter.policy("p").unwrap();
        let mut reference: HashMap<String, State> = HashMap::new();
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for (i, &(gap, key, step)) in trace.iter().enumerate() {
            clock.advance(gap as u64 * 3_000_000);
            let now = clock.now();
            let key = format!("k{key}");
            let state = reference.entry(key.clone()).or_insert_with(|| policy.new_state());
            let lease = |n: usize| taken.get(n).copied().unwrap_or_default();
            let (expected, got) = match step {
                LeaseStep::Check(cost) => {
                    let cost = cost.min(limit);
                    let expected = policy.acquire(state, now, cost, i as u64 + 1).unwrap();
                    let got = limiter.check_one(Check::new(id, &key).cost(cost)).unwrap();
                    prop_assert_eq!(got.lease.is_some(), expected.lease.is_some());
                    if let Some(ours) = got.lease {
                        taken.push((ours, i as u64 + 1));
                    }
                    (expected, got)
                }
                LeaseStep::Release(n) => (
                    policy.release(state, now, lease(n).1).unwrap(),
                    limiter.release(id, &key, lease(n).0).unwrap(),
                ),
                LeaseStep::Renew(n) => (
                    policy.renew(state, now, lease(n).1).unwrap(),
                    limiter.renew(id, &key, lease(n).0).unwrap(),
                ),
            };
            let bare = |d: Decision| Decision { lease: None, ..d };
            prop_assert_eq!(bare(got), bare(expected), "at {} {} {:?}", now, key, step);
            if i % 7 == 0 {
                limiter.sweep();
            }
        }
    }
}

/// A concurrency policy among others: its lease is taken only when every
/// policy admits, a shadow concurrency policy that would refuse takes none,
/// and leases are never reported.
#[test]
fn a_lease_is_taken_only_when_every_policy_admits() {
    let limiter = Limiter::builder()
        .policy(
            "slots",
            Policy::parse("concurrency limit=1 lease=1m").unwrap(),
        )
        .policy(
            "rate",
            Policy::parse("fixed-window limit=2 window=1h").unwrap(),
        )
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    let (slots, rate) = (
        limiter.policy("slots").unwrap(),
        limiter.policy("rate").unwrap(),
    );
    let both = |k| [Check::new(slots, k), Check::new(rate, k)];
    let first = limiter.check_all(&both("a")).unwrap();
    let lease = first.decisions[0].lease.expect("admitted: a lease");
    assert_eq!(first.decisions[1].lease, None);
    // The slot is held: refused, the rate not charged.
    assert!(!limiter.check_all(&both("a")).unwrap().allowed);
    assert!(limiter.release(slots, "a", lease).unwrap().allowed);
    assert!(
        !limiter.release(slots, "a", lease).unwrap().allowed,
        "released once"
    );
    let second = limiter.check_all(&both("a")).unwrap();
    assert!(second.allowed && second.decisions[1].remaining == 0);
    // The rate refuses: no lease taken, the slot stays free.
    let refused = limiter.check_all(&both("a")).unwrap();
    assert!(!refused.allowed && refused.decisions[0].lease.is_none());
    let held = limiter.peek(Check::new(slots, "a")).unwrap().0;
    assert_eq!(held.remaining, 0, "the second admission's lease");
    // Shadow: would refuse, takes nothing, lets the request through.
    let shadowed = limiter
        .check_all(&[Check::new(slots, "a").shadow()])
        .unwrap();
    assert!(
        shadowed.allowed && !shadowed.decisions[0].allowed && shadowed.decisions[0].lease.is_none()
    );
    assert!(matches!(
        limiter.report(Check::new(slots, "a")),
        Err(Error::Invalid(CheckError::Cost { .. }))
    ));
    assert!(matches!(
        limiter.release(rate, "a", 1),
        Err(Error::Invalid(CheckError::Cost { .. }))
    ));
}

/// docs/SPEC.md, several policies: a banned policy refuses the request like
/// any refusing policy, and nothing is charged; a policy that refuses within
/// a request of several is banned as alone.
#[test]
fn a_ban_refuses_a_request_of_several_policies() {
    let s = 1_000_000_000;
    let limiter = Limiter::builder()
        .policy(
            "login",
            Policy::parse("fixed-window limit=1 window=10s").unwrap(),
        )
        .policy(
            "site",
            Policy::parse("token-bucket capacity=100 rate=1/s").unwrap(),
        )
        .penalty("login", Penalty::new(60 * s, None, None, None).unwrap())
        .clock(FakeClock::at(0))
        .build()
        .unwrap();
    let (login, site) = (
        limiter.policy("login").unwrap(),
        limiter.policy("site").unwrap(),
    );
    let both = [Check::new(login, "ann"), Check::new(site, "all")];
    assert!(limiter.check_all(&both).unwrap().allowed);
    let refused = limiter.check_all(&both).unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.decisions[0].banned, 60 * s);
    assert_eq!(refused.decisions[1].remaining, 99, "nothing charged");
    // Past the window, still banned: refused, and still nothing charged.
    limiter.clock().set(20 * s);
    let banned = limiter.check_all(&both).unwrap();
    assert!(!banned.allowed);
    assert_eq!(banned.decisions[0].retry_after, 40 * s);
    // A probe of both answers the same without charging.
    limiter.clock().set(61 * s);
    let probes = [both[0].probe(), both[1].probe()];
    let probed = limiter.check_all(&probes).unwrap();
    assert!(probed.allowed);
    assert_eq!(probed.decisions[0].remaining, 0, "as if charged");
    assert!(
        limiter.check_all(&both).unwrap().allowed,
        "the probe charged nothing"
    );
}
