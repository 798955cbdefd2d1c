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
    /// This call found the generation marker missing: the store lost its
    /// state (restarted empty, flushed, evicted) since the marker was set —
    /// or it was never set (a new store).
    pub state_lost: bool,
}

/// What a key lost with the store's state counts as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLoss {
    /// A new key: its full allowance (as if never seen).
    #[default]
    Full,
    /// Used up at the moment the loss was found; it refills from there.
    Empty,
}

/// One check of a request.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The policy's name (part of the key).
    pub name: &'a str,
    /// The policy.
    pub policy: &'a Policy,
    /// Whose allowance.
    pub identity: &'a str,
    /// What the key counts as when lost (needs [`RedisStore::with_marker`]).
    pub on_loss: OnLoss,
    /// Its own cost instead of the request's; `Some(0)` reports the key's
    /// standing, charging nothing and refusing nothing.
    pub cost: Option<u64>,
}

/// What a call does with its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Charge when every check allows and no shaper would delay by more
    /// than `max_delay` ns.
    Charge {
        /// The longest delay accepted.
        max_delay: Nanos,
    },
    /// Decide as a check would, writing nothing.
    Peek,
}

/// The generation marker's key (single node only: see [`RedisStore::with_marker`]).
pub const MARKER: &str = "rl:v1:generation";

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
    marker: bool,
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

/// Checks, without connecting, that `url` is one [`RedisStore::connect`]
/// accepts; what is wrong otherwise.
pub fn check_url(url: &str) -> Result<(), String> {
    let nodes: Vec<String> = match url.strip_prefix("redis-cluster://") {
        Some(nodes) => nodes.split(',').map(|n| format!("redis://{n}")).collect(),
        None => vec![url.to_owned()],
    };
    for node in &nodes {
        redis::Client::open(node.as_str()).map_err(|e| format!("`{node}`: {e}"))?;
    }
    Ok(())
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
            None => {
                // Reconnect quickly after a restart: short, capped backoff.
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_min_delay(std::time::Duration::from_millis(25))
                    .set_max_delay(std::time::Duration::from_millis(200))
                    .set_number_of_retries(3)
                    .set_connection_timeout(Some(std::time::Duration::from_millis(500)));
                let client = redis::Client::open(url)?;
                Connection::Single(client.get_connection_manager_with_config(config).await?)
            }
        };
        let timeout = std::time::Duration::from_millis(50);
        Ok(Self {
            connection,
            script: Script::new(SCRIPT),
            timeout,
            marker: false,
        })
    }

    /// Keeps a generation marker ([`MARKER`]) so that a loss of the store's
    /// state is detected rather than guessed, and [`OnLoss::Empty`] applies.
    /// A single node only: on a cluster a marker would live on one node and
    /// say nothing of the others (`false` is kept there).
    pub fn with_marker(mut self, on: bool) -> Self {
        self.marker = on && matches!(self.connection, Connection::Single(_));
        self
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// Whether the store answers a `PING` within the timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("PING");
        self.call(async {
            match &self.connection {
                Connection::Single(c) => cmd.query_async::<()>(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async::<()>(&mut c.clone()).await,
            }
        })
        .await
    }

    /// Forgets `identity` under the policy `name` (granting it a fresh
    /// allowance); whether it was stored.
    pub async fn reset(&self, name: &str, identity: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key(name, identity));
        let deleted: i64 = self
            .call(async {
                match &self.connection {
                    Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
                    Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
                }
            })
            .await?;
        Ok(deleted > 0)
    }

    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(StoreError::Redis)
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
        let checks: Vec<Check<'_>> = checks
            .iter()
            .map(|&(name, policy, identity)| Check {
                name,
                policy,
                identity,
                on_loss: OnLoss::Full,
                cost: None,
            })
            .collect();
        let mode = Mode::Charge {
            max_delay: Nanos::MAX,
        };
        self.decide(&checks, cost, at, mode).await
    }

    /// Decides `checks` as one request: all-or-nothing, at the Redis clock
    /// or at `at`. On a cluster every check must have the same identity
    /// (one hash slot); a request across identities is refused as invalid.
    pub async fn decide(
        &self,
        checks: &[Check<'_>],
        cost: u64,
        at: Option<Nanos>,
        mode: Mode,
    ) -> Result<Checked, StoreError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(cost);
        match at {
            None => invocation.arg("redis"),
            Some(t) => invocation.arg(format!("{} {}", t / NANOS_PER_SEC, t % NANOS_PER_SEC)),
        };
        match mode {
            // Every delay is below 2^53 ns; a larger bound is the same.
            Mode::Charge { max_delay } => invocation.arg(max_delay.min(1 << 53)),
            Mode::Peek => invocation.arg("peek"),
        };
        invocation.arg(if self.marker { "m" } else { "-" });
        for check in checks {
            let own = check.cost.unwrap_or(cost);
            check
                .policy
                .validate_cost(own.max(1))
                .map_err(|e: CostError| {
                    StoreError::Invalid(format!("policy `{}`: {e}", check.name))
                })?;
            if check.identity.len() > MAX_IDENTITY {
                return Err(StoreError::Invalid(format!(
                    "identity longer than {MAX_IDENTITY} bytes"
                )));
            }
            if matches!(self.connection, Connection::Cluster(_))
                && check.identity != checks[0].identity
            {
                return Err(StoreError::Invalid(
                    "on a Redis Cluster, the checks of one request share one identity".into(),
                ));
            }
            invocation.key(key(check.name, check.identity));
            let mut spec = spec(check.policy);
            if check.on_loss == OnLoss::Empty {
                spec.push_str(" e");
            }
            if let Some(own) = check.cost {
                let _ = write!(spec, " c={own}");
            }
            invocation.arg(spec);
        }
        if self.marker {
            invocation.key(MARKER);
        }
        // One round trip; the multiplexed connection pipelines concurrent
        // calls, and `invoke_async` loads the script again on NOSCRIPT.
        let reply = self
            .call(async {
                match &self.connection {
                    Connection::Single(c) => {
                        invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await
                    }
                    Connection::Cluster(c) => {
                        invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await
                    }
                }
            })
            .await?;
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
    if reply.len() != 2 + 5 * count {
        return Err(StoreError::Reply);
    }
    let n = |x: i64| u64::try_from(x).map_err(|_| StoreError::Reply);
    let decisions = reply[2..]
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
        state_lost: reply[1] == 1,
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
