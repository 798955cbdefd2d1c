//! Nanoseconds per decision for each algorithm's pure transition: one key,
//! the clock advancing a little less than the policy's pace, so the stream is
//! a realistic mix of admissions and rejections.
//!
//! `cargo bench -p weir-core --bench algorithms`

#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use weir_core::{Nanos, Policy};

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

criterion_group!(benches, transitions);
criterion_main!(benches);
