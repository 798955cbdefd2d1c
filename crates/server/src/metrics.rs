//! Prometheus metrics: the recorder (installed once per process) and the
//! handles that do not belong to one policy.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError};

use crossbeam_utils::sync::ShardedLock;
use std::time::Instant;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Histogram buckets (seconds): 10 µs to 2.5 s, so that a decision in
/// process and a store call that times out both land in a bucket.
const BUCKETS: [f64; 16] = [
    1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
    0.1, 2.5,
];

/// The process's recorder, installed on first use.
pub(crate) fn handle() -> PrometheusHandle {
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
            metrics::describe_counter!(
                "weir_decisions_total",
                "Decisions per policy and outcome (allowed, rejected, uncharged, error, shadow_limited, unlimited): each decision once"
            );
            metrics::describe_counter!(
                "weir_near_limit_total",
                "Admissions that left less than 1 - near_limit_ratio of the limit (a part of outcome=\"allowed\")"
            );
            metrics::describe_histogram!(
                "weir_check_duration_seconds",
                metrics::Unit::Seconds,
                "Time to decide one request, store call included"
            );
            metrics::describe_counter!(
                "weir_fallback_decisions_total",
                "Policy decisions made without the shared store (on_store_error)"
            );
            metrics::describe_counter!(
                "weir_store_errors_total",
                "Failed store calls by kind (timeout, redis, reply, circuit_open)"
            );
            metrics::describe_counter!(
                "weir_store_state_losses_total",
                "Times the store was found to have lost its state"
            );
            metrics::describe_gauge!("weir_store_up", "1 while decisions go to the shared store");
            metrics::describe_gauge!("weir_queue_depth", "Requests the gateway holds in a shaper policy's delay now");
            metrics::describe_gauge!("weir_build_info", "The running weir's version");
            metrics::describe_counter!("weir_grpc_requests_total", "gRPC calls by code");
            metrics::describe_histogram!(
                "weir_grpc_duration_seconds",
                metrics::Unit::Seconds,
                "Time to answer one gRPC call"
            );
            metrics::describe_counter!(
                "weir_http_requests_total",
                "HTTP requests answered, by route (a gateway route as written, an API path, or unmatched) and status"
            );
            metrics::describe_histogram!(
                "weir_upstream_duration_seconds",
                metrics::Unit::Seconds,
                "Time from forwarding a request to the upstream's response head, by route"
            );
            metrics::describe_counter!(
                "weir_upstream_errors_total",
                "Requests the upstream could not answer, by route"
            );
            metrics::describe_gauge!("weir_connections_open", "Connections open now, on every listener");
            metrics::describe_gauge!("weir_leases_in_use", "A concurrency policy's leases this weir granted that are neither released nor expired");
            metrics::describe_counter!("weir_leases_expired_total", "A concurrency policy's leases that expired unreleased: a holder that crashed or forgot");
            metrics::describe_counter!("weir_lease_releases_total", "Releases of a concurrency policy's leases: released, or not_live (already expired or released)");
            metrics::describe_gauge!("weir_keys", "Keys stored in process (the store, or the fallback on Redis)");
            metrics::describe_gauge!("weir_max_keys", "The in-process key budget ([store] max_keys)");
            process().describe();
            metrics::gauge!("weir_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            metrics::counter!("weir_store_errors_total", "kind" => "timeout").absolute(0);
            handle
        })
        .clone()
}

/// The process collector (`process_cpu_seconds_total`, resident memory,
/// open file descriptors, …), sampled at each scrape.
pub(crate) fn process() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Metric handles by route (or API path) and status, registered once: a
/// request finds its handle under a read lock by one hash of the route,
/// instead of registering it again.
/// Read on every request from every thread: a lock whose readers write no
/// shared cache line.
type Handles<T> =
    OnceLock<ShardedLock<HashMap<String, Vec<(u16, T)>, foldhash::fast::RandomState>>>;

/// Applies `apply` to the handle of `route` and `status`, or to the one
/// `make` registers (kept for at most [`MAX_ROUTES`] routes: routes and API
/// paths are configured). A known handle is used under the read lock, not
/// cloned: a clone and its drop would write its shared reference count.
fn cached<T: Clone>(
    handles: &Handles<T>,
    route: &str,
    status: u16,
    make: impl FnOnce() -> T,
    apply: impl FnOnce(&T),
) {
    let handles = handles.get_or_init(ShardedLock::default);
    {
        let known = handles.read().unwrap_or_else(PoisonError::into_inner);
        let found = known
            .get(route)
            .and_then(|statuses| statuses.iter().find(|(s, _)| *s == status));
        if let Some((_, handle)) = found {
            return apply(handle);
        }
    }
    let handle = make();
    let mut known = handles.write().unwrap_or_else(PoisonError::into_inner);
    if known.len() < MAX_ROUTES || known.contains_key(route) {
        let statuses = known.entry(route.to_owned()).or_default();
        statuses.push((status, handle.clone()));
    }
    apply(&handle);
}

/// The most routes [`cached`] keeps handles for.
const MAX_ROUTES: usize = 1024;

/// Handles that belong to no one policy.
#[derive(Debug)]
pub(crate) struct Meters {
    duration: Histogram,
    /// The same, for the dashboard.
    pub(crate) latency: crate::live::Latency,
}

impl Meters {
    pub(crate) fn new(store: &'static str) -> Self {
        handle(); // the recorder first, then the handles
        Self {
            duration: metrics::histogram!("weir_check_duration_seconds", "store" => store),
            latency: crate::live::Latency::default(),
        }
    }

    /// The time one check took.
    pub(crate) fn observe(&self, started: Instant) {
        let elapsed = started.elapsed();
        self.duration.record(elapsed.as_secs_f64());
        self.latency.observe(elapsed);
    }

    /// One gRPC call's outcome and latency (only a server with gRPC on
    /// has these series).
    pub(crate) fn grpc(code: &'static str, started: Instant) {
        static DURATION: OnceLock<Histogram> = OnceLock::new();
        static HANDLES: Handles<Counter> = OnceLock::new();
        cached(
            &HANDLES,
            code,
            0,
            || metrics::counter!("weir_grpc_requests_total", "code" => code),
            |requests| requests.increment(1),
        );
        DURATION
            .get_or_init(|| metrics::histogram!("weir_grpc_duration_seconds"))
            .record(started.elapsed().as_secs_f64());
    }

    /// One HTTP answer. Handles are looked up once per (route, status),
    /// not registered again per request.
    pub(crate) fn http(route: &str, status: u16) {
        static HANDLES: Handles<Counter> = OnceLock::new();
        let make = || metrics::counter!("weir_http_requests_total", "route" => route.to_owned(), "status" => status.to_string());
        cached(&HANDLES, route, status, make, |requests| {
            requests.increment(1)
        });
    }

    /// One upstream call of a gateway route: its latency, or an error.
    pub(crate) fn upstream(route: &str, started: Instant, ok: bool) {
        static LATENCY: Handles<Histogram> = OnceLock::new();
        static ERRORS: Handles<Counter> = OnceLock::new();
        match ok {
            true => cached(
                &LATENCY,
                route,
                0,
                || metrics::histogram!("weir_upstream_duration_seconds", "route" => route.to_owned()),
                |latency| latency.record(started.elapsed().as_secs_f64()),
            ),
            false => cached(
                &ERRORS,
                route,
                0,
                || metrics::counter!("weir_upstream_errors_total", "route" => route.to_owned()),
                |errors| errors.increment(1),
            ),
        }
    }

    /// One failed store call (`timeout`, `redis`, `reply`), or one not made
    /// because the breaker is open (`circuit_open`).
    pub(crate) fn store_error(kind: &'static str) {
        metrics::counter!("weir_store_errors_total", "kind" => kind).increment(1);
    }

    /// The store was found to have lost its state.
    pub(crate) fn state_lost() {
        metrics::counter!("weir_store_state_losses_total").increment(1);
    }
}
