//! Resident memory of the sliding-window log: 100,000 keys, each holding 120
//! admissions within one minute (12 million live admissions).
//!
//! `cargo run --release -p weir-limiter --example log_memory`

use weir_limiter::{FakeClock, Limiter, Policy};

const KEYS: u64 = 100_000;
const ADMISSIONS: u64 = 120;

/// Resident set size now, in bytes (Linux).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    kib * 1024
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user-{i}")).collect();
    let limiter = Limiter::builder()
        .policy("log", Policy::parse("sliding-log limit=120 window=1m")?)
        .clock(FakeClock::at(1_000_000_000))
        .build()?;
    let before = rss();
    // 120 rounds, 490 ms apart: every admission is still live at the end.
    for round in 0..ADMISSIONS {
        for key in &keys {
            limiter.clock().advance(4);
            if !limiter.check(key, 1)?.allowed {
                return Err(format!("{key} rejected in round {round}").into());
            }
        }
        limiter.clock().advance(490_000_000);
    }
    let used = rss().saturating_sub(before);
    let admissions = KEYS * ADMISSIONS;
    println!(
        "{{\"keys\":{KEYS},\"admissions\":{admissions},\"rss_bytes\":{used},\"bytes_per_admission\":{:.2},\"bytes_per_key\":{}}}",
        used as f64 / admissions as f64,
        used / KEYS
    );
    Ok(())
}
