//! What the handlers share: the config, the limiter, the upstream client and
//! the metrics; swapped whole on reload.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use axum::body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use weir_limiter::{Limiter, Policy};
use weir_tower::{quota, rate_limit_policy};

use crate::config::Config;
use crate::store::Remote;

/// One configuration, ready to serve.
#[derive(Debug)]
pub struct Shared {
    /// The validated config.
    pub config: Config,
    /// The in-process store and its policies; with Redis, the local
    /// fallback (policies scaled by `fallback_share`).
    pub limiter: Arc<Limiter>,
    /// The shared Redis store, when configured.
    pub remote: Option<Arc<Remote>>,
    /// Per policy: its `RateLimit-Policy` item and limit.
    pub(crate) fields: HashMap<String, (String, u64)>,
    /// Pooled keep-alive connections to the upstreams.
    pub(crate) client: Client<HttpConnector, Body>,
    /// Metric handles, looked up once rather than per request.
    pub(crate) meters: Meters,
}

/// How a policy's part in a decision ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Allowed,
    Rejected,
    /// Would have allowed, but another policy of the same request refused.
    Uncharged,
    Error,
}

/// The metric handles of one configuration.
#[derive(Debug)]
pub(crate) struct Meters {
    decisions: HashMap<String, [Counter; 4]>,
    /// Per shaper: its gauge and its slots (queue + the one served).
    queues: HashMap<String, (Gauge, u64)>,
    fallbacks: HashMap<String, Counter>,
    duration: Histogram,
    grpc: Histogram,
}

impl Meters {
    fn new(config: &Config) -> Self {
        let decisions = config
            .policies
            .iter()
            .map(|(name, _)| {
                let counter = |outcome: &'static str| {
                    metrics::counter!("weir_decisions_total", "policy" => name.clone(), "outcome" => outcome)
                };
                (name.clone(), [counter("allowed"), counter("rejected"), counter("uncharged"), counter("error")])
            })
            .collect();
        let queues = config
            .policies
            .iter()
            .filter_map(|(name, p)| match p {
                Policy::LeakyBucket(l) => Some((
                    name.clone(),
                    (
                        metrics::gauge!("weir_queue_depth", "policy" => name.clone()),
                        l.queue() + 1,
                    ),
                )),
                _ => None,
            })
            .collect();
        let fallbacks = config
            .policies
            .iter()
            .map(|(name, _)| {
                let counter =
                    metrics::counter!("weir_fallback_decisions_total", "policy" => name.clone());
                (name.clone(), counter)
            })
            .collect();
        let store = if config.store == "memory" {
            "memory"
        } else {
            "redis"
        };
        let duration = metrics::histogram!("weir_check_duration_seconds", "store" => store);
        Self {
            decisions,
            queues,
            fallbacks,
            duration,
            grpc: metrics::histogram!("weir_grpc_duration_seconds"),
        }
    }

    /// One policy decided without the shared store.
    pub(crate) fn fallback(&self, policy: &str) {
        if let Some(counter) = self.fallbacks.get(policy) {
            counter.increment(1);
        }
    }

    /// One failed store call (`timeout`, `redis`, `reply`), or one not made
    /// because the breaker is open (`circuit_open`).
    pub(crate) fn store_error(&self, kind: &'static str) {
        metrics::counter!("weir_store_errors_total", "kind" => kind).increment(1);
    }

    /// One gRPC call's outcome and latency.
    pub(crate) fn grpc(&self, code: &'static str, started: std::time::Instant) {
        metrics::counter!("weir_grpc_requests_total", "code" => code).increment(1);
        self.grpc.record(started.elapsed().as_secs_f64());
    }

    /// The store was found to have lost its state.
    pub(crate) fn state_lost(&self) {
        metrics::counter!("weir_store_state_losses_total").increment(1);
    }

    /// Counts one policy's outcome (unknown names are not counted: clients
    /// cannot add series).
    pub(crate) fn count(&self, policy: &str, outcome: Outcome) {
        if let Some(counters) = self.decisions.get(policy) {
            counters[outcome as usize].increment(1);
        }
    }

    /// The time one check took.
    pub(crate) fn observe(&self, started: std::time::Instant) {
        self.duration.record(started.elapsed().as_secs_f64());
    }

    /// A shaper's slots in use, from a decision's `remaining`.
    pub(crate) fn queue(&self, policy: &str, remaining: u64) {
        if let Some((gauge, slots)) = self.queues.get(policy) {
            gauge.set(slots.saturating_sub(remaining) as f64);
        }
    }
}

impl Shared {
    /// Builds what `config` needs, keeping `previous`'s limiter (and so every
    /// key's state) when the policies and the key budget are unchanged, and
    /// its Redis connection when the URL and timeout are. With Redis, call it
    /// within a tokio runtime: the connection is made (and probed when down)
    /// by a task of that runtime.
    pub fn new(config: Config, previous: Option<&Shared>) -> Result<Self, weir_limiter::Error> {
        let same = previous.filter(|p| {
            p.config.policies == config.policies
                && p.config.max_keys == config.max_keys
                && p.config.store == config.store
                && p.config.fallback_share == config.fallback_share
        });
        metrics_handle(); // the recorder first, then the handles
        let remote = (config.store != "memory").then(|| {
            previous
                .and_then(|p| p.remote.clone())
                .filter(|r| r.serves(&config.store, config.timeout))
                .unwrap_or_else(|| Remote::new(&config.store, config.timeout))
        });
        let limiter = match same {
            Some(previous) => previous.limiter.clone(),
            None => {
                let mut builder = Limiter::builder();
                for (name, policy) in &config.policies {
                    let local = match remote {
                        None => *policy,
                        Some(_) => policy.scaled(config.fallback_share, 1_000_000).unwrap_or_else(|e| {
                            tracing::warn!(policy = %name, error = %e, "the local fallback keeps the whole limit");
                            *policy
                        }),
                    };
                    builder = builder.policy(name.clone(), local);
                }
                Arc::new(
                    builder
                        .max_keys(config.max_keys)
                        .max_key_len(weir_redis::MAX_IDENTITY)
                        .build()?,
                )
            }
        };
        let fields = config
            .policies
            .iter()
            .map(|(name, policy)| (name.clone(), field(name, policy)))
            .collect();
        let client = Client::builder(TokioExecutor::new()).build_http();
        let meters = Meters::new(&config);
        Ok(Self {
            meters,
            config,
            limiter,
            remote,
            fields,
            client,
        })
    }

    /// A policy's limit (its `RateLimit-Policy` quota).
    pub(crate) fn limit(&self, policy: &str) -> u64 {
        self.fields.get(policy).map_or(0, |f| f.1)
    }
}

fn field(name: &str, policy: &Policy) -> (String, u64) {
    let (limit, window) = quota(policy);
    let value = rate_limit_policy(name, limit, window);
    (value.to_str().unwrap_or_default().to_owned(), limit)
}

/// The server's state: the current configuration and the metrics handle.
#[derive(Debug)]
pub struct AppState {
    current: ArcSwap<Shared>,
    pub(crate) metrics: PrometheusHandle,
}

/// Histogram buckets of `weir_check_duration_seconds`.
const BUCKETS: [f64; 12] = [
    1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3, 1e-2,
];

fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(&BUCKETS)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Only the first server of a process installs the recorder.
            let _ = metrics::set_global_recorder(recorder);
            metrics::gauge!("weir_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            metrics::counter!("weir_store_errors_total", "kind" => "timeout").absolute(0);
            handle
        })
        .clone()
}

impl AppState {
    /// The state for `shared`.
    pub fn new(shared: Shared) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(shared),
            metrics: metrics_handle(),
        })
    }

    /// The metrics, in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// The configuration being served.
    pub fn current(&self) -> Arc<Shared> {
        self.current.load_full()
    }

    /// Serves `config` from now on (requests in flight finish on the old one).
    pub fn reload(&self, config: Config) -> Result<(), weir_limiter::Error> {
        let next = Shared::new(config, Some(&self.current()))?;
        self.current.store(Arc::new(next));
        Ok(())
    }
}
