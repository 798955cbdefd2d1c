//! Forward-auth: a proxy in front of the service asks weir about each
//! request before it forwards it — nginx (`auth_request`), Traefik
//! (`ForwardAuth`), Caddy (`forward_auth`) and Envoy's HTTP `ext_authz`.
//! weir reads the original request from the headers the proxy sends,
//! matches its own routes, identifies the caller as the route says and
//! decides as the gateway would: `200` with the `RateLimit` fields for the
//! proxy to forward, or the gateway's `429`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, Method, StatusCode};
use weir_core::{Nanos, Policy};
use weir_tower::{Limited, Part, append_fields};

use crate::answer::ApiError;
use crate::backend::{Check, InlineVec};
use crate::config::{OnStoreError, Route};
use crate::engine::Ask;
use crate::metrics::Meters;
use crate::routing::{Identified, Matched, RouteLabel, canonical, host_name, identify, route};
use crate::state::{AppState, Shared};

/// The endpoint, and the prefix under which Envoy's HTTP `ext_authz`
/// appends the original path (`path_prefix = "/v1/auth"`).
pub(crate) const PATH: &str = "/v1/auth";

/// The original request's target: nginx's (as its docs set it), then
/// Traefik's and Caddy's.
const TARGETS: [HeaderName; 2] = [
    HeaderName::from_static("x-original-uri"),
    HeaderName::from_static("x-forwarded-uri"),
];
/// Its method, likewise.
const METHODS: [HeaderName; 2] = [
    HeaderName::from_static("x-original-method"),
    HeaderName::from_static("x-forwarded-method"),
];
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Whether `path` is the endpoint's (`/v1/auth`, `/v1/auth/…`).
pub(crate) fn answers(path: &str) -> bool {
    path.strip_prefix(PATH)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// `/v1/auth` and `/v1/auth/{*original}`, any method.
pub(crate) async fn auth(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let shared = state.current();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let (response, label) = match original(&request) {
        Ok(original) => decide(&shared, original, request, peer).await,
        Err(e) => (e.into_response(), None),
    };
    Meters::answered(
        "forward_auth",
        label.as_deref(),
        Meters::outcome(response.status()),
    );
    let mut response = response;
    if let Some(label) = label {
        response.extensions_mut().insert(RouteLabel(label));
    }
    response
}

/// The request a proxy asks about: its method, its path (canonical,
/// without the query) and its host.
pub(crate) struct Original {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) host: Option<String>,
}

impl Original {
    /// From a method, a target (a path, with a query or not) and a `Host`
    /// value, as sent.
    pub(crate) fn new(method: Method, target: &str, host: Option<&str>) -> Result<Self, ApiError> {
        let path = target.split(['?', '#']).next().unwrap_or_default();
        if !path.starts_with('/') {
            return Err(ApiError::InvalidRequest(format!(
                "the original request's path `{path}` does not start with /"
            )));
        }
        Ok(Self {
            method,
            path: canonical(path)?.into_owned(),
            host: host.map(|h| host_name(h.split(',').next().unwrap_or_default().trim())),
        })
    }
}

/// The one header of `names` the proxy set: two that disagree are refused
/// (a client's own `X-Original-URI` passed on by a proxy that sets
/// `X-Forwarded-Uri` must not choose the route).
fn one_of<'h>(headers: &'h HeaderMap, names: &[HeaderName]) -> Result<Option<&'h str>, ApiError> {
    let mut found: Option<(&HeaderName, &str)> = None;
    for name in names {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            continue;
        };
        let text = value
            .to_str()
            .map_err(|_| ApiError::InvalidRequest(format!("`{name}` is not text")))?;
        if values.next().is_some() {
            return Err(ApiError::InvalidRequest(format!("`{name}` is sent twice")));
        }
        match found {
            Some((first, seen)) if seen != text => {
                return Err(ApiError::InvalidRequest(format!(
                    "`{first}` and `{name}` name different requests: the proxy sets one, remove the other"
                )));
            }
            Some(_) => {}
            None => found = Some((name, text)),
        }
    }
    Ok(found.map(|(_, text)| text))
}

/// The original request as the proxy's headers (or, for Envoy's HTTP
/// ext_authz, the path after [`PATH`]) describe it.
fn original(request: &Request) -> Result<Original, ApiError> {
    let headers = request.headers();
    let method = match one_of(headers, &METHODS)? {
        Some(m) => Method::from_bytes(m.as_bytes())
            .map_err(|_| ApiError::InvalidRequest(format!("`{m}` is not an HTTP method")))?,
        None => request.method().clone(),
    };
    let target = match one_of(headers, &TARGETS)? {
        Some(target) => target,
        None => match request.uri().path().strip_prefix(PATH) {
            Some("") | None => "/",
            Some(path) => path,
        },
    };
    let host =
        match headers.get(X_FORWARDED_HOST) {
            Some(h) => Some(h.to_str().map_err(|_| {
                ApiError::InvalidRequest(format!("`{X_FORWARDED_HOST}` is not text"))
            })?),
            None => (headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok()))
            .or_else(|| request.uri().authority().map(|a| a.as_str())),
        };
    Original::new(method, target, host)
}

/// Decides `original`, asked in `request` (whose headers identify the
/// caller) from `peer`: `200` and its `RateLimit` fields, or the gateway's
/// `429`; a request no route matches is not limited (`200` without
/// fields). With the label of the route it matched.
pub(crate) async fn decide(
    shared: &Arc<Shared>,
    original: Original,
    request: Request,
    peer: Option<SocketAddr>,
) -> (Response, Option<Arc<str>>) {
    let Original { method, path, host } = original;
    let Ok(Matched { route, params }) = route(shared, &method, host.as_deref(), &path) else {
        return (StatusCode::OK.into_response(), None);
    };
    let label = Some(route.label.clone());
    match decide_route(shared, route, &params, request, peer).await {
        Ok(response) => (response, label),
        Err(e) => (e.into_response(), label),
    }
}

/// [`decide`] once the route is found.
async fn decide_route(
    shared: &Arc<Shared>,
    route: &Route,
    params: &[(&str, &str)],
    request: Request,
    peer: Option<SocketAddr>,
) -> Result<Response, ApiError> {
    if let Some(&leased) = (route.policies.iter())
        .find(|&&id| matches!(shared.table.get(id).policy, Policy::Concurrency(_)))
    {
        return Err(ApiError::InvalidConfig(format!(
            "{} holds the concurrency policy `{}`: forward-auth has no end of the request to release it at (give it to a gateway route)",
            route.text,
            shared.table.get(leased).name
        )));
    }
    let Identified {
        ids,
        own_keys,
        key,
        cost,
        client,
        ..
    } = identify(shared, route, params, &request, peer)?;
    drop(request);
    let checks: InlineVec<Check<'_>> = (ids.iter().zip(&own_keys))
        .map(|(&policy, own)| Check {
            policy,
            key: own.as_deref().unwrap_or(&key),
            cost,
        })
        .collect();
    let verdict = shared
        .decide(Ask {
            checks: &checks,
            client,
            max_delay: Nanos::try_from(route.max_wait.as_nanos()).unwrap_or(Nanos::MAX),
            on_store_error: Some(OnStoreError::Local),
            // A route that charges only some answers: probed here, its
            // failures reported by the application (POST /v1/report).
            probe: route.charge_on.is_some(),
        })
        .await?;
    let parts: InlineVec<Part<'_>> = verdict.visible(&shared.table, &ids);
    let style = shared.config.server.headers;
    if let Some(first) = verdict.refusing() {
        let refusing = shared.table.get(ids[first]);
        let refused = Limited {
            policy: &refusing.name,
            retry_after: verdict.retry_after(),
            parts: &parts,
            style,
        };
        let decision = verdict.decisions().nth(first).unwrap_or_default();
        let body = crate::answer::refusal_body(refusing, &decision);
        return Ok(refused.response_with(body));
    }
    let delay = verdict.delay();
    if delay > 0 {
        // Counted in its shapers' queue depth while it waits; the proxy
        // forwards when weir answers.
        let _waiting: InlineVec<_> = (ids.iter())
            .filter_map(|&id| shared.table.get(id).meters.waiting())
            .collect();
        tokio::time::sleep(Duration::from_nanos(delay)).await;
    }
    let mut response = StatusCode::OK.into_response();
    append_fields(style, &parts, response.headers_mut());
    Ok(response)
}
