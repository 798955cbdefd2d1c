//! What the HTTP faces answer: typed errors that turn themselves into
//! responses, and the serde bodies of decisions. The `429` itself is built by
//! `weir_tower::Limited`, shared with the tower layer and the Envoy service.

use axum::Json;
use axum::body::{Body, Bytes, to_bytes};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use weir_core::algo::LeaseId;
use weir_core::{CheckError, CostError, Decision, Nanos};

use crate::backend::Undecided;
use crate::table::Entry;

/// Why an HTTP request got no decision.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The backend could not decide it.
    Refused(Undecided),
    /// No policy of that name.
    UnknownPolicy(String),
    /// A body over the limit.
    BodyTooLarge(usize),
    /// Headers over the limit.
    HeadersTooLarge(usize),
    /// Not JSON.
    Malformed(String),
    /// JSON, but not a valid request.
    InvalidRequest(String),
    /// A cost of 0 (a standing report is not for the decision API).
    InvalidCost,
    /// JSON without the fields a request needs.
    MissingField(&'static str),
    /// No route.
    NotFound(String),
    /// A path that could be read two ways.
    BadPath(String),
    /// A route's path, but not its method: `allow` lists the methods.
    MethodNotAllowed { allow: String, detail: String },
    /// The request carries no usable identity.
    MissingIdentity(String),
    /// Admin endpoints are off.
    AdminDisabled,
    /// A bad or missing admin token.
    Unauthorized,
    /// This client created its share of new keys: wait this long.
    NewKeys(Nanos),
    /// Too many failed admin attempts from this client: wait this long.
    AdminThrottled(std::time::Duration),
    /// A configuration that does not parse or validate (every error).
    InvalidConfig(String),
    /// The upstream of this route (its text) could not be reached.
    Upstream(String),
    /// The upstream did not answer in time.
    UpstreamTimeout(std::time::Duration),
    /// The client's request body failed (cut short, too slow).
    BadBody(String),
    /// The request body did not arrive whole within `[server]
    /// body_deadline`.
    BodyDeadline(std::time::Duration),
    /// A JSON Web Token that does not verify (why, never its content).
    InvalidToken(String),
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2), or an HTTP/2 one
    /// without `:authority` or `Host`.
    MissingHost,
    /// Every slot of a bounded, costly service (the playground) is taken.
    Busy(String),
    /// The client's address is on `[server] deny`.
    Denied,
    /// A fault of weir's own (logged; its text never reaches the client).
    Internal,
}

impl From<Undecided> for ApiError {
    fn from(refusal: Undecided) -> Self {
        match refusal {
            Undecided::NewKeys(wait) => Self::NewKeys(wait),
            refusal => Self::Refused(refusal),
        }
    }
}

impl From<CheckError> for ApiError {
    fn from(e: CheckError) -> Self {
        Self::Refused(Undecided::Invalid(e))
    }
}

/// A request body of at most `max` bytes, whole within `deadline`: a
/// client that drips its body a byte at a time, each byte inside `[server]
/// body_timeout`, is still cut off at the deadline (`408`, and the
/// connection closes with the body unread).
pub(crate) async fn read_body(
    body: Body,
    max: usize,
    deadline: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let read = match tokio::time::timeout(deadline, to_bytes(body, max)).await {
        Ok(read) => read,
        Err(_) => return Err(ApiError::BodyDeadline(deadline)),
    };
    read.map_err(|e| {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(c) = cause {
            if c.is::<http_body_util::LengthLimitError>() {
                return ApiError::BodyTooLarge(max);
            }
            cause = c.source();
        }
        ApiError::BadBody(e.to_string())
    })
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: String,
    /// Only for store failures: the request was not decided by the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<bool>,
}

impl ApiError {
    /// What the client is told, for a log line.
    pub(crate) fn detail(&self) -> String {
        self.parts().2
    }

    pub(crate) fn parts(&self) -> (StatusCode, &'static str, String) {
        use StatusCode as S;
        match self {
            Self::Refused(Undecided::Invalid(e)) => {
                let (status, code) = match e {
                    CheckError::UnknownPolicy(_) => (S::NOT_FOUND, "UNKNOWN_POLICY"),
                    CheckError::Cost {
                        error: CostError::Zero,
                        ..
                    } => (S::UNPROCESSABLE_ENTITY, "INVALID_COST"),
                    CheckError::Cost {
                        error: CostError::NoLeases,
                        ..
                    } => (S::UNPROCESSABLE_ENTITY, "NOT_A_CONCURRENCY_POLICY"),
                    CheckError::Cost {
                        error: CostError::NoReports,
                        ..
                    } => (S::UNPROCESSABLE_ENTITY, "NO_REPORTS"),
                    CheckError::Cost { .. } => (S::UNPROCESSABLE_ENTITY, "COST_NEVER_FITS"),
                    CheckError::KeyTooLong { .. } => (S::UNPROCESSABLE_ENTITY, "KEY_TOO_LONG"),
                    CheckError::DuplicateCheck { .. } => {
                        (S::UNPROCESSABLE_ENTITY, "DUPLICATE_CHECK")
                    }
                    _ => (S::UNPROCESSABLE_ENTITY, "INVALID_REQUEST"),
                };
                (status, code, e.to_string())
            }
            Self::Refused(Undecided::Full { max }) => (
                S::SERVICE_UNAVAILABLE,
                "LIMITER_FULL",
                format!("the limiter holds its maximum of {max} keys and none is idle; new keys are refused until some are"),
            ),
            Self::Refused(Undecided::Unsupported(m)) => {
                (S::UNPROCESSABLE_ENTITY, "UNSUPPORTED", (*m).to_owned())
            }
            Self::Refused(Undecided::Unavailable { .. }) => (
                S::SERVICE_UNAVAILABLE,
                "STORE_UNAVAILABLE",
                "the store is unavailable: a policy's on_store_error is \"deny\", or the operation needs the store".into(),
            ),
            Self::UnknownPolicy(name) => (
                S::NOT_FOUND,
                "UNKNOWN_POLICY",
                format!("unknown policy `{name}`"),
            ),
            Self::BodyTooLarge(max) => (
                S::PAYLOAD_TOO_LARGE,
                "BODY_TOO_LARGE",
                format!("at most {max} bytes"),
            ),
            Self::HeadersTooLarge(size) => (
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "HEADERS_TOO_LARGE",
                format!("{size} bytes of headers; at most {}", MAX_HEADER_BYTES),
            ),
            Self::Malformed(m) => (S::BAD_REQUEST, "MALFORMED_JSON", m.clone()),
            Self::InvalidRequest(m) => (S::UNPROCESSABLE_ENTITY, "INVALID_REQUEST", m.clone()),
            Self::InvalidCost => (
                S::UNPROCESSABLE_ENTITY,
                "INVALID_COST",
                "`cost` is at least 1".into(),
            ),
            Self::MissingField(m) => (S::UNPROCESSABLE_ENTITY, "MISSING_FIELD", (*m).to_owned()),
            Self::NotFound(m) => (S::NOT_FOUND, "NOT_FOUND", m.clone()),
            Self::BadPath(m) => (S::BAD_REQUEST, "BAD_PATH", m.clone()),
            Self::MethodNotAllowed { detail, .. } => {
                (S::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", detail.clone())
            }
            Self::MissingIdentity(m) => (S::BAD_REQUEST, "MISSING_IDENTITY", m.clone()),
            Self::AdminDisabled => (
                S::NOT_FOUND,
                "ADMIN_DISABLED",
                "set [server] admin_token to enable admin endpoints".into(),
            ),
            Self::Unauthorized => (
                S::UNAUTHORIZED,
                "UNAUTHORIZED",
                "a valid bearer token is required".into(),
            ),
            Self::NewKeys(_) | Self::Refused(Undecided::NewKeys(_)) => (
                S::TOO_MANY_REQUESTS,
                "NEW_KEYS_LIMITED",
                "this address created its share of new identities ([server] new_keys_per_ip)".into(),
            ),
            Self::AdminThrottled(wait) => (
                S::TOO_MANY_REQUESTS,
                "ADMIN_THROTTLED",
                format!(
                    "too many failed admin attempts from this address; retry in {} s",
                    wait.as_secs().max(1)
                ),
            ),
            Self::InvalidConfig(m) => (S::UNPROCESSABLE_ENTITY, "CONFIG_INVALID", m.clone()),
            // The route, never the upstream's address (that is logged).
            Self::Upstream(route) => (
                S::BAD_GATEWAY,
                "UPSTREAM_UNAVAILABLE",
                format!("the upstream of route `{route}` could not be reached"),
            ),
            Self::UpstreamTimeout(t) => (
                S::GATEWAY_TIMEOUT,
                "UPSTREAM_TIMEOUT",
                format!("the upstream did not answer within {t:?}"),
            ),
            Self::BadBody(m) => (S::BAD_REQUEST, "BAD_BODY", m.clone()),
            Self::BodyDeadline(t) => (
                S::REQUEST_TIMEOUT,
                "BODY_TIMEOUT",
                format!(
                    "the request body did not arrive whole within {} s ([server] body_deadline)",
                    t.as_secs_f64()
                ),
            ),
            Self::InvalidToken(why) => (
                S::UNAUTHORIZED,
                "INVALID_TOKEN",
                format!("the token does not verify: {why}"),
            ),
            Self::MissingHost => (
                S::BAD_REQUEST,
                "MISSING_HOST",
                "an HTTP/1.1 request names its host in a `Host` header".into(),
            ),
            Self::Busy(what) => (S::SERVICE_UNAVAILABLE, "BUSY", what.clone()),
            Self::Denied => (
                S::FORBIDDEN,
                "DENIED",
                "this client's address is denied ([server] deny)".into(),
            ),
            Self::Internal => (
                S::INTERNAL_SERVER_ERROR,
                "INTERNAL",
                "weir could not answer this request; the fault is in its log".into(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error, detail) = self.parts();
        let unavailable = matches!(self, Self::Refused(Undecided::Unavailable { .. }));
        let body = ErrorBody {
            error,
            detail,
            allowed: unavailable.then_some(false),
            degraded: unavailable.then_some(true),
        };
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Self::AdminThrottled(wait) = &self {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(wait.as_secs().max(1)),
            );
        }
        if let Self::NewKeys(wait) = &self {
            let seconds = weir_tower::retry_after_seconds(*wait);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Self::MethodNotAllowed { allow, .. } = &self {
            if let Ok(allow) = HeaderValue::try_from(allow.as_str()) {
                headers.insert(header::ALLOW, allow);
            }
        }
        if let Self::InvalidToken(_) = &self {
            let challenge = HeaderValue::from_static("Bearer error=\"invalid_token\"");
            headers.insert(header::WWW_AUTHENTICATE, challenge);
        } else if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Nanoseconds as whole milliseconds, rounded up.
pub(crate) fn ms(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000)
}

/// One policy's decision, as the decision API answers it.
#[derive(Debug, Serialize)]
pub(crate) struct DecisionBody<'a> {
    pub(crate) allowed: bool,
    pub(crate) policy: &'a str,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) retry_after_ms: u64,
    pub(crate) reset_ms: u64,
    pub(crate) delay_ms: u64,
    /// A shadow policy that would have refused this request.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) shadow_limited: bool,
    /// The lease an admission by a concurrency policy took: release it with
    /// `POST /v1/release` when the work ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease: Option<String>,
    /// The key is banned (its policy's penalty): refused until `banned_until`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) banned: bool,
    /// When the ban ends, as an RFC 3339 UTC time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) banned_until: Option<String>,
}

/// A `429`'s body for `entry`'s refusal `d`: the policy's own (made once),
/// or, for a banned key, the same with `"banned": true` and
/// `"banned_until"`.
pub(crate) fn refusal_body(entry: &Entry, d: &Decision) -> Body {
    match time_after(d.banned) {
        None => Body::from(entry.shown.refused.clone()),
        Some(until) => Body::from(
            serde_json::json!({
                "error": "RATE_LIMITED",
                "policy": entry.name,
                "banned": true,
                "banned_until": until,
            })
            .to_string(),
        ),
    }
}

/// The time `wait` ns from now, as an RFC 3339 UTC time (`None` for 0).
pub(crate) fn time_after(wait: Nanos) -> Option<String> {
    let wait = i64::try_from(wait).ok().filter(|&w| w > 0)?;
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_nanos(wait));
    Some(at.unwrap_or(jiff::Timestamp::MAX).to_string())
}

/// A lease as clients see it: its identity in hex, marked `m` when the
/// in-process fallback took it (the shared store was down), so that its
/// release goes where it lives.
pub(crate) fn lease_token(lease: LeaseId, degraded: bool) -> String {
    let mark = if degraded { "m" } else { "" };
    format!("{mark}{lease:016x}")
}

/// A lease from its token: the identity, and whether the fallback holds it.
pub(crate) fn read_lease(token: &str) -> Option<(LeaseId, bool)> {
    let (hex, local) = match token.strip_prefix('m') {
        Some(hex) => (hex, true),
        None => (token, false),
    };
    let valid = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    let id = LeaseId::from_str_radix(hex, 16).ok().filter(|_| valid)?;
    (id != 0).then_some((id, local))
}

impl<'a> DecisionBody<'a> {
    pub(crate) fn new(entry: &'a Entry, d: &Decision, degraded: bool) -> Self {
        let limit = entry.shown.limit(degraded);
        Self {
            allowed: d.allowed,
            policy: &entry.name,
            limit,
            remaining: d.remaining.min(limit),
            retry_after_ms: ms(d.retry_after),
            reset_ms: ms(d.reset),
            delay_ms: ms(d.delay),
            shadow_limited: false,
            lease: d.lease.map(|id| lease_token(id, degraded)),
            banned: d.banned > 0,
            banned_until: time_after(d.banned),
        }
    }
}

/// A request's extension: it came over TLS (the gateway then says
/// `X-Forwarded-Proto: https`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Secure;

/// A request body's next piece did not come in time (the listener's
/// `body_deadline`).
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {0:?}")]
pub(crate) struct BodyTimedOut(pub(crate) std::time::Duration);

/// The most header bytes (names and values) a request may carry.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The largest gRPC request message a call may send (tonic's own default
/// is 4 MiB): a rate limit request's 64 descriptors, an ext_authz request's
/// 32 KiB of headers, with room to spare. Past it: `OUT_OF_RANGE`, nothing
/// decided.
pub(crate) const MAX_GRPC_MESSAGE: usize = 256 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_tokens_read_back() {
        for (id, degraded) in [(1, false), (u64::MAX, true), (0xf000_0000_0000_0001, false)] {
            assert_eq!(read_lease(&lease_token(id, degraded)), Some((id, degraded)));
        }
        for bad in [
            "",
            "0000000000000000",
            "m12",
            "+000000000000001",
            "x0000000000000001",
        ] {
            assert_eq!(read_lease(bad), None, "{bad}");
        }
    }
}
