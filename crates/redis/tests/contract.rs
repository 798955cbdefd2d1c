//! The same decisions as the core, to the nanosecond.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use weir_core::{NANOS_PER_SEC, Nanos, Policy, State};
use weir_redis::RedisStore;

use weir_testkit::RedisServer;

pub(crate) const POLICIES: [&str; 9] = [
    "token-bucket capacity=5 rate=2/s",
    "token-bucket capacity=3 rate=3/s",
    "gcra burst=4 rate=1/100ms",
    "fixed-window limit=4 window=1s",
    "fixed-window limit=3 window=1500ms",
    "sliding-log limit=4 window=1s",
    "sliding-counter limit=5 window=1s",
    "leaky-bucket rate=2/s queue=3",
    "leaky-bucket rate=7/1500ms queue=2",
];

/// The store timeout of tests about decisions, not time: a loaded machine
/// (two cores compiling beside the tests) can hold a call past the default
/// 50 ms.
const PATIENT: std::time::Duration = std::time::Duration::from_secs(5);

/// A Redis server of its own for one test, and a store connected to it.
struct Shared {
    runtime: tokio::runtime::Runtime,
    store: RedisStore,
    _server: RedisServer,
}

fn shared() -> Shared {
    let server = RedisServer::start(&[]);
    let (runtime, store) = connect(&server.url());
    Shared {
        runtime,
        store,
        _server: server,
    }
}

/// A runtime and a store connected to `url` (a node or a cluster).
pub(crate) fn connect(url: &str) -> (tokio::runtime::Runtime, RedisStore) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(RedisStore::connect(url)).unwrap();
    (runtime, store.with_timeout(PATIENT))
}

/// Charging, as a check is (no shaper bound).
const CHARGE: weir_redis::Mode = weir_redis::Mode::Charge { max_delay: 0 };

/// A request of one check of cost 1 of `key` under `policy`.
fn one_check<'a>(policy: &'a Policy, key: &'a str) -> [weir_redis::Check<'a>; 1] {
    [weir_redis::Check::from(weir_core::Check {
        name: "one",
        policy,
        key,
        cost: 1,
    })]
}

/// The script says which keys it created, and a check that must not create
/// its key refuses the request, storing nothing, when the key is missing.
#[test]
fn the_script_tells_created_keys_and_refuses_new_ones_when_asked() {
    let shared = shared();
    let policy = Policy::parse("token-bucket capacity=5 rate=1/h").unwrap();
    let decide = |key: &str, no_new_key: bool| {
        let mut check = one_check(&policy, key);
        check[0].no_new_key = no_new_key;
        shared
            .runtime
            .block_on(shared.store.decide(&check, None, CHARGE))
            .unwrap()
    };
    let refused = decide("guarded", true);
    assert!(refused.new_key_refused && !refused.all.allowed);
    assert_eq!(refused.created, 0);
    let first = decide("guarded", false);
    assert_eq!(
        (first.created, first.all.decisions[0].remaining),
        (1, 4),
        "nothing was stored before"
    );
    let again = decide("guarded", true);
    assert!(
        !again.new_key_refused && again.all.allowed,
        "an existing key is decided"
    );
    assert_eq!((again.created, again.all.decisions[0].remaining), (0, 3));
}

/// Replays arrivals `(gap ms, key, cost)` — all checks — through Redis and
/// the core.
pub(crate) fn replay(
    store: &RedisStore,
    runtime: &tokio::runtime::Runtime,
    policy: Policy,
    trace: &[(i64, u8, u64)],
    case: u64,
) {
    let ops: Vec<(i64, u8, u64, bool)> = trace.iter().map(|&(g, k, c)| (g, k, c, false)).collect();
    replay_ops(store, runtime, policy, &ops, case);
}

/// Replays arrivals `(gap ms, key, cost, report)` through Redis and the
/// core: checks (cost 0 included) and reports, charged after the fact.
pub(crate) fn replay_ops(
    store: &RedisStore,
    runtime: &tokio::runtime::Runtime,
    policy: Policy,
    trace: &[(i64, u8, u64, bool)],
    case: u64,
) {
    replay_in(store, runtime, policy, trace, case, 1_000_000);
}

/// Replays `trace` with its gaps in units of `unit` ns.
fn replay_in(
    store: &RedisStore,
    runtime: &tokio::runtime::Runtime,
    policy: Policy,
    trace: &[(i64, u8, u64, bool)],
    case: u64,
    unit: i64,
) {
    Replay::new(store, runtime, case, unit).run(policy, trace);
}

/// A replay through Redis and the core: the core's states, the time.
struct Replay<'a> {
    store: &'a RedisStore,
    runtime: &'a tokio::runtime::Runtime,
    reference: HashMap<String, State>,
    now: Nanos,
    case: u64,
    unit: i64,
}

impl<'a> Replay<'a> {
    fn new(
        store: &'a RedisStore,
        runtime: &'a tokio::runtime::Runtime,
        case: u64,
        unit: i64,
    ) -> Self {
        Self {
            store,
            runtime,
            reference: HashMap::new(),
            // A realistic absolute time (about 2026), far above 2^53 ns.
            now: 1_796_000_000 * NANOS_PER_SEC + 123_456_789,
            case,
            unit,
        }
    }

    /// The core's states after the policy's parameters changed from `old`
    /// to `new` (a reload): carried over, or started over.
    fn change(&mut self, old: &Policy, new: &Policy) {
        self.reference = std::mem::take(&mut self.reference)
            .into_iter()
            .filter_map(|(key, state)| Some((key, new.carry(old, &state)?)))
            .collect();
    }

    fn run(&mut self, policy: Policy, trace: &[(i64, u8, u64, bool)]) {
        let name = format!("p{}", self.case);
        for &(gap, key, cost, report) in trace {
            self.now = self
                .now
                .saturating_add_signed(gap * self.unit + i64::from(key) * 7);
            let (now, store, runtime) = (self.now, self.store, self.runtime);
            let identity = format!("c{}-k{key}", self.case);
            let state = self
                .reference
                .entry(identity.clone())
                .or_insert_with(|| policy.new_state());
            let (expected, got) = if report {
                let expected = policy.report(state, now, cost).unwrap();
                let got =
                    runtime.block_on(store.report(&name, &policy, &identity, cost, Some(now)));
                (expected, got.unwrap())
            } else {
                let cost = cost.min(policy.max_cost().0);
                let expected = policy.check(state, now, cost).unwrap();
                let got = runtime.block_on(store.check(&name, &policy, &identity, cost, Some(now)));
                (expected, got.unwrap())
            };
            assert_eq!(
                got, expected,
                "{policy} at {now}, {identity}, cost {cost}, report {report}"
            );
        }
    }
}

/// A policy's parameters changed (one name, a reload): Redis carries each
/// key's state over, or starts it over, as the core's `Policy::carry` says,
/// also from one algorithm to another, and decides as the core from there.
/// Without the refusal cache: a refusal it answers does not move the time
/// Redis last saw the key, and the state is carried from that time
/// (docs/SEMANTICS.md, the Redis store).
#[test]
fn changed_parameters_carry_over_as_the_core() {
    let server = RedisServer::start(&[]);
    let (runtime, store) = connect(&server.url());
    let shared = Shared {
        runtime,
        store: store.with_refusal_cache(false),
        _server: server,
    };
    let case = AtomicU64::new(0);
    let mut policies = POLICIES.to_vec();
    policies.extend([
        "token-bucket capacity=12 rate=5/s",
        "fixed-window limit=2 window=1s",
        "sliding-log limit=2 window=3s",
        "sliding-counter limit=2 window=1s",
        "leaky-bucket rate=3/s queue=5",
        "token-bucket capacity=4 rate=2/14d",
    ]);
    let ops = || prop::collection::vec((gap(), 0u8..4, 1u64..=4, prop::bool::weighted(0.2)), 1..40);
    let strategy = (
        prop::sample::select(policies.clone()),
        prop::sample::select(policies),
        ops(),
        ops(),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(before, after, first, then)| {
            let (before, after) = (
                Policy::parse(before).unwrap(),
                Policy::parse(after).unwrap(),
            );
            let mut replay = Replay::new(
                &shared.store,
                &shared.runtime,
                case.fetch_add(1, Ordering::SeqCst),
                1_000_000,
            );
            replay.run(before, &first);
            replay.change(&before, &after);
            replay.run(after, &then);
            Ok(())
        })
        .unwrap();
}

#[test]
fn reports_and_debt_decide_as_the_core() {
    let shared = shared();
    let case = AtomicU64::new(0);
    let strategy = (
        prop::sample::select(POLICIES.to_vec()),
        prop::collection::vec((gap(), 0u8..3, 0u64..=12, prop::bool::weighted(0.3)), 1..60),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(policy, trace)| {
            let n = case.fetch_add(1, Ordering::SeqCst);
            // Names apart from the check-only test's.
            let case = 1_000_000 + n;
            replay_ops(
                &shared.store,
                &shared.runtime,
                Policy::parse(policy).unwrap(),
                &trace,
                case,
            );
            Ok(())
        })
        .unwrap();
}

/// Policies beyond doubles — what users write for token budgets and slow
/// refills, up to the largest sizes and a 366-day span — and policies that
/// outgrow doubles only in debt: the script decides them in wide integers,
/// exactly as the core.
const WIDE: [&str; 12] = [
    "sliding-counter limit=100000 window=1h",
    "sliding-counter limit=1125899906842624 window=366d",
    "sliding-counter limit=10000 window=1s",
    "token-bucket capacity=5000 rate=3/h",
    "token-bucket capacity=10000 rate=1/m",
    "gcra burst=100000 rate=7/d",
    "leaky-bucket rate=7/h queue=1251",
    "leaky-bucket rate=3/366d queue=4294967296",
    "fixed-window limit=4294967296 window=366d",
    "fixed-window limit=10 window=200d",
    "sliding-log limit=1000 window=366d",
    "sliding-log limit=5 window=300d",
];

#[test]
fn wide_policies_decide_as_the_core() {
    let shared = shared();
    let case = AtomicU64::new(0);
    // Costs as shares of the policy's size (0: a probe; 8: all of it), and
    // reports of up to 1,200 times its size (past the ceiling).
    let strategy = (
        prop::sample::select(WIDE.to_vec()),
        prop::collection::vec(
            (
                gap(),
                0u8..3,
                prop_oneof![3 => 0u64..=8, 1 => 9u64..=9_600],
                prop::bool::weighted(0.2),
            ),
            1..60,
        ),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(spec, trace)| {
            let policy = Policy::parse(spec).unwrap();
            let size = policy.max_cost().0;
            let trace: Vec<_> = trace
                .into_iter()
                .map(|(gap, key, share, report)| {
                    let cost = size.saturating_mul(share) / 8;
                    let cost = if report {
                        cost.min(policy.max_report())
                    } else {
                        cost.min(size)
                    };
                    (gap, key, cost, report)
                })
                .collect();
            // Gaps in thousandths of the policy's grain: a gap of 1000 is a
            // window, or one token's refill.
            let grain = policy.window().unwrap_or_else(|| match policy {
                Policy::TokenBucket(b) | Policy::Gcra(b) => b.rate().period() / b.rate().tokens(),
                Policy::LeakyBucket(l) => l.rate().period() / l.rate().tokens(),
                _ => unreachable!("windowed policies have a window"),
            });
            let n = case.fetch_add(1, Ordering::SeqCst);
            replay_in(
                &shared.store,
                &shared.runtime,
                policy,
                &trace,
                2_000_000 + n,
                i64::try_from(grain / 1000).unwrap().max(1),
            );
            Ok(())
        })
        .unwrap();
}

/// Gaps in ms: bursts, exact window and refill boundaries, going back.
fn gap() -> impl Strategy<Value = i64> {
    prop_oneof![3 => Just(0i64), 2 => prop::sample::select(vec![100i64, 250, 500, 1000, 1500, 3000]), 4 => -300i64..900]
}

#[test]
fn redis_decides_as_the_core() {
    let shared = shared();
    let case = AtomicU64::new(0);
    let strategy = (
        prop::sample::select(POLICIES.to_vec()),
        prop::collection::vec((gap(), 0u8..4, 1u64..=3), 1..80),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(policy, trace)| {
            let n = case.fetch_add(1, Ordering::SeqCst);
            replay(
                &shared.store,
                &shared.runtime,
                Policy::parse(policy).unwrap(),
                &trace,
                n,
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn several_policies_are_charged_all_or_none() {
    let shared = shared();
    let seller = Policy::parse("token-bucket capacity=3 rate=1/h").unwrap();
    let endpoint = Policy::parse("fixed-window limit=2 window=1h").unwrap();
    let at = Some(1_796_000_000 * NANOS_PER_SEC);
    let checks = [
        ("seller", &seller, "all-or-none"),
        ("endpoint", &endpoint, "all-or-none"),
    ];
    let run = |cost| {
        shared
            .runtime
            .block_on(shared.store.check_all(&checks, cost, at))
            .unwrap()
    };
    assert!(run(1).all.allowed);
    assert!(run(1).all.allowed);
    let third = run(1).all;
    assert!(!third.allowed && third.decisions[0].allowed && !third.decisions[1].allowed);
    let seller_now = shared
        .runtime
        .block_on(shared.store.check("seller", &seller, "all-or-none", 1, at))
        .unwrap();
    assert_eq!(
        seller_now.remaining, 0,
        "one token was left: the refused request charged nothing"
    );
}

#[test]
fn on_the_redis_clock_keys_expire_at_their_reset() {
    let shared = shared();
    let policy = Policy::parse("token-bucket capacity=2 rate=1/s").unwrap();
    let d = shared
        .runtime
        .block_on(shared.store.check("ttl", &policy, "clock", 1, None))
        .unwrap();
    assert!(d.allowed && d.remaining == 1 && d.reset == NANOS_PER_SEC);
    let ttl: i64 = shared.runtime.block_on(async {
        let client = redis::Client::open(shared._server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("PTTL")
            .arg(weir_redis::key("ttl", "clock"))
            .query_async(&mut conn)
            .await
            .unwrap()
    });
    assert!(
        (1..=1000).contains(&ttl),
        "expires with its reset: {ttl} ms"
    );
}

#[test]
fn the_packed_log_costs_a_third_of_a_sorted_set() {
    let shared = shared();
    let policy = Policy::parse("sliding-log limit=120 window=1m").unwrap();
    let start = 1_796_000_000 * NANOS_PER_SEC;
    for i in 0..120u64 {
        let at = Some(start + i * 490_000_000);
        let d = shared
            .runtime
            .block_on(shared.store.check("mem", &policy, "log", 1, at))
            .unwrap();
        assert!(d.allowed);
    }
    let (ours, zset): (i64, i64) = shared.runtime.block_on(async {
        let client = redis::Client::open(shared._server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for i in 0..120u64 {
            let at = start + i * 490_000_000;
            let _: () = redis::cmd("ZADD")
                .arg("zset-baseline")
                .arg(at / 1000)
                .arg(format!("{at}-{i}"))
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let ours = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(weir_redis::key("mem", "log"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let zset = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("zset-baseline")
            .query_async(&mut conn)
            .await
            .unwrap();
        (ours, zset)
    });
    println!("sliding log, 120 admissions: packed {ours} bytes, sorted set {zset} bytes");
    assert!(ours * 3 <= zset, "packed {ours} vs sorted set {zset}");
}

/// Requests over up to three policies at once, each with its own cost
/// (0 asks for the standing), and reports over them, through Redis and the in-process
/// limiter: the same verdicts, the same standing reported for policies that
/// were not charged, the same refusals of shaper waits over `max_delay`.
/// Time only moves forward here, as a server's clock does: a refused request
/// moves a key's clock forward in the script but not in the limiter, which
/// shows only when a later request comes with an earlier time.
#[test]
fn several_policies_decide_as_the_in_process_limiter() {
    use weir_core::FakeClock;
    use weir_limiter::Limiter;
    use weir_redis::{Check, Mode};

    let shared = shared();
    let specs = [
        ("tb", POLICIES[0]),
        ("sc", POLICIES[6]),
        ("lb", POLICIES[7]),
        ("sl", POLICIES[5]),
    ];
    let strategy = prop::collection::vec(
        (
            gap().prop_map(|g| g.max(0)),
            prop::sample::subsequence(vec![0usize, 1, 2, 3], 1..=3),
            prop::collection::vec(0u64..=2, 3),
            prop::sample::select(vec![0u64, 400, 2000]),
            prop::collection::vec(prop::bool::weighted(0.3), 4),
            prop::bool::weighted(0.25),
        ),
        1..60,
    );
    let case = AtomicU64::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |trace| {
            let n = case.fetch_add(1, Ordering::SeqCst);
            let mut now: Nanos = 1_796_000_000 * NANOS_PER_SEC + 987_654_321;
            let clock = FakeClock::at(now);
            let limiter = specs
                .iter()
                .fold(Limiter::builder(), |b, (name, spec)| {
                    b.policy(*name, Policy::parse(spec).unwrap())
                })
                .clock(clock.clone())
                .build()
                .unwrap();
            let policies: Vec<Policy> = specs
                .iter()
                .map(|(_, s)| Policy::parse(s).unwrap())
                .collect();
            let identity = format!("multi-{n}");
            for (gap, chosen, costs, max_delay_ms, shadows, report) in trace {
                now = now.saturating_add_signed(gap * 1_000_000);
                clock.set(now);
                let max_delay = max_delay_ms * 1_000_000;
                // Costs of their own, 0 (the standing only) among them.
                let weighed: Vec<weir_limiter::Check<'_>> = chosen
                    .iter()
                    .zip(&costs)
                    .map(|(&i, &c)| {
                        let policy = limiter.policy(specs[i].0).unwrap();
                        let check = weir_limiter::Check::new(policy, &identity).cost(c);
                        if shadows[i] { check.shadow() } else { check }
                    })
                    .collect();
                let checks: Vec<Check<'_>> = chosen
                    .iter()
                    .zip(&costs)
                    .map(|(&i, &c)| Check {
                        shadow: shadows[i],
                        ..Check::from(weir_core::Check {
                            name: specs[i].0,
                            policy: &policies[i],
                            key: &identity,
                            cost: c,
                        })
                    })
                    .collect();
                if report {
                    // Usage after the fact, into debt: every policy charged
                    // (five times the cost), in one script call.
                    let expected: Vec<_> = weighed
                        .iter()
                        .map(|c| limiter.report(c.cost(c.cost * 5)).unwrap())
                        .collect();
                    let reports: Vec<Check<'_>> = checks
                        .iter()
                        .map(|c| Check {
                            report: true,
                            check: weir_core::Check {
                                cost: c.check.cost * 5,
                                ..c.check
                            },
                            ..*c
                        })
                        .collect();
                    let got = shared
                        .runtime
                        .block_on(shared.store.decide(&reports, Some(now), CHARGE))
                        .unwrap()
                        .all;
                    prop_assert_eq!(&got.decisions, &expected, "report {:?} at {}", chosen, now);
                    continue;
                }
                let expected = limiter.check_all_within(&weighed, max_delay).unwrap();
                let got = shared
                    .runtime
                    .block_on(
                        shared
                            .store
                            .decide(&checks, Some(now), Mode::Charge { max_delay }),
                    )
                    .unwrap()
                    .all;
                prop_assert_eq!(got.allowed, expected.allowed);
                prop_assert_eq!(
                    &got.decisions,
                    &expected.decisions,
                    "{:?} at {}",
                    chosen,
                    now
                );
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn peek_charges_nothing() {
    use weir_redis::{Check, Mode};
    let shared = shared();
    let policy = Policy::parse("fixed-window limit=2 window=1h").unwrap();
    let at = Some(1_796_000_000 * NANOS_PER_SEC);
    let check = [Check::from(weir_core::Check {
        name: "peek",
        policy: &policy,
        key: "k",
        cost: 1,
    })];
    for _ in 0..3 {
        let d = shared
            .runtime
            .block_on(shared.store.decide(&check, at, Mode::Peek))
            .unwrap();
        assert!(d.all.decisions[0].allowed && d.all.decisions[0].remaining == 1);
    }
    let charged = shared
        .runtime
        .block_on(shared.store.check("peek", &policy, "k", 1, at))
        .unwrap();
    assert_eq!(charged.remaining, 1, "the peeks charged nothing");
}

/// With the generation marker, a store that lost its state is detected, and
/// `OnLoss::Empty` keys count as used up at the moment it was found.
#[test]
fn a_lost_state_is_detected_and_empty_keys_refill_from_then() {
    use weir_redis::OnLoss;
    let server = RedisServer::start(&[]);
    let (runtime, store) = connect(&server.url());
    let store = store.with_marker(true);
    let bucket = Policy::parse("token-bucket capacity=4 rate=1/s").unwrap();
    let window = Policy::parse("sliding-log limit=3 window=10s").unwrap();
    let t0 = 1_796_000_000 * NANOS_PER_SEC;
    let run = |identity: &str, policy: &Policy, on_loss, at: Nanos| {
        let mut check = one_check(policy, identity);
        check[0].on_loss = on_loss;
        let checked = runtime
            .block_on(store.decide(&check, Some(at), CHARGE))
            .unwrap();
        (checked.all, checked.state_lost)
    };
    // A new store: the marker is missing, so this is (conservatively) a loss.
    let (first, lost) = run("a", &bucket, OnLoss::Empty, t0);
    assert!(lost && !first.allowed);
    assert_eq!(first.decisions[0].retry_after, NANOS_PER_SEC);
    let (later, lost) = run("b", &bucket, OnLoss::Empty, t0 + 2 * NANOS_PER_SEC);
    assert!(!lost && later.allowed);
    assert_eq!(
        later.decisions[0].remaining, 1,
        "two tokens back since the loss, one spent"
    );
    assert_eq!(
        run("c", &bucket, OnLoss::Full, t0 + 2 * NANOS_PER_SEC)
            .0
            .decisions[0]
            .remaining,
        3
    );
    // Wide policies (decided in wide integers) lose keys as the others do:
    // used up when the loss was found, as the core's key is after a check
    // of all it holds (a shaper: its queue and the slot being served).
    for spec in [
        "token-bucket capacity=5000 rate=3/h",
        "leaky-bucket rate=7/h queue=1251",
        "fixed-window limit=10 window=200d",
        "sliding-counter limit=1125899906842624 window=366d",
        "sliding-log limit=5 window=300d",
    ] {
        let policy = Policy::parse(spec).unwrap();
        let mut state = policy.new_state();
        policy.check(&mut state, t0, policy.max_cost().0).unwrap();
        if let Policy::LeakyBucket(_) = policy {
            policy.check(&mut state, t0, 1).unwrap();
        }
        let at = t0 + 5 * NANOS_PER_SEC;
        let expected = policy.check(&mut state, at, 1).unwrap();
        let (got, _) = run(spec, &policy, OnLoss::Empty, at);
        assert_eq!(got.decisions[0], expected, "{spec}");
    }
    // The store restarts empty.
    runtime.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    });
    let t1 = t0 + 100 * NANOS_PER_SEC;
    let (after, lost) = run("a", &window, OnLoss::Empty, t1);
    assert!(lost && !after.allowed);
    assert_eq!(after.decisions[0].retry_after, 10 * NANOS_PER_SEC);
    assert!(
        run("a", &window, OnLoss::Empty, t1 + 10 * NANOS_PER_SEC)
            .0
            .allowed
    );
    assert!(!run("z", &window, OnLoss::Full, t1 + NANOS_PER_SEC).1);
}

/// After Redis restarts, a passed `ping` (the breaker's probe) means that a
/// check on any thread goes through: every thread's own connection, broken
/// by the restart, was asked too (and so made again), not only the shared one.
#[test]
fn after_a_restart_a_passed_ping_means_every_connection_answers() {
    let mut server = RedisServer::start(&[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(2));
    let policy = Policy::parse("token-bucket capacity=5 rate=2/s").unwrap();
    // Checks spread over both worker threads; how many Redis did not decide.
    let failed = |round: usize| {
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                runtime.spawn(async move {
                    let key = format!("{round}-{i}");
                    let check = one_check(&policy, &key);
                    store.decide(&check, None, CHARGE).await.is_err()
                })
            })
            .collect();
        runtime.block_on(async {
            let mut failed = 0;
            for call in calls {
                failed += usize::from(call.await.unwrap());
            }
            failed
        })
    };
    // Each thread opens its own connection in the background.
    for round in 0..3 {
        assert_eq!(failed(round), 0);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server.restart();
    let started = std::time::Instant::now();
    while runtime.block_on(store.ping()).is_err() {
        assert!(started.elapsed().as_secs() < 10, "Redis is back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(failed(3), 0, "checks after a passed ping");
}

/// A thread whose runtime has stopped leaves no connection for the probe to
/// ask: `ping` answers for the connections still in use.
#[test]
fn a_stopped_runtime_leaves_no_connection_to_ping() {
    let server = RedisServer::start(&[]);
    let (runtime, store) = connect(&server.url());
    let policy = Policy::parse("token-bucket capacity=5 rate=2/s").unwrap();
    let check = one_check(&policy, "k");
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let own = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            own.block_on(async {
                // The second check goes on this thread's own connection.
                store.decide(&check, None, CHARGE).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                store.decide(&check, None, CHARGE).await.unwrap();
            });
        });
    });
    runtime.block_on(store.ping()).unwrap();
}

/// Requests queued together (here: every one before the first is sent) go
/// to Redis as a few script calls, not one each, and are decided exactly as
/// the core decides them one after another in the order they were queued:
/// one key's checks and reports, several keys, times going back.
pub(crate) fn queued_requests_decide_in_order(url: &str, case: u64) {
    // One thread: tasks run in the order they were spawned, and each queues
    // its request on its first poll.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedisStore::connect(url))
        .unwrap()
        .with_timeout(PATIENT);
    let policy = Policy::parse("token-bucket capacity=5 rate=2/s").unwrap();
    let start: Nanos = 1_796_000_000 * NANOS_PER_SEC;
    let ops: Vec<(String, Nanos, u64, bool)> = (0..400u64)
        .map(|i| {
            let key = format!("b{case}-k{}", i % 7);
            let at = start + (i * 7_919 % 500) * 1_000_000;
            (key, at, i % 3, i % 11 == 0)
        })
        .collect();
    let calls_before = evalsha_calls(url);
    let answers = runtime.block_on(async {
        let mut tasks = Vec::new();
        for (key, at, cost, report) in ops.clone() {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                match report {
                    true => store.report("b", &policy, &key, cost, Some(at)).await,
                    false => store.check("b", &policy, &key, cost, Some(at)).await,
                }
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap().unwrap());
        }
        answers
    });
    let calls = evalsha_calls(url) - calls_before;
    assert!(calls < 40, "400 queued requests took {calls} script calls");
    let mut model: HashMap<String, State> = HashMap::new();
    for ((key, at, cost, report), got) in ops.iter().zip(answers) {
        let state = model
            .entry(key.clone())
            .or_insert_with(|| policy.new_state());
        let expected = match report {
            true => policy.report(state, *at, *cost).unwrap(),
            false => policy.check(state, *at, *cost).unwrap(),
        };
        assert_eq!(got, expected, "{key} at {at}, cost {cost}, report {report}");
    }
}

/// Script calls so far, over every node of `url`.
fn evalsha_calls(url: &str) -> u64 {
    let nodes = url
        .trim_start_matches("redis-cluster://")
        .trim_start_matches("redis://");
    nodes
        .split(',')
        .map(|node| {
            let client = redis::Client::open(format!("redis://{node}")).unwrap();
            let mut connection = client.get_connection().unwrap();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut connection)
                .unwrap();
            ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
                .iter()
                .filter_map(|stat| {
                    let at = info.find(stat)? + stat.len();
                    info[at..].split(',').next()?.parse::<u64>().ok()
                })
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn queued_requests_go_as_one_call_and_decide_in_order() {
    let server = RedisServer::start(&[]);
    queued_requests_decide_in_order(&server.url(), 1);
}

/// Mostly identities over their limit: with the refusal cache, the same
/// decisions as without it (and as the core), from a fraction of the calls.
#[test]
fn cached_refusals_decide_as_redis_would() {
    let (with, without) = (RedisServer::start(&[]), RedisServer::start(&[]));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cached = runtime
        .block_on(RedisStore::connect(&with.url()))
        .unwrap()
        .with_timeout(PATIENT);
    let plain = runtime
        .block_on(RedisStore::connect(&without.url()))
        .unwrap()
        .with_timeout(PATIENT)
        .with_refusal_cache(false);
    let start: Nanos = 1_796_000_000 * NANOS_PER_SEC;
    for (case, spec) in POLICIES.iter().enumerate() {
        let policy = Policy::parse(spec).unwrap();
        let mut model: HashMap<String, State> = HashMap::new();
        let mut now = start;
        for i in 0..600u64 {
            // Forward 1 ms at a time, now and then back; a cost of 2 or a
            // report now and then.
            now = if i % 50 == 49 {
                now - 40_000_000
            } else {
                now + 1_000_000
            };
            let key = format!("r{case}-k{}", i % 10);
            let cost = 1 + u64::from(i % 17 == 0);
            let report = i % 41 == 0;
            let state = model
                .entry(key.clone())
                .or_insert_with(|| policy.new_state());
            let (expected, got, reference) = match report {
                true => (
                    policy.report(state, now, cost).unwrap(),
                    runtime.block_on(cached.report("c", &policy, &key, cost, Some(now))),
                    runtime.block_on(plain.report("c", &policy, &key, cost, Some(now))),
                ),
                false => (
                    policy.check(state, now, cost).unwrap(),
                    runtime.block_on(cached.check("c", &policy, &key, cost, Some(now))),
                    runtime.block_on(plain.check("c", &policy, &key, cost, Some(now))),
                ),
            };
            let (got, reference) = (got.unwrap(), reference.unwrap());
            assert_eq!(got, reference, "{spec} {key} at {now}, cost {cost}");
            assert_eq!(got, expected, "{spec} {key} at {now}, cost {cost}");
        }
    }
    let (calls, all) = (evalsha_calls(&with.url()), evalsha_calls(&without.url()));
    assert!(
        calls * 3 < all,
        "{calls} calls with the cache, {all} without"
    );
}

/// An admin reset on one instance reaches every instance's cache.
#[test]
fn a_reset_reaches_every_cache() {
    let server = RedisServer::start(&[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (one, other) = runtime.block_on(async {
        let one = RedisStore::connect(&server.url()).await.unwrap();
        let other = RedisStore::connect(&server.url()).await.unwrap();
        (one, other)
    });
    let policy = Policy::parse("token-bucket capacity=1 rate=1/h").unwrap();
    let check = || {
        runtime
            .block_on(one.check("p", &policy, "tenant", 1, None))
            .unwrap()
    };
    assert!(check().allowed);
    assert!(!check().allowed);
    assert_eq!(one.cached_refusals(), 1);
    assert!(!check().allowed, "refused from the cache");
    // Another instance resets the key: this one hears of it.
    assert!(runtime.block_on(other.reset("p", "tenant")).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while one.cached_refusals() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the reset never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(check().allowed);
}

/// One operation of a concurrency trace: a check of a cost, or a release
/// or renewal of the n-th lease taken so far (of any key: another key's
/// lease finds nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LeaseStep {
    Check(u64),
    Release(usize),
    Renew(usize),
}

/// Checks, releases and renewals through Redis and the core, at explicit
/// times: the same decisions to the nanosecond, and a lease exactly when
/// the core takes one.
#[test]
fn leases_decide_as_the_core() {
    let shared = shared();
    let case = AtomicU64::new(0);
    let step = prop_oneof![
        4 => (0u64..=4).prop_map(LeaseStep::Check),
        2 => (0usize..40).prop_map(LeaseStep::Release),
        1 => (0usize..40).prop_map(LeaseStep::Renew),
    ];
    let strategy = (
        prop::sample::select(vec![
            "concurrency limit=3 lease=1s",
            "concurrency limit=4 lease=1500ms",
            "concurrency limit=1 lease=250ms",
        ]),
        prop::collection::vec((gap(), 0u8..2, step), 1..60),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(policy, trace)| {
            let case = 2_000_000 + case.fetch_add(1, Ordering::SeqCst);
            let policy = Policy::parse(policy).unwrap();
            replay_leases(&shared.store, &shared.runtime, policy, &trace, case);
            Ok(())
        })
        .unwrap();
}

/// Replays `(gap ms, key, step)` of a concurrency policy through Redis and
/// the core; panics on the first decision that differs.
pub(crate) fn replay_leases(
    store: &RedisStore,
    runtime: &tokio::runtime::Runtime,
    policy: Policy,
    trace: &[(i64, u8, LeaseStep)],
    case: u64,
) {
    let name = format!("p{case}");
    let mut reference: HashMap<String, State> = HashMap::new();
    // (the store's identity, the core's) of each lease taken.
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut now: Nanos = 1_796_000_000 * NANOS_PER_SEC + 123_456_789;
    for (i, &(gap, key, step)) in trace.iter().enumerate() {
        now = now.saturating_add_signed(gap * 1_000_000 + i64::from(key) * 7);
        let identity = format!("c{case}-k{key}");
        let state = reference
            .entry(identity.clone())
            .or_insert_with(|| policy.new_state());
        // Another key's lease, or none: acts on nothing here.
        let lease = |n: usize| taken.get(n).copied().unwrap_or_default();
        let on = |op| {
            runtime
                .block_on(store.on_lease(&name, &policy, &identity, op, Some(now)))
                .unwrap()
        };
        let (expected, got) = match step {
            LeaseStep::Check(cost) => {
                let cost = cost.min(policy.max_cost().0);
                let core_id = i as u64 + 1;
                let expected = policy.acquire(state, now, cost, core_id).unwrap();
                let got = runtime
                    .block_on(store.check(&name, &policy, &identity, cost, Some(now)))
                    .unwrap();
                assert_eq!(got.lease.is_some(), expected.lease.is_some());
                if let Some(id) = got.lease {
                    taken.push((id, core_id));
                }
                (expected, got)
            }
            LeaseStep::Release(n) => (
                policy.release(state, now, lease(n).1).unwrap(),
                on(weir_redis::LeaseOp::Release(lease(n).0)),
            ),
            LeaseStep::Renew(n) => (
                policy.renew(state, now, lease(n).1).unwrap(),
                on(weir_redis::LeaseOp::Renew(lease(n).0)),
            ),
        };
        let bare = |d: weir_core::Decision| weir_core::Decision { lease: None, ..d };
        assert_eq!(
            bare(got),
            bare(expected),
            "{policy} at {now}, {identity}, {step:?}"
        );
    }
}
