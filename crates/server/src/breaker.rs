//! The circuit breaker in front of a shared Redis store.
//!
//! Guarantees (docs/RELIABILITY.md): no request waits on the store longer
//! than `[store] timeout`; after [`OPEN_AFTER`] failures in a row the breaker
//! opens and requests stop waiting at all; a background probe closes it
//! within [`PROBE_EVERY`] of Redis answering again. While it is closed, a
//! single node's connections are pinged every [`PROBE_EVERY`] too, so that
//! a connection Redis closed while weir was idle is made again before a
//! check needs it (and a Redis gone while idle opens the breaker by itself).
//!
//! On a Redis Cluster each master has a breaker of its own: the masters
//! and their slots are read every [`TOPOLOGY_EVERY`], a check goes to the
//! breaker of the master serving its identity's slot, and one master down
//! puts only its own slots on the fallback. When slots move (a failover, a
//! master added or removed) they take the state of their new master, and
//! the connection is made again so that it routes by the new slots at once.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use metrics::Gauge;
use weir_redis::RedisStore;

use crate::config::StoreConfig;

/// Consecutive store failures that open the breaker.
pub const OPEN_AFTER: u32 = 3;
/// How often an open breaker (or a store never reached) is probed, and a
/// closed one's connections pinged.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// How often a cluster's masters and slots are read again.
pub const TOPOLOGY_EVERY: Duration = Duration::from_millis(500);

/// Opens after [`OPEN_AFTER`] failures in a row; closed again by a probe.
/// Its gauge says 1 while closed.
#[derive(Debug)]
struct Breaker {
    failures: AtomicU32,
    up: AtomicBool,
    gauge: Gauge,
}

impl Breaker {
    fn new(gauge: Gauge, up: bool) -> Self {
        gauge.set(if up { 1.0 } else { 0.0 });
        Self {
            failures: AtomicU32::new(0),
            up: AtomicBool::new(up),
            gauge,
        }
    }

    fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Opens or closes it; whether that changed anything.
    fn set_up(&self, up: bool) -> bool {
        if up {
            self.failures.store(0, Ordering::Release);
        }
        let changed = self.up.swap(up, Ordering::AcqRel) != up;
        if changed {
            self.gauge.set(if up { 1.0 } else { 0.0 });
        }
        changed
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// One failure more; whether it opened the breaker.
    fn failed(&self) -> bool {
        self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= OPEN_AFTER && self.set_up(false)
    }
}

/// One master of a cluster, behind its own breaker.
#[derive(Debug)]
pub struct Node {
    /// `host:port`.
    pub addr: String,
    breaker: Breaker,
}

impl Node {
    fn new(addr: &str) -> Self {
        let gauge = metrics::gauge!(crate::metrics::STORE_NODE_UP, "node" => addr.to_owned());
        Self {
            addr: addr.to_owned(),
            breaker: Breaker::new(gauge, true),
        }
    }

    /// Whether checks of this master's slots go to Redis.
    pub fn is_up(&self) -> bool {
        self.breaker.is_up()
    }

    fn logged(&self, up: bool) {
        match up {
            true => {
                tracing::info!(node = %self.addr, "cluster node up: its slots go to Redis again")
            }
            false => {
                tracing::warn!(node = %self.addr, "cluster node down: its slots decide by on_store_error")
            }
        }
    }
}

/// The masters of a cluster and which one serves each slot.
#[derive(Debug)]
struct Topology {
    /// Per slot, the index of its master in `nodes` (`u16::MAX`: none).
    owner: Vec<u16>,
    nodes: Vec<Arc<Node>>,
}

/// A shared Redis store behind a circuit breaker.
#[derive(Debug)]
pub struct Remote {
    url: String,
    /// TLS and credentials beside the URL.
    access: weir_redis::Access,
    /// The URL as logs show it (no password).
    shown: String,
    timeout: Duration,
    max_key_len: usize,
    store: ArcSwapOption<RedisStore>,
    /// The store's breaker (on a cluster: whether it is connected).
    breaker: Breaker,
    /// Whether the store has been up before (the log says "again" after).
    was_up: AtomicBool,
    /// A cluster's masters, once read.
    topology: ArcSwapOption<Topology>,
    /// `[store] replica_acks`.
    pub(crate) replica_acks: u32,
    /// `[store] refusal_cache`.
    refusal_cache: bool,
}

impl Remote {
    /// A store for `url` (keys up to `max_key_len` bytes), connected (and
    /// probed when down) by a background task that ends with the last
    /// reference.
    pub fn new(url: &str, config: &StoreConfig, max_key_len: usize) -> Arc<Self> {
        let remote = Arc::new(Self {
            url: url.to_owned(),
            access: config.access.clone(),
            shown: weir_redis::redacted(url),
            timeout: config.timeout,
            max_key_len,
            store: ArcSwapOption::empty(),
            breaker: Breaker::new(metrics::gauge!(crate::metrics::STORE_UP), false),
            was_up: AtomicBool::new(false),
            topology: ArcSwapOption::empty(),
            replica_acks: config.replica_acks,
            refusal_cache: config.refusal_cache,
        });
        if config.access.tls_insecure_skip_verify {
            tracing::warn!(
                url = %remote.shown,
                "[store] tls_insecure_skip_verify: the Redis server's certificate is not verified, so anyone on the path can read and change weir's state"
            );
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(supervise(Arc::downgrade(&remote)));
        }
        remote
    }

    /// Whether this store serves `url` with `timeout` and `replica_acks`
    /// (kept across reloads).
    pub(crate) fn serves(&self, url: &str, config: &StoreConfig) -> bool {
        self.url == url
            && self.access == config.access
            && self.timeout == config.timeout
            && self.replica_acks == config.replica_acks
            && self.refusal_cache == config.refusal_cache
    }

    /// On a cluster whose masters are known, the master serving the keys
    /// of `identity`.
    pub(crate) fn node_for(&self, identity: &str) -> Option<Arc<Node>> {
        let topology = self.topology.load();
        let topology = topology.as_ref()?;
        let owner = *topology
            .owner
            .get(usize::from(weir_redis::cluster::slot(identity)))?;
        topology.nodes.get(usize::from(owner)).cloned()
    }

    /// A cluster's masters: address, up, and how many slots each serves.
    pub fn nodes(&self) -> Vec<(String, bool, usize)> {
        let topology = self.topology.load();
        let Some(topology) = topology.as_ref() else {
            return Vec::new();
        };
        topology
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let slots = topology
                    .owner
                    .iter()
                    .filter(|&&o| usize::from(o) == i)
                    .count();
                (node.addr.clone(), node.is_up(), slots)
            })
            .collect()
    }

    /// Whether requests go to Redis (the breaker is closed).
    pub fn is_up(&self) -> bool {
        self.breaker.is_up()
    }

    /// Through Sentinel: the master in use (`host:port`).
    pub fn master(&self) -> Option<String> {
        let store = self.store.load();
        store.as_ref().and_then(|s| s.master().map(str::to_owned))
    }

    /// Through Sentinel: whether the sentinels now name another master than
    /// the one in use — after a failover — in which case the store is
    /// dropped and the breaker opened, so that the next probe connects to
    /// the new one.
    async fn follow_master(&self) {
        let Some(store) = self.store.load_full() else {
            return;
        };
        let Some(used) = store.master() else {
            return;
        };
        let Ok(Some(named)) = RedisStore::master_now(&self.url, &self.access).await else {
            return;
        };
        if named != used {
            tracing::warn!(url = %self.shown, from = %used, to = %named, "the sentinels name a new master: connecting to it");
            metrics::gauge!(crate::metrics::STORE_NODE_UP, "node" => used.to_owned()).set(0.0);
            self.store.store(None);
            if self.breaker.set_up(false) {
                self.logged(false);
            }
        }
    }

    /// Waits until connected or `within` has passed; whether it is up.
    pub async fn wait_up(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_up() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.is_up()
    }

    /// The longest key it takes.
    pub(crate) fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// The connected store while the breaker is closed.
    pub(crate) fn available(&self) -> Option<Arc<RedisStore>> {
        self.store.load_full().filter(|_| self.is_up())
    }

    fn logged(&self, up: bool) {
        if up && self.was_up.swap(true, Ordering::AcqRel) {
            tracing::info!(url = %self.shown, "store up: decisions go to Redis again");
        } else if up {
            tracing::info!(url = %self.shown, "store connected: decisions go to Redis");
        } else {
            tracing::warn!(url = %self.shown, "store down: circuit open, policies decide by on_store_error");
        }
    }

    /// A store call went well (on `node`, on a cluster).
    pub(crate) fn succeeded(&self, node: Option<&Node>) {
        node.map_or(&self.breaker, |n| &n.breaker).succeeded();
    }

    /// A store call failed (on `node`, on a cluster: only its breaker).
    pub(crate) fn failed(&self, node: Option<&Node>) {
        match node {
            Some(node) if node.breaker.failed() => node.logged(false),
            None if self.breaker.failed() => self.logged(false),
            _ => {}
        }
    }

    /// The addresses to ask for the topology: the known masters, then the
    /// URL's.
    fn seeds(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self
            .topology
            .load()
            .as_ref()
            .map(|t| t.nodes.iter().map(|n| n.addr.clone()).collect())
            .unwrap_or_default();
        for seed in self
            .url
            .strip_prefix("redis-cluster://")
            .into_iter()
            .flat_map(|n| n.split(','))
        {
            if !addrs.iter().any(|a| a == seed) {
                addrs.push(seed.to_owned());
            }
        }
        addrs
    }

    /// Reads the masters again; whether any slot changed master.
    async fn refresh(&self) -> bool {
        let seeds = self.seeds();
        let asked = weir_redis::cluster::masters(
            &seeds,
            self.timeout.max(Duration::from_millis(200)),
            &self.access,
        );
        let Ok(masters) = asked.await else {
            return false;
        };
        let old = self.topology.load_full();
        let mut owner = vec![u16::MAX; usize::from(weir_redis::cluster::SLOTS)];
        let mut nodes = Vec::new();
        for (i, master) in masters.iter().enumerate() {
            // A master keeps its breaker; a new one starts up.
            let node = old
                .as_ref()
                .and_then(|t| t.nodes.iter().find(|n| n.addr == master.addr).cloned())
                .unwrap_or_else(|| Arc::new(Node::new(&master.addr)));
            nodes.push(node);
            for &(start, end) in &master.slots {
                for slot in start..=end.min(weir_redis::cluster::SLOTS - 1) {
                    owner[usize::from(slot)] = u16::try_from(i).unwrap_or(u16::MAX);
                }
            }
        }
        let moved = old.as_ref().is_some_and(|t| {
            t.owner.iter().zip(&owner).any(|(a, b)| {
                t.nodes.get(usize::from(*a)).map(|n| &n.addr)
                    != nodes.get(usize::from(*b)).map(|n| &n.addr)
            })
        });
        for gone in old.iter().flat_map(|t| &t.nodes) {
            if !nodes.iter().any(|n| n.addr == gone.addr) {
                gone.breaker.gauge.set(0.0);
            }
        }
        self.topology
            .store(Some(Arc::new(Topology { owner, nodes })));
        moved
    }
}

/// Connects, then probes whenever the breaker is open.
async fn supervise(remote: Weak<Remote>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = String::new();
    let mut tended = 0u64;
    loop {
        tick.tick().await;
        let Some(remote) = remote.upgrade() else {
            return;
        };
        tended += 1;
        // Through Sentinel: where the master is, asked at every probe while
        // the store is down, every half second while it is up.
        if !remote.is_up() || tended % 5 == 0 {
            remote.follow_master().await;
        }
        if remote.is_up() {
            let Some(store) = remote.store.load_full() else {
                continue;
            };
            if store.is_cluster() {
                tend(&remote, &store, tended).await;
            } else if store.ping().await.is_err() {
                // A connection that Redis closed (a restart, a failover)
                // fails its next call: the ping made that call, not a check.
                remote.failed(None);
            }
            continue;
        }
        let store = match remote.store.load_full() {
            Some(store) => store,
            None => {
                let connect = RedisStore::connect_with(&remote.url, &remote.access);
                match tokio::time::timeout(Duration::from_secs(1), connect).await {
                    Ok(Ok(store)) => {
                        let store = store
                            .with_timeout(remote.timeout)
                            .with_marker(true)
                            .with_refusal_cache(remote.refusal_cache)
                            .with_max_key_len(remote.max_key_len);
                        match store.init_marker().await {
                            Ok(weir_redis::MarkerInit::New) => {
                                tracing::info!(url = %remote.shown, "a new store: generation marker set");
                            }
                            Ok(weir_redis::MarkerInit::Missing) => {
                                tracing::warn!(url = %remote.shown, "the store has keys but no generation marker: it lost state; on_state_loss applies");
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::debug!(error = %e, "generation marker not checked");
                                continue;
                            }
                        }
                        if let Some(master) = store.master() {
                            // Through Sentinel: the master in use is the node up.
                            let node = master.to_owned();
                            metrics::gauge!(crate::metrics::STORE_NODE_UP, "node" => node).set(1.0);
                        }
                        let store = Arc::new(store);
                        remote.store.store(Some(store.clone()));
                        store
                    }
                    Ok(Err(e)) => {
                        // Said once per new reason, not every probe.
                        let error = e.to_string();
                        if error != last_error {
                            tracing::warn!(url = %remote.shown, %error, "cannot connect to the store; policies decide by on_store_error");
                            last_error = error;
                        }
                        continue;
                    }
                    Err(_) => continue,
                }
            }
        };
        if store.ping().await.is_ok() {
            if store.is_cluster() {
                remote.refresh().await;
            }
            if remote.breaker.set_up(true) {
                remote.logged(true);
            }
        }
    }
}

/// A connected cluster, every [`PROBE_EVERY`]: its down masters probed; and
/// every [`TOPOLOGY_EVERY`], its masters read again — connecting anew when
/// slots moved.
async fn tend(remote: &Remote, store: &RedisStore, tick: u64) {
    let nodes = remote.topology.load_full();
    for node in nodes.iter().flat_map(|t| &t.nodes).filter(|n| !n.is_up()) {
        let timeout = remote.timeout.max(Duration::from_millis(100));
        if weir_redis::cluster::ping(&node.addr, timeout, &remote.access).await
            && node.breaker.set_up(true)
        {
            node.logged(true);
        }
    }
    let every = (TOPOLOGY_EVERY.as_millis() / PROBE_EVERY.as_millis()).max(1) as u64;
    if tick % every != 0 || !remote.refresh().await {
        return;
    }
    tracing::info!(url = %remote.shown, "cluster slots moved: connecting anew");
    let connect = RedisStore::connect_with(&remote.url, &remote.access);
    if let Ok(Ok(fresh)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
        let fresh = fresh
            .with_timeout(store.timeout())
            .with_refusal_cache(remote.refusal_cache)
            .with_max_key_len(remote.max_key_len);
        remote.store.store(Some(Arc::new(fresh)));
    }
}
