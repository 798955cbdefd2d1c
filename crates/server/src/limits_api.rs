//! The API of limits managed by API (admin token, internal listener):
//!
//! - `PUT /v1/limits/{policy}/{key}` `{"limit": 20000, "expires_at": "…",
//!   "reason": "…"}` (any of the policy's parameters, or `"unlimited":
//!   true`, or `"multiplier": 2`), `GET` it, `DELETE` it;
//! - `GET /v1/limits?policy=…&prefix=…&after=…&limit=…[&plans=true]`: a page;
//! - `PUT /v1/keys/{key}/plan` `{"plan": "pro", …}`, `GET` it, `DELETE` it.
//!
//! Every change is written where decisions are made (on Redis: in the
//! shared records and their change log, seen by every weir within
//! [`crate::limits_feed::POLL`]), logged as an audit line (who — the
//! token's name — and from where, what, before and after, why) and counted
//! (`weir_limit_changes_total`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use weir_core::MAX_IDENTITY;

use crate::answer::{ApiError, read_body};
use crate::api::{Peer, admin};
use crate::config::Setting;
use crate::limits::{Change, Filter, META, Record, now, scalar, unix};
use crate::state::{AppState, Shared};

/// The largest body of a change.
const MAX_BODY: usize = 16 * 1024;
/// The longest `reason`, in bytes.
const MAX_REASON: usize = 512;
/// The most records in one page.
const MAX_PAGE: usize = 1_000;

/// `PUT /v1/limits/{policy}/{key}`.
pub(crate) async fn set_limit(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (shared, by) = admin(&state, peer, &headers)?;
    let id = (shared.table.find(&policy)).ok_or_else(|| ApiError::UnknownPolicy(policy.clone()))?;
    check_key(&key)?;
    let (fields, meta) = body_fields(body, &shared).await?;
    let texts = (fields.iter())
        .map(|(k, v)| {
            let text = scalar(v).ok_or_else(|| {
                ApiError::InvalidRequest(format!("`{k}`: expected a string, a number or a boolean"))
            })?;
            Ok((k.as_str(), text))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let base = &shared.table.get(id).policy;
    let setting = Setting::parse(texts, base)
        .map_err(|(field, e)| ApiError::InvalidRequest(format!("`{field}`: {e}")))?;
    if !shared.table.managed_room(id, &setting.canonical()) {
        return Err(ApiError::InvalidRequest(format!(
            "{} distinct per-key settings are in use already: give this key one of them, or put it on a plan",
            crate::table::MANAGED
        )));
    }
    let change = Change::Setting {
        policy,
        key,
        record: Some(meta.record(setting, &by)),
    };
    commit(&shared, change, &by, peer).await
}

/// `PUT /v1/keys/{key}/plan`.
pub(crate) async fn set_plan(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (shared, by) = admin(&state, peer, &headers)?;
    check_key(&key)?;
    let (fields, meta) = body_fields(body, &shared).await?;
    let plan = match fields.get("plan") {
        Some(Value::String(plan)) if fields.len() == 1 => plan.clone(),
        _ => {
            return Err(ApiError::InvalidRequest(
                "expected {\"plan\": NAME} (with `expires_at` and `reason` if wanted)".into(),
            ));
        }
    };
    if !shared.table.has_plan(&plan) {
        let known: Vec<&str> = shared
            .config
            .plans
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        return Err(ApiError::InvalidRequest(format!(
            "no plan `{plan}` (configured: {})",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )));
    }
    let change = Change::Plan {
        key,
        record: Some(meta.record(plan.into(), &by)),
    };
    commit(&shared, change, &by, peer).await
}

/// `DELETE /v1/limits/{policy}/{key}`.
pub(crate) async fn remove_limit(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, by) = admin(&state, peer, &headers)?;
    (shared.table.find(&policy)).ok_or_else(|| ApiError::UnknownPolicy(policy.clone()))?;
    let change = Change::Setting {
        policy,
        key,
        record: None,
    };
    commit(&shared, change, &by, peer).await
}

/// `DELETE /v1/keys/{key}/plan`.
pub(crate) async fn remove_plan(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, by) = admin(&state, peer, &headers)?;
    commit(&shared, Change::Plan { key, record: None }, &by, peer).await
}

/// `GET /v1/limits/{policy}/{key}`.
pub(crate) async fn get_limit(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, _) = admin(&state, peer, &headers)?;
    let filter = Filter {
        policy: Some(&policy),
        ..Filter::default()
    };
    one(
        &shared,
        &key,
        &filter,
        &format!("no limit set for `{key}` under `{policy}`"),
    )
}

/// `GET /v1/keys/{key}/plan`.
pub(crate) async fn get_plan(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, _) = admin(&state, peer, &headers)?;
    let filter = Filter {
        plans: true,
        ..Filter::default()
    };
    one(&shared, &key, &filter, &format!("`{key}` is on no plan"))
}

fn one(
    shared: &Shared,
    key: &str,
    filter: &Filter<'_>,
    missing: &str,
) -> Result<Response, ApiError> {
    let found = shared.limits.get(key).and_then(|limits| {
        let shown = filter.shown(key, &limits);
        shown.into_iter().next()
    });
    let found = found.ok_or_else(|| ApiError::NotFound(missing.to_owned()))?;
    Ok(Json(found).into_response())
}

/// `GET /v1/limits`'s query.
#[derive(Debug, Deserialize)]
pub(crate) struct Page {
    policy: Option<String>,
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    plans: bool,
}

/// `GET /v1/limits`: a page of records in key order; `next` is the `after`
/// of the next page (none: the last page).
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Peer(peer): Peer,
    Query(page): Query<Page>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (shared, _) = admin(&state, peer, &headers)?;
    let limit = page.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let filter = Filter {
        prefix: &page.prefix,
        after: page.after.as_deref(),
        policy: page.policy.as_deref(),
        plans: page.plans,
    };
    let (limits, more) = shared.limits.list(&filter, limit);
    let next = more
        .then(|| {
            limits
                .last()
                .and_then(|l| l["key"].as_str())
                .map(str::to_owned)
        })
        .flatten();
    Ok(
        Json(json!({ "limits": limits, "next": next, "total_keys": shared.limits.len() }))
            .into_response(),
    )
}

/// A change's `expires_at` and `reason`.
struct Meta {
    expires_at: Option<i64>,
    reason: String,
}

impl Meta {
    fn record<T>(self, value: T, by: &str) -> Record<T> {
        Record {
            value,
            expires_at: self.expires_at,
            reason: self.reason.into(),
            by: by.into(),
            at: now(),
        }
    }
}

/// A change's body: its setting's fields, and its `expires_at` and
/// `reason`.
async fn body_fields(body: Body, shared: &Shared) -> Result<(Map<String, Value>, Meta), ApiError> {
    let deadline = shared.config.server.limits.body_deadline;
    let bytes = read_body(body, MAX_BODY, deadline).await?;
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(ApiError::InvalidRequest(
            "expected a JSON object, e.g. {\"limit\": 20000, \"expires_at\": \"2026-12-31T23:59:59Z\", \"reason\": \"launch week\"}".into(),
        ));
    };
    let expires_at = match fields.remove("expires_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => {
            let at = unix(&t).ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "`expires_at`: `{t}` is not an RFC 3339 time (e.g. 2026-12-31T23:59:59Z)"
                ))
            })?;
            if at <= now() {
                return Err(ApiError::InvalidRequest(format!(
                    "`expires_at`: {t} has passed"
                )));
            }
            Some(at)
        }
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`expires_at`: expected an RFC 3339 time".into(),
            ));
        }
    };
    let reason = match fields.remove("reason") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(r)) if r.len() <= MAX_REASON => r,
        Some(_) => {
            return Err(ApiError::InvalidRequest(format!(
                "`reason`: expected text of at most {MAX_REASON} bytes"
            )));
        }
    };
    if let Some(field) = fields.keys().find(|k| META.contains(&k.as_str())) {
        return Err(ApiError::InvalidRequest(format!(
            "`{field}` is not set in the body (the path names the policy and key; the server records who and when)"
        )));
    }
    Ok((fields, Meta { expires_at, reason }))
}

/// An identity of 1 to [`MAX_IDENTITY`] bytes.
fn check_key(key: &str) -> Result<(), ApiError> {
    match key.is_empty() || key.len() > MAX_IDENTITY {
        true => Err(ApiError::InvalidRequest(format!(
            "a key is 1 to {MAX_IDENTITY} bytes"
        ))),
        false => Ok(()),
    }
}

/// Makes `change` where decisions are made, then here; logs and counts it;
/// answers it with the record before and after.
async fn commit(
    shared: &Shared,
    change: Change,
    by: &str,
    peer: Option<IpAddr>,
) -> Result<Response, ApiError> {
    let (key, kind) = match &change {
        Change::Setting { key, .. } => (key.as_str(), "limit"),
        Change::Plan { key, .. } => (key.as_str(), "plan"),
    };
    if change.stored().is_some()
        && shared.limits.get(key).is_none()
        && shared.limits.len() >= crate::limits::MAX_LIMITS
    {
        return Err(ApiError::InvalidRequest(crate::limits::Full.to_string()));
    }
    let before = match shared.backend.remote() {
        None => shared
            .limits
            .apply(&change)
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?,
        Some(remote) => {
            let store = remote.available().ok_or_else(|| {
                ApiError::Busy("the store is down: limits managed by API are kept in Redis, so nothing was changed; try again".into())
            })?;
            let before = (store
                .limits_write(&change.field(), change.stored().as_deref())
                .await)
                .map_err(|e| {
                    ApiError::Busy(format!(
                        "the store did not take the change ({e}); nothing was changed"
                    ))
                })?;
            // Here at once; the other weir within the poll.
            let _ = shared.limits.apply(&change);
            before.and_then(|b| Change::from_stored(&change.field(), &b)?.shown())
        }
    };
    let after = change.shown();
    let removed = after.is_none();
    if removed && before.is_none() {
        return Err(ApiError::NotFound(match &change {
            Change::Setting { policy, key, .. } => {
                format!("no limit set for `{key}` under `{policy}`")
            }
            Change::Plan { key, .. } => format!("`{key}` is on no plan"),
        }));
    }
    let show = |v: &Option<Value>| {
        v.as_ref()
            .map_or_else(|| "none".to_owned(), Value::to_string)
    };
    let (policy, reason) = match &change {
        Change::Setting { policy, record, .. } => (
            policy.as_str(),
            record.as_ref().map(|r| r.reason.to_string()),
        ),
        Change::Plan { record, .. } => ("", record.as_ref().map(|r| r.reason.to_string())),
    };
    let admin = peer.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    tracing::info!(
        target: "weir::audit",
        by,
        %admin,
        kind,
        policy,
        key,
        before = %show(&before),
        after = %show(&after),
        reason = reason.unwrap_or_default(),
        "audit: limit changed"
    );
    let label = if removed { "removed" } else { "set" };
    metrics::counter!(crate::metrics::LIMIT_CHANGES, "kind" => kind, "change" => label)
        .increment(1);
    metrics::gauge!(crate::metrics::LIMITS).set(shared.limits.len() as f64);
    Ok(Json(json!({ "before": before, "after": after })).into_response())
}
