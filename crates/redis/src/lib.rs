//! weir's Redis store: several weir instances share one balance in Redis (a
//! single node or a Redis Cluster). Every check is **one** atomic Lua script
//! ([`SCRIPT`], `weir.lua` beside this file) that refills, checks and
//! conditionally debits every key of the request — all-or-nothing — using
//! the Redis server's clock (`TIME`), or an explicit time for replay and
//! tests. Its decisions are those of `weir-core`, to the nanosecond: every
//! quantity stays an exact integer below 2^53 (the bounds `weir-core`
//! enforces), and absolute times are kept as (seconds, nanoseconds) pairs.
//!
//! Keys are versioned and escaped, `rl:v1:{IDENTITY}:POLICY`, with the
//! identity as the hash tag so that one identity's policies share a slot on a
//! cluster (and one script can check them together). Every key expires when
//! its `reset` is reached (Redis-clock mode), so idle state disappears exactly
//! when deleting it grants nothing. Works on a plain managed Redis (no modules).

use std::fmt::Write as _;

use redis::Script;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use thiserror::Error;
use weir_core::{CostError, Decision, NANOS_PER_SEC, Nanos, Policy};

/// The script: see its header for the KEYS/ARGV contract.
pub const SCRIPT: &str = include_str!("weir.lua");

/// The longest identity stored, in bytes (before escaping).
pub const MAX_IDENTITY: usize = 256;

/// Why a check could not be decided by Redis.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis failed or could not be reached: transient, not a rejection.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No answer within the store's timeout: transient, not a rejection.
    #[error("redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The script answered something else than a decision.
    #[error("unexpected reply from the weir script")]
    Reply,
    /// The request can never be decided (cost, identity).
    #[error("{0}")]
    Invalid(String),
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Redis(_) | Self::Timeout(_))
    }
}

/// A checked request over several policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Every policy allowed, and so every one was charged.
    pub allowed: bool,
    /// One decision per check, in order (see the in-process `AllDecision`).
    pub decisions: Vec<Decision>,
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A Redis (or Redis Cluster) store.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    script: Script,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `redis://host:port` or `redis-cluster://host:port[,host:port…]`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let connection = match url.strip_prefix("redis-cluster://") {
            Some(nodes) => {
                let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
                let client = redis::cluster::ClusterClient::new(nodes)?;
                Connection::Cluster(client.get_async_connection().await?)
            }
            None => Connection::Single(redis::Client::open(url)?.get_connection_manager().await?),
        };
        let timeout = std::time::Duration::from_millis(50);
        Ok(Self {
            connection,
            script: Script::new(SCRIPT),
            timeout,
        })
    }

    /// The deadline of each call (default 50 ms): past it, the check fails
    /// with [`StoreError::Timeout`] instead of waiting on a slow store.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks `(policy name, policy, identity)` triples as one request, at
    /// the Redis clock or at `at`. The identity's policies must be checked
    /// together with one identity (one hash slot).
    pub async fn check_all(
        &self,
        checks: &[(&str, &Policy, &str)],
        cost: u64,
        at: Option<Nanos>,
    ) -> Result<Checked, StoreError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(cost);
        match at {
            None => invocation.arg("redis"),
            Some(t) => invocation.arg(format!("{} {}", t / NANOS_PER_SEC, t % NANOS_PER_SEC)),
        };
        for (name, policy, identity) in checks {
            policy
                .validate_cost(cost)
                .map_err(|e: CostError| StoreError::Invalid(format!("policy `{name}`: {e}")))?;
            if identity.len() > MAX_IDENTITY {
                return Err(StoreError::Invalid(format!(
                    "identity longer than {MAX_IDENTITY} bytes"
                )));
            }
            invocation.key(key(name, identity));
            invocation.arg(spec(policy));
        }
        // One round trip; the multiplexed connection pipelines concurrent
        // calls, and `invoke_async` loads the script again on NOSCRIPT.
        let call = async {
            match &self.connection {
                Connection::Single(c) => invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await,
                Connection::Cluster(c) => invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await,
            }
        };
        let reply = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        parse(&reply, checks.len())
    }

    /// One policy, one identity.
    pub async fn check(
        &self,
        name: &str,
        policy: &Policy,
        identity: &str,
        cost: u64,
        at: Option<Nanos>,
    ) -> Result<Decision, StoreError> {
        let checked = self
            .check_all(&[(name, policy, identity)], cost, at)
            .await?;
        checked
            .decisions
            .into_iter()
            .next()
            .ok_or(StoreError::Reply)
    }
}

fn parse(reply: &[i64], count: usize) -> Result<Checked, StoreError> {
    if reply.len() != 1 + 5 * count {
        return Err(StoreError::Reply);
    }
    let n = |x: i64| u64::try_from(x).map_err(|_| StoreError::Reply);
    let decisions = reply[1..]
        .chunks(5)
        .map(|d| {
            Ok(Decision {
                allowed: d[0] == 1,
                remaining: n(d[1])?,
                retry_after: n(d[2])?,
                reset: n(d[3])?,
                delay: n(d[4])?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Checked {
        allowed: reply[0] == 1,
        decisions,
    })
}

/// The script's policy argument.
pub fn spec(policy: &Policy) -> String {
    match policy {
        Policy::TokenBucket(b) | Policy::Gcra(b) => format!(
            "tb {} {} {}",
            b.capacity(),
            b.rate().tokens(),
            b.rate().period()
        ),
        Policy::LeakyBucket(l) => format!(
            "lb {} {} {}",
            l.queue(),
            l.rate().tokens(),
            l.rate().period()
        ),
        Policy::FixedWindow(w) => format!("fw {} {}", w.limit(), w.window()),
        Policy::SlidingCounter(c) => format!("sc {} {}", c.limit(), c.window()),
        Policy::SlidingLog(l) => format!("sl {} {}", l.limit(), l.window()),
        _ => String::new(),
    }
}

/// `rl:v1:{IDENTITY}:POLICY`, both escaped: every byte outside
/// `[A-Za-z0-9._-]` becomes `%XX`, so no two (policy, identity) pairs share
/// a key whatever they hold, and `{`/`}` can never end the hash tag early.
pub fn key(policy: &str, identity: &str) -> String {
    format!("rl:v1:{{{}}}:{}", escape(identity), escape(policy))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_and_tagged() {
        assert_eq!(key("stock-read", "842"), "rl:v1:{842}:stock-read");
        assert_eq!(key("a", "x}:{y"), "rl:v1:{x%7D%3A%7By}:a");
        assert_ne!(key("a:b", "c"), key("a", "b:c"));
        assert_ne!(key("a", "%41"), key("a", "A"));
    }
}
