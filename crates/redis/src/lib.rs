//! weir's Redis store: several weir instances share one balance in Redis (a
//! single node or a Redis Cluster). Every check is **one** atomic Lua script
//! ([`SCRIPT`], `weir.lua` beside this file) that refills, checks and
//! conditionally debits every key of the request — all-or-nothing — using
//! the Redis server's clock (`TIME`), or an explicit time for replay and
//! tests. Its decisions are those of `weir-core`, to the nanosecond: a check
//! whose quantities stay below 2^51 is computed in doubles, any other in wide
//! integers, and absolute times are kept as (seconds, nanoseconds) pairs.
//!
//! Keys are versioned and escaped, `rl:v1:{IDENTITY}:POLICY`, with the
//! identity as the hash tag so that one identity's policies share a slot on a
//! cluster (and one script can check them together). Every key expires when
//! its `reset` is reached (Redis-clock mode), so idle state disappears exactly
//! when deleting it grants nothing. Works on a plain managed Redis (no modules).

use std::fmt::Write as _;

mod access;
mod batch;
pub mod cluster;
pub mod limits;
mod refusals;
mod sentinel;

pub use access::{Access, redacted};
pub use refusals::CHANNEL as RESETS_CHANNEL;

use redis::Script;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use thiserror::Error;
use weir_core::{AllDecision, CheckError, Decision, NANOS_PER_SEC, Nanos, Policy};

/// The store boundary's vocabulary, `weir-core`'s: every store speaks it.
pub use weir_core::store::{Check, Checked, LeaseOp, Mode, OnLoss};

/// The script: see its header for the KEYS/ARGV contract.
pub const SCRIPT: &str = include_str!("weir.lua");

/// How long one sentinel may take to name the master before the next is
/// asked.
const SENTINEL_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

/// The longest key accepted by default, in bytes (before escaping): the
/// same bound as the in-process limiter's.
pub const DEFAULT_MAX_KEY_LEN: usize = weir_core::MAX_IDENTITY;

/// Why a check could not be decided by Redis.
#[derive(Debug, Clone, Error)]
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
    /// No sentinel named a master of that name.
    #[error("no sentinel answered with the address of master `{0}`")]
    NoMaster(String),
    /// A sentinel could not be asked where the master is.
    #[error(
        "sentinel {sentinel} did not name the master: {error} (the sentinels' credentials: [store] sentinel_username and sentinel_password_file, an empty file for none; without them, the master's are tried, then none)"
    )]
    Sentinel {
        /// The sentinel's `host:port`.
        sentinel: String,
        /// What went wrong.
        error: String,
    },
    /// Redis refused the credentials given.
    #[error(
        "Redis refused the credentials of user `{user}`: check [store] username and password_file (or WEIR_REDIS_PASSWORD, or the URL's)"
    )]
    Credentials {
        /// The user the credentials were for.
        user: String,
    },
    /// The request can never be decided (cost, key, a pair named twice),
    /// exactly as the in-process limiter refuses it.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// The store cannot decide this request as one atomic call (on a
    /// cluster, checks of several identities live on several nodes).
    #[error("{0}")]
    Unsupported(&'static str),
    /// Fewer replicas than asked acknowledged an admission in time
    /// (`replica_acks`): it may not survive a failover.
    #[error("{acked} of {wanted} replicas acknowledged the write in time")]
    Replication {
        /// Replicas that did.
        acked: u64,
        /// Replicas asked for.
        wanted: u32,
    },
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Redis(_) | Self::Timeout(_) | Self::Replication { .. }
        )
    }
}

/// What the script answered, with what the refusal cache needs: per check,
/// how far its key's latest time moved its time forward (docs/SPEC.md's
/// clamp), and for a check refused at a cost above 1 the wait until a
/// check of cost 1 would fit (else 0).
#[derive(Debug)]
pub(crate) struct Reply {
    checked: Checked,
    late: Vec<Nanos>,
    unit_waits: Vec<Nanos>,
}

/// What [`RedisStore::init_marker`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerInit {
    /// No marker kept (a cluster, or not asked for).
    Off,
    /// A new, empty store: the marker was set.
    New,
    /// The marker was there: the store kept its state.
    Present,
    /// Keys but no marker: state was lost (the first check reports it).
    Missing,
}

/// The generation marker's key (single node only: see [`RedisStore::with_marker`]).
pub const MARKER: &str = "rl:v1:generation";

/// A single node's requests queue per thread, each thread with a
/// connection of its own; a cluster's queue in one place (its connection
/// routes each slot's calls to its master).
#[derive(Debug, Clone)]
enum Sender {
    PerThread(Box<batch::PerThread>),
    Shared(batch::Batcher),
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
    /// Where requests queue for a script call (see `batch`).
    sender: Sender,
    /// Refusals still in force (`None`: every check goes to Redis).
    refusals: Option<std::sync::Arc<refusals::Refusals>>,
    timeout: std::time::Duration,
    marker: bool,
    max_key_len: usize,
    /// Through Sentinel: the master connected to (`host:port`).
    master: Option<String>,
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
/// accepts; what is wrong otherwise (the URL shown [`redacted`]).
pub fn check_url(url: &str) -> Result<(), String> {
    access::nodes(url).map(drop).map_err(|e| {
        // What is wrong, as a URL parser says it of the first node that
        // does not parse (redis's own error is a kind,
        // `InvalidClientConfig`), and the form to write.
        let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
        let nodes = rest.split('/').next().unwrap_or(rest);
        let why = nodes
            .split(',')
            .find_map(|node| url::Url::parse(&format!("{scheme}://{node}")).err())
            .map_or_else(
                || e.to_string().trim_end_matches("- InvalidClientConfig").trim().to_owned(),
                |parsed| parsed.to_string(),
            );
        format!(
            "`{}`: {why} (valid: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss:// for TLS, redis-cluster://HOST:PORT,HOST:PORT, redis-sentinel://HOST:PORT,HOST:PORT/MASTER)",
            redacted(url)
        )
    })
}

impl RedisStore {
    /// Connects to `redis://host:port` (`rediss://` over TLS; `valkey://`
    /// and `valkeys://` alike) or `redis-cluster://host:port[,host:port…]`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &Access::default()).await
    }

    /// Connects as [`RedisStore::connect`] does, with TLS and credentials
    /// beside the URL.
    pub async fn connect_with(url: &str, access: &Access) -> Result<Self, StoreError> {
        let (kind, mut nodes) = access::nodes(url)?;
        // The user Redis refused: the access's, else the URL's, else Redis's default.
        let user = access
            .username
            .clone()
            .or_else(|| Some(nodes.first()?.redis_settings().username()?.to_owned()))
            .unwrap_or_else(|| "default".into());
        let denied = |e: redis::RedisError| match e.kind() {
            redis::ErrorKind::AuthenticationFailed => {
                StoreError::Credentials { user: user.clone() }
            }
            _ => StoreError::Redis(e),
        };
        let mut master = None;
        if let access::Kind::Sentinel(name) = &kind {
            let found = sentinel::master(&nodes, name, access, SENTINEL_TIMEOUT).await?;
            master = Some(sentinel::address(&found));
            nodes = vec![found];
        }
        let (connection, per_thread) = match kind {
            access::Kind::Cluster => {
                let client = access.cluster(&nodes)?;
                let connection = client.get_async_connection().await.map_err(denied)?;
                (Connection::Cluster(connection), None)
            }
            access::Kind::Single | access::Kind::Sentinel(_) => {
                // Reconnect quickly after a restart: short, capped backoff.
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_min_delay(std::time::Duration::from_millis(25))
                    .set_max_delay(std::time::Duration::from_millis(200))
                    .set_number_of_retries(3)
                    .set_connection_timeout(Some(std::time::Duration::from_millis(500)));
                let client = access.client(&nodes[0])?;
                let manager = client
                    .get_connection_manager_with_config(config.clone())
                    .await
                    .map_err(denied)?;
                let per_thread = batch::PerThread {
                    client,
                    config,
                    alive: std::sync::Arc::new(()),
                    opened: std::sync::Arc::default(),
                };
                (Connection::Single(manager), Some(per_thread))
            }
        };
        let nodes = nodes
            .iter()
            .map(|n| access.client(n))
            .collect::<Result<_, _>>()?;
        let refusals = std::sync::Arc::new(refusals::Refusals::default());
        tokio::spawn(refusals::listen(
            std::sync::Arc::downgrade(&refusals),
            nodes,
        ));
        let timeout = DEFAULT_TIMEOUT;
        Ok(Self {
            sender: match per_thread {
                Some(per_thread) => Sender::PerThread(Box::new(per_thread)),
                None => Sender::Shared(batch::Batcher::start(
                    connection.clone(),
                    Script::new(SCRIPT),
                )),
            },
            refusals: Some(refusals),
            connection,
            timeout,
            marker: false,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            master,
        })
    }

    /// Through Sentinel (`redis-sentinel://`): the master this store is
    /// connected to, `host:port`.
    pub fn master(&self) -> Option<&str> {
        self.master.as_deref()
    }

    /// Through Sentinel: the master the sentinels name now (`None` for a
    /// URL of another kind) — when it is not [`RedisStore::master`], a
    /// failover happened, and a store connected anew follows it.
    pub async fn master_now(url: &str, access: &Access) -> Result<Option<String>, StoreError> {
        let (access::Kind::Sentinel(name), sentinels) = access::nodes(url)? else {
            return Ok(None);
        };
        let found = sentinel::master(&sentinels, &name, access, SENTINEL_TIMEOUT).await?;
        Ok(Some(sentinel::address(&found)))
    }

    /// Keeps a generation marker ([`MARKER`]) so that a loss of the store's
    /// state is detected rather than guessed, and [`OnLoss::Empty`] applies.
    /// A single node only: on a cluster a marker would live on one node and
    /// say nothing of the others (`false` is kept there).
    pub fn with_marker(mut self, on: bool) -> Self {
        self.marker = on && matches!(self.connection, Connection::Single(_));
        self
    }

    /// Answers checks that Redis has promised to refuse without asking it
    /// again (on by default; see the `refusals` module docs in the source:
    /// a refused check of cost 1 is refused until its `retry_after` has
    /// passed, and every instance forgets a key an admin resets).
    pub fn with_refusal_cache(mut self, on: bool) -> Self {
        if !on {
            self.refusals = None;
        }
        self
    }

    /// Refusals the cache holds now.
    pub fn cached_refusals(&self) -> usize {
        self.refusals.as_ref().map_or(0, |r| r.len())
    }

    /// The longest key accepted, in bytes (default [`DEFAULT_MAX_KEY_LEN`]).
    pub fn with_max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// Whether the store answers a `PING` within the timeout on every
    /// connection it checks on (a single node's threads each have one: a
    /// connection that failed while Redis was away fails its next call, and
    /// reconnects then, so the probe makes that call rather than a check).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query::<()>(&redis::cmd("PING")).await?;
        let Sender::PerThread(threads) = &self.sender else {
            return Ok(());
        };
        let pings = threads.connections().into_iter().map(|mut c| async move {
            self.call(redis::cmd("PING").query_async::<()>(&mut c))
                .await
        });
        futures_util::future::try_join_all(pings).await.map(drop)
    }

    /// Forgets `identity` under the policy `name` (granting it a fresh
    /// allowance); whether it was stored.
    /// Every instance's refusal cache forgets the key (Redis pub/sub).
    pub async fn reset(&self, name: &str, identity: &str) -> Result<bool, StoreError> {
        let key = key(name, identity);
        if let Some(refusals) = &self.refusals {
            refusals.forget(&key);
        }
        let deleted: i64 = self.query(redis::cmd("DEL").arg(&key)).await?;
        let _: i64 = self
            .query(redis::cmd("PUBLISH").arg(refusals::CHANNEL).arg(&key))
            .await?;
        Ok(deleted > 0)
    }

    /// Lifts the ban of `identity` under the policy `name` (its allowance
    /// left as it is); whether it had one. Every instance's refusal cache
    /// forgets the key.
    pub async fn lift_ban(&self, name: &str, identity: &str) -> Result<bool, StoreError> {
        const LIFT: &str = "local v = redis.call('GET', KEYS[1]) \
            if not v or string.byte(v, 1) ~= 33 then return 0 end \
            local e = string.find(v, ';', 2, true) \
            redis.call('SET', KEYS[1], string.sub(v, e + 1), 'KEEPTTL') \
            return 1";
        let key = key(name, identity);
        if let Some(refusals) = &self.refusals {
            refusals.forget(&key);
        }
        let lifted: i64 = self
            .query(redis::cmd("EVAL").arg(LIFT).arg(1).arg(&key))
            .await?;
        let _: i64 = self
            .query(redis::cmd("PUBLISH").arg(refusals::CHANNEL).arg(&key))
            .await?;
        Ok(lifted == 1)
    }

    /// Tells a brand-new store from one that lost its state, once, when a
    /// process first connects: a store with no marker **and no key at all**
    /// is new, and gets a marker dated at the epoch (its keys lost nothing;
    /// `OnLoss::Empty` keys start full). A store with keys but no marker is
    /// left alone: the first check reports the loss. What cannot be told
    /// apart: a store that was emptied while no weir process was connected
    /// to it looks new. No-op without [`RedisStore::with_marker`].
    pub async fn init_marker(&self) -> Result<MarkerInit, StoreError> {
        if !self.marker {
            return Ok(MarkerInit::Off);
        }
        let script = redis::Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end \
             if redis.call('DBSIZE') > 0 then return -1 end \
             redis.call('SET', KEYS[1], '0 0') return 1",
        );
        let answer: i64 = self.invoke(&script.key(MARKER)).await?;
        Ok(match answer {
            1 => MarkerInit::New,
            0 => MarkerInit::Present,
            _ => MarkerInit::Missing,
        })
    }

    /// Whether `identity` has state under the policy `name`.
    pub async fn exists(&self, name: &str, identity: &str) -> Result<bool, StoreError> {
        let found: i64 = self
            .query(redis::cmd("EXISTS").arg(key(name, identity)))
            .await?;
        Ok(found > 0)
    }

    /// Waits until `replicas` replicas hold every write made so far on the
    /// connection to the master of `identity`'s keys (`WAIT`), for at most
    /// four fifths of the store's timeout; how many do.
    pub async fn wait_replicas(&self, identity: &str, replicas: u32) -> Result<u64, StoreError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let ms = u64::try_from(self.timeout.as_millis() * 4 / 5).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(ms.max(1));
        self.call(async {
            match &self.connection {
                Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
                Connection::Cluster(c) => {
                    let route = Route::new(cluster::slot(identity), SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    let value = c.clone().route_command(cmd, routing).await?;
                    redis::from_redis_value(value).map_err(Into::into)
                }
            }
        })
        .await
    }

    /// Whether this store is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    /// One command on the node or the cluster, within the timeout.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.call(async {
            match &self.connection {
                Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            }
        })
        .await
    }

    /// One script call (loaded again on `NOSCRIPT`), within the timeout.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.call(async {
            match &self.connection {
                Connection::Single(c) => invocation.invoke_async(&mut c.clone()).await,
                Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
            }
        })
        .await
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

    /// Checks `(policy name, policy, identity)` triples of one cost as one
    /// request, at the Redis clock or at `at`. On a cluster the identity's
    /// policies must be checked with one identity (one hash slot).
    pub async fn check_all(
        &self,
        checks: &[(&str, &Policy, &str)],
        cost: u64,
        at: Option<Nanos>,
    ) -> Result<Checked, StoreError> {
        let checks: Vec<Check<'_>> = checks
            .iter()
            .map(|&(name, policy, key)| {
                Check::from(weir_core::Check {
                    name,
                    policy,
                    key,
                    cost,
                })
            })
            .collect();
        let mode = Mode::Charge {
            max_delay: Nanos::MAX,
        };
        self.decide(&checks, at, mode).await
    }

    /// Decides `checks` as one request: all-or-nothing, at the Redis clock
    /// or at `at`, after the validation every store shares
    /// ([`weir_core::check::validate`]). On a cluster every check must have
    /// the same identity (one hash slot).
    pub async fn decide(
        &self,
        checks: &[Check<'_>],
        at: Option<Nanos>,
        mode: Mode,
    ) -> Result<Checked, StoreError> {
        self.validate(checks)?;
        let keys: Vec<String> = checks
            .iter()
            .map(|c| key(c.check.name, c.check.key))
            .collect();
        // A check of cost 1 that Redis has promised to refuse is refused
        // here (see `refusals`).
        let cached = self
            .refusals
            .as_deref()
            .filter(|_| refusals::cacheable(checks, mode));
        let clock = match at {
            Some(_) => refusals::Clock::Explicit,
            None => refusals::Clock::Local,
        };
        let (mut at, mut sent) = (at, 0);
        if let Some(refusals) = &self.refusals {
            let now = at.unwrap_or_else(|| refusals.local_now());
            let policy = checks[0].check.policy;
            let cost = checks[0].check.cost;
            if let Some(refusal) = cached.and_then(|c| c.answer(&keys[0], policy, cost, clock, now))
            {
                return Ok(refused(refusal));
            }
            sent = keys.iter().fold(now, |t, k| refusals.take(k, clock, t));
            at = at.map(|_| sent);
        }
        let cache_key = cached.map(|_| keys[0].clone());
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = batch::Request {
            head: header(checks.len(), mode, at),
            keys,
            specs: checks.iter().map(|c| spec(c, at)).collect(),
            slot: self
                .is_cluster()
                .then(|| cluster::slot(checks[0].check.key)),
            marker: self.marker,
            timeout: self.timeout,
            reply,
        };
        // Queued for the next script call on the connection (see `batch`).
        match &self.sender {
            Sender::PerThread(per_thread) => per_thread.submit(&self.connection, request),
            Sender::Shared(batcher) => batcher.submit(request),
        }
        .ok_or(StoreError::Reply)?;
        let Reply {
            mut checked,
            late,
            unit_waits,
        } = match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => return Err(StoreError::Reply),
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        // A look is allowed when every check would be (the script answers
        // "nothing charged"); a request refused for a new key decided
        // nothing — the same answers as every store's.
        if mode == Mode::Peek {
            checked.all.allowed = checked.all.decisions.iter().all(|d| d.allowed);
        }
        if checked.new_key_refused {
            checked.all.decisions.fill(Decision::default());
        }
        // An admission that was charged took its lease.
        if checked.all.allowed && mode != Mode::Peek {
            for (decision, check) in checked.all.decisions.iter_mut().zip(checks) {
                if let (true, LeaseOp::Take(id @ 1..)) = (decision.allowed, check.lease) {
                    decision.lease = (check.check.cost > 0).then_some(id);
                }
            }
        }
        if let (Some(cache), Some(key), [decision], [late], [unit_wait]) = (
            cached,
            cache_key,
            checked.all.decisions.as_slice(),
            late.as_slice(),
            unit_waits.as_slice(),
        ) {
            let decided = sent.saturating_add(*late);
            let check = &checks[0].check;
            let refused = refusals::Refused {
                cost: check.cost,
                decision,
                unit_wait: *unit_wait,
            };
            cache.record(&key, check.policy, clock, decided, &refused);
        }
        Ok(checked)
    }

    /// The validation every store shares, a report's cost bounded by the
    /// report's own bound (not the capacity); on a cluster, one identity.
    fn validate(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        weir_core::store::validate(checks, self.max_key_len)?;
        if self.is_cluster() && checks.iter().any(|c| c.check.key != checks[0].check.key) {
            return Err(StoreError::Unsupported(
                "on a Redis Cluster, the checks of one request share one identity",
            ));
        }
        Ok(())
    }

    /// Reports usage of `cost` for one policy and identity after the fact
    /// (docs/SPEC.md): always charged, possibly into debt.
    pub async fn report(
        &self,
        name: &str,
        policy: &Policy,
        identity: &str,
        cost: u64,
        at: Option<Nanos>,
    ) -> Result<Decision, StoreError> {
        let check = Check {
            report: true,
            ..Check::from(weir_core::Check {
                name,
                policy,
                key: identity,
                cost,
            })
        };
        let mode = Mode::Charge {
            max_delay: Nanos::MAX,
        };
        sole_decision(self.decide(&[check], at, mode).await?)
    }

    /// Releases (or with `renew`, renews) the lease `lease` of `identity`
    /// under a concurrency policy: allowed is whether it was live, with the
    /// standing after it (docs/SPEC.md).
    pub async fn on_lease(
        &self,
        name: &str,
        policy: &Policy,
        identity: &str,
        op: LeaseOp,
        at: Option<Nanos>,
    ) -> Result<Decision, StoreError> {
        if !matches!(policy, Policy::Concurrency(_)) || matches!(op, LeaseOp::Take(_)) {
            return Err(StoreError::Invalid(weir_core::CheckError::Cost {
                policy: name.to_owned(),
                error: weir_core::CostError::NoLeases,
            }));
        }
        let check = Check {
            lease: op,
            ..Check::from(weir_core::Check {
                name,
                policy,
                key: identity,
                cost: 0,
            })
        };
        let mode = Mode::Charge {
            max_delay: Nanos::MAX,
        };
        sole_decision(self.decide(&[check], at, mode).await?)
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
        sole_decision(
            self.check_all(&[(name, policy, identity)], cost, at)
                .await?,
        )
    }
}

/// A request's header for the script: `N MODE TIME` (see `weir.lua`).
fn header(checks: usize, mode: Mode, at: Option<Nanos>) -> String {
    let mode = match mode {
        // No wait is longer than MAX_WAIT: a larger bound is the same.
        Mode::Charge { max_delay } => max_delay.min(weir_core::policy::MAX_WAIT).to_string(),
        Mode::Peek => "peek".to_owned(),
    };
    match at {
        None => format!("{checks} {mode} r"),
        Some(t) => format!(
            "{checks} {mode} {} {}",
            t / NANOS_PER_SEC,
            t % NANOS_PER_SEC
        ),
    }
}

/// The policy as the script reads it (`weir.lua`: `tb CAPACITY TOKENS
/// PERIOD`, `lb QUEUE TOKENS PERIOD`, `fw|sc|sl LIMIT WINDOW`, `cc LIMIT
/// LEASE`). GCRA is the token bucket.
fn policy_spec(policy: &Policy) -> String {
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
        Policy::FixedWindow(w) if w.calendar().is_some() => format!("fw {} 0", w.limit()),
        Policy::FixedWindow(w) => format!("fw {} {}", w.limit(), w.window()),
        Policy::SlidingCounter(c) => format!("sc {} {}", c.limit(), c.window()),
        Policy::SlidingLog(l) => format!("sl {} {}", l.limit(), l.window()),
        Policy::Concurrency(c) => format!("cc {} {}", c.limit(), c.lease()),
    }
}

/// A calendar's name and the boundaries of the windows before, holding and
/// after `now` (the script has no time-zone database: it picks, among
/// these, the window holding the check's time on its clock).
fn calendar_spec(calendar: &weir_core::algo::Calendar, now: Nanos) -> String {
    let (start, end) = calendar.window(now);
    let before = calendar.window(start.saturating_sub(1)).0;
    let after = calendar.window(end).1;
    let mut text = format!(
        " z={}-{}-{}",
        calendar.period().name(),
        calendar.anchor(),
        calendar.zone().name()
    );
    for t in [before, start, end, after] {
        let _ = write!(text, ",{},{}", t / NANOS_PER_SEC, t % NANOS_PER_SEC);
    }
    text
}

/// A check's argument for the script: its policy, then its flags and cost
/// (see `weir.lua`); `at`, the explicit time of the call (none: now, on
/// this machine's clock, for a calendar's windows).
fn spec(c: &Check<'_>, at: Option<Nanos>) -> String {
    let mut spec = policy_spec(c.check.policy);
    if let Policy::FixedWindow(w) = c.check.policy
        && let Some(calendar) = w.calendar()
    {
        let now = at.unwrap_or_else(|| {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            since.map_or(0, |d| Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX))
        });
        spec.push_str(&calendar_spec(calendar, now));
    }
    if c.on_loss == OnLoss::Empty {
        spec.push_str(" e");
    }
    if c.shadow {
        spec.push_str(" s");
    }
    if c.report {
        // The largest report is also the ceiling on debt.
        let _ = write!(spec, " r={}", c.check.policy.max_report());
    }
    if c.no_new_key {
        spec.push_str(" n");
    }
    if c.probe {
        spec.push_str(" p");
    }
    if let Some(p) = c.penalty {
        let _ = write!(
            spec,
            " b={},{},{},{}",
            p.ban(),
            p.factor(),
            p.max(),
            p.memory()
        );
    }
    let _ = write!(spec, " c={}", c.check.cost);
    // Last: the script parses a policy once per call, whatever the lease.
    if let Policy::Concurrency(_) = c.check.policy {
        let _ = match c.lease {
            LeaseOp::Take(id) => write!(spec, " i={id}"),
            LeaseOp::Release(id) => write!(spec, " x={id}"),
            LeaseOp::Renew(id) => write!(spec, " w={id}"),
        };
    }
    spec
}

/// A request of one check refused by the refusal cache.
fn refused(decision: Decision) -> Checked {
    Checked {
        all: AllDecision {
            allowed: false,
            decisions: vec![decision],
        },
        ..Checked::default()
    }
}

/// The script's reply per check: allowed, remaining, retry_after, reset,
/// delay, late, created, a refusal's wait for cost 1, the ban's wait, and whether it began (after the
/// request's all_allowed and state_lost).
pub(crate) const PER_CHECK: usize = 10;

fn parse(reply: &[i64], count: usize) -> Result<Reply, StoreError> {
    if reply.len() != 2 + PER_CHECK * count {
        return Err(StoreError::Reply);
    }
    let n = |x: i64| u64::try_from(x).map_err(|_| StoreError::Reply);
    let mut decisions = Vec::with_capacity(count);
    let mut late = Vec::with_capacity(count);
    let mut unit_waits = Vec::with_capacity(count);
    let (mut created, mut new_key_refused) = (0, false);
    for d in reply[2..].chunks(PER_CHECK) {
        created += usize::from(d[6] == 1);
        new_key_refused |= d[6] == 2;
        decisions.push(Decision {
            allowed: d[0] == 1,
            remaining: n(d[1])?,
            retry_after: n(d[2])?,
            reset: n(d[3])?,
            delay: n(d[4])?,
            lease: None,
            banned: n(d[8])?,
            new_ban: d[9] == 1,
        });
        late.push(n(d[5])?);
        unit_waits.push(n(d[7])?);
    }
    Ok(Reply {
        checked: Checked {
            all: AllDecision {
                allowed: reply[0] == 1,
                decisions,
            },
            state_lost: reply[1] == 1,
            created,
            new_key_refused,
            degraded: false,
        },
        late,
        unit_waits,
    })
}

/// The one decision of a request of one check.
fn sole_decision(checked: Checked) -> Result<Decision, StoreError> {
    checked
        .all
        .decisions
        .into_iter()
        .next()
        .ok_or(StoreError::Reply)
}

impl From<StoreError> for weir_core::store::Error {
    fn from(e: StoreError) -> Self {
        let kind = match &e {
            StoreError::Invalid(e) => return Self::Invalid(e.clone()),
            StoreError::Unsupported(m) => return Self::Unsupported(m),
            StoreError::Timeout(_) => "timeout",
            StoreError::Reply => "reply",
            StoreError::Replication { .. } => "replication",
            _ => "redis",
        };
        Self::Unavailable {
            kind,
            reason: e.to_string(),
        }
    }
}

/// Redis as a store: every call one script call, at the Redis clock.
impl weir_core::store::Store for RedisStore {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        mode: Mode,
    ) -> Result<Checked, weir_core::store::Error> {
        Ok(RedisStore::decide(self, checks, None, mode).await?)
    }

    async fn exists(&self, name: &str, key: &str) -> Result<bool, weir_core::store::Error> {
        Ok(RedisStore::exists(self, name, key).await?)
    }

    async fn reset(&self, name: &str, key: &str) -> Result<bool, weir_core::store::Error> {
        Ok(RedisStore::reset(self, name, key).await?)
    }

    async fn lift_ban(&self, name: &str, key: &str) -> Result<bool, weir_core::store::Error> {
        Ok(RedisStore::lift_ban(self, name, key).await?)
    }
}

/// The deadline of a store call unless [`RedisStore::with_timeout`] sets
/// another (`[store] timeout`): past it, a check fails as a timeout and its
/// policy's `on_store_error` decides.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

/// `rl:v1:{IDENTITY}:POLICY`, both escaped: every byte outside
/// `[A-Za-z0-9._-]` becomes `%XX`, so no two (policy, identity) pairs share
/// a key whatever they hold, and `{`/`}` can never end the hash tag early.
pub fn key(policy: &str, identity: &str) -> String {
    let mut key = String::with_capacity(identity.len() + policy.len() + 9);
    key.push_str("rl:v1:{");
    weir_core::check::escape(&mut key, identity);
    key.push_str("}:");
    weir_core::check::escape(&mut key, policy);
    key
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
