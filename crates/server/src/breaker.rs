//! The circuit breaker in front of a shared Redis store.
//!
//! Guarantees (docs/RELIABILITY.md): no request waits on the store longer
//! than `[store] timeout`; after [`OPEN_AFTER`] failures in a row the breaker
//! opens and requests stop waiting at all; a background probe closes it
//! within [`PROBE_EVERY`] of Redis answering again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use metrics::Gauge;
use weir_redis::RedisStore;

/// Consecutive store failures that open the breaker.
pub const OPEN_AFTER: u32 = 3;
/// How often an open breaker (or a store never reached) is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

/// A shared Redis store behind a circuit breaker.
#[derive(Debug)]
pub struct Remote {
    url: String,
    timeout: Duration,
    max_key_len: usize,
    store: ArcSwapOption<RedisStore>,
    failures: AtomicU32,
    up: AtomicBool,
    /// Whether the store has been up before (the log says "again" after).
    was_up: AtomicBool,
    gauge: Gauge,
}

impl Remote {
    /// A store for `url` (keys up to `max_key_len` bytes), connected (and
    /// probed when down) by a background task that ends with the last
    /// reference.
    pub fn new(url: &str, timeout: Duration, max_key_len: usize) -> Arc<Self> {
        let remote = Arc::new(Self {
            url: url.to_owned(),
            timeout,
            max_key_len,
            store: ArcSwapOption::empty(),
            failures: AtomicU32::new(0),
            up: AtomicBool::new(false),
            was_up: AtomicBool::new(false),
            gauge: metrics::gauge!("weir_store_up"),
        });
        remote.gauge.set(0.0);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(supervise(Arc::downgrade(&remote)));
        }
        remote
    }

    /// Whether this store serves `url` with `timeout` (kept across reloads).
    pub(crate) fn serves(&self, url: &str, timeout: Duration) -> bool {
        self.url == url && self.timeout == timeout
    }

    /// Whether requests go to Redis (the breaker is closed).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Waits until connected or `within` has passed; whether it is up.
    pub async fn wait_up(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_up() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.is_up()
    }

    /// The connected store while the breaker is closed.
    pub(crate) fn available(&self) -> Option<Arc<RedisStore>> {
        self.store.load_full().filter(|_| self.is_up())
    }

    fn set_up(&self, up: bool) {
        if self.up.swap(up, Ordering::AcqRel) != up {
            self.gauge.set(if up { 1.0 } else { 0.0 });
            if up && self.was_up.swap(true, Ordering::AcqRel) {
                tracing::info!(url = %self.url, "store up: decisions go to Redis again");
            } else if up {
                tracing::info!(url = %self.url, "store connected: decisions go to Redis");
            } else {
                tracing::warn!(url = %self.url, "store down: circuit open, policies decide by on_store_error");
            }
        }
    }

    pub(crate) fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    pub(crate) fn failed(&self) {
        if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= OPEN_AFTER {
            self.set_up(false);
        }
    }
}

/// Connects, then probes whenever the breaker is open.
async fn supervise(remote: Weak<Remote>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = String::new();
    loop {
        tick.tick().await;
        let Some(remote) = remote.upgrade() else {
            return;
        };
        if remote.is_up() {
            continue;
        }
        let store = match remote.store.load_full() {
            Some(store) => store,
            None => {
                let connect = RedisStore::connect(&remote.url);
                match tokio::time::timeout(Duration::from_secs(1), connect).await {
                    Ok(Ok(store)) => {
                        let store = store
                            .with_timeout(remote.timeout)
                            .with_marker(true)
                            .with_max_key_len(remote.max_key_len);
                        match store.init_marker().await {
                            Ok(weir_redis::MarkerInit::New) => {
                                tracing::info!(url = %remote.url, "a new store: generation marker set");
                            }
                            Ok(weir_redis::MarkerInit::Missing) => {
                                tracing::warn!(url = %remote.url, "the store has keys but no generation marker: it lost state; on_state_loss applies");
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::debug!(error = %e, "generation marker not checked");
                                continue;
                            }
                        }
                        let store = Arc::new(store);
                        remote.store.store(Some(store.clone()));
                        store
                    }
                    Ok(Err(e)) => {
                        // Said once per new reason, not every probe.
                        let error = e.to_string();
                        if error != last_error {
                            tracing::warn!(url = %remote.url, %error, "cannot connect to the store; policies decide by on_store_error");
                            last_error = error;
                        }
                        continue;
                    }
                    Err(_) => continue,
                }
            }
        };
        if store.ping().await.is_ok() {
            remote.succeeded();
            remote.set_up(true);
        }
    }
}
