//! What both gateways share: the same policy, key and refusal as
//! `docs/bench/weir.toml` (`token-bucket capacity=10 rate=2/s` per
//! `x-seller-id`), and their two arguments.

use weir_limiter::{Limiter, Policy};

pub fn limiter() -> Limiter {
    Limiter::new(Policy::parse("token-bucket capacity=10 rate=2/s").expect("a valid policy"))
}

/// `LISTEN UPSTREAM`, e.g. `127.0.0.1:19003 127.0.0.1:19000`.
pub fn args() -> (String, String) {
    let mut args = std::env::args().skip(1);
    match (args.next(), args.next()) {
        (Some(listen), Some(upstream)) => (listen, upstream),
        _ => {
            eprintln!("usage: GATEWAY LISTEN-ADDR UPSTREAM-ADDR");
            std::process::exit(2)
        }
    }
}

/// Seconds until a retry, rounded up (`Retry-After`).
pub fn retry_secs(retry_after_ns: u64) -> u64 {
    retry_after_ns.div_ceil(1_000_000_000)
}
