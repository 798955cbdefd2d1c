//! The gateway: match a route, identify the caller, check the route's
//! policies all-or-nothing, then forward (after a shaper's delay) or answer
//! `429` with `Retry-After` and the `RateLimit` fields.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weir_limiter::{Decision, Nanos};
use weir_tower::retry_after_seconds;

use crate::config::{Identity, OnStoreError, Route, Segment};
use crate::handlers::{error, rate_limit_headers, refusal};
use crate::state::{AppState, Shared};
use crate::store::decide;

/// The longest identity accepted, in bytes.
const MAX_IDENTITY: usize = 256;

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn matches<'a>(
    route: &'a Route,
    method: &http::Method,
    path: &'a str,
) -> Option<Vec<(&'a str, &'a str)>> {
    if route.method.as_ref().is_some_and(|m| m != method) {
        return None;
    }
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    if parts.len() != route.segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (segment, part) in route.segments.iter().zip(parts) {
        match segment {
            Segment::Literal(text) if text == part => {}
            Segment::Param(name) if !part.is_empty() => params.push((name.as_str(), part)),
            _ => return None,
        }
    }
    Some(params)
}

fn identity(
    route: &Route,
    request: &Request,
    params: &[(&str, &str)],
    peer: Option<SocketAddr>,
) -> Result<String, Response> {
    let value = match &route.identity {
        Identity::Header(name) => request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        Identity::Path(name) => params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| (*v).to_owned()),
        Identity::Peer => peer.map(|p| p.ip().to_string()),
    };
    match value {
        Some(v) if v.is_empty() => Err(error(
            StatusCode::BAD_REQUEST,
            "MISSING_IDENTITY",
            "the identity is empty",
        )),
        Some(v) if v.len() > MAX_IDENTITY => Err(error(
            StatusCode::BAD_REQUEST,
            "IDENTITY_TOO_LONG",
            format!("an identity is at most {MAX_IDENTITY} bytes"),
        )),
        Some(v) => Ok(format!("{}:{v}", route.identity.kind())),
        None => Err(error(
            StatusCode::BAD_REQUEST,
            "MISSING_IDENTITY",
            format!("no {}", route.identity.kind()),
        )),
    }
}

/// Every request that is not the API's: a gateway route, or `404`.
pub(crate) async fn forward(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let shared = state.current();
    let path = request.uri().path().to_owned();
    let found =
        shared.config.routes.iter().find_map(|route| {
            matches(route, request.method(), &path).map(|params| (route, params))
        });
    let Some((route, params)) = found else {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no route for {} {path}", request.method()),
        );
    };
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let key = match identity(route, &request, &params, peer) {
        Ok(key) => key,
        Err(response) => return response,
    };
    let pairs: Vec<(&str, &str, u64)> = route
        .policies
        .iter()
        .map(|p| (p.as_str(), key.as_str(), 1))
        .collect();
    let max_wait = Nanos::try_from(route.max_wait.as_nanos()).unwrap_or(Nanos::MAX);
    let verdict = match decide(&shared, &pairs, max_wait, Some(OnStoreError::Local)).await {
        Ok(verdict) => verdict,
        Err(r) => return refusal(r),
    };
    let decided = verdict.decided;
    if !verdict.all.allowed {
        return rejection(&shared, &decided, max_wait);
    }
    let delay = decided.iter().map(|(_, d)| d.delay).max().unwrap_or(0);
    if delay > 0 {
        // A client that goes away while waiting drops this future: it is
        // never forwarded (its slot is not refunded).
        tokio::time::sleep(Duration::from_nanos(delay)).await;
    }
    let mut response = send(&shared, route, request, peer).await;
    rate_limit_headers(&shared, &decided, response.headers_mut());
    response
}

fn rejection(shared: &Shared, decided: &[(&str, Decision)], max_wait: Nanos) -> Response {
    // The first policy that refused; or, when a shaper's wait was too long,
    // the one that would have made it wait longest.
    let (policy, decision) = decided
        .iter()
        .find(|(_, d)| !d.allowed)
        .or_else(|| decided.iter().max_by_key(|(_, d)| d.delay))
        .copied()
        .unwrap_or(("", Decision::default()));
    let wait = if decision.allowed {
        decision.delay.saturating_sub(max_wait)
    } else {
        decision.retry_after
    };
    let body = json!({ "error": "RATE_LIMITED", "policy": policy }).to_string();
    let mut response = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    headers.insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(retry_after_seconds(wait)),
    );
    rate_limit_headers(shared, decided, headers);
    response
}

async fn send(
    shared: &Shared,
    route: &Route,
    request: Request,
    peer: Option<SocketAddr>,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = Uri::builder()
        .scheme("http")
        .authority(route.upstream.authority().map_or("", |a| a.as_str()))
        .path_and_query(path)
        .build();
    let Ok(uri) = uri else {
        return error(
            StatusCode::BAD_GATEWAY,
            "UPSTREAM_UNAVAILABLE",
            "cannot build the upstream URI",
        );
    };
    parts.uri = uri;
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if let Some(authority) = route
        .upstream
        .authority()
        .and_then(|a| HeaderValue::try_from(a.as_str()).ok())
    {
        parts.headers.insert(http::header::HOST, authority);
    }
    if let Some(ip) = peer.and_then(|p| HeaderValue::try_from(p.ip().to_string()).ok()) {
        parts.headers.append("x-forwarded-for", ip);
    }
    match shared
        .client
        .request(Request::from_parts(parts, body))
        .await
    {
        Ok(response) => response.map(Body::new),
        Err(e) => {
            tracing::warn!(route = %route.text, error = %e, "upstream unavailable");
            error(
                StatusCode::BAD_GATEWAY,
                "UPSTREAM_UNAVAILABLE",
                format!("{}: {e}", route.upstream),
            )
        }
    }
}
