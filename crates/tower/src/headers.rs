//! The HTTP fields: `Retry-After` and the IETF draft `RateLimit-Policy` /
//! `RateLimit` structured fields (draft-ietf-httpapi-ratelimit-headers),
//! e.g. `"api";q=10;w=5` and `"api";r=0;t=1`.

use http::HeaderValue;
use weir_limiter::{Nanos, Policy};

const SECOND: Nanos = 1_000_000_000;

fn ceil_seconds(ns: Nanos) -> u64 {
    ns.div_ceil(SECOND)
}

/// `Retry-After` in whole seconds, rounded up and never 0 (a client told
/// "retry after 0" would retry at once, before it may).
pub fn retry_after_seconds(retry_after: Nanos) -> u64 {
    ceil_seconds(retry_after).max(1)
}

/// A policy's quota for `RateLimit-Policy`: `q` units per `w` seconds. For a
/// token bucket, its capacity over the time to refill it from empty; for the
/// windows, the limit per window; for the shaper, its queue and the slot being
/// served over the time to drain them.
pub fn quota(policy: &Policy) -> (u64, u64) {
    let level = |size: u64, rate: weir_limiter::Nanos, tokens: u64| {
        let window = u128::from(size) * u128::from(rate) / u128::from(tokens);
        u64::try_from(window).unwrap_or(u64::MAX)
    };
    let (q, w) = match policy {
        Policy::TokenBucket(b) | Policy::Gcra(b) => (
            b.capacity(),
            level(b.capacity(), b.rate().period(), b.rate().tokens()),
        ),
        Policy::FixedWindow(w) => (w.limit(), w.window()),
        Policy::SlidingLog(l) => (l.limit(), l.window()),
        Policy::SlidingCounter(c) => (c.limit(), c.window()),
        Policy::LeakyBucket(l) => (
            l.queue() + 1,
            level(l.queue() + 1, l.rate().period(), l.rate().tokens()),
        ),
        _ => (0, 0),
    };
    (q, ceil_seconds(w).max(1))
}

/// A structured-field string: `"` and `\` escaped, anything outside
/// printable ASCII replaced by `?` (sf-string cannot carry it).
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

fn value(text: String) -> HeaderValue {
    // Only printable ASCII is ever produced.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `RateLimit-Policy: "name";q=Q;w=W`.
pub fn rate_limit_policy(name: &str, q: u64, w: u64) -> HeaderValue {
    value(format!("{};q={q};w={w}", sf_string(name)))
}

/// `RateLimit: "name";r=R;t=T` with `t` the reset in whole seconds, rounded up.
pub fn rate_limit(name: &str, remaining: u64, reset: Nanos) -> HeaderValue {
    value(format!(
        "{};r={remaining};t={}",
        sf_string(name),
        ceil_seconds(reset)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(SECOND), 1);
        assert_eq!(retry_after_seconds(SECOND + 1), 2);
        assert_eq!(rate_limit("api", 0, 500_000_000), "\"api\";r=0;t=1");
        assert_eq!(
            rate_limit_policy("a\"b\\c\u{e9}", 10, 5),
            "\"a\\\"b\\\\c?\";q=10;w=5"
        );
        let p = |s| quota(&Policy::parse(s).unwrap());
        assert_eq!(p("token-bucket capacity=10 rate=2/s"), (10, 5));
        assert_eq!(p("fixed-window limit=120 window=1m"), (120, 60));
        assert_eq!(p("sliding-log limit=5 window=1500ms"), (5, 2));
        assert_eq!(p("leaky-bucket rate=2/s queue=9"), (10, 5));
        assert_eq!(p("gcra burst=1 rate=1/ms"), (1, 1));
    }
}
