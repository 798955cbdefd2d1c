//! Nanoseconds per decision for each algorithm's pure transition: one key,
//! the clock advancing a little less than the policy's pace, so the stream is
//! a realistic mix of admissions and rejections.
//!
//! `cargo bench -p weir-core --bench algorithms`

#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use weir_core::algo::{Concurrency, LeaseId, LeaseState};
use weir_core::{NANOS_PER_SEC, Nanos, Policy};

fn transitions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for (spec, step) in [
        ("token-bucket capacity=10 rate=100/s", 9_000_000),
        ("gcra burst=10 rate=7/1500ms", 200_000_000),
        ("fixed-window limit=100 window=1s", 9_000_000),
        ("sliding-log limit=100 window=1s", 9_000_000),
        ("sliding-counter limit=100 window=1s", 9_000_000),
        ("leaky-bucket rate=100/s queue=10", 9_000_000),
    ] {
        let policy = Policy::parse(spec).expect("a valid policy");
        let name = policy.algorithm().name();
        group.bench_function(name, |b| {
            let mut state = policy.new_state();
            let mut now: Nanos = 0;
            b.iter(|| {
                now += step;
                black_box(policy.check(&mut state, black_box(now), 1))
            });
        });
    }
    group.finish();
}

/// The concurrency limit's own transitions: a check that takes a lease
/// and the release of the one taken five checks before, so five are in
/// flight, as a steady stream of requests that each run a while.
fn leases(c: &mut Criterion) {
    let policy = Concurrency::new(10, 30 * NANOS_PER_SEC).expect("a valid limit");
    c.bench_function("decision/concurrency check+release", |b| {
        let mut state = LeaseState::default();
        let (mut now, mut id): (Nanos, LeaseId) = (0, 0);
        for _ in 0..5 {
            id += 1;
            policy.check(&mut state, now, 1, id);
        }
        b.iter(|| {
            now += 1_000_000;
            id += 1;
            black_box(policy.check(&mut state, black_box(now), 1, id));
            black_box(policy.release(&mut state, now, id - 5))
        });
    });
}

criterion_group!(benches, transitions, leases);
criterion_main!(benches);
