//! The dashboard: `/ui` (a page embedded in the binary: it works offline),
//! and what it reads — `/v1/stats` (no identities), `/v1/top` (identities:
//! the admin token) and `/v1/simulate` (the playground: the same code as
//! `weir simulate --compare --plot`).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use weir_core::Policy;
use weir_sim::compare::{compare, default_burst_window};
use weir_sim::{TraceError, TraceReader};

use crate::answer::{ApiError, read_body};
use crate::api::{Peer, authorize};
use crate::live::{CAPACITY, Hitter, PolicyCounts, SLICE, SLICES, now_ms};
use crate::state::AppState;

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

/// The page may load only its own script, style and the plots it made.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'";

fn asset(kind: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `GET /ui`.
pub(crate) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// `GET /ui/app.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/style.css`.
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

#[derive(Debug, Serialize)]
struct Stats {
    /// Milliseconds since the Unix epoch.
    time_ms: u128,
    /// Whether the admin API (top keys, inspector, reset) is enabled.
    admin: bool,
    store: Store,
    /// `[largest µs of the bucket, checks]` since the configuration loaded.
    latency_us: Vec<[u64; 2]>,
    policies: Vec<PolicyCounts>,
    /// With `?history=1`: the counts and latencies as they were each second
    /// of the last [`crate::live::HISTORY`] (oldest first), for a dashboard
    /// opened now.
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<Vec<crate::live::Sample>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StatsQuery {
    #[serde(default)]
    history: Option<u8>,
}

#[derive(Debug, Serialize)]
struct Store {
    kind: &'static str,
    up: bool,
    /// `closed` (decisions go to Redis) or `open` (the fallback decides
    /// while a probe waits for Redis).
    breaker: &'static str,
    /// Keys held in process (with Redis: the fallback's).
    local_keys: usize,
    /// On a cluster, each master and its breaker.
    nodes: Vec<crate::api::NodeBody>,
    /// Through Sentinel: the master in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    master: Option<String>,
}

/// `GET /v1/stats`: decisions per policy since the configuration loaded,
/// the store's state and check latencies; with `?history=1` also each
/// second's of the last three minutes. No identity is shown.
pub(crate) async fn stats(
    State(state): State<Arc<AppState>>,
    Query(query): Query<StatsQuery>,
) -> Response {
    let shared = state.current();
    let (kind, up, nodes, master) = match shared.backend.remote() {
        None => ("memory", true, Vec::new(), None),
        Some(remote) => (
            "redis",
            remote.is_up(),
            crate::api::nodes(remote),
            remote.master(),
        ),
    };
    let policies = shared
        .table
        .iter()
        .map(|(_, e)| PolicyCounts::new(Arc::from(e.name.as_str()), e.meters.live.totals()))
        .collect();
    let stats = Stats {
        time_ms: now_ms(),
        admin: shared.config.server.admin_token.is_some(),
        store: Store {
            kind,
            up,
            breaker: if up { "closed" } else { "open" },
            local_keys: shared.backend.local().len(),
            nodes,
            master,
        },
        latency_us: shared.meters.latency.read(),
        policies,
        history: (query.history == Some(1)).then(|| state.history.samples()),
    };
    Json(stats).into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct TopQuery {
    policy: String,
    n: Option<usize>,
}

#[derive(Debug, Serialize)]
struct Top<'a> {
    policy: &'a str,
    window_seconds: u64,
    /// Refusals of the policy in the window.
    refused: u64,
    /// No listed count is further than this from the truth, and every
    /// identity refused more often than this is listed.
    error_bound: u64,
    top: Vec<Hitter>,
}

/// `GET /v1/top?policy=NAME&n=N`: the identities refused most over the
/// last minute (admin token).
pub(crate) async fn top(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Query(query): Query<TopQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, id) = authorize(&state, peer, &headers, &query.policy)?;
    let entry = shared.table.get(id);
    let n = query.n.unwrap_or(10).clamp(1, CAPACITY);
    let (top, refused) = entry.meters.live.top(n);
    Ok(Json(Top {
        policy: &entry.name,
        window_seconds: SLICE.as_secs() * SLICES,
        refused,
        error_bound: refused / CAPACITY as u64,
        top,
    })
    .into_response())
}

/// The most rows and policies the playground takes (larger: `weir
/// simulate`).
pub(crate) const MAX_ROWS: usize = 20_000;
const MAX_POLICIES: usize = 6;
/// The largest playground request body.
pub(crate) const MAX_BODY: usize = 1 << 20;
/// Playground runs at once, across every request and listener: a run of
/// the largest trace holds about 25 MB while it simulates and plots, so
/// the playground holds at most about 50 MB, whatever the clients send.
/// A request past them gets `503 BUSY` with `Retry-After: 1`.
pub(crate) const MAX_RUNS: usize = 2;
static RUNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_RUNS);

#[derive(Debug, Deserialize)]
struct Playground {
    /// Policies as `weir simulate --policy` takes them, or configured names.
    policies: Vec<String>,
    /// A CSV trace: `time,key[,cost][,op]`.
    trace: String,
}

#[derive(Debug, Serialize)]
struct Lane {
    label: String,
    admitted: u64,
    rejected: u64,
    delayed: u64,
    max_burst: u64,
}

#[derive(Debug, Serialize)]
struct Plotted {
    svg: String,
    lanes: Vec<Lane>,
}

/// `POST /v1/simulate` `{"policies":[…],"trace":"time,key\n…"}`: the
/// decisions of each policy over the trace, side by side, as
/// `weir simulate --compare --plot` draws them.
pub(crate) async fn simulate(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let deadline = state.current().config.server.limits.body_deadline;
    let bytes = read_body(body, MAX_BODY, deadline)
        .await
        .map_err(|e| match e {
            ApiError::BodyTooLarge(_) => ApiError::InvalidRequest(format!(
                "the playground takes at most {} KiB; replay larger traces with `weir simulate`",
                MAX_BODY >> 10
            )),
            e => e,
        })?;
    let asked: Playground =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::Malformed(e.to_string()))?;
    if asked.policies.is_empty() || asked.policies.len() > MAX_POLICIES {
        return Err(ApiError::InvalidRequest(format!(
            "name 1 to {MAX_POLICIES} policies"
        )));
    }
    let shared = state.current();
    let mut policies = Vec::new();
    for (i, text) in asked.policies.iter().enumerate() {
        let text = text.trim();
        let policy = match shared.table.find(text) {
            Some(id) => shared.table.get(id).policy,
            None => Policy::parse(text).map_err(|e| {
                ApiError::InvalidRequest(format!(
                    "policy {}: {e} (a configured name, or e.g. \"token-bucket capacity=10 rate=2/s\")",
                    i + 1
                ))
            })?,
        };
        policies.push((text.to_owned(), policy));
    }
    let Ok(run) = RUNS.try_acquire() else {
        return Err(ApiError::Busy(format!(
            "the playground runs at most {MAX_RUNS} simulations at once; retry in a second, or replay the trace with `weir simulate`"
        )));
    };
    let plotted = tokio::task::spawn_blocking(move || {
        let _run = run;
        plot(policies, &asked.trace)
    })
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "the playground's simulation failed");
        ApiError::Internal
    })??;
    Ok(Json(plotted).into_response())
}

fn plot(policies: Vec<(String, Policy)>, trace: &str) -> Result<Plotted, ApiError> {
    let window = default_burst_window(&policies);
    let rows = TraceReader::new(trace.as_bytes())
        .enumerate()
        .map(|(i, row)| match i < MAX_ROWS {
            true => row,
            false => Err(TraceError {
                line: i as u64 + 2,
                message: format!("the playground takes at most {MAX_ROWS} rows; replay larger traces with `weir simulate`"),
            }),
        });
    let lanes = compare(policies, rows).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let svg =
        weir_sim::plot::render("playground", &lanes, window).map_err(ApiError::InvalidRequest)?;
    let lanes = lanes
        .iter()
        .map(|lane| {
            let s = lane.summary(window);
            Lane {
                label: lane.label.clone(),
                admitted: s.admitted,
                rejected: s.rejected,
                delayed: s.delayed,
                max_burst: s.max_burst,
            }
        })
        .collect();
    Ok(Plotted { svg, lanes })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// With every run taken, a playground request is answered `503 BUSY`
    /// at once, whatever it asks: concurrent runs cannot add up.
    #[tokio::test]
    async fn the_playground_runs_at_most_max_runs_at_once() {
        use tower::ServiceExt;
        let text = "[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n";
        let config = crate::config::parse(text, &Default::default()).unwrap();
        let state = AppState::new(crate::Shared::new(config, None).unwrap());
        let app = axum::Router::new()
            .route("/v1/simulate", axum::routing::post(simulate))
            .with_state(state);
        let ask = || {
            let body = r#"{"policies":["api"],"trace":"time,key\n0,a\n0.5,a\n"}"#;
            http::Request::post("/v1/simulate")
                .body(Body::from(body))
                .unwrap()
        };
        let taken = RUNS.acquire_many(MAX_RUNS as u32).await.unwrap();
        let busy = app.clone().oneshot(ask()).await.unwrap();
        assert_eq!(busy.status(), 503);
        assert_eq!(busy.headers()["retry-after"], "1");
        drop(taken);
        let answered = app.oneshot(ask()).await.unwrap();
        assert_eq!(answered.status(), 200);
    }
}
