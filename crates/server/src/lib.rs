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

pub mod addresses;
mod answer;
mod api;
pub mod backend;
pub mod breaker;
pub mod config;
mod engine;
pub mod envoy;
mod envoy_json;
mod ext_authz;
mod forward_auth;
mod gateway;
pub mod grants;
mod grpc;
pub mod guarded;
mod http_app;
mod lease_book;
mod leases;
pub use grpc::run_grpc;
pub mod limits;
mod limits_api;
mod limits_feed;
mod live;
pub mod metrics;
mod policy_meters;
pub mod reload;
mod resp;
mod rlqs;
pub use resp::run_resp;
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

pub use answer::MAX_HEADER_BYTES;
pub use http_app::{App, Face, app};
pub use state::{AppState, Shared};

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
