//! The gateway: match a route, identify the caller, check the route's
//! policies all-or-nothing, then forward (after a shaper's delay) or answer
//! `429` with `Retry-After` and the `RateLimit` fields.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::uri::{Authority, PathAndQuery};
use axum::http::{HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, Method, Version, header};
use ipnet::IpNet;
use weir_core::Nanos;
use weir_tower::{LeaseBody, Limited, Part, append_fields};

use crate::answer::ApiError;
use crate::backend::{Check, InlineVec};
use crate::config::{OnStoreError, Route, TableId, Usage};
use crate::engine::Ask;
use crate::leases::held;
use crate::metrics::Meters;
use crate::routing::RouteLabel;
use crate::routing::{
    Identified, Matched, canonical, client_ip, encode, identify, request_host, route,
};
use crate::state::{AppState, Shared};
use crate::telemetry::Traced;
use crate::upstream;
use crate::usage::{Charge, Metered, Scanner};

/// Whether a header belongs to one connection, not to the message (one
/// comparison of lengths, then of bytes, per header).
fn hop_by_hop(name: &HeaderName) -> bool {
    hop_by_hop_text(name.as_str())
}

/// [`hop_by_hop`] for a name in lower case.
fn hop_by_hop_text(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The router's fallback: [`forward`].
pub(crate) async fn fallback(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let (mut response, label) = forward(&state, peer, request).await;
    if let Some(label) = label {
        response.extensions_mut().insert(RouteLabel(label));
    }
    response
}

/// Every request that is not the API's, from `peer`: a gateway route, or
/// `404`; and the label of the route it matched, to count it under.
pub(crate) async fn forward(
    state: &AppState,
    peer: Option<SocketAddr>,
    request: Request,
) -> (Response, Option<Arc<str>>) {
    let shared = state.current();
    let mut request = request;
    // With the access log: the line's start, and the request's id (the
    // client's `X-Request-Id` when it is a sane one, else a new one, sent
    // on to the upstream).
    let logged = shared
        .config
        .server
        .access_log
        .then(|| Access::start(&mut request, peer, &shared.config.server.trusted_proxies));
    // A copy of the URI (its parts are shared, not copied) for the path to
    // borrow from, as the request moves on.
    let uri = request.uri().clone();
    let path = match canonical(uri.path()) {
        Ok(path) => path,
        Err(e) => {
            let response = e.into_response();
            if let Some(access) = &logged {
                access.log(None, &response);
            }
            return (response, None);
        }
    };
    let host = request_host(&request);
    let Matched { route, params } = match route(&shared, request.method(), host.as_deref(), &path) {
        Ok(found) => found,
        Err(e) => {
            let response = e.into_response();
            if let Some(access) = &logged {
                access.log(None, &response);
            }
            return (response, None);
        }
    };
    if route.upstream.is_none() {
        let error = ApiError::NotFound(format!(
            "{} has no upstream: it answers forward-auth ({}) only",
            route.text,
            crate::forward_auth::PATH
        ));
        let response = error.into_response();
        if let Some(access) = &logged {
            access.log(Some(route), &response);
        }
        return (response, Some(route.label.clone()));
    }
    let traced = Traced::start("weir.gateway");
    if traced.is_recording() {
        traced.set("http.route", route.text.clone());
        traced.set("http.request.method", request.method().to_string());
    }
    // Awaited as it is made: a future bound to a name and then awaited, or
    // built in the awaited expression and moved into a wrapper, takes its
    // room twice in the enclosing future (measured: 6.7 kB instead of 3.8).
    // Traced, it is boxed in a statement of its own.
    let response = match traced.is_recording() {
        false => decide_and_forward(&shared, route, &params, &path, request, peer).await,
        true => {
            let traced = traced.boxed(decide_and_forward(
                &shared, route, &params, &path, request, peer,
            ));
            traced.await
        }
    };
    traced.set(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    if let Some(access) = &logged {
        access.log(Some(route), &response);
    }
    (response, Some(route.label.clone()))
}

/// What the access log says of a request beyond its status, set by
/// [`decide_and_forward`] when `[server] access_log` is on.
#[derive(Debug, Clone)]
struct Logged {
    /// `admitted`, `delayed` or `limited`.
    outcome: &'static str,
    /// The policy that refused it.
    policy: Option<String>,
    /// Decided without the shared store.
    degraded: bool,
    /// The identity as sent (`access_log_identity` only).
    identity: Option<String>,
}

/// One access log line (`[server] access_log`): route, method, status,
/// outcome, refusing policy, latency — and the identity only when
/// `access_log_identity` asks for it. A request refused before it was
/// decided is `invalid` (4xx) or `error` (5xx).
/// A request the access log will have a line for, from its start.
struct Access {
    started: std::time::Instant,
    method: Method,
    /// As sent (the query left out: it may hold secrets).
    path: String,
    client: IpAddr,
    id: HeaderValue,
}

/// The header of a request's id.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

impl Access {
    fn start(request: &mut Request, peer: Option<SocketAddr>, trusted: &[IpNet]) -> Self {
        let sane = |v: &&HeaderValue| {
            (1..=64).contains(&v.len())
                && v.as_bytes()
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
        };
        let id = match request.headers().get(X_REQUEST_ID).filter(sane) {
            Some(id) => id.clone(),
            None => {
                let id = HeaderValue::from_str(&format!("{:016x}", fastrand::u64(..)));
                let id = id.unwrap_or(HeaderValue::from_static("-"));
                request.headers_mut().insert(X_REQUEST_ID, id.clone());
                id
            }
        };
        let unknown = IpAddr::from([0, 0, 0, 0]);
        Self {
            started: std::time::Instant::now(),
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            client: peer.map_or(unknown, |p| client_ip(request.headers(), p.ip(), trusted)),
            id,
        }
    }

    /// One line, info level, target `weir::access`: request id, client,
    /// method, path, route (none: it matched none), status, outcome,
    /// refusing policy, the upstream's status when it answered, latency —
    /// and the identity only when `access_log_identity` asks for it. A
    /// request refused before it was decided is `invalid` (4xx) or `error`
    /// (5xx).
    fn log(&self, route: Option<&Route>, response: &Response) {
        let status = response.status().as_u16();
        let logged = response.extensions().get::<Logged>();
        let outcome = match (logged, status) {
            (Some(l), _) => l.outcome,
            (None, 500..) => "error",
            (None, _) => "invalid",
        };
        let policy = logged.and_then(|l| l.policy.as_deref()).unwrap_or("");
        let degraded = logged.is_some_and(|l| l.degraded);
        let upstream_status = response
            .extensions()
            .get::<Upstreamed>()
            .map_or(0, |_| status);
        // Whole microseconds, as milliseconds: 0.745, never 0.7452099999.
        let latency_ms = self.started.elapsed().as_micros() as f64 / 1000.0;
        let (route, method, path) = (
            route.map_or("", |r| r.text.as_str()),
            &self.method,
            &self.path,
        );
        let (id, client) = (self.id.to_str().unwrap_or("-"), self.client);
        // Set only with `access_log_identity`.
        match logged.and_then(|l| l.identity.as_deref()) {
            Some(identity) => {
                tracing::info!(target: "weir::access", id, %client, %method, path, route, status, outcome, policy, upstream_status, degraded, latency_ms, identity, "access")
            }
            _ => {
                tracing::info!(target: "weir::access", id, %client, %method, path, route, status, outcome, policy, upstream_status, degraded, latency_ms, "access")
            }
        }
    }
}

/// A response's extension: it is the upstream's answer.
#[derive(Debug, Clone, Copy)]
struct Upstreamed;

/// A matched request: identified, decided, then forwarded or refused.
async fn decide_and_forward(
    shared: &Arc<Shared>,
    route: &Route,
    params: &[(&str, &str)],
    path: &str,
    request: Request,
    peer: Option<SocketAddr>,
) -> Response {
    let Identified {
        ids,
        own_keys,
        key,
        cost,
        client,
        identity,
    } = match identify(shared, route, params, &request, peer) {
        Ok(identified) => identified,
        Err(e) => return e.into_response(),
    };
    let checks: InlineVec<Check<'_>> = (ids.iter().zip(&own_keys))
        .map(|(&policy, own)| Check {
            policy,
            key: own.as_deref().unwrap_or(&key),
            cost: (shared.table.get(policy).policy).request_cost(cost, route.concurrency_cost),
        })
        .collect();
    let decided = shared
        .decide(Ask {
            checks: &checks,
            client,
            max_delay: Nanos::try_from(route.max_wait.as_nanos()).unwrap_or(Nanos::MAX),
            on_store_error: Some(OnStoreError::Local),
            probe: route.charge_on.is_some(),
        })
        .await;
    let verdict = match decided {
        Ok(verdict) => verdict,
        Err(refusal) => return ApiError::from(refusal).into_response(),
    };
    let parts: InlineVec<Part<'_>> = verdict.visible(&shared.table, &ids);
    let server = &shared.config.server;
    let logged = |outcome, policy: Option<&str>| Logged {
        outcome,
        policy: policy.map(str::to_owned),
        degraded: verdict.degraded,
        identity: identity.clone(),
    };
    if let Some(first) = verdict.refusing() {
        let refusing = shared.table.get(ids[first]);
        let mut response = Limited {
            policy: &refusing.name,
            retry_after: verdict.retry_after(),
            parts: &parts,
            style: server.headers,
        }
        .response_with(crate::answer::refusal_body(
            refusing,
            &verdict.decisions().nth(first).unwrap_or_default(),
        ));
        if server.access_log {
            let logged = logged("limited", Some(&refusing.name));
            response.extensions_mut().insert(logged);
        }
        return response;
    }
    // Held until the answer's body ends, the client goes away or the
    // upstream fails (this future, or the body, is then dropped).
    let held = held(shared, &key, &ids, &verdict);
    let delay = verdict.delay();
    let logged = server
        .access_log
        .then(|| logged(if delay > 0 { "delayed" } else { "admitted" }, None));
    if delay > 0 {
        // Counted in its shapers' queue depth while it waits. A client that
        // goes away while waiting drops this future: it is never forwarded
        // (its slot is not refunded).
        let _waiting: InlineVec<_> = ids
            .iter()
            .filter_map(|&id| shared.table.get(id).meters.waiting())
            .collect();
        tokio::time::sleep(Duration::from_nanos(delay)).await;
    }
    let charge = route.usage.is_some().then(|| Charge {
        shared: Arc::clone(shared),
        route: Arc::clone(&route.label),
        policies: ids.to_vec(),
        key: key.clone(),
        admitted: cost,
        missing: route.usage_missing,
    });
    // Admitted by a probe: charged once the answer's status is known (or
    // its client has gone away).
    let on_answer = route.charge_on.as_ref().map(|on| OnAnswer {
        shared: Arc::clone(shared),
        route: Arc::clone(&route.label),
        charged: (ids.iter().zip(&own_keys))
            .map(|(&policy, own)| (policy, own.clone().unwrap_or_else(|| key.clone())))
            .collect(),
        cost,
        hangup: on.on_hangup,
    });
    // Boxed: the refusing path (most of a flood) then moves a small future.
    let forwarded = Box::pin(send(shared, route, path, request, peer, charge));
    let mut response = forwarded.await;
    if let (Some(on_answer), Some(on)) = (on_answer, &route.charge_on) {
        on_answer
            .answered(on.matches(response.status().as_u16()))
            .await;
    }
    if let Some(held) = held {
        response = response.map(|body| Body::new(LeaseBody::holding(body, Some(held))));
    }
    append_fields(server.headers, &parts, response.headers_mut());
    if let Some(logged) = logged {
        response.extensions_mut().insert(logged);
    }
    response
}

/// A request a `charge_on` route admitted by a probe: charged its cost
/// after its answer when the status is one the route charges, or — when
/// `charge_on_hangup` says so — when the client went away first (this is
/// dropped unanswered).
struct OnAnswer {
    shared: Arc<Shared>,
    route: Arc<str>,
    /// Each policy and the key it counts.
    charged: Vec<(TableId, String)>,
    cost: u64,
    /// Charge if dropped before the answer.
    hangup: bool,
}

impl OnAnswer {
    /// The answer came: charged when `charged`, before it is sent on (the
    /// client's next attempt sees the charge).
    async fn answered(mut self, charged: bool) {
        self.hangup = false;
        if charged {
            self.charge().await;
        }
    }

    fn charge(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (shared, route) = (Arc::clone(&self.shared), Arc::clone(&self.route));
        let (charged, cost) = (self.charged.clone(), self.cost);
        async move {
            for (policy, key) in &charged {
                Charge::report(&shared, &route, &[*policy], key, cost, cost).await;
            }
        }
    }
}

impl Drop for OnAnswer {
    fn drop(&mut self) {
        if self.hangup {
            tokio::spawn(self.charge());
        }
    }
}

/// Headers by which proxies tell an upstream about the client or the
/// original request (beside `X-Forwarded-For`, `-Host` and `-Proto`, which
/// weir writes itself): from a client that is not a trusted proxy they are
/// removed, never passed on, whatever the upstream believes of them.
fn forwarding(name: &str) -> bool {
    matches!(
        name,
        "forwarded"
            | "x-real-ip"
            | "true-client-ip"
            | "x-client-ip"
            | "cf-connecting-ip"
            | "fastly-client-ip"
            | "x-cluster-client-ip"
            | "x-original-forwarded-for"
            | "x-forwarded-port"
            | "x-forwarded-server"
            | "x-forwarded-prefix"
            | "x-forwarded-method"
            | "x-forwarded-uri"
            | "x-forwarded-ssl"
            | "x-forwarded-scheme"
            | "x-original-url"
            | "x-original-uri"
            | "x-original-method"
            | "x-rewrite-url"
            | "x-host"
    )
}

/// Removes the hop-by-hop headers, and those the `Connection` header names
/// but for those `kept` says weir reads (a route's identity and cost
/// headers: a client cannot have the upstream miss the identity it was
/// charged as).
fn strip_hop_by_hop(headers: &mut HeaderMap, kept: impl Fn(&str) -> bool) {
    // One scan over the names present, which nearly always finds none but
    // an upstream's `Connection: keep-alive`.
    let (mut connection, mut fixed) = (false, false);
    for name in headers.keys() {
        match name == header::CONNECTION {
            true => connection = true,
            false => fixed |= hop_by_hop(name),
        }
    }
    if connection {
        // `Connection`'s values are taken out first (nearly always one,
        // whose copy shares its bytes), then each name they list is removed
        // by its text: nothing is parsed. `close` (not a header name) and
        // the fixed set as written in lower case cost no lookup.
        let mut values = headers.get_all(header::CONNECTION).iter();
        let first = values.next().cloned();
        let more: Vec<HeaderValue> = values.cloned().collect();
        headers.remove(header::CONNECTION);
        for value in first.iter().chain(&more) {
            for listed in value.to_str().unwrap_or_default().split(',') {
                let listed = listed.trim();
                if !listed.eq_ignore_ascii_case("close")
                    && !hop_by_hop_text(listed)
                    && !kept(&listed.to_ascii_lowercase())
                {
                    headers.remove(listed);
                }
            }
        }
    }
    if fixed {
        while let Some(name) = headers.keys().find(|name| hop_by_hop(name)).cloned() {
            headers.remove(name);
        }
    }
}

/// Appends `ip` as text: an IPv4 address octet by octet, without the
/// formatting machinery (it is written on every forwarded request).
fn push_ip(out: &mut smallvec::SmallVec<[u8; 64]>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(digits.format(octet).as_bytes());
            }
        }
        IpAddr::V6(v6) => out.extend_from_slice(v6.to_string().as_bytes()),
    }
}

async fn send(
    shared: &Shared,
    route: &Route,
    path: &str,
    request: Request,
    peer: Option<SocketAddr>,
    charge: Option<Charge>,
) -> Response {
    let (mut parts, body) = request.into_parts();
    // The upstream gets the path that was matched, encoded once, and the
    // query as sent.
    let path = encode(path);
    let target = match (parts.uri.path_and_query(), parts.uri.query()) {
        // Nothing decoded, nothing encoded: the target as sent, shared.
        (Some(sent), _) if sent.path() == path => Ok(sent.clone()),
        (_, None) => PathAndQuery::try_from(&*path),
        (_, Some(query)) => PathAndQuery::try_from([&path, "?", query].concat()),
    };
    // Origin-form: the connection is to the route's upstream already.
    let uri = route.upstream.as_ref();
    let (Some(uri), Some(authority), Ok(target)) = (uri, uri.and_then(Uri::authority), target)
    else {
        tracing::warn!(route = %route.text, "cannot build the upstream URI");
        return ApiError::Upstream(route.text.clone()).into_response();
    };
    let secure = parts.extensions.get::<crate::answer::Secure>().is_some();
    // HTTP/2 names the host in the URI (`:authority`), not in a header.
    if !parts.headers.contains_key(header::HOST)
        && let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(header::HOST, host);
    }
    parts.uri = Uri::from(target);
    parts.version = Version::HTTP_11;
    upstream_headers(shared, route, &mut parts.headers, peer, secure);
    // A body without a length is cut at the bound as it streams.
    let limit = usize::try_from(route.max_body).unwrap_or(usize::MAX);
    let body = match hyper::body::Body::is_end_stream(&body) {
        true => body,
        false => Body::new(http_body_util::Limited::new(body, limit)),
    };
    let started = std::time::Instant::now();
    let traced = Traced::start("weir.upstream");
    if traced.is_recording() {
        traced.set("server.address", authority.to_string());
    }
    let request = Request::from_parts(parts, body);
    // As in `forward`.
    let answered = match (charge, &route.usage, traced.is_recording()) {
        (Some(charge), Some(usage), _) => {
            let metered = metered(route, uri, authority, request, charge, usage.clone());
            traced.boxed(metered).await
        }
        (_, _, false) => call_upstream(route, uri, authority, request)
            .await
            .map(client_response),
        (_, _, true) => traced
            .boxed(call_upstream(route, uri, authority, request))
            .await
            .map(client_response),
    };
    match &answered {
        Ok(Ok(response)) => {
            traced.set(
                "http.response.status_code",
                i64::from(response.status().as_u16()),
            );
        }
        Ok(Err(e)) => traced.error(e.to_string()),
        Err(_) => traced.error("timed out".to_owned()),
    }
    drop(traced);
    let failure = match answered {
        Ok(Ok(response)) => {
            Meters::upstream(&route.text, started, true);
            let (mut parts, body) = response.into_parts();
            // Clients are answered in HTTP/1.1, whatever the upstream spoke.
            parts.version = Version::HTTP_11;
            strip_hop_by_hop(&mut parts.headers, |_| false);
            parts.extensions.insert(Upstreamed);
            return Response::from_parts(parts, body);
        }
        Ok(Err(e)) => e,
        Err(_) => {
            Meters::upstream(&route.text, started, false);
            tracing::warn!(route = %route.text, timeout = ?route.timeout, "upstream timed out");
            return ApiError::UpstreamTimeout(route.timeout).into_response();
        }
    };
    // The client's side: its body was too large, too slow or cut short.
    match client_fault(&*failure) {
        Some(ClientFault::TooLarge) => return ApiError::BodyTooLarge(limit).into_response(),
        Some(ClientFault::Body) => {
            tracing::debug!(route = %route.text, error = %failure, "client body failed");
            return ApiError::BadBody(failure.to_string()).into_response();
        }
        None => {}
    }
    Meters::upstream(&route.text, started, false);
    tracing::warn!(route = %route.text, error = %failure, "upstream unavailable");
    ApiError::Upstream(route.text.clone()).into_response()
}

/// The headers the upstream gets: hop-by-hop ones stripped, `Host` the
/// upstream's (the client's goes on as `X-Forwarded-Host`), the forwarding
/// headers weir's own (a trusted proxy's chain extended with the peer), and
/// what a metered route needs to read its usage.
fn upstream_headers(
    shared: &Shared,
    route: &Route,
    headers: &mut HeaderMap,
    peer: Option<SocketAddr>,
    secure: bool,
) {
    strip_hop_by_hop(headers, |name| route.reads(name));
    // The client's host goes on as X-Forwarded-Host (never the client's
    // own: a request without `Host` is refused before it gets here); the
    // upstream's is Host.
    match headers.remove(header::HOST) {
        Some(host) => headers.insert(X_FORWARDED_HOST, host),
        None => headers.remove(X_FORWARDED_HOST),
    };
    if let Some(host) = &route.host {
        headers.insert(header::HOST, host.clone());
    }
    // What an untrusted peer says about addresses is replaced, never
    // passed on; a trusted proxy's chain is extended with the peer.
    let trusted = peer.is_some_and(|p| {
        let nets = &shared.config.server.trusted_proxies;
        nets.iter().any(|net| net.contains(&p.ip()))
    });
    // Written on the stack, then copied once into its field.
    let mut chain = smallvec::SmallVec::<[u8; 64]>::new();
    match trusted {
        true => {
            for hop in headers.get_all(X_FORWARDED_FOR).iter() {
                if let Ok(hop) = hop.to_str() {
                    chain.extend_from_slice(hop.as_bytes());
                    chain.extend_from_slice(b", ");
                }
            }
        }
        // Looked up only when one is there: a scan of the few names sent.
        false if headers.keys().any(|name| forwarding(name.as_str())) => {
            let sent: Vec<HeaderName> = headers
                .keys()
                .filter(|name| forwarding(name.as_str()))
                .cloned()
                .collect();
            for name in sent {
                headers.remove(name);
            }
        }
        false => {}
    }
    // Inserting replaces every value the client sent.
    match peer {
        Some(peer) => {
            push_ip(&mut chain, peer.ip());
            match HeaderValue::from_bytes(&chain) {
                Ok(value) => headers.insert(X_FORWARDED_FOR, value),
                Err(_) => headers.remove(X_FORWARDED_FOR),
            };
        }
        None => {
            headers.remove(X_FORWARDED_FOR);
        }
    }
    let proto = if secure { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    // A usage header may come as a trailer, which HTTP/1.1 sends only to
    // who asks for them.
    match route.usage {
        Some(Usage::Header(_)) => {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        // The usage is read from the answer's JSON as it passes: asked for
        // uncompressed, whatever the client accepts, so that a client
        // cannot turn the charge off with `Accept-Encoding: gzip`.
        Some(Usage::Json(_)) => {
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        None => {}
    }
}

/// What an upstream call answered: the response (its body as the client
/// will read it), the failure, or the route's timeout.
type Answered =
    Result<Result<http::Response<Body>, upstream::Failure>, tokio::time::error::Elapsed>;

fn client_response(
    answered: Result<http::Response<upstream::Answer>, upstream::Failure>,
) -> Result<http::Response<Body>, upstream::Failure> {
    answered.map(|response| response.map(Body::new))
}

/// A metered route's upstream call, in a task of its own: a client that
/// hangs up before the answer's head is charged all the same, when the
/// answer ends (its body is then read without the client, as
/// [`Metered`] reads the rest of an answer the client left mid-stream).
async fn metered(
    route: &Route,
    uri: &Uri,
    authority: &Authority,
    request: Request,
    charge: Charge,
    usage: Usage,
) -> Answered {
    let (uri, authority, timeout) = (uri.clone(), authority.clone(), route.timeout);
    let ca = route.upstream_ca.clone();
    let call = tokio::spawn(async move {
        let upstream = upstream::Upstream {
            uri: &uri,
            authority: &authority,
            ca: ca.as_deref(),
        };
        let answered = tokio::time::timeout(timeout, upstream::send(upstream, request));
        answered.await.map(|answered| {
            answered.map(|response| {
                let (parts, body) = response.into_parts();
                let scanner = Scanner::new(&usage, &parts.headers);
                let body = Body::new(Metered::new(body, scanner, charge, timeout));
                http::Response::from_parts(parts, body)
            })
        })
    });
    match call.await {
        Ok(answered) => answered,
        // The task panicked (a bug): an upstream failure to the client.
        Err(e) => Ok(Err(e.into())),
    }
}

/// The upstream call within the route's timeout (made outside the async
/// fn that awaits it, so that the call's future is not held twice).
fn call_upstream<'a>(
    route: &'a Route,
    uri: &'a Uri,
    authority: &'a Authority,
    request: Request,
) -> tokio::time::Timeout<
    impl Future<Output = Result<http::Response<upstream::Answer>, upstream::Failure>> + 'a,
> {
    let upstream = upstream::Upstream {
        uri,
        authority,
        ca: route.upstream_ca.as_deref(),
    };
    tokio::time::timeout(route.timeout, upstream::send(upstream, request))
}

/// What went wrong on the client's side of a forwarded request.
enum ClientFault {
    TooLarge,
    Body,
}

/// Finds, in an upstream call's error, a fault of the client's body.
fn client_fault(error: &(dyn std::error::Error + 'static)) -> Option<ClientFault> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return Some(ClientFault::TooLarge);
        }
        if e.is::<crate::answer::BodyTimedOut>() {
            return Some(ClientFault::Body);
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            // The client's connection broke while its body was read, or the
            // body being sent failed (`is_user`: the request body is the
            // only user code of an upstream call) — cut short of its
            // length, or a chunk that does not parse.
            if hyper.is_incomplete_message() || hyper.is_body_write_aborted() || hyper.is_user() {
                return Some(ClientFault::Body);
            }
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_lists_are_removed() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "Keep-Alive, X-Secret"),
            ("connection", " x-other ,close"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("content-type", "text/plain"),
            ("x-kept", "3"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers, |_| false);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-kept"]);
        // The fixed set without `Connection`, and `Connection` alone.
        for first in [("transfer-encoding", "chunked"), ("connection", "close")] {
            let mut headers = HeaderMap::new();
            for (name, value) in [first, ("x-kept", "3")] {
                headers.append(name, HeaderValue::from_static(value));
            }
            strip_hop_by_hop(&mut headers, |_| false);
            assert_eq!(headers.keys().collect::<Vec<_>>(), ["x-kept"]);
        }
    }

    #[test]
    fn addresses_are_written_as_std_writes_them() {
        for text in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let mut out = smallvec::SmallVec::from_slice(b"x, ");
            push_ip(&mut out, ip);
            assert_eq!(out.as_slice(), format!("x, {ip}").as_bytes());
        }
    }
}
