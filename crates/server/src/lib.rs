//! `weir serve`: the HTTP decision API, the gateway that forwards admitted
//! requests and answers the rest with `429`, the Envoy rate limit service,
//! Prometheus metrics, health, and admin endpoints — over the in-process
//! limiter or a shared Redis.
//!
//! One way through: [`config`] (parsed and validated) → [`table`] (each
//! policy resolved once) → [`backend`] (in process or Redis, with the
//! breaker and the store-error rules) → [`state`] (what a configuration
//! serves with) → the faces: `api` and `gateway` over HTTP, [`envoy`] over
//! gRPC, all answering through `answer` and `weir_tower`'s `Limited`.
//! `docs/ARCHITECTURE.md` draws it.
//!
//! The server is a function you can test: [`app`] builds the router from an
//! [`AppState`], and [`run`] serves it on a listener the caller owns until the
//! caller's shutdown future completes.

mod answer;
mod api;
pub mod backend;
pub mod breaker;
pub mod config;
mod engine;
pub mod envoy;
mod envoy_json;
mod gateway;
mod grpc;
pub mod guarded;
mod lease_book;
mod leases;
pub use grpc::run_grpc;
mod live;
pub mod metrics;
mod policy_meters;
pub mod reload;
mod routing;
pub mod serve;
mod shown;
pub mod state;
pub mod table;
pub mod telemetry;
pub mod tls;
mod ui;
mod upstream;
mod usage;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{MethodRouter, get, post};

pub use state::{AppState, Shared};

use crate::answer::ApiError;

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// Everything: the decision API, admin, metrics, health and the
    /// gateway routes (no `[server] internal` listener).
    All,
    /// The gateway routes and `/healthz` (the public side when there is an
    /// internal listener).
    Public,
    /// The decision API, admin, `/metrics`, `/v1/policies`, `/readyz` and
    /// `/healthz` (`[server] internal`).
    Internal,
}

/// Every route but `/healthz` that the public face of a split listener
/// does not serve: the decision API, admin, metrics and the dashboard. One
/// list, from which [`app`] builds the router and [`App::gateway`] tells the
/// API's paths from the gateway routes'.
fn api_routes() -> [(&'static str, MethodRouter<Arc<AppState>>); 16] {
    [
        ("/v1/check", post(api::check)),
        ("/v1/report", post(api::report)),
        ("/v1/release", post(api::release)),
        ("/v1/renew", post(api::renew)),
        ("/v1/policies", get(api::policies)),
        (
            "/v1/keys/{policy}/{key}",
            get(api::inspect_key).delete(api::reset_key),
        ),
        ("/v1/admin/reload", post(api::reload)),
        ("/readyz", get(api::readyz)),
        ("/metrics", get(api::metrics)),
        ("/rlconfig", get(envoy::rlconfig)),
        ("/v1/stats", get(ui::stats)),
        ("/v1/top", get(ui::top)),
        ("/v1/simulate", post(ui::simulate)),
        ("/ui", get(ui::page)),
        ("/ui/app.js", get(ui::script)),
        ("/ui/style.css", get(ui::style)),
    ]
}

/// The liveness paths every listener answers: weir's, and the one
/// envoyproxy/ratelimit's probes ask.
const HEALTH: [&str; 2] = ["/healthz", "/healthcheck"];

/// Where `[server] envoy_json` answers.
const ENVOY_JSON: &str = "/json";

/// The router of one listener. Every path no API route takes goes to the
/// gateway routes (on the public side).
pub fn app(state: Arc<AppState>, face: Face) -> Router {
    let mut router = HEALTH
        .into_iter()
        .fold(Router::new(), |r, path| r.route(path, get(api::healthz)));
    if face != Face::Public {
        for (path, handler) in api_routes() {
            router = router.route(path, handler);
        }
    }
    if face != Face::Internal {
        if state.current().config.server.envoy_json {
            router = router.route(ENVOY_JSON, axum::routing::post(envoy_json::json));
        }
        router = router.fallback(gateway::fallback);
    }
    router
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            every_request,
        ))
        .with_state(state)
}

/// What a listener serves: the gateway's requests straight to the gateway
/// (no router, no middleware stack: one boxed future per request, as a
/// plain hyper service), everything else through [`app`]'s router.
#[derive(Debug, Clone)]
pub struct App {
    router: Router,
    gateway: Option<Arc<AppState>>,
    face: Face,
    /// `[server] envoy_json`: `POST /json` goes to the router.
    envoy_json: bool,
    /// The API's paths outside `/v1/` ([`api_routes`]), and [`HEALTH`].
    api_paths: Arc<[&'static str]>,
    /// `[server.tls]` (the internal face: `[server.internal_tls]`).
    tls: Option<tls::TlsFiles>,
    /// Its acceptor once loaded: one for every thread of the listener, so
    /// that all serve the same certificate, the last good one.
    loaded: Arc<std::sync::Mutex<Option<tls::Tls>>>,
}

impl App {
    /// The service of a listener with `face`.
    pub fn new(state: Arc<AppState>, face: Face) -> Self {
        let api = api_routes().map(|(path, _)| path);
        let outside = api.into_iter().filter(|p| !p.starts_with("/v1/"));
        let server = &state.current().config.server;
        let tls = match face {
            Face::Internal => server.internal_tls.clone(),
            Face::All | Face::Public => server.tls.clone(),
        };
        Self {
            tls,
            loaded: Arc::default(),
            router: app(state.clone(), face),
            gateway: (face != Face::Internal).then_some(state),
            face,
            envoy_json: server.envoy_json,
            api_paths: HEALTH.into_iter().chain(outside).collect(),
        }
    }

    /// The listener's TLS, loaded now (a pair that does not load is an
    /// error naming the file).
    pub(crate) fn tls(&self) -> Result<Option<tls::Tls>, String> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tls) = &*loaded {
            return Ok(Some(tls.clone()));
        }
        let tls = tls::Tls::new(files, tls::Alpn::Http)?;
        *loaded = Some(tls.clone());
        Ok(Some(tls))
    }

    /// The state, when `path` goes to the gateway directly: any path the
    /// router has no route for (a path it might have — under `/v1/` — goes
    /// through the router, which answers it as [`app`] does).
    pub(crate) fn gateway(&self, path: &str) -> Option<&Arc<AppState>> {
        if path == ENVOY_JSON && self.envoy_json {
            return None;
        }
        let api = match self.face {
            Face::Public => HEALTH.contains(&path),
            Face::All | Face::Internal => {
                path.starts_with("/v1/") || self.api_paths.contains(&path)
            }
        };
        self.gateway.as_ref().filter(|_| !api)
    }

    /// The router, for every other request.
    pub(crate) fn router(&self) -> &Router {
        &self.router
    }
}

/// What every request goes through, as one layer (one boxed future, not
/// one per rule): [`bounded_and_counted`].
async fn every_request(
    state: axum::extract::State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let path = path.as_ref().map(axum::extract::MatchedPath::as_str);
    bounded_and_counted(&state, path, request, |request| async {
        let response = next.run(request).await;
        let label = response
            .extensions()
            .get::<RouteLabel>()
            .map(|l| l.0.clone());
        (response, label)
    })
    .await
}

/// Headers over [`MAX_HEADER_BYTES`] refused with `431`, the body's pieces
/// bounded in time ([`bound_body`]), and every answer counted in
/// `weir_http_requests_total{route,status}` — a gateway route as written,
/// an API path as routed (`path`), or `unmatched`.
pub(crate) async fn bounded_and_counted<F>(
    state: &Arc<AppState>,
    path: Option<&str>,
    request: axum::extract::Request,
    next: impl FnOnce(axum::extract::Request) -> F,
) -> axum::response::Response
where
    F: Future<Output = (axum::response::Response, Option<Arc<str>>)>,
{
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    let (response, label) = match size > MAX_HEADER_BYTES {
        true => (
            axum::response::IntoResponse::into_response(ApiError::HeadersTooLarge(size)),
            None,
        ),
        false => next(bound_body(state, request)).await,
    };
    let route = match (&label, path) {
        (Some(label), _) => label,
        (None, Some(path)) => path,
        (None, None) => "unmatched",
    };
    metrics::Meters::http(route, response.status().as_u16());
    response
}

/// Bounds the wait for each piece of a request body by `[server]
/// body_timeout`: a client that stops sending mid-body fails the read
/// (answered `400`, or `408` by the decision API) instead of holding the
/// request.
fn bound_body(state: &AppState, request: axum::extract::Request) -> axum::extract::Request {
    use hyper::body::Body as _;
    if request.body().is_end_stream() {
        return request;
    }
    let timeout = state.current().config.server.limits.body_timeout;
    request.map(|body| axum::body::Body::new(serve::TimeoutBody::new(body, timeout)))
}

/// The route an answer is counted under, set by the gateway behind the
/// router (the per-core listener hands it over directly).
#[derive(Debug, Clone)]
pub(crate) struct RouteLabel(pub(crate) Arc<str>);

/// The most header bytes (names and values) a request may carry.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Serves `state` on `listener` until `shutdown` completes, then finishes the
/// requests in flight. Idle keys are swept every few seconds meanwhile.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (router, limits, sweeper) = prepare(state).await;
    let served = serve::serve(listener, router, limits, shutdown).await;
    sweeper.abort();
    served
}

/// [`run`], from `threads` threads with a current-thread runtime each
/// ([`serve::serve_per_core`]), until `stop` turns true.
pub async fn run_per_core(
    listener: std::net::TcpListener,
    threads: usize,
    state: Arc<AppState>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (router, limits, sweeper) = prepare(state).await;
    let threads = serve::serve_per_core(listener, threads, router, limits, stop)?;
    let served = joined(threads).await;
    sweeper.abort();
    served
}

/// Waits for listener threads without blocking the runtime.
async fn joined(threads: Vec<std::thread::JoinHandle<std::io::Result<()>>>) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || {
        threads.into_iter().try_for_each(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a listener thread panicked")))
        })
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// What both ways of serving share: waits briefly for the store, starts
/// the housekeeping, and picks the face of the main listener.
async fn prepare(
    state: Arc<AppState>,
) -> (App, config::ConnectionLimits, tokio::task::JoinHandle<()>) {
    // Serve at once either way; a store still down is decided by the
    // policies' on_store_error rules until the probe reaches it.
    if !state
        .current()
        .backend
        .wait_up(Duration::from_secs(2))
        .await
    {
        tracing::warn!("the store is not reachable yet: serving by on_store_error");
    }
    // Housekeeping: histogram samples are folded into their buckets every
    // second (unscraped, they would pile up), the dashboard's counts
    // recorded, idle keys swept every five seconds.
    let sweeper = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            for second in 0u64.. {
                tick.tick().await;
                state.metrics.run_upkeep();
                let shared = state.current();
                let totals = shared
                    .table
                    .iter()
                    .map(|(_, e)| (e.name.as_str(), e.meters.live.totals()));
                state.history.record(totals, shared.meters.latency.read());
                if second % 5 == 4 {
                    shared.backend.local().sweep();
                }
            }
        })
    };
    let config = &state.current().config;
    let face = match config.server.internal {
        Some(_) => Face::Public,
        None => {
            if !config.routes.is_empty() {
                tracing::warn!(
                    "gateway routes share their listener with the decision API and metrics: any client can call /v1/check; set [server] internal to move them to a listener of their own"
                );
            }
            Face::All
        }
    };
    let limits = config.server.limits;
    (App::new(state, face), limits, sweeper)
}

/// Serves the internal face (`[server] internal`: the decision API, admin,
/// metrics) on `listener` until `shutdown` completes.
pub async fn run_internal(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.current().config.server.limits;
    serve::serve(listener, App::new(state, Face::Internal), limits, shutdown).await
}

/// [`run_grpc`] from `threads` threads with a current-thread runtime each
/// ([`serve::per_core`]), until `stop` turns true.
pub async fn run_grpc_per_core(
    listener: std::net::TcpListener,
    threads: usize,
    state: Arc<AppState>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    // One set of connection caps for the listener, across its threads.
    let open = Arc::default();
    let tls = grpc::grpc_tls(&state)?;
    let threads = serve::per_core(listener, threads, "weir-grpc", move |listener| {
        let (state, open, stop) = (state.clone(), Arc::clone(&open), stop.clone());
        let tls = tls.clone();
        async move { grpc::serve_grpc(listener, state, tls, open, serve::stopped(stop)).await }
    })?;
    joined(threads).await
}
