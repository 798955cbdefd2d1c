//! Prometheus metrics: the catalog of every metric weir exports (one place
//! for each name, its kind, labels and help), the recorder (installed once
//! per process) and the handles that do not belong to one policy.

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

/// What a metric measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric of the catalog.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// Its labels, as they appear on its series.
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

macro_rules! catalog {
    ($($id:ident = $name:literal, $kind:ident [$($label:literal),*], $help:literal;)*) => {
        $(#[doc = concat!("`", $name, "` (its help: [`CATALOG`]).")] pub const $id: &str = $name;)*
        /// Every metric weir exports (`docs/METRICS.md` is this list).
        pub const CATALOG: &[Metric] = &[
            $(Metric { name: $name, kind: Kind::$kind, labels: &[$($label),*], help: $help },)*
        ];
    };
}

catalog! {
    DECISIONS = "weir_decisions_total", Counter ["policy", "outcome"],
        "Decisions per policy, each counted once by outcome: allowed; rejected; uncharged (would have allowed, but another policy of the request refused); error (not decided: an invalid request); shadow_limited (a shadow policy would have refused, and admitted); unlimited (an override without a limit admitted it uncounted).";
    NEAR_LIMIT = "weir_near_limit_total", Counter ["policy"],
        "Admissions that left less than 1 - near_limit_ratio of the limit (a part of outcome=\"allowed\").";
    FALLBACK_DECISIONS = "weir_fallback_decisions_total", Counter ["policy"],
        "Policy decisions made without the shared store, as on_store_error says.";
    REPORTED_COST = "weir_reported_cost_total", Counter ["policy"],
        "Cost charged after the fact (usage reports, metered answers).";
    ADDRESS_LISTS = "weir_address_lists_total", Counter ["list"],
        "Gateway and forward-auth requests an address list decided: deny (refused 403 before anything was charged), exempt (a client of [server] allow, or of a route's or policy's exempt, not limited by some or all of its policies).";
    BANS = "weir_bans_total", Counter ["policy"],
        "Bans begun: a policy with a penalty refused a key, which is shut out until its ban ends (docs/SPEC.md, \"Penalties\").";
    GRANTS = "weir_grants_total", Counter ["policy", "outcome"],
        "Fleet grants asked of the Rate Limit Quota Service, by outcome: granted (booked and sent, a renewal or a new grant, possibly smaller than the fair share), refused (nothing could be booked: DENY_ALL sent), unmatched (a bucket no [[quota_buckets]] rule matches; policy empty).";
    GRANT_DEMAND = "weir_grant_demand", Gauge ["policy"],
        "The demand the last usage report said, in requests per second (allowed and denied).";
    GRANT_RATE = "weir_grant_rate", Gauge ["policy"],
        "The rate of the last grant sent, in tokens per second.";
    LIMIT_CHANGES = "weir_limit_changes_total", Counter ["kind", "change"],
        "Changes to limits managed by API made through this instance: kind (limit: a per-key setting; plan: a key's plan) and change (set, removed).";
    LIMITS = "weir_limits", Gauge [],
        "Keys with a limit or a plan set through the API (as this instance knows them).";
    QUEUE_DEPTH = "weir_queue_depth", Gauge ["policy"],
        "Requests the gateway holds in a shaper policy's delay now.";
    CHECK_DURATION = "weir_check_duration_seconds", Histogram ["store"],
        "Time to decide one request, the store call included.";
    STORE_ERRORS = "weir_store_errors_total", Counter ["kind"],
        "Store calls that failed, by kind: timeout, redis (an error Redis answered or a lost connection), reply (an answer weir could not read), replication (a write not replicated as [store] min_replicas asks), circuit_open (not made: the breaker is open).";
    STORE_STATE_LOSSES = "weir_store_state_losses_total", Counter [],
        "Times the store was found to have lost its state (a restart without data, a flush).";
    STORE_UP = "weir_store_up", Gauge [],
        "1 while decisions go to the shared store, 0 while on_store_error decides.";
    STORE_NODE_UP = "weir_store_node_up", Gauge ["node"],
        "Per Redis master (a cluster's, or Sentinel's): 1 while its circuit breaker is closed.";
    KEYS = "weir_keys", Gauge [],
        "Keys stored in process (the store, or the fallback on Redis).";
    MAX_KEYS = "weir_max_keys", Gauge [],
        "The in-process key budget ([store] max_keys).";
    LEASES_IN_USE = "weir_leases_in_use", Gauge ["policy"],
        "A concurrency policy's leases this weir granted that are neither released nor expired.";
    LEASES_EXPIRED = "weir_leases_expired_total", Counter ["policy"],
        "A concurrency policy's leases that expired unreleased: a holder that crashed or forgot.";
    LEASE_RELEASES = "weir_lease_releases_total", Counter ["policy", "outcome"],
        "Releases of a concurrency policy's leases, by outcome: released, or not_live (already expired or released).";
    USAGE_MISSING = "weir_usage_missing_total", Counter ["route"],
        "Metered answers whose usage was not found (charged as usage_missing says).";
    USAGE_UNREPORTED = "weir_usage_unreported_total", Counter ["route"],
        "Usage read from an answer that could not be charged (the store failed).";
    HTTP_REQUESTS = "weir_http_requests_total", Counter ["route", "status"],
        "HTTP requests answered, by route (a gateway route as written, an API path, or unmatched) and status.";
    UPSTREAM_DURATION = "weir_upstream_duration_seconds", Histogram ["route"],
        "Time from forwarding a request to the upstream's response head, by route.";
    UPSTREAM_ERRORS = "weir_upstream_errors_total", Counter ["route"],
        "Requests the upstream could not answer, by route.";
    GRPC_REQUESTS = "weir_grpc_requests_total", Counter ["code"],
        "gRPC calls answered, by code.";
    GRPC_DURATION = "weir_grpc_duration_seconds", Histogram [],
        "Time to answer one gRPC call.";
    FACE_ANSWERS = "weir_face_answers_total", Counter ["face", "route", "outcome"],
        "Answers of the faces a proxy or a client asks (forward_auth: /v1/auth; ext_authz: Envoy's gRPC ext_authz; resp: the Redis protocol), by route (the gateway route matched, unmatched; for resp the command) and outcome: admitted, limited, invalid (a request weir refused to decide), error (weir could not decide).";
    CONNECTIONS_OPEN = "weir_connections_open", Gauge [],
        "Connections open now, on every listener.";
    CONNECTIONS_REFUSED = "weir_connections_refused_total", Counter [],
        "Connections closed at once: past [server] max_connections, or past the per-address bound.";
    CONNECTIONS_TIMED_OUT = "weir_connections_timed_out_total", Counter ["phase"],
        "Connections closed by a timeout, by phase: handshake, header, idle, send (an answer the client does not take), or resets (too many cancelled streams).";
    ACCEPT_ERRORS = "weir_accept_errors_total", Counter [],
        "Failed accepts (out of file descriptors, say): the listener waits, then goes on.";
    TLS_HANDSHAKES_FAILED = "weir_tls_handshakes_failed_total", Counter [],
        "TLS handshakes that failed (a refused client certificate, a client that is not TLS).";
    ADMIN_AUTH_FAILURES = "weir_admin_auth_failures_total", Counter [],
        "Admin requests with a wrong or missing token.";
    CONFIG_RELOADS = "weir_config_reloads_total", Counter ["result"],
        "Configuration reloads, by result: ok, or error (the old configuration keeps serving).";
    CONFIG_INFO = "weir_config_info", Gauge ["hash"],
        "1 for the hash of the configuration served (the same on every instance serving the same file).";
    CONFIG_LAST_RELOAD = "weir_config_last_reload_timestamp_seconds", Gauge [],
        "When the configuration served was loaded (Unix seconds).";
    BUILD_INFO = "weir_build_info", Gauge ["version"],
        "1, with the running weir's version.";
}

/// The catalog as `docs/METRICS.md` has it (a test holds the two equal).
pub fn catalog_markdown() -> String {
    let mut out = String::from(
        "# weir's metrics\n\nEvery metric weir exports on `/metrics` (Prometheus text), from the\ncatalog in `crates/server/src/metrics.rs`: a test holds this page to it\n(`UPDATE_DOCS=1 cargo test -p weir-server metrics_md` writes it again).\nThe process collector's `process_*` series come beside them.\n\n| metric | kind | labels | what it counts |\n|---|---|---|---|\n",
    );
    for m in CATALOG {
        let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
        let kind = match m.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        out.push_str(&format!(
            "| `{}` | {kind} | {} | {} |\n",
            m.name,
            labels.join(", "),
            m.help
        ));
    }
    out
}

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
            for m in CATALOG {
                match m.kind {
                    Kind::Counter => metrics::describe_counter!(m.name, m.help),
                    Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
                    Kind::Histogram => {
                        metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
                    }
                }
            }
            process().describe();
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            metrics::counter!(STORE_ERRORS, "kind" => "timeout").absolute(0);
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
            duration: metrics::histogram!(CHECK_DURATION, "store" => store),
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
            || metrics::counter!(GRPC_REQUESTS, "code" => code),
            |requests| requests.increment(1),
        );
        DURATION
            .get_or_init(|| metrics::histogram!(GRPC_DURATION))
            .record(started.elapsed().as_secs_f64());
    }

    /// One answer of a face a proxy or a client asks (forward-auth,
    /// ext_authz, the Redis protocol).
    /// Handles are looked up as [`Meters::http`]'s (one per route and
    /// (face, outcome) pair), not registered anew per answer.
    pub(crate) fn answered(face: &'static str, route: Option<&str>, outcome: &'static str) {
        static HANDLES: Handles<Counter> = OnceLock::new();
        const FACES: [&str; 3] = ["forward_auth", "ext_authz", "resp"];
        const OUTCOMES: [&str; 4] = ["admitted", "limited", "invalid", "error"];
        let index = |names: &[&str], name| names.iter().position(|n| *n == name).unwrap_or(0);
        let pair = index(&FACES, face) * OUTCOMES.len() + index(&OUTCOMES, outcome);
        let route = route.unwrap_or("unmatched");
        let make = || metrics::counter!(FACE_ANSWERS, "face" => face, "route" => route.to_owned(), "outcome" => outcome);
        cached(&HANDLES, route, pair as u16, make, |answers| {
            answers.increment(1)
        });
    }

    /// The outcome of an HTTP answer, by its status.
    pub(crate) fn outcome(status: http::StatusCode) -> &'static str {
        match status.as_u16() {
            429 => "limited",
            200..=299 => "admitted",
            400..=499 => "invalid",
            _ => "error",
        }
    }

    /// One HTTP answer. Handles are looked up once per (route, status),
    /// not registered again per request.
    pub(crate) fn http(route: &str, status: u16) {
        static HANDLES: Handles<Counter> = OnceLock::new();
        let make = || metrics::counter!(HTTP_REQUESTS, "route" => route.to_owned(), "status" => status.to_string());
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
                || metrics::histogram!(UPSTREAM_DURATION, "route" => route.to_owned()),
                |latency| latency.record(started.elapsed().as_secs_f64()),
            ),
            false => cached(
                &ERRORS,
                route,
                0,
                || metrics::counter!(UPSTREAM_ERRORS, "route" => route.to_owned()),
                |errors| errors.increment(1),
            ),
        }
    }

    /// One failed store call (`timeout`, `redis`, `reply`, `replication`),
    /// or one not made because the breaker is open (`circuit_open`).
    pub(crate) fn store_error(kind: &'static str) {
        metrics::counter!(STORE_ERRORS, "kind" => kind).increment(1);
    }

    /// The store was found to have lost its state.
    pub(crate) fn state_lost() {
        metrics::counter!(STORE_STATE_LOSSES).increment(1);
    }
}

#[cfg(test)]
mod tests {
    /// `docs/METRICS.md` is the catalog; `UPDATE_DOCS=1` writes it again.
    #[test]
    fn metrics_md_is_the_catalog() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/METRICS.md");
        let made = super::catalog_markdown();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, &made).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == made,
            "docs/METRICS.md is not the catalog: UPDATE_DOCS=1 cargo test -p weir-server metrics_md"
        );
    }
}
