//! The decision API, admin, health and metrics endpoints.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, to_bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use weir_limiter::{Decision, Error, Nanos};
use weir_tower::rate_limit;

use crate::config::OnStoreError;
use crate::state::{AppState, Shared};
use crate::store::{Refusal, decide};

/// The answer to a request that could not be decided.
pub(crate) fn refusal(refusal: Refusal) -> Response {
    match refusal {
        Refusal::Invalid(e) => limiter_error(&e),
        Refusal::Unsupported(message) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, "UNSUPPORTED", message)
        }
        Refusal::Unavailable { .. } => {
            let body = json!({ "allowed": false, "degraded": true, "error": "STORE_UNAVAILABLE",
                               "detail": "the store is unavailable: a policy's on_store_error is \"deny\", or the operation needs the store" });
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// The largest decision request body.
const MAX_BODY: usize = 64 * 1024;

/// Keys given to the decision API live apart from gateway identities.
pub(crate) const API_PREFIX: &str = "api:";

fn ms(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000)
}

/// A JSON error: `{"error": CODE, "detail": …}`.
pub(crate) fn error(status: StatusCode, code: &str, detail: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "error": code, "detail": detail.into() })),
    )
        .into_response()
}

/// The status and code a limiter error is answered with.
pub(crate) fn limiter_error(e: &Error) -> Response {
    let (status, code) = match e {
        Error::UnknownPolicy(_) => (StatusCode::NOT_FOUND, "UNKNOWN_POLICY"),
        Error::Cost {
            error: weir_limiter::CostError::Zero,
            ..
        } => (StatusCode::UNPROCESSABLE_ENTITY, "INVALID_COST"),
        Error::Cost { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "COST_NEVER_FITS"),
        Error::KeyTooLong { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "KEY_TOO_LONG"),
        Error::DuplicateCheck { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "DUPLICATE_CHECK"),
        Error::TooManyKeys { .. } => (StatusCode::SERVICE_UNAVAILABLE, "LIMITER_FULL"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    };
    error(status, code, e.to_string())
}

pub(crate) fn decision_json(shared: &Shared, policy: &str, d: &Decision) -> Value {
    let limit = shared.limit(policy);
    json!({
        "allowed": d.allowed,
        "policy": policy,
        "limit": limit,
        "remaining": d.remaining,
        "retry_after_ms": ms(d.retry_after),
        "reset_ms": ms(d.reset),
        "delay_ms": ms(d.delay),
    })
}

/// `RateLimit-Policy` and `RateLimit` for these (policy, decision) pairs.
pub(crate) fn rate_limit_headers(
    shared: &Shared,
    decisions: &[(&str, Decision)],
    headers: &mut HeaderMap,
) {
    let (policies, states) = rate_limit_fields(shared, decisions);
    if let Ok(v) = HeaderValue::try_from(policies) {
        headers.insert("ratelimit-policy", v);
    }
    if let Ok(v) = HeaderValue::try_from(states) {
        headers.insert("ratelimit", v);
    }
}

/// The values of `RateLimit-Policy` and `RateLimit` for these decisions.
pub(crate) fn rate_limit_fields(
    shared: &Shared,
    decisions: &[(&str, Decision)],
) -> (String, String) {
    let policies: Vec<&str> = decisions
        .iter()
        .filter_map(|(p, _)| shared.fields.get(*p).map(|f| f.0.as_str()))
        .collect();
    let states: Vec<String> = decisions
        .iter()
        .map(|(p, d)| {
            let limit = shared.fields.get(*p).map_or(u64::MAX, |f| f.1);
            rate_limit(p, d.remaining.min(limit), d.reset)
                .to_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    (policies.join(", "), states.join(", "))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: Option<String>,
    key: Option<String>,
    checks: Option<Vec<OneCheck>>,
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OneCheck {
    policy: String,
    key: String,
}

/// `POST /v1/check`: one policy, or several all-or-nothing.
pub(crate) async fn check(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let Ok(bytes) = to_bytes(body, MAX_BODY).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BODY_TOO_LARGE",
            format!("at most {MAX_BODY} bytes"),
        );
    };
    let request: CheckRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) if e.is_data() => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_REQUEST",
                e.to_string(),
            );
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, "MALFORMED_JSON", e.to_string()),
    };
    let multi = request.checks.is_some();
    let checks: Vec<(String, String)> = match (request.policy, request.key, request.checks) {
        (Some(policy), Some(key), None) => vec![(policy, key)],
        (None, None, Some(checks)) if !checks.is_empty() && checks.len() <= 16 => {
            checks.into_iter().map(|c| (c.policy, c.key)).collect()
        }
        (None, None, Some(_)) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID_REQUEST",
                "`checks` holds 1 to 16 checks",
            );
        }
        _ => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "MISSING_FIELD",
                "give `policy` and `key`, or `checks`: [{\"policy\":…,\"key\":…}]",
            );
        }
    };
    let cost = request.cost.unwrap_or(1);
    if cost == 0 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_COST",
            "`cost` is at least 1",
        );
    }
    let shared = state.current();
    let keys: Vec<String> = checks
        .iter()
        .map(|(_, k)| format!("{API_PREFIX}{k}"))
        .collect();
    let pairs: Vec<(&str, &str, u64)> = checks
        .iter()
        .zip(&keys)
        .map(|((p, _), k)| (p.as_str(), k.as_str(), cost))
        .collect();
    let default = Some(OnStoreError::Local);
    let verdict = match decide(&shared, &pairs, Nanos::MAX, default).await {
        Ok(verdict) => verdict,
        Err(r) => return refusal(r),
    };
    let decided = &verdict.decided;
    let mut body = if multi {
        let decisions: Vec<Value> = decided
            .iter()
            .map(|(p, d)| decision_json(&shared, p, d))
            .collect();
        json!({ "allowed": verdict.all.allowed, "retry_after_ms": ms(verdict.all.retry_after()), "decisions": decisions })
    } else {
        decision_json(&shared, decided[0].0, &decided[0].1)
    };
    body["degraded"] = Value::Bool(verdict.degraded);
    let mut response = Json(body).into_response();
    rate_limit_headers(&shared, decided, response.headers_mut());
    response
}

/// `GET /v1/policies`.
pub(crate) async fn policies(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.current();
    let list: Vec<Value> = shared
        .config
        .policies
        .iter()
        .map(|(name, policy)| {
            let rules = shared.config.rules.get(name).copied().unwrap_or_default();
            let on_store_error = match rules.on_store_error {
                None => "unset (HTTP: local; gRPC: UNAVAILABLE)",
                Some(OnStoreError::Local) => "local",
                Some(OnStoreError::Allow) => "allow",
                Some(OnStoreError::Deny) => "deny",
            };
            let on_state_loss = match rules.on_state_loss {
                weir_redis::OnLoss::Full => "full",
                weir_redis::OnLoss::Empty => "empty",
            };
            json!({ "name": name, "algorithm": policy.algorithm().name(), "spec": policy.to_string(),
                    "ratelimit_policy": shared.fields.get(name).map(|f| f.0.clone()),
                    "on_store_error": on_store_error, "on_state_loss": on_state_loss })
        })
        .collect();
    Json(json!({ "policies": list })).into_response()
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: ready to decide. With Redis down the server still
/// decides (by each policy's `on_store_error`), so it stays ready and says
/// the store is down: taking every instance out of service at once would be
/// the outage the fallback exists to prevent.
pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.current();
    let keys = shared.limiter.len();
    match &shared.remote {
        None => Json(json!({ "ready": true, "store": "memory", "keys": keys })),
        Some(remote) => Json(json!({
            "ready": true, "store": "redis", "store_up": remote.is_up(),
            "degraded": !remote.is_up(), "local_keys": keys,
        })),
    }
    .into_response()
}

/// `GET /metrics`, Prometheus text format.
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut response = state.render_metrics().into_response();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// Admin access: `Authorization: Bearer TOKEN`, compared in constant time.
/// The current config, once the request proves it may use the admin API.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<Arc<Shared>, Response> {
    let shared = state.current();
    let Some(token) = shared.config.admin_token.as_deref() else {
        return Err(error(
            StatusCode::NOT_FOUND,
            "ADMIN_DISABLED",
            "set [server] admin_token to enable admin endpoints",
        ));
    };
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let same = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(shared)
    } else {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "a valid bearer token is required",
        );
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        Err(response)
    }
}

/// `GET /v1/keys/{policy}/{key}`: what a check of cost 1 would decide now.
/// The key is the stored one: `api:…` for the decision API, `header:NAME:…`,
/// `path:PARAM:…` or `peer:…` for gateway identities.
pub(crate) async fn inspect_key(
    State(state): State<Arc<AppState>>,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let shared = match authorize(&state, &headers) {
        Ok(shared) => shared,
        Err(denied) => return denied,
    };
    let peeked = crate::store::peek(&shared, &policy, &key).await;
    match peeked {
        Ok(d) => Json(json!({ "policy": policy, "key": key, "next_check": decision_json(&shared, &policy, &d) })).into_response(),
        Err(r) => refusal(r),
    }
}

/// `DELETE /v1/keys/{policy}/{key}`: forgets the key — which grants it a
/// fresh, full allowance.
pub(crate) async fn reset_key(
    State(state): State<Arc<AppState>>,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let shared = match authorize(&state, &headers) {
        Ok(shared) => shared,
        Err(denied) => return denied,
    };
    let reset = crate::store::reset(&shared, &policy, &key).await;
    match reset {
        Ok(existed) => {
            tracing::info!(policy, key, existed, "admin reset a key");
            Json(
                json!({ "policy": policy, "key": key, "reset": true, "existed": existed,
                         "effect": "the key starts afresh with its full allowance" }),
            )
            .into_response()
        }
        Err(r) => refusal(r),
    }
}
