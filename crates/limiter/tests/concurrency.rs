//! Many threads, one key: decisions equal some serial order of the checks,
//! and admissions never exceed the bound.

use std::sync::{Arc, Barrier};
use std::thread;

use weir_limiter::{Clock, Decision, FakeClock, Limiter, Policy, SystemClock};

const THREADS: usize = 4;

fn hammer<C: Clock + 'static>(limiter: Arc<Limiter<C>>, per_thread: usize) -> Vec<Decision> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (limiter, barrier) = (limiter.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|_| limiter.check("hot", 1).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

/// With time standing still, a serial order admits exactly the capacity, and
/// the admitted decisions report each remaining count from C-1 down to 0
/// exactly once.
#[test]
fn frozen_time_admits_exactly_the_capacity_in_a_serial_order() {
    for spec in [
        "token-bucket capacity=1000 rate=1/h",
        "gcra burst=1000 rate=1/h",
        "fixed-window limit=1000 window=1h",
        "sliding-log limit=1000 window=1h",
        "sliding-counter limit=1000 window=1h",
    ] {
        let policy = Policy::parse(spec).unwrap();
        let limiter = Limiter::builder()
            .policy("p", policy)
            .clock(FakeClock::at(7));
        {
            let decisions = hammer(Arc::new(limiter.build().unwrap()), 2_000);
            let mut remaining: Vec<u64> = decisions
                .iter()
                .filter(|d| d.allowed)
                .map(|d| d.remaining)
                .collect();
            remaining.sort_unstable();
            assert_eq!(remaining, (0..1000).collect::<Vec<_>>(), "{spec}");
        }
    }
    let shaper = Policy::parse("leaky-bucket rate=1/h queue=500").unwrap();
    let limiter = Limiter::builder()
        .policy("p", shaper)
        .clock(FakeClock::at(7));
    {
        let decisions = hammer(Arc::new(limiter.build().unwrap()), 1_000);
        let mut delays: Vec<u64> = decisions
            .iter()
            .filter(|d| d.allowed)
            .map(|d| d.delay)
            .collect();
        delays.sort_unstable();
        let slot = 3_600_000_000_000;
        assert_eq!(
            delays,
            (0..=500).map(|k| k * slot).collect::<Vec<_>>(),
            "each slot once"
        );
    }
}

/// The real clock, several threads on one key for a while: admissions stay
/// within C + d·N/P over the whole run.
#[test]
fn real_clock_never_over_admits() {
    for (spec, capacity, tokens, period) in [
        (
            "token-bucket capacity=50 rate=1000/s",
            50u128,
            1000u128,
            1_000_000_000u128,
        ),
        ("gcra burst=10 rate=7/3ms", 10, 7, 3_000_000),
    ] {
        let limiter = Arc::new(Limiter::new(Policy::parse(spec).unwrap()));
        let clock = SystemClock::new();
        let start = clock.now();
        let admitted = hammer(limiter, 200_000)
            .iter()
            .filter(|d| d.allowed)
            .count() as u128;
        let elapsed = u128::from(clock.now() - start);
        let bound = capacity + elapsed * tokens / period;
        assert!(
            admitted <= bound,
            "{spec}: {admitted} admitted, bound {bound}"
        );
        assert!(admitted >= capacity, "{spec}: the burst at least");
    }
}
