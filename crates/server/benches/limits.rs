//! The decision path with limits managed by API: resolving a request's
//! policy for its key, and that plus the in-process decision, with no
//! limit set, with 1,000,000 keys holding one (for a key without one, and
//! for a key with one), and the memory the million take.
//!
//! `cargo bench -p weir-server --bench limits`

#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use weir_core::store::{self, Mode};
use weir_server::config::{self, Setting};
use weir_server::limits::{Change, Record};
use weir_server::{AppState, Shared};

const CONFIG: &str = r#"
[policies.monthly]
algorithm = "fixed-window"
limit = 1000000000
window = "1h"

[plans.pro]
policies = { monthly = { limit = 2000000000 } }
"#;

/// The process's resident memory, in MiB.
fn resident_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    kib / 1024
}

/// One key's resolution, and its resolution and decision, under `shared`.
fn bench_key(c: &mut Criterion, shared: &Shared, name: &str, key: &str) {
    let id = shared.table.find("monthly").unwrap();
    c.bench_function(&format!("limits/resolve/{name}"), |b| {
        b.iter(|| black_box(shared.resolve(id, black_box(key))));
    });
    let limiter = shared.backend.local();
    c.bench_function(&format!("limits/resolve+decide/{name}"), |b| {
        b.iter(|| {
            let entry = shared.table.get(shared.resolve(id, black_box(key)));
            let check = weir_core::Check {
                name: &entry.stored_as,
                policy: &entry.policy,
                key,
                cost: 1,
            };
            black_box(limiter.decide_now(&[store::Check::from(check)], Mode::CHARGE))
        });
    });
}

fn limits(c: &mut Criterion) {
    let config = config::parse(CONFIG, &Default::default()).unwrap();
    let state = AppState::new(Shared::new(config, None).unwrap());
    let shared = state.current();
    bench_key(c, &shared, "none-set", "acme");
    let before = resident_mib();
    let twice = Setting::read([("multiplier", "2".to_owned())]).unwrap();
    for n in 0..1_000_000u32 {
        let key = format!("customer-{n}");
        let change = match n % 2 {
            0 => Change::Plan {
                key,
                record: Some(Record {
                    value: "pro".into(),
                    expires_at: None,
                    reason: "".into(),
                    by: "bench".into(),
                    at: 0,
                }),
            },
            _ => Change::Setting {
                policy: "monthly".into(),
                key,
                record: Some(Record {
                    value: twice.clone(),
                    expires_at: None,
                    reason: "".into(),
                    by: "bench".into(),
                    at: 0,
                }),
            },
        };
        shared.limits.apply(&change).unwrap();
    }
    eprintln!(
        "1,000,000 keys with a limit or plan: {} MiB resident more",
        resident_mib().saturating_sub(before)
    );
    bench_key(c, &shared, "1M-set/key-without", "acme");
    bench_key(c, &shared, "1M-set/key-on-plan", "customer-42");
    bench_key(c, &shared, "1M-set/key-with-limit", "customer-43");
}

criterion_group!(benches, limits);
criterion_main!(benches);
