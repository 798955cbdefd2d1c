//! The decision API, admin, health and metrics endpoints.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use serde::{Deserialize, Serialize};
use weir_core::Nanos;
use weir_tower::{Part, append_fields};

use crate::answer::{ApiError, DecisionBody, ms, read_body, read_lease};
use crate::backend::{API_SCOPE, Check, InlineVec, scoped_key};
use crate::config::{Identity, OnStoreError, TableId};
use crate::engine::Ask;
use crate::state::{AppState, Shared};
use weir_core::algo::LeaseId;
use weir_redis::LeaseOp;

/// The client's address, when the listener knows it.
pub(crate) struct Peer(pub(crate) Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let info = parts.extensions.get::<ConnectInfo<SocketAddr>>();
        Ok(Self(info.map(|c| c.0.ip())))
    }
}

/// The largest decision request body.
const MAX_BODY: usize = 64 * 1024;

/// The most checks in one request.
const MAX_CHECKS: usize = 16;

/// The scope of decision API keys: they live apart from gateway identities.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: Option<String>,
    key: Option<String>,
    checks: Option<Vec<OneCheck>>,
    cost: Option<u64>,
    /// Answer as the check would be, charging nothing (docs/SPEC.md's probe).
    #[serde(default)]
    probe: bool,
    /// Where the keys come from, as a route names it (`peer`,
    /// `header:NAME`, …): the keys are then the route's, so that an
    /// application reports what a forward-auth route admitted (`api`, the
    /// decision API's own, by default).
    source: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OneCheck {
    policy: String,
    key: String,
}

#[derive(Debug, Serialize)]
struct Single<'a> {
    #[serde(flatten)]
    decision: DecisionBody<'a>,
    degraded: bool,
}

#[derive(Debug, Serialize)]
struct Multi<'a> {
    allowed: bool,
    retry_after_ms: u64,
    decisions: Vec<DecisionBody<'a>>,
    degraded: bool,
}

/// A request body, read.
struct Read {
    /// (policy, key as the client sent it).
    named: Vec<(String, String)>,
    cost: u64,
    /// `checks` was given: the answer lists every decision.
    multi: bool,
    probe: bool,
    source: Option<String>,
}

/// The request's (policy, client key) pairs, or what is wrong with it.
fn read(bytes: &[u8]) -> Result<Read, ApiError> {
    let request: CheckRequest = serde_json::from_slice(bytes).map_err(|e| match e.is_data() {
        true => ApiError::InvalidRequest(e.to_string()),
        false => ApiError::Malformed(format!(
            "the body is not a JSON object such as {{\"policy\":\"api\",\"key\":\"842\"}} ({e})"
        )),
    })?;
    let multi = request.checks.is_some();
    let probe = request.probe;
    let checks = match (request.policy, request.key, request.checks) {
        (Some(policy), Some(key), None) => vec![(policy, key)],
        (None, None, Some(checks)) if (1..=MAX_CHECKS).contains(&checks.len()) => {
            checks.into_iter().map(|c| (c.policy, c.key)).collect()
        }
        (None, None, Some(_)) => {
            return Err(ApiError::InvalidRequest(format!(
                "`checks` holds 1 to {MAX_CHECKS} checks"
            )));
        }
        _ => {
            return Err(ApiError::MissingField(
                "give `policy` and `key`, or `checks`: [{\"policy\":…,\"key\":…}]",
            ));
        }
    };
    // An empty or blank identity would be one bucket shared by every
    // client that sends one: refused, as the gateway refuses it.
    if let Some((i, _)) = checks
        .iter()
        .enumerate()
        .find(|(_, (_, key))| key.trim().is_empty())
    {
        let which = match multi {
            true => format!("`checks[{i}].key`"),
            false => "`key`".to_owned(),
        };
        return Err(ApiError::MissingIdentity(format!(
            "{which} is empty or blank: name the client, e.g. \"seller-842\""
        )));
    }
    match request.cost.unwrap_or(1) {
        0 => Err(ApiError::InvalidCost),
        cost => Ok(Read {
            named: checks,
            cost,
            multi,
            probe,
            source: request.source,
        }),
    }
}

/// A decision request's body: what was asked, resolved to policy ids and
/// stored keys.
struct Asked {
    ids: Vec<TableId>,
    keys: Vec<String>,
    cost: u64,
    multi: bool,
    probe: bool,
}

impl Asked {
    /// One check per (policy, key), each of the request's cost.
    fn checks(&self) -> Vec<Check<'_>> {
        self.ids
            .iter()
            .zip(&self.keys)
            .map(|(&policy, key)| Check {
                policy,
                key,
                cost: self.cost,
            })
            .collect()
    }

    /// The answer: one decision, or (`checks` was given) every one with
    /// the request's outcome and its longest wait.
    fn answer(
        &self,
        bodies: Vec<DecisionBody<'_>>,
        allowed: bool,
        retry_after: Nanos,
        degraded: bool,
    ) -> Result<Response, ApiError> {
        if self.multi {
            return Ok(Json(Multi {
                allowed,
                retry_after_ms: ms(retry_after),
                decisions: bodies,
                degraded,
            })
            .into_response());
        }
        let decision = bodies
            .into_iter()
            .next()
            .ok_or(ApiError::InvalidRequest("give `policy` and `key`".into()))?;
        Ok(Json(Single { decision, degraded }).into_response())
    }
}

async fn read_request(shared: &Shared, body: Body) -> Result<Asked, ApiError> {
    let deadline = shared.config.server.limits.body_deadline;
    let bytes = read_body(body, MAX_BODY, deadline).await?;
    let Read {
        named,
        cost,
        multi,
        probe,
        source,
    } = read(&bytes)?;
    let scope = match source.as_deref() {
        None | Some(API_SCOPE) => API_SCOPE.to_owned(),
        Some(source) => Identity::parse(source).map(|s| s.scope()).map_err(|e| {
            ApiError::InvalidRequest(format!("`source`: {e}; or `api`, the decision API's"))
        })?,
    };
    let mut ids = Vec::with_capacity(named.len());
    let mut keys = Vec::with_capacity(named.len());
    let mut resolver = shared.resolver();
    for (policy, key) in &named {
        let id = shared
            .table
            .find(policy)
            .ok_or_else(|| ApiError::UnknownPolicy(policy.clone()))?;
        if shared.table.get(id).grants.is_some() {
            return Err(ApiError::InvalidRequest(format!(
                "policy `{policy}` hands out fleet grants: it is served over the Rate Limit Quota Service only"
            )));
        }
        // An overridden identity is decided by its override.
        ids.push(resolver.resolve(id, key));
        keys.push(scoped_key(&scope, key)?);
    }
    Ok(Asked {
        ids,
        keys,
        cost,
        multi,
        probe,
    })
}

/// `POST /v1/report`: usage known only after the fact (the same bodies as
/// `/v1/check`), always charged — possibly into debt — and answered `200`
/// with each policy's standing after the charge.
pub(crate) async fn report(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    body: Body,
) -> Result<Response, ApiError> {
    let shared = state.current();
    let asked = read_request(&shared, body).await?;
    let checks = asked.checks();
    // A report stores a key as a check does: the same guard.
    let decided = shared.report(&checks, peer).await?;
    let bodies = asked
        .ids
        .iter()
        .zip(&decided)
        .map(|(id, d)| DecisionBody::new(shared.table.get(*id), d, false))
        .collect();
    let retry = decided.iter().map(|d| d.retry_after).max().unwrap_or(0);
    asked.answer(bodies, true, retry, false)
}

/// `POST /v1/check`: one policy, or several all-or-nothing.
pub(crate) async fn check(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    body: Body,
) -> Result<Response, ApiError> {
    let shared = state.current();
    let asked = read_request(&shared, body).await?;
    let verdict = shared
        .decide(Ask {
            checks: &asked.checks(),
            client: peer,
            max_delay: Nanos::MAX,
            on_store_error: Some(OnStoreError::Local),
            probe: asked.probe,
        })
        .await?;
    let degraded = verdict.degraded;
    let bodies = asked
        .ids
        .iter()
        .zip(verdict.decisions())
        .enumerate()
        .map(|(i, (id, d))| {
            let body = DecisionBody::new(shared.table.get(*id), &d, degraded);
            match verdict.shadow_limited(i) {
                // Admitted: the shadow policy only says it would have refused.
                true => DecisionBody {
                    allowed: true,
                    shadow_limited: true,
                    ..body
                },
                false => body,
            }
        })
        .collect();
    let retry = verdict.retry_after();
    let mut response = asked.answer(bodies, verdict.all.allowed, retry, degraded)?;
    let parts: InlineVec<Part<'_>> = verdict.visible(&shared.table, &asked.ids);
    let style = shared.config.server.headers;
    append_fields(style, &parts, response.headers_mut());
    Ok(response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRequest {
    policy: String,
    key: String,
    lease: String,
}

/// `POST /v1/release`: frees a concurrency policy's lease when the work
/// ends; `allowed` says whether it was live (a lease released twice, or
/// expired, or of another key or policy, frees nothing), with the standing
/// after it.
pub(crate) async fn release(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    on_lease(&state, body, LeaseOp::Release).await
}

/// `POST /v1/renew`: extends a live lease to the policy's full lease from
/// now, for work that outlasts it.
pub(crate) async fn renew(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    on_lease(&state, body, LeaseOp::Renew).await
}

async fn on_lease(
    state: &AppState,
    body: Body,
    op: fn(LeaseId) -> LeaseOp,
) -> Result<Response, ApiError> {
    let shared = state.current();
    let deadline = shared.config.server.limits.body_deadline;
    let bytes = read_body(body, MAX_BODY, deadline).await?;
    let request: LeaseRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::InvalidRequest(format!(
            "expected {{\"policy\":…,\"key\":…,\"lease\":…}} with the lease a check answered ({e})"
        ))
    })?;
    let id = shared
        .table
        .find(&request.policy)
        .ok_or_else(|| ApiError::UnknownPolicy(request.policy.clone()))?;
    let id = shared.resolve(id, &request.key);
    let (lease, local) = read_lease(&request.lease).ok_or_else(|| {
        ApiError::InvalidRequest(format!(
            "`lease` {:?} is not a lease this API answered (16 hex digits)",
            request.lease.chars().take(40).collect::<String>()
        ))
    })?;
    let key = scoped_key(API_SCOPE, &request.key)?;
    let decision = shared.on_lease(id, &key, op(lease), local).await?;
    let entry = shared.table.get(id);
    let body = DecisionBody::new(entry, &decision, local);
    Ok(Json(Single {
        decision: body,
        degraded: local,
    })
    .into_response())
}

#[derive(Debug, Serialize)]
struct PolicyBody<'a> {
    name: &'a str,
    algorithm: &'static str,
    spec: String,
    ratelimit_policy: &'a str,
    on_store_error: String,
    on_state_loss: String,
    shadow: bool,
    /// The gateway routes that check it, as written.
    routes: Vec<&'a str>,
    /// The Envoy descriptor rules that name it (`domain: entries`).
    descriptors: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Policies<'a> {
    policies: Vec<PolicyBody<'a>>,
}

/// `GET /v1/policies`.
pub(crate) async fn policies(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.current();
    let config = &shared.config;
    let list: Vec<PolicyBody<'_>> = shared
        .table
        .iter()
        .map(|(id, e)| PolicyBody {
            name: &e.name,
            algorithm: e.policy.algorithm().name(),
            spec: e.policy.to_string(),
            ratelimit_policy: e.shown.fields.field.to_str().unwrap_or_default(),
            on_store_error: e.on_store_error.map_or_else(
                || "unset (HTTP: local; gRPC: UNAVAILABLE)".to_owned(),
                |r| r.to_string(),
            ),
            on_state_loss: e.on_state_loss.to_string(),
            shadow: e.shadow,
            routes: config
                .routes
                .iter()
                .filter(|r| r.policies.contains(&id))
                .map(|r| r.text.as_str())
                .collect(),
            descriptors: config
                .descriptors
                .iter()
                .filter(|d| d.policy == Some(id))
                .map(|d| {
                    let entries: Vec<String> = d
                        .entries
                        .iter()
                        .map(|(k, v)| v.as_ref().map_or_else(|| k.clone(), |v| format!("{k}={v}")))
                        .collect();
                    let report = if d.report { " (report)" } else { "" };
                    format!("{}: [{}]{report}", d.domain, entries.join(", "))
                })
                .collect(),
        })
        .collect();
    Json(Policies { policies: list }).into_response()
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

#[derive(Debug, Serialize)]
struct Ready {
    ready: bool,
    store: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_keys: Option<usize>,
    /// On a cluster, each master: its slots go to Redis while it is up.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes: Vec<NodeBody>,
    /// Through Sentinel: the master in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    master: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct NodeBody {
    node: String,
    up: bool,
    slots: usize,
}

/// A cluster's masters, as [`NodeBody`]s.
pub(crate) fn nodes(remote: &crate::breaker::Remote) -> Vec<NodeBody> {
    remote
        .nodes()
        .into_iter()
        .map(|(node, up, slots)| NodeBody { node, up, slots })
        .collect()
}

/// `GET /readyz`: ready to decide. With Redis down the server still
/// decides (by each policy's `on_store_error`), so it stays ready and says
/// the store is down: taking every instance out of service at once would be
/// the outage the fallback exists to prevent.
pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.current();
    let keys = shared.backend.local().len();
    let mut ready = match shared.backend.remote() {
        None => Ready {
            ready: true,
            store: "memory",
            keys: Some(keys),
            store_up: None,
            degraded: None,
            local_keys: None,
            nodes: Vec::new(),
            master: None,
        },
        Some(remote) => Ready {
            ready: true,
            store: "redis",
            keys: None,
            store_up: Some(remote.is_up()),
            degraded: None,
            local_keys: Some(keys),
            nodes: nodes(remote),
            master: remote.master(),
        },
    };
    if let Some(remote) = shared.backend.remote() {
        ready.degraded = Some(!remote.is_up() || ready.nodes.iter().any(|n| !n.up));
    }
    Json(ready).into_response()
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

/// The current config and the named policy, once the request proves it may
/// use the admin API (`Authorization: Bearer TOKEN`, compared in constant
/// time).
/// Failed attempts are throttled per client: after
/// [`crate::state::ADMIN_FAILURES`] in a minute, its admin requests get
/// `429` until the minute is over, whatever the token.
pub(crate) fn authorize(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    policy: &str,
) -> Result<(Arc<Shared>, TableId), ApiError> {
    let shared = authenticate(state, peer, headers)?;
    let id = shared
        .table
        .find(policy)
        .ok_or_else(|| ApiError::UnknownPolicy(policy.to_owned()))?;
    Ok((shared, id))
}

/// The current config, once the request proves it may use the admin API.
fn authenticate(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
) -> Result<Arc<Shared>, ApiError> {
    admin(state, peer, headers).map(|(shared, _)| shared)
}

/// The current config and the name of the admin token the request gives
/// (`admin` for `admin_token`; `[server.admin_tokens]` name the others),
/// once it proves it may use the admin API.
pub(crate) fn admin(
    state: &AppState,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
) -> Result<(Arc<Shared>, String), ApiError> {
    let shared = state.current();
    let server = &shared.config.server;
    let tokens: Vec<(&str, &str)> = (server.admin_token.iter())
        .map(|t| ("admin", t.as_str()))
        .chain(
            server
                .admin_tokens
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str())),
        )
        .collect();
    if tokens.is_empty() {
        return Err(ApiError::AdminDisabled);
    }
    // One client per /64 (`[server] ipv6_prefix`), as for every per-address bound.
    let peer = peer.map(|ip| shared.config.server.limits.client(ip));
    // RFC 7235: the scheme is case-insensitive.
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    let same = |token: &str| {
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    };
    // Every token is compared, whichever matches.
    let matched = tokens
        .iter()
        .fold(None, |found, (name, token)| match same(token) {
            true => Some(*name),
            false => found,
        });
    // The right token is never locked out, whoever shares its address
    // (a NAT, a /64): the throttle answers only the wrong ones, after the
    // same constant-time comparison, so it neither locks the admin out nor
    // tells a guesser more than a refusal would. Guessing is bounded by the
    // token itself (16 characters at least, checked at config).
    if let Some(name) = matched {
        let name = name.to_owned();
        return Ok((shared, name));
    }
    if let Some(wait) = peer.and_then(|ip| state.admin_locked(ip)) {
        return Err(ApiError::AdminThrottled(wait));
    }
    if let Some(ip) = peer {
        state.admin_failed(ip);
    }
    let peer = peer.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    tracing::warn!(%peer, "admin authentication failed");
    Err(ApiError::Unauthorized)
}

/// `?source=` of the key endpoints: where the identity came from.
#[derive(Debug, Deserialize)]
pub(crate) struct KeySource {
    source: Option<String>,
}

/// The scopes a stored key starts with (`api:acme`, `header:x-id:acme`).
const SCOPES: [&str; 8] = [
    "api:", "peer:", "envoy:", "header:", "path:", "query:", "cookie:", "route:",
];

/// The stored key an admin request addresses, and the policy table entry
/// that holds it (an overridden identity's override). `key` is the identity
/// as a client sent it, through the decision API unless `source` names
/// another (`header:NAME`, `path:PARAM`, `peer`); a key that already starts
/// with a scope (`api:acme`, as the dashboard lists them) is the stored key.
fn addressed(
    shared: &Shared,
    id: TableId,
    key: &str,
    source: Option<&str>,
) -> Result<(TableId, String), ApiError> {
    let stored = match source {
        Some(API_SCOPE) => scoped_key(API_SCOPE, key)?,
        // A gateway source, scoped as a route scopes it.
        Some(source) => {
            let scope = Identity::parse(source).map(|s| s.scope()).map_err(|e| {
                ApiError::InvalidRequest(format!("`source`: {e}; or `api`, the decision API's"))
            })?;
            scoped_key(&scope, key)?
        }
        None if SCOPES.iter().any(|s| key.starts_with(s)) => key.to_owned(),
        None => scoped_key(API_SCOPE, key)?,
    };
    let id = sent_identity(&stored).map_or(id, |sent| shared.resolve(id, sent));
    Ok((id, stored))
}

/// The identity as sent, of a stored key: what overrides are keyed by.
fn sent_identity(stored: &str) -> Option<&str> {
    match stored.split_once(':') {
        Some(("header" | "path" | "query" | "cookie", rest)) => {
            rest.split_once(':').map(|(_, v)| v)
        }
        Some(("api" | "peer", v)) => Some(v),
        _ => None,
    }
}

#[derive(Debug, Serialize)]
struct Inspected<'a> {
    policy: &'a str,
    key: &'a str,
    /// The key in the store: the identity under its source's scope.
    stored_key: &'a str,
    /// Whether the key has state; a key never seen (or a typo) is decided
    /// as new: its full allowance.
    exists: bool,
    next_check: DecisionBody<'a>,
}

/// `GET /v1/keys/{policy}/{key}[?source=…]`: whether the key exists, and
/// what a check of cost 1 would decide now. The key is an identity as a
/// client sent it (see [`addressed`]), or a stored key.
pub(crate) async fn inspect_key(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    Query(KeySource { source }): Query<KeySource>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, id) = authorize(&state, peer, &headers, &policy)?;
    let (id, stored) = addressed(&shared, id, &key, source.as_deref())?;
    let (decision, exists) = shared.peek(id, &stored).await?;
    let entry = shared.table.get(id);
    Ok(Json(Inspected {
        policy: &entry.name,
        key: &key,
        stored_key: &stored,
        exists,
        next_check: DecisionBody::new(entry, &decision, false),
    })
    .into_response())
}

#[derive(Debug, Serialize)]
struct Reset<'a> {
    policy: &'a str,
    key: &'a str,
    stored_key: &'a str,
    reset: bool,
    existed: bool,
    /// Unbanning: whether the key had a ban (in force, or remembered).
    #[serde(skip_serializing_if = "Option::is_none")]
    lifted: Option<bool>,
    effect: &'static str,
}

/// `DELETE /v1/keys/{policy}/{key}[?source=…]`: forgets the key — which
/// grants it a fresh, full allowance.
pub(crate) async fn reset_key(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    Query(KeySource { source }): Query<KeySource>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, id) = authorize(&state, peer, &headers, &policy)?;
    let (id, stored) = addressed(&shared, id, &key, source.as_deref())?;
    let existed = shared.reset(id, &stored).await?;
    tracing::info!(policy, key = stored, existed, "admin reset a key");
    Ok(Json(Reset {
        policy: &policy,
        key: &key,
        stored_key: &stored,
        reset: true,
        existed,
        lifted: None,
        effect: "the key starts afresh with its full allowance",
    })
    .into_response())
}

/// `?policy=…&key=…[&source=…]` of `/v1/explain`.
#[derive(Debug, Deserialize)]
pub(crate) struct ExplainQuery {
    policy: String,
    key: String,
    source: Option<String>,
}

#[derive(Debug, Serialize)]
struct Explained<'a> {
    policy: &'a str,
    key: &'a str,
    stored_key: &'a str,
    /// The gateway routes that check this policy.
    routes: Vec<&'a str>,
    /// The entry that decides this identity instead of the policy, if one
    /// does: an `[[overrides]]` table's (`NAME@override-N`), a plan's
    /// (`NAME@plan:PLAN`) or a per-key limit's (`NAME@SETTING`).
    #[serde(skip_serializing_if = "Option::is_none")]
    r#override: Option<&'a str>,
    /// The per-key limit (`"limit"`) or plan (`"plan"`) set through the API
    /// that applies, with who set it, why and until when.
    #[serde(flatten)]
    managed: serde_json::Map<String, serde_json::Value>,
    unlimited: bool,
    /// The parameters in force (the override's, when one applies).
    parameters: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    penalty: Option<String>,
    shadow: bool,
    exists: bool,
    /// Under a balance below zero (usage reported past the limit): every
    /// check is refused until it is paid back.
    in_debt: bool,
    banned: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    banned_until: Option<String>,
    /// What a check of cost 1 would decide now.
    next_check: DecisionBody<'a>,
}

/// `GET /v1/explain?policy=…&key=…[&source=…]` (admin token): why a key is
/// limited — the routes that check the policy, the override that decides
/// the identity, the parameters and penalty in force, and the key's
/// standing (remaining, reset, in debt, banned): nothing is charged.
pub(crate) async fn explain(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Query(query): Query<ExplainQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, base) = authorize(&state, peer, &headers, &query.policy)?;
    let (id, stored) = addressed(&shared, base, &query.key, query.source.as_deref())?;
    let managed = match sent_identity(&stored).and_then(|s| shared.resolver().applied(base, s)) {
        Some(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let ((next, exists), (standing, _)) =
        tokio::try_join!(shared.peek(id, &stored), shared.peek_cost(id, &stored, 0))?;
    let entry = shared.table.get(id);
    let routes = (shared.config.routes.iter())
        .filter(|r| r.policies.contains(&base))
        .map(|r| r.text.as_str())
        .collect();
    Ok(Json(Explained {
        policy: &entry.name,
        key: &query.key,
        stored_key: &stored,
        routes,
        r#override: (id != base).then_some(entry.stored_as.as_str()),
        managed,
        unlimited: entry.unlimited,
        parameters: entry.policy.to_string(),
        penalty: entry.penalty.map(|p| p.to_string()),
        shadow: entry.shadow,
        exists,
        in_debt: !standing.allowed && standing.banned == 0,
        banned: next.banned > 0,
        banned_until: crate::answer::time_after(next.banned),
        next_check: DecisionBody::new(entry, &next, false),
    })
    .into_response())
}

/// `DELETE /v1/bans/{policy}/{key}[?source=…]`: lifts the key's ban,
/// forgets its level (the next ban is the first again) and gives it its
/// full allowance — what unbanning a locked-out customer needs (a ban lifted
/// over a spent allowance would begin again at the next attempt). Logged,
/// with the admin's address.
pub(crate) async fn lift_ban(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    Query(KeySource { source }): Query<KeySource>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, id) = authorize(&state, peer, &headers, &policy)?;
    if shared.table.get(id).penalty.is_none() {
        return Err(ApiError::InvalidRequest(format!(
            "policy `{policy}` has no penalty: it bans no one (give it `penalty = {{ ban = \"15m\" }}`)"
        )));
    }
    let (id, stored) = addressed(&shared, id, &key, source.as_deref())?;
    let lifted = shared.lift_ban(id, &stored).await?;
    let existed = shared.reset(id, &stored).await?;
    let admin = peer.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    tracing::info!(policy, key = stored, lifted, %admin, "admin lifted a ban");
    Ok(Json(Reset {
        policy: &policy,
        key: &key,
        stored_key: &stored,
        reset: true,
        existed,
        lifted: Some(lifted),
        effect: "the key is no longer banned, starts afresh with its full allowance, and its next ban is the first",
    })
    .into_response())
}

#[derive(Debug, Serialize)]
struct ReloadBody {
    reloaded: &'static str,
    hash: String,
}

/// `POST /v1/admin/reload`: reads the configuration file again and serves
/// it if it is valid; a file with errors changes nothing and is answered
/// with every error.
pub(crate) async fn reload(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authenticate(&state, peer, &headers)?;
    let reloading = state.clone();
    let result = tokio::task::spawn_blocking(move || reloading.reload_from_source())
        .await
        .map_err(|e| ApiError::InvalidConfig(e.to_string()))?;
    let reloaded = match result.map_err(ApiError::InvalidConfig)? {
        crate::reload::Reloaded::Applied => "applied",
        crate::reload::Reloaded::Unchanged => "unchanged",
    };
    Ok(Json(ReloadBody {
        reloaded,
        hash: format!("{:016x}", state.current().hash),
    })
    .into_response())
}
