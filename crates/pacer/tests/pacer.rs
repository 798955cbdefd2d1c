use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{Instant, advance};
use weir_core::algo::LevelState;
use weir_core::{Nanos, Policy};
use weir_pacer::{PaceError, Pacer};

fn shaper(spec: &str) -> Policy {
    Policy::parse(spec).unwrap()
}

/// Random arrivals: (gap in ns, destination, cost).
fn arrivals(seed: u64, count: usize, mean_gap: u64, max_cost: u64) -> Vec<(u64, String, u64)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..count)
        .map(|_| {
            let gap = if rng.bool() {
                0
            } else {
                rng.u64(0..=2 * mean_gap)
            };
            (gap, format!("host-{}", rng.u8(0..3)), rng.u64(1..=max_cost))
        })
        .collect()
}

/// With one policy, every release is docs/SPEC.md's `delay` for the same
/// arrivals, to the nanosecond, and every refusal is docs/SPEC.md's rejection.
#[tokio::test(start_paused = true)]
async fn release_times_are_the_spec_delay() {
    for (spec, mean_gap) in [
        ("leaky-bucket rate=2/s queue=5", 300_000_000),
        ("leaky-bucket rate=3/s queue=4", 200_000_000),
        ("leaky-bucket rate=7/1500ms queue=3", 150_000_000),
    ] {
        let policy = shaper(spec);
        let Policy::LeakyBucket(bucket) = policy else {
            unreachable!()
        };
        for seed in 0..20 {
            let pacer = Pacer::builder().per_destination(policy).unwrap().build();
            let start = Instant::now();
            let mut reference: HashMap<String, LevelState> = HashMap::new();
            let mut now: Nanos = 0;
            for (gap, host, cost) in arrivals(seed, 60, mean_gap, 2) {
                advance(Duration::from_nanos(gap)).await;
                now += gap;
                let state = reference.entry(host.clone()).or_default();
                let (expected, next) = bucket.check(*state, now, cost);
                match pacer.reserve(&host, cost, None) {
                    Ok(slot) => {
                        assert!(expected.allowed, "{spec} seed {seed}");
                        *state = next;
                        assert_eq!(
                            slot.wait,
                            Duration::from_nanos(expected.delay),
                            "{spec} seed {seed}"
                        );
                        assert_eq!(slot.at, start + Duration::from_nanos(now + expected.delay));
                    }
                    Err(PaceError::QueueFull { retry_after, .. }) => {
                        assert!(!expected.allowed, "{spec} seed {seed}");
                        assert_eq!(retry_after, Duration::from_nanos(expected.retry_after));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
}

/// Per host 2/s and 5/s across hosts: the release times never put two
/// requests to one host closer than 500 ms, nor any two closer than 200 ms.
#[tokio::test(start_paused = true)]
async fn combined_policies_never_exceed_either() {
    for seed in 0..20 {
        let pacer = Pacer::builder()
            .per_destination(shaper("leaky-bucket rate=2/s queue=1000"))
            .unwrap()
            .global(shaper("leaky-bucket rate=5/s queue=1000"))
            .unwrap()
            .build();
        let mut releases: Vec<(Instant, String)> = Vec::new();
        for (gap, host, _) in arrivals(seed, 80, 100_000_000, 1) {
            advance(Duration::from_nanos(gap)).await;
            let slot = pacer.reserve(&host, 1, None).unwrap();
            releases.push((slot.at, host));
        }
        releases.sort();
        for pair in releases.windows(2) {
            assert!(
                pair[1].0 - pair[0].0 >= Duration::from_millis(200),
                "global, seed {seed}"
            );
        }
        for host in ["host-0", "host-1", "host-2"] {
            let times: Vec<Instant> = releases
                .iter()
                .filter(|(_, h)| h == host)
                .map(|(t, _)| *t)
                .collect();
            for pair in times.windows(2) {
                assert!(
                    pair[1] - pair[0] >= Duration::from_millis(500),
                    "{host}, seed {seed}"
                );
            }
        }
    }
}

/// Refusals charge nothing: the next request gets the slot the refused one
/// would have had.
#[tokio::test(start_paused = true)]
async fn deadline_and_full_queue_charge_nothing() {
    let pacer = Pacer::builder()
        .per_destination(shaper("leaky-bucket rate=1/s queue=2"))
        .unwrap()
        .global(shaper("leaky-bucket rate=10/s queue=100"))
        .unwrap()
        .build();
    for _ in 0..3 {
        pacer.reserve("a", 1, None).unwrap();
    }
    // Full: the fourth would wait 3 s, beyond the queue of 2 slots.
    assert!(matches!(
        pacer.reserve("a", 1, None),
        Err(PaceError::QueueFull {
            scope: "destination",
            ..
        })
    ));
    advance(Duration::from_secs(1)).await;
    // Now it would wait 2 s; a deadline 1 s away refuses it, charging nothing.
    let soon = Instant::now() + Duration::from_secs(1);
    assert_eq!(
        pacer.reserve("a", 1, Some(soon)),
        Err(PaceError::Deadline {
            wait: Duration::from_secs(2)
        })
    );
    assert_eq!(
        pacer.reserve("a", 1, None).unwrap().wait,
        Duration::from_secs(2)
    );
    // Another host was never charged by the refusals: only the global pace.
    let other = pacer.reserve("b", 1, None).unwrap();
    assert!(other.wait <= Duration::from_millis(100), "{:?}", other.wait);
    assert!(matches!(
        pacer.reserve("a", 0, None),
        Err(PaceError::Cost(_))
    ));
    assert!(
        Pacer::builder()
            .global(shaper("token-bucket capacity=1 rate=1/s"))
            .is_err()
    );
}

/// A waiter dropped before its time is never released, and its slot stays
/// taken (docs/SPEC.md: not refunded).
#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_is_never_released() {
    let pacer = Arc::new(
        Pacer::builder()
            .per_destination(shaper("leaky-bucket rate=1/s queue=5"))
            .unwrap()
            .build(),
    );
    pacer.acquire("a", 1, None).await.unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let task = {
        let (pacer, released) = (pacer.clone(), released.clone());
        tokio::spawn(async move {
            pacer.acquire("a", 1, None).await.unwrap();
            released.store(true, Ordering::SeqCst);
        })
    };
    advance(Duration::from_millis(500)).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    advance(Duration::from_secs(5)).await;
    assert!(!released.load(Ordering::SeqCst));
    // Its slot (at 1 s) was used up: at 5.5 s the key is idle again.
    assert_eq!(pacer.reserve("a", 1, None).unwrap().wait, Duration::ZERO);
}

/// Destinations cost memory only while they are active.
#[tokio::test(start_paused = true)]
async fn idle_destinations_are_dropped() {
    let pacer = Pacer::builder()
        .per_destination(shaper("leaky-bucket rate=10/s queue=5"))
        .unwrap()
        .build();
    for round in 0..20 {
        for i in 0..1000 {
            pacer
                .reserve(&format!("host-{round}-{i}"), 1, None)
                .unwrap();
        }
        advance(Duration::from_secs(1)).await;
    }
    assert!(pacer.destinations() <= 2_000, "{}", pacer.destinations());
}
