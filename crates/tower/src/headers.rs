//! The HTTP answer of a rate limiter, built in one place for every face (the
//! tower layer, the gateway, the Envoy service): `Retry-After` and the IETF
//! draft `RateLimit-Policy` / `RateLimit` structured fields
//! (draft-ietf-httpapi-ratelimit-headers), e.g. `"api";q=10;w=5` and
//! `"api";r=0;t=1`, and the `429` with its JSON body.

use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use smallvec::SmallVec;
use weir_limiter::{Decision, Nanos, Policy};

const SECOND: Nanos = 1_000_000_000;

// Names made once, at compile time (`from_static` in a `const`).
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

fn ceil_seconds(ns: Nanos) -> u64 {
    ns.div_ceil(SECOND)
}

/// `Retry-After` in whole seconds, rounded up and never 0 (a client told
/// "retry after 0" would retry at once, before it may).
pub fn retry_after_seconds(retry_after: Nanos) -> u64 {
    ceil_seconds(retry_after).max(1)
}

/// A policy's quota for `RateLimit-Policy`: `q` units per `w` whole
/// seconds (rounded up, at least 1), from [`Policy::quota`].
pub fn quota(policy: &Policy) -> (u64, u64) {
    let (q, w) = policy.quota();
    (q, ceil_seconds(w).max(1))
}

/// Text made for a field: on the stack up to 64 bytes (an answer's
/// `RateLimit` for a policy or two), copied once into its `HeaderValue`.
type FieldText = SmallVec<[u8; 64]>;

/// A structured-field string: `"` and `\` escaped, anything outside
/// printable ASCII replaced by `?` (sf-string cannot carry it).
fn sf_string(out: &mut FieldText, name: &str) {
    out.push(b'"');
    // A name with nothing to escape (nearly all) is copied whole.
    let plain = |b: &u8| matches!(b, b' '..=b'~') && !matches!(b, b'"' | b'\\');
    match name.as_bytes().iter().all(plain) {
        true => out.extend_from_slice(name.as_bytes()),
        false => {
            for c in name.chars() {
                match c {
                    '"' | '\\' => {
                        out.push(b'\\');
                        out.push(c as u8);
                    }
                    ' '..='~' => out.push(c as u8),
                    _ => out.push(b'?'),
                }
            }
        }
    }
    out.push(b'"');
}

fn value(text: &[u8]) -> HeaderValue {
    // Only printable ASCII is ever produced.
    HeaderValue::from_bytes(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Appends `n` in decimal.
fn push_number(out: &mut FieldText, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `RateLimit-Policy: "name";q=Q;w=W` for `policy`; for a concurrency
/// limit, `"name";q=L;qu="concurrent-requests"` (its quota is in flight at
/// once, not per window).
pub fn rate_limit_policy(name: &str, policy: &Policy) -> HeaderValue {
    let (q, w) = quota(policy);
    let mut out = FieldText::new();
    sf_string(&mut out, name);
    out.extend_from_slice(b";q=");
    push_number(&mut out, q);
    match policy {
        Policy::Concurrency(_) => out.extend_from_slice(br#";qu="concurrent-requests""#),
        _ => {
            out.extend_from_slice(b";w=");
            push_number(&mut out, w);
        }
    }
    value(&out)
}

/// One policy's part in an answer.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// The policy's name.
    pub name: &'a str,
    /// Its `RateLimit-Policy` item (made once by [`rate_limit_policy`]).
    pub field: &'a HeaderValue,
    /// Its limit (`q`): `remaining` is never reported above it.
    pub limit: u64,
    /// What it decided.
    pub decision: Decision,
}

/// Which rate-limit header fields an answer carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` (the default).
    #[default]
    Ietf,
    /// The older `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds), of the most restrictive policy.
    XRateLimit,
    /// Both.
    Both,
    /// None (`Retry-After` is still sent with a `429`).
    None,
}

impl HeaderStyle {
    /// How many fields an answer in this style carries.
    fn field_count(self) -> usize {
        match self {
            Self::Ietf => 2,
            Self::XRateLimit => 3,
            Self::Both => 5,
            Self::None => 0,
        }
    }
}

impl std::str::FromStr for HeaderStyle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ietf" => Ok(Self::Ietf),
            "x-ratelimit" => Ok(Self::XRateLimit),
            "both" => Ok(Self::Both),
            "none" => Ok(Self::None),
            _ => Err(format!(
                "`{s}` is not valid (valid: \"ietf\", \"x-ratelimit\", \"both\", \"none\")"
            )),
        }
    }
}

/// The rate-limit fields of these parts in `style`.
pub fn fields_in(style: HeaderStyle, parts: &[Part<'_>]) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(5);
    each_field(style, parts, |name, value| out.push((name, value)));
    out
}

/// Appends the rate-limit fields of these parts in `style` to `headers`
/// (no vector on the way: this runs on every answer).
pub fn append_fields(style: HeaderStyle, parts: &[Part<'_>], headers: &mut HeaderMap) {
    headers.reserve(style.field_count());
    each_field(style, parts, |name, value| {
        headers.append(name, value);
    });
}

fn each_field(
    style: HeaderStyle,
    parts: &[Part<'_>],
    mut emit: impl FnMut(HeaderName, HeaderValue),
) {
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let [policies, states] = fields(parts);
        emit(policies.0, policies.1);
        emit(states.0, states.1);
    }
    // The most restrictive policy: the fewest left, then the longest reset.
    let tightest = parts.iter().min_by_key(|p| {
        (
            p.decision.remaining.min(p.limit),
            std::cmp::Reverse(p.decision.reset),
        )
    });
    if let (HeaderStyle::XRateLimit | HeaderStyle::Both, Some(p)) = (style, tightest) {
        emit(X_RATELIMIT_LIMIT, HeaderValue::from(p.limit));
        emit(
            X_RATELIMIT_REMAINING,
            HeaderValue::from(p.decision.remaining.min(p.limit)),
        );
        emit(
            X_RATELIMIT_RESET,
            HeaderValue::from(ceil_seconds(p.decision.reset)),
        );
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of these parts, as one
/// list item per policy: `"api";r=R;t=T` with `t` the reset in whole
/// seconds, rounded up.
pub fn fields(parts: &[Part<'_>]) -> [(HeaderName, HeaderValue); 2] {
    // One policy (the common case): its item as made once, shared.
    let policies = match parts {
        [one] => one.field.clone(),
        _ => {
            let mut policies = Vec::with_capacity(parts.len() * 24);
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    policies.extend_from_slice(b", ");
                }
                policies.extend_from_slice(part.field.as_bytes());
            }
            value(&policies)
        }
    };
    let mut states = FieldText::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            states.extend_from_slice(b", ");
        }
        sf_string(&mut states, part.name);
        states.extend_from_slice(b";r=");
        push_number(&mut states, part.decision.remaining.min(part.limit));
        states.extend_from_slice(b";t=");
        push_number(&mut states, ceil_seconds(part.decision.reset));
    }
    [(RATELIMIT_POLICY, policies), (RATELIMIT, value(&states))]
}

/// A refused request's answer: `429`, `Retry-After`, `Cache-Control:
/// no-store`, the `RateLimit` fields and `{"error":"RATE_LIMITED","policy":…}`.
#[derive(Debug, Clone, Copy)]
pub struct Limited<'a> {
    /// The policy named in the body: the first that refused.
    pub policy: &'a str,
    /// The earliest wait after which the request could be admitted: the
    /// largest among the refusing policies.
    pub retry_after: Nanos,
    /// Every policy of the request.
    pub parts: &'a [Part<'a>],
    /// Which rate-limit fields to send.
    pub style: HeaderStyle,
}

impl Limited<'_> {
    /// The fields every refusal has, whatever the policies.
    fn fixed(&self) -> [(HeaderName, HeaderValue); 3] {
        [
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                RETRY_AFTER,
                HeaderValue::from(retry_after_seconds(self.retry_after)),
            ),
        ]
    }

    /// The header fields of the answer, in order.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = self.fixed().to_vec();
        headers.extend(fields_in(self.style, self.parts));
        headers
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        error_body("RATE_LIMITED", self.policy)
    }

    /// The whole `429` response.
    pub fn response<B: From<String>>(&self) -> Response<B> {
        self.response_with(B::from(self.body()))
    }

    /// The `429` response with `body`: [`Limited::body`], made once (per
    /// policy, say) by a caller that answers many.
    pub fn response_with<B>(&self, body: B) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        // Room for all the fields at once (growing the map as they come
        // reallocated it twice), and no more.
        let headers = response.headers_mut();
        headers.reserve(3 + self.style.field_count());
        // Appended one by one: no vector of all the fields on the way.
        for (name, value) in self.fixed() {
            headers.append(name, value);
        }
        each_field(self.style, self.parts, |name, value| {
            headers.append(name, value);
        });
        response
    }
}

/// `{"error":CODE,"policy":NAME}`.
pub fn error_body(code: &str, policy: &str) -> String {
    let mut body = Vec::with_capacity(24 + code.len() + policy.len());
    body.extend_from_slice(br#"{"error":""#);
    body.extend_from_slice(code.as_bytes());
    body.extend_from_slice(br#"","policy":"#);
    let _ = serde_json::to_writer(&mut body, policy);
    body.push(b'}');
    String::from_utf8(body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_the_answer() {
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(SECOND), 1);
        assert_eq!(retry_after_seconds(SECOND + 1), 2);
        let concurrency = Policy::parse("concurrency limit=3 lease=10m").unwrap();
        assert_eq!(
            rate_limit_policy("jobs", &concurrency),
            r#""jobs";q=3;qu="concurrent-requests""#
        );
        let p = |s| quota(&Policy::parse(s).unwrap());
        assert_eq!(p("token-bucket capacity=10 rate=2/s"), (10, 5));
        assert_eq!(p("fixed-window limit=120 window=1m"), (120, 60));
        assert_eq!(p("sliding-log limit=5 window=1500ms"), (5, 2));
        assert_eq!(p("leaky-bucket rate=2/s queue=9"), (10, 5));
        assert_eq!(p("gcra burst=1 rate=1/ms"), (1, 1));
        let policy = Policy::parse("token-bucket capacity=10 rate=2/s").unwrap();
        let field = rate_limit_policy("a\"b\\c\u{e9}", &policy);
        assert_eq!(field, "\"a\\\"b\\\\c?\";q=10;w=5");
        let api = rate_limit_policy("api", &policy);
        let parts = [
            Part {
                name: "api",
                field: &api,
                limit: 10,
                decision: Decision {
                    remaining: 0,
                    reset: SECOND / 2,
                    ..Decision::default()
                },
            },
            Part {
                name: "b",
                field: &api,
                limit: 3,
                decision: Decision {
                    allowed: true,
                    remaining: 7,
                    reset: 3 * SECOND + 1,
                    ..Decision::default()
                },
            },
        ];
        let [(_, policies), (_, states)] = fields(&parts);
        assert_eq!(policies, "\"api\";q=10;w=5, \"api\";q=10;w=5");
        assert_eq!(states, "\"api\";r=0;t=1, \"b\";r=3;t=4");
        let limited = Limited {
            policy: "api",
            retry_after: 1_500_000_000,
            parts: &parts,
            style: HeaderStyle::Ietf,
        };
        let response: Response<String> = limited.response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["cache-control"], "no-store");
        assert_eq!(
            response.body(),
            r#"{"error":"RATE_LIMITED","policy":"api"}"#
        );
        assert_eq!(
            error_body("RATE_LIMITED", "a\"b\\c\u{1}"),
            r#"{"error":"RATE_LIMITED","policy":"a\"b\\c\u0001"}"#
        );
    }

    #[test]
    fn the_older_fields_name_the_tightest_policy() {
        let policy = Policy::parse("token-bucket capacity=10 rate=2/s").unwrap();
        let field = rate_limit_policy("a", &policy);
        let part = |remaining, reset| Part {
            name: "a",
            field: &field,
            limit: 10,
            decision: Decision {
                remaining,
                reset,
                ..Decision::default()
            },
        };
        let parts = [part(7, SECOND), part(2, 3 * SECOND + 1)];
        let names = |style| {
            fields_in(style, &parts)
                .into_iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(HeaderStyle::XRateLimit),
            [
                "x-ratelimit-limit: 10",
                "x-ratelimit-remaining: 2",
                "x-ratelimit-reset: 4"
            ]
        );
        assert_eq!(names(HeaderStyle::Both).len(), 5);
        assert!(names(HeaderStyle::None).is_empty());
        assert_eq!("x-ratelimit".parse(), Ok(HeaderStyle::XRateLimit));
    }
}
