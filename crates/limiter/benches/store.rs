//! The in-process store against governor, side by side in one run: keyed
//! checks with each library's real clock (both: quanta's TSC clock where
//! the kernel keeps time by the TSC), 1 key and 100,000 keys, 1 and 2 threads.
//! Throughput is reported as elements (decisions) per second.
//!
//! Also a reload of 1,000,000 keys, kept or carried over; and what the
//! `Store` face (`decide_now`: names resolved, keys created counted) costs
//! over the library's `check_one`, one thread, 100,000 keys.
//!
//! Also what a penalty costs an admitted check, and a banned key's refusal.
//!
//! `cargo bench -p weir-limiter --bench store`

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

#[path = "support/walk.rs"]
mod walk;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use weir_limiter::{Limiter, Policy};

const THREADS: [usize; 2] = [1, 2];
const KEY_COUNTS: [usize; 2] = [1, 100_000];

fn keyed(c: &mut Criterion) {
    let weir_policies = [
        "token-bucket capacity=10 rate=100/s",
        "gcra burst=10 rate=100/s",
        "fixed-window limit=10 window=100ms",
        "sliding-counter limit=10 window=100ms",
        "sliding-log limit=10 window=100ms",
        "leaky-bucket rate=100/s queue=10",
    ];
    for keys in KEY_COUNTS {
        let names: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("user-{i}")).collect());
        for threads in THREADS {
            let mut group = c.benchmark_group(format!("keyed/{keys}-keys/{threads}-threads"));
            group.throughput(Throughput::Elements(1));
            group
                .sample_size(20)
                .measurement_time(Duration::from_secs(3))
                .warm_up_time(Duration::from_secs(1));

            let quota = Quota::per_second(NonZeroU32::new(100).unwrap())
                .allow_burst(NonZeroU32::new(10).unwrap());
            let governor = Arc::new(RateLimiter::dashmap(quota));
            let check = Arc::new(move |k: &String| {
                black_box(governor.check_key(k).is_ok());
            });
            group.bench_function(BenchmarkId::new("governor", "gcra"), |b| {
                b.iter_custom(|iters| walk::run(check.clone(), &names, threads, iters));
            });

            for spec in weir_policies {
                let policy = Policy::parse(spec).unwrap();
                let limiter = Arc::new(Limiter::new(policy));
                let check = Arc::new(move |k: &String| {
                    black_box(limiter.check(k, 1).unwrap().allowed);
                });
                group.bench_function(BenchmarkId::new("weir", policy.algorithm().name()), |b| {
                    b.iter_custom(|iters| walk::run(check.clone(), &names, threads, iters));
                });
            }
            group.finish();
        }
    }
}

/// A reload of a limiter holding 1,000,000 keys: the same policy (its
/// store shared), and its capacity changed (every key's state carried over
/// into a new store, `Policy::carry`).
fn reload(c: &mut Criterion) {
    let before = Policy::parse("token-bucket capacity=10 rate=100/s").unwrap();
    let after = Policy::parse("token-bucket capacity=20 rate=100/s").unwrap();
    let keys = 1_000_000;
    let old = Limiter::builder()
        .policy("api", before)
        .max_keys(2 * keys)
        .build()
        .unwrap();
    for i in 0..keys {
        assert!(old.check(&format!("user-{i}"), 1).unwrap().allowed);
    }
    assert_eq!(old.len(), keys);
    let mut group = c.benchmark_group("reload/1000000-keys");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for (name, policy) in [("unchanged", before), ("carried", after)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let new = Limiter::builder().policy("api", policy).max_keys(2 * keys);
                black_box(new.keep_state_of(&old).build().unwrap().len())
            });
        });
    }
    group.finish();
}

fn face(c: &mut Criterion) {
    use weir_core::store::{Check, Mode};
    let policy = Policy::parse("token-bucket capacity=10 rate=100/s").unwrap();
    let limiter = Limiter::builder()
        .policy("api", policy)
        .max_keys(200_000)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
    let id = limiter.policy("api").unwrap();
    let mut group = c.benchmark_group("face/100000-keys/1-thread");
    group.throughput(Throughput::Elements(1));
    let mut i = 0;
    group.bench_function("check_one", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(
                limiter
                    .check_one(weir_limiter::Check::new(id, &keys[i]))
                    .unwrap(),
            )
        });
    });
    group.bench_function("store_decide_now", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let check = Check::from(weir_core::Check {
                name: "api",
                policy: &policy,
                key: &keys[i],
                cost: 1,
            });
            black_box(limiter.decide_now(&[check], Mode::CHARGE).unwrap())
        });
    });
    group.finish();
}

/// A penalty's cost on the path of an admitted check (a penalised key
/// lives behind its mutex, never on the one-word path), and a banned key's
/// refusal, one thread, 100,000 keys.
fn penalty(c: &mut Criterion) {
    let policy = Policy::parse("token-bucket capacity=10 rate=100/s").unwrap();
    let penalty = weir_core::Penalty::new(60_000_000_000, Some(4), None, None).unwrap();
    let plain = Limiter::builder()
        .policy("p", policy)
        .max_keys(200_000)
        .build()
        .unwrap();
    let penalised = Limiter::builder()
        .policy("p", policy)
        .penalty("p", penalty)
        .max_keys(200_000)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
    let mut group = c.benchmark_group("penalty/100000-keys/1-thread");
    group.throughput(Throughput::Elements(1));
    let mut i = 0;
    for (name, limiter) in [("none", &plain), ("penalty", &penalised)] {
        group.bench_function(BenchmarkId::new("admitted", name), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(limiter.check(&keys[i], 1).unwrap())
            });
        });
    }
    // One key, spent and banned: every check refused.
    while penalised.check("banned", 1).unwrap().allowed {}
    group.bench_function(BenchmarkId::new("refused", "banned"), |b| {
        b.iter(|| black_box(penalised.check("banned", 1).unwrap()));
    });
    group.finish();
}

criterion_group!(benches, keyed, reload, face, penalty);
criterion_main!(benches);
