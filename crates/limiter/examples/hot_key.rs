//! One hot key on one thread: governor's keyed limiter and weir's, each
//! timed over 20 million checks after its clock has calibrated. Steadier
//! than the criterion bench on a shared machine; take the lowest of several
//! runs (`docs/BENCHMARKS.md`):
//!
//! ```sh
//! cargo run --release -p weir-limiter --example hot_key -- governor
//! cargo run --release -p weir-limiter --example hot_key -- weir 'fixed-window limit=10 window=100ms'
//! ```

#![allow(clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use weir_limiter::{Limiter, Policy};

const CHECKS: u32 = 20_000_000;

/// Times `CHECKS` calls of `check`, after one untimed call.
fn timed(check: impl Fn() -> bool) -> Duration {
    check();
    let start = Instant::now();
    for _ in 0..CHECKS {
        black_box(check());
    }
    start.elapsed()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "weir".into());
    let spec = args
        .next()
        .unwrap_or_else(|| "token-bucket capacity=10 rate=100/s".into());
    let key = String::from("user-0");
    let elapsed = match which.as_str() {
        "governor" => {
            let quota = Quota::per_second(NonZeroU32::new(100).expect("positive"))
                .allow_burst(NonZeroU32::new(10).expect("positive"));
            let governor = RateLimiter::dashmap(quota);
            timed(|| governor.check_key(&key).is_ok())
        }
        _ => {
            let limiter = Limiter::new(Policy::parse(&spec).expect("a valid policy"));
            timed(|| limiter.check(&key, 1).expect("a valid check").allowed)
        }
    };
    println!(
        "{which}: {:.1} ns per check",
        elapsed.as_secs_f64() * 1e9 / f64::from(CHECKS)
    );
}
