//! What weir's integration tests share: real `redis-server` processes and a
//! Redis Cluster on free loopback ports, the one test server ([`serve`]), a
//! small HTTP client, and a fake LLM
//! upstream that says how many tokens each answer used.
//!
//! Tests panic on purpose here (a fixture that cannot start is a failed
//! test), always with a message that says what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod boundary;
mod http_client;
pub mod llm;
mod redis;
pub mod tls;
mod upstream;

pub use http_client::{Reply, send};
pub use llm::Llm;
pub use redis::{Cluster, RedisServer, Sentinels, free_port, require};
pub use tls::Certs;
pub use upstream::serve;

/// A test's tool is missing: under `CI=true` the test fails, naming it and
/// how to install it; elsewhere (a developer's machine without Chromium,
/// say) it says SKIPPED, and why, and the caller returns.
pub fn missing(test: &str, what: &str) {
    let ci = strict(std::env::var("CI").ok().as_deref());
    assert!(
        !ci,
        "{test}: {what}, and CI=true: tools/test.sh installs it"
    );
    eprintln!("SKIPPED {test}: {what}");
}

/// Whether a missing tool fails the test: `CI` is `true`.
fn strict(ci: Option<&str>) -> bool {
    ci == Some("true")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_tool_fails_only_under_ci() {
        assert!(super::strict(Some("true")));
        assert!(!super::strict(None));
        assert!(!super::strict(Some("false")));
    }
}
