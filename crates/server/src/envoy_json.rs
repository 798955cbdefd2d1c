//! `POST /json` (`[server] envoy_json = true`): the Envoy rate limit
//! service's call as JSON, as envoyproxy/ratelimit answers it on its HTTP
//! port — the request and response messages in protobuf's JSON mapping,
//! `200` when every descriptor is within its limit, `429` when one is over,
//! `400` for a request that cannot be decided.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::answer::read_body;
use crate::state::AppState;

/// The largest request body.
const MAX_BODY: usize = 64 * 1024;

/// A request in protobuf's JSON mapping: lowerCamelCase names, and the
/// proto names accepted as well; a field it does not have is an error that
/// names it (as protobuf's JSON parser answers), never read as missing.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    limit: Option<JsonLimit>,
    #[serde(alias = "hits_addend")]
    hits_addend: Option<JsonNumber>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonLimit {
    #[serde(default, alias = "requests_per_unit")]
    requests_per_unit: u32,
    #[serde(default)]
    unit: String,
}

/// A 64-bit number: protobuf's JSON writes it as a string, and reads both.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonNumber {
    Number(u64),
    Text(String),
}

impl JsonRequest {
    fn into_request(self) -> Result<RateLimitRequest, String> {
        let descriptors = self
            .descriptors
            .into_iter()
            .map(|d| {
                let hits_addend = match d.hits_addend {
                    None => None,
                    Some(JsonNumber::Number(n)) => Some(n),
                    Some(JsonNumber::Text(t)) => Some(
                        t.parse()
                            .map_err(|_| format!("`hitsAddend` \"{t}\" is not a whole number"))?,
                    ),
                };
                let limit = d
                    .limit
                    .map(|l| {
                        let unit =
                            Unit::from_str_name(&l.unit.to_ascii_uppercase()).ok_or_else(|| {
                                format!("`limit.unit` \"{}\" is not a unit (SECOND … YEAR)", l.unit)
                            })?;
                        Ok::<_, String>(RateLimitOverride {
                            requests_per_unit: l.requests_per_unit,
                            unit: unit.into(),
                        })
                    })
                    .transpose()?;
                Ok(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit,
                    hits_addend: hits_addend.map(|value| UInt64Value { value }),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: self.hits_addend,
        })
    }
}

/// A response in protobuf's JSON mapping (enums by name, durations as
/// `"1.5s"`, empty fields left out).
fn to_json(response: &RateLimitResponse) -> Value {
    let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = json!({ "code": code(s.code) });
            if let Some(limit) = &s.current_limit {
                let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
                let mut current = json!({ "requestsPerUnit": limit.requests_per_unit, "unit": unit.as_str_name() });
                if !limit.name.is_empty() {
                    current["name"] = json!(limit.name);
                }
                status["currentLimit"] = current;
            }
            if s.limit_remaining > 0 {
                status["limitRemaining"] = json!(s.limit_remaining);
            }
            if let Some(d) = &s.duration_until_reset {
                status["durationUntilReset"] = json!(duration(d.seconds, d.nanos));
            }
            status
        })
        .collect();
    let mut out = json!({ "overallCode": code(response.overall_code), "statuses": statuses });
    if !response.response_headers_to_add.is_empty() {
        out["responseHeadersToAdd"] = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
    }
    out
}

/// A duration as protobuf's JSON writes it: seconds, with 3, 6 or 9
/// fractional digits when there are any.
fn duration(seconds: i64, nanos: i32) -> String {
    match nanos {
        0 => format!("{seconds}s"),
        n if n % 1_000_000 == 0 => format!("{seconds}.{:03}s", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{seconds}.{:06}s", n / 1_000),
        n => format!("{seconds}.{n:09}s"),
    }
}

#[derive(Debug, Serialize)]
struct Problem {
    error: &'static str,
    detail: String,
}

fn bad(detail: String) -> Response {
    let body = Problem {
        error: "INVALID_REQUEST",
        detail,
    };
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// `POST /json`.
pub(crate) async fn json(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let shared = state.current();
    let deadline = shared.config.server.limits.body_deadline;
    let bytes = match read_body(body, MAX_BODY, deadline).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    let request = match serde_json::from_slice::<JsonRequest>(&bytes) {
        Ok(request) => request.into_request(),
        Err(e) => Err(format!("not a RateLimitRequest in JSON: {e}")),
    };
    let request = match request {
        Ok(request) => request,
        Err(e) => return bad(e),
    };
    match crate::envoy::answer_now(&state, &request).await {
        Ok(response) => {
            let status = match Code::try_from(response.overall_code) {
                Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
                Ok(Code::Ok) => StatusCode::OK,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, Json(to_json(&response))).into_response()
        }
        Err(status) => bad(status.message().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_protobuf_json_writes_them() {
        assert_eq!(duration(1, 0), "1s");
        assert_eq!(duration(0, 500_000_000), "0.500s");
        assert_eq!(duration(2, 1_000), "2.000001s");
        assert_eq!(duration(0, 1), "0.000000001s");
    }
}

#[cfg(test)]
mod fields {
    use super::*;

    /// A misspelt field is named, not read as a missing one.
    #[test]
    fn an_unknown_field_is_named() {
        let error = serde_json::from_str::<JsonRequest>(
            r#"{"domian":"shop","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("unknown field `domian`"), "{error}");
        assert!(error.contains("domain"), "what is valid: {error}");
        let known = r#"{"domain":"shop","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"3"}]}"#;
        assert!(serde_json::from_str::<JsonRequest>(known).is_ok());
    }
}
