//! Keyed checks through governor's and weir's public APIs, timed without a
//! harness: `keyed LIBRARY KEYS THREADS [POLICY]` makes 20 million checks
//! of `user-N` keys from THREADS threads (each walking the keys from its own
//! starting point, as `benches/store.rs` does) after each limiter's clock
//! has calibrated, and prints decisions per second. On a shared machine the
//! best of several interleaved runs is steadier than one criterion sample
//! (`bench/compare.sh library` runs it so):
//!
//! ```sh
//! cargo run --release -p weir-limiter --example keyed -- governor 1 1
//! cargo run --release -p weir-limiter --example keyed -- weir 100000 2 'fixed-window limit=10 window=100ms'
//! ```

#![allow(clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;

#[path = "../benches/support/walk.rs"]
mod walk;

use governor::{Quota, RateLimiter};
use weir_limiter::{Limiter, Policy};

const CHECKS: u64 = 20_000_000;

/// Decisions per second of `check` over `keys` from `threads` threads,
/// after one untimed pass over the keys.
fn rate(
    check: impl Fn(&String) -> bool + Send + Sync + 'static,
    keys: usize,
    threads: usize,
) -> f64 {
    let keys: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("user-{i}")).collect());
    for key in keys.iter() {
        check(key);
    }
    let check = Arc::new(move |key: &String| {
        black_box(check(key));
    });
    let took = walk::run(check, &keys, threads, CHECKS);
    CHECKS as f64 / took.as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).map_or(default.to_owned(), Clone::clone);
    let library = arg(0, "weir");
    let keys: usize = arg(1, "1").parse().expect("KEYS: a number");
    let threads: usize = arg(2, "1").parse().expect("THREADS: a number");
    let spec = arg(3, "token-bucket capacity=10 rate=100/s");
    let per_second = match library.as_str() {
        "governor" => {
            let quota = Quota::per_second(NonZeroU32::new(100).expect("positive"))
                .allow_burst(NonZeroU32::new(10).expect("positive"));
            let governor = RateLimiter::dashmap(quota);
            rate(move |key| governor.check_key(key).is_ok(), keys, threads)
        }
        _ => {
            let limiter = Limiter::new(Policy::parse(&spec).expect("a valid policy"));
            rate(
                move |key| limiter.check(key, 1).expect("a valid check").allowed,
                keys,
                threads,
            )
        }
    };
    println!("{library} {keys} keys {threads} threads: {per_second:.0} decisions/s");
}
