//! `weir serve`'s configuration: TOML, parsed once into typed structs and
//! validated before anything is served. Every semantic error is reported,
//! each with its line, table and key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use serde::Deserialize;
use toml::{Spanned, Value};
use weir_core::Policy;
use weir_core::units::parse_duration;

/// The example served when `weir serve` is given no config, and printed by
/// `weir config example`.
pub const EXAMPLE: &str = r#"# weir serve configuration (TOML). `weir config check FILE` validates one.

[server]
listen = "127.0.0.1:8080"        # decision API, gateway routes, /metrics, /healthz, /readyz
# grpc = "127.0.0.1:8081"        # the Envoy rate limit service (off without it)
# admin_token = "change-me"      # admin endpoints are off without it (or set WEIR_ADMIN_TOKEN)

[store]
url = "memory"                   # the in-process store; or "redis://127.0.0.1:6379",
                                 # "redis-cluster://10.0.0.1:6379,10.0.0.2:6379"
timeout = "50ms"                 # the longest any request waits on the store
max_keys = 1000000               # in-process keys (also the local fallback's): new
                                 # identities are refused, never a limited key evicted
fallback_share = 1.0             # Redis down: each instance's local share of a limit
                                 # (0.25 for four instances)

[policies.api]
algorithm = "token-bucket"
capacity = 10
rate = "2/s"
# on_store_error = "local"       # Redis down: "local" (fallback_share of the limit,
#                                # in process), "allow" or "deny"
# on_state_loss = "full"         # Redis lost its keys: "full" (start afresh) or
#                                # "empty" (as if used up when the loss was found)

[policies.per-minute]
algorithm = "sliding-log"
limit = 120
window = "1m"

[policies.crawler]
algorithm = "leaky-bucket"
rate = "1/s"
queue = 5

# A gateway route: match, identify, check, then forward or answer 429.
# [[routes]]
# match = "GET /sellers/{seller}/stock"
# identity = "header:x-seller-id"   # or "path:seller", "peer"
# policies = ["api", "per-minute"]  # several = all-or-nothing
# upstream = "http://127.0.0.1:9000"
# max_wait = "2s"                   # a shaper's delay beyond this is a 429

# An Envoy descriptor rule (gRPC envoy.service.ratelimit.v3): the first rule
# whose domain and entries match a descriptor decides it; none: unlimited.
# [[descriptors]]
# domain = "kartly"
# entries = ["seller", "endpoint=stock-read"]  # "key": any value; "key=value": that one
# policy = "api"
"#;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The bearer token of the admin endpoints; none turns them off.
    pub admin_token: Option<String>,
    /// The store's deadline per call.
    pub timeout: Duration,
    /// The key budget of the in-process store.
    pub max_keys: usize,
    /// `memory`, or a Redis URL.
    pub store: String,
    /// The local fallback's share of each limit, as parts per million.
    pub fallback_share: u64,
    /// Named policies, in name order.
    pub policies: Vec<(String, Policy)>,
    /// Per policy (by name): what happens when the store fails.
    pub rules: BTreeMap<String, Rules>,
    /// Gateway routes, in file order (the first match wins).
    pub routes: Vec<Route>,
    /// Where the Envoy rate limit service listens; none: off.
    pub grpc: Option<SocketAddr>,
    /// Envoy descriptor rules, in file order (the first match wins).
    pub descriptors: Vec<DescriptorRule>,
}

/// Maps an Envoy descriptor to a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// The request's domain.
    pub domain: String,
    /// The descriptor's entries, in order: a key, and the one value it must
    /// have (none: any value).
    pub entries: Vec<(String, Option<String>)>,
    /// The policy that decides it.
    pub policy: String,
}

/// What a policy does when its store fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rules {
    /// `on_store_error`; none set means `local` over HTTP and `UNAVAILABLE`
    /// over gRPC (so that Envoy's `failure_mode_deny` decides).
    pub on_store_error: Option<OnStoreError>,
    /// `on_state_loss`.
    pub on_state_loss: weir_redis::OnLoss,
}

/// `on_store_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// Decide in process, with the policy scaled by `fallback_share`.
    Local,
    /// Admit without counting (fail open).
    Allow,
    /// Refuse (fail closed).
    Deny,
}

/// A gateway route.
#[derive(Debug, Clone)]
pub struct Route {
    /// As written (`GET /sellers/{seller}/stock`).
    pub text: String,
    /// The method, or any when the pattern has none.
    pub method: Option<Method>,
    /// The path pattern, segment by segment.
    pub segments: Vec<Segment>,
    /// Where the identity comes from.
    pub identity: Identity,
    /// Policies checked all-or-nothing.
    pub policies: Vec<String>,
    /// `scheme://authority` of the upstream.
    pub upstream: Uri,
    /// The longest a shaper may delay a request before it is refused.
    pub max_wait: Duration,
}

/// One path segment of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must be equal.
    Literal(String),
    /// Any one segment, named.
    Param(String),
}

/// The source of a request's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A header set by a trusted proxy.
    Header(HeaderName),
    /// A named segment of the path.
    Path(String),
    /// The peer's IP address.
    Peer,
}

impl Identity {
    /// A prefix that keeps identities of different sources apart in one
    /// policy's keys (`header:x-id:…` never equals `peer:…`).
    pub fn kind(&self) -> String {
        match self {
            Self::Header(name) => format!("header:{name}"),
            Self::Path(name) => format!("path:{name}"),
            Self::Peer => "peer".to_owned(),
        }
    }
}

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// Where: `[server] listen`, `[[routes]] #2 policies`, …
    pub place: String,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.place, self.message)
    }
}

/// Every problem found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    policies: BTreeMap<String, BTreeMap<String, Spanned<Value>>>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    domain: Spanned<String>,
    entries: Spanned<Vec<String>>,
    policy: Spanned<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<Spanned<String>>,
    admin_token: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_keys: Option<Spanned<u64>>,
    fallback_share: Option<Spanned<Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    #[serde(rename = "match")]
    pattern: Spanned<String>,
    identity: Spanned<String>,
    policies: Spanned<Vec<String>>,
    upstream: Spanned<String>,
    max_wait: Option<Spanned<String>>,
}

/// Parses and validates `text`; `admin_token_env` stands in for an absent
/// `admin_token` (from `WEIR_ADMIN_TOKEN`).
pub fn parse(text: &str, admin_token_env: Option<String>) -> Result<Config, ConfigErrors> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let raw: Raw = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(s.start));
        ConfigErrors(vec![ConfigError {
            line,
            place: "file".into(),
            message: e.message().trim().to_owned(),
        }])
    })?;
    let mut errors = Vec::new();
    let mut error = |line: usize, place: &str, message: String| {
        errors.push(ConfigError {
            line,
            place: place.to_owned(),
            message,
        });
    };

    let listen = match &raw.server.listen {
        None => SocketAddr::from(([127, 0, 0, 1], 8080)),
        Some(s) => s.get_ref().parse().unwrap_or_else(|_| {
            error(
                line_of(s.span().start),
                "[server] listen",
                format!("`{}` is not an address such as 127.0.0.1:8080", s.get_ref()),
            );
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }),
    };
    let grpc = raw
        .server
        .grpc
        .as_ref()
        .and_then(|s| match s.get_ref().parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                error(
                    line_of(s.span().start),
                    "[server] grpc",
                    format!("`{}` is not an address such as 127.0.0.1:8081", s.get_ref()),
                );
                None
            }
        });
    let admin_token = raw
        .server
        .admin_token
        .map(Spanned::into_inner)
        .or(admin_token_env);
    if admin_token.as_deref().is_some_and(|t| t.len() < 16) {
        let line = 0;
        error(
            line,
            "[server] admin_token",
            "must be at least 16 characters".into(),
        );
    }
    let store = raw
        .store
        .url
        .as_ref()
        .map_or("memory", |u| u.get_ref().as_str());
    if let Some(url) = &raw.store.url {
        let redis = ["redis://", "rediss://", "redis-cluster://"]
            .iter()
            .any(|scheme| url.get_ref().starts_with(scheme));
        if let Some(Err(e)) = redis.then(|| weir_redis::check_url(url.get_ref())) {
            error(
                line_of(url.span().start),
                "[store] url",
                format!("not a Redis URL: {e}"),
            );
        }
        if url.get_ref() != "memory" && !redis {
            error(
                line_of(url.span().start),
                "[store] url",
                format!(
                    "`{}` is not a store (valid: \"memory\", \"redis://HOST:PORT\", \"redis-cluster://HOST:PORT,HOST:PORT\")",
                    url.get_ref()
                ),
            );
        }
    }
    let fallback_share = match &raw.store.fallback_share {
        None => 1_000_000,
        Some(v) => {
            let share = match v.get_ref() {
                Value::Float(f) => Some(*f),
                Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match share {
                Some(f) if f > 0.0 && f <= 1.0 => ((f * 1e6).round() as u64).max(1),
                _ => {
                    error(
                        line_of(v.span().start),
                        "[store] fallback_share",
                        "must be a number above 0 and at most 1, e.g. 0.25 for four instances"
                            .into(),
                    );
                    1_000_000
                }
            }
        }
    };
    let timeout = match &raw.store.timeout {
        None => Duration::from_millis(50),
        Some(t) => match parse_duration(t.get_ref()) {
            Ok(ns) => Duration::from_nanos(ns),
            Err(e) => {
                error(
                    line_of(t.span().start),
                    "[store] timeout",
                    format!("`{}` is not valid: {e}", t.get_ref()),
                );
                Duration::from_millis(50)
            }
        },
    };
    let max_keys = raw
        .store
        .max_keys
        .map_or(weir_limiter::DEFAULT_MAX_KEYS, |m| {
            usize::try_from(*m.get_ref()).unwrap_or(usize::MAX).max(1)
        });

    let mut policies = Vec::new();
    let mut rules = BTreeMap::new();
    for (name, table) in &raw.policies {
        let place = format!("[policies.{name}]");
        let first = table
            .values()
            .map(|v| line_of(v.span().start))
            .min()
            .unwrap_or(0);
        let at = |key: &str| table.get(key).map_or(first, |v| line_of(v.span().start));
        if !valid_name(name) {
            error(
                first,
                &place,
                "a policy name is letters, digits, `-` and `_`".into(),
            );
        }
        let mut params = Vec::new();
        let mut algorithm = None;
        let mut policy_rules = Rules::default();
        for (key, value) in table {
            let text = match value.get_ref() {
                Value::String(s) => s.clone(),
                Value::Integer(i) => i.to_string(),
                other => {
                    error(
                        at(key),
                        &format!("{place} {key}"),
                        format!(
                            "expected a string or an integer, found {}",
                            other.type_str()
                        ),
                    );
                    continue;
                }
            };
            let mut bad_rule = |valid: &str| {
                error(
                    at(key),
                    &format!("{place} {key}"),
                    format!("`{text}` is not valid (valid: {valid})"),
                );
            };
            if key == "algorithm" {
                algorithm = Some(text);
            } else if key == "on_store_error" {
                policy_rules.on_store_error = match text.as_str() {
                    "local" => Some(OnStoreError::Local),
                    "allow" => Some(OnStoreError::Allow),
                    "deny" => Some(OnStoreError::Deny),
                    _ => {
                        bad_rule("\"local\", \"allow\", \"deny\"");
                        None
                    }
                };
            } else if key == "on_state_loss" {
                policy_rules.on_state_loss = match text.as_str() {
                    "full" => weir_redis::OnLoss::Full,
                    "empty" => weir_redis::OnLoss::Empty,
                    _ => {
                        bad_rule("\"full\", \"empty\"");
                        weir_redis::OnLoss::Full
                    }
                };
            } else {
                params.push((key.clone(), text));
            }
        }
        let Some(algorithm) = algorithm else {
            error(first, &place, "has no `algorithm` (token-bucket, gcra, fixed-window, sliding-log, sliding-counter, leaky-bucket)".into());
            continue;
        };
        match Policy::from_params(
            &algorithm,
            params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ) {
            Ok(policy) => {
                policies.push((name.clone(), policy));
                rules.insert(name.clone(), policy_rules);
            }
            Err(e) => error(
                at(&e.field),
                &format!("{place} {}", e.field),
                e.kind.to_string(),
            ),
        }
    }

    let mut routes = Vec::new();
    for (i, raw_route) in raw.routes.iter().enumerate() {
        let place = |key: &str| format!("[[routes]] #{} {key}", i + 1);
        let line = |s: &std::ops::Range<usize>| line_of(s.start);
        let pattern = raw_route.pattern.get_ref().trim();
        let (method, path) = match pattern.split_once(' ') {
            Some((m, p)) => match Method::from_bytes(m.as_bytes()) {
                Ok(method) if m.chars().all(|c| c.is_ascii_uppercase()) => (Some(method), p.trim()),
                _ => {
                    error(
                        line(&raw_route.pattern.span()),
                        &place("match"),
                        format!("`{m}` is not an HTTP method"),
                    );
                    (None, p.trim())
                }
            },
            None => (None, pattern),
        };
        let mut segments = Vec::new();
        if !path.starts_with('/') {
            error(
                line(&raw_route.pattern.span()),
                &place("match"),
                "the path must start with `/`, e.g. \"GET /sellers/{seller}/stock\"".into(),
            );
        }
        for part in path.split('/').skip(1) {
            match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Some(name) if valid_name(name) => segments.push(Segment::Param(name.to_owned())),
                Some(name) => error(
                    line(&raw_route.pattern.span()),
                    &place("match"),
                    format!("`{{{name}}}` is not a parameter name"),
                ),
                None => segments.push(Segment::Literal(part.to_owned())),
            }
        }
        let identity_text = raw_route.identity.get_ref();
        let identity = match identity_text.split_once(':') {
            _ if identity_text == "peer" => Some(Identity::Peer),
            Some(("header", name)) => match HeaderName::try_from(name) {
                Ok(name) => Some(Identity::Header(name)),
                Err(_) => {
                    error(
                        line(&raw_route.identity.span()),
                        &place("identity"),
                        format!("`{name}` is not a header name"),
                    );
                    None
                }
            },
            Some(("path", name)) if segments.contains(&Segment::Param(name.to_owned())) => {
                Some(Identity::Path(name.to_owned()))
            }
            Some(("path", name)) => {
                error(
                    line(&raw_route.identity.span()),
                    &place("identity"),
                    format!("the match has no `{{{name}}}` segment"),
                );
                None
            }
            _ => {
                error(
                    line(&raw_route.identity.span()),
                    &place("identity"),
                    format!(
                        "`{identity_text}` is not an identity (valid: \"header:NAME\", \"path:PARAM\", \"peer\")"
                    ),
                );
                None
            }
        };
        if raw_route.policies.get_ref().is_empty() {
            error(
                line(&raw_route.policies.span()),
                &place("policies"),
                "name at least one policy".into(),
            );
        }
        for name in raw_route.policies.get_ref() {
            if !raw.policies.contains_key(name) {
                let known: Vec<&str> = raw.policies.keys().map(String::as_str).collect();
                error(
                    line(&raw_route.policies.span()),
                    &place("policies"),
                    format!("no policy `{name}` (defined: {})", known.join(", ")),
                );
            }
        }
        let upstream = match raw_route.upstream.get_ref().parse::<Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.authority().is_some() => Some(uri),
            _ => {
                let text = raw_route.upstream.get_ref();
                error(
                    line(&raw_route.upstream.span()),
                    &place("upstream"),
                    format!("`{text}` is not an upstream such as \"http://127.0.0.1:9000\""),
                );
                None
            }
        };
        let max_wait = match &raw_route.max_wait {
            None => Duration::from_secs(10),
            Some(w) => match parse_duration(w.get_ref()) {
                Ok(ns) => Duration::from_nanos(ns),
                Err(e) => {
                    error(
                        line(&w.span()),
                        &place("max_wait"),
                        format!("`{}` is not valid: {e}", w.get_ref()),
                    );
                    Duration::ZERO
                }
            },
        };
        if let (Some(identity), Some(upstream)) = (identity, upstream) {
            routes.push(Route {
                text: pattern.to_owned(),
                method,
                segments,
                identity,
                policies: raw_route.policies.get_ref().clone(),
                upstream,
                max_wait,
            });
        }
    }
    let mut descriptors = Vec::new();
    for (i, rule) in raw.descriptors.iter().enumerate() {
        let place = |key: &str| format!("[[descriptors]] #{} {key}", i + 1);
        let mut entries = Vec::new();
        for entry in rule.entries.get_ref() {
            let (key, value) = match entry.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (entry.as_str(), None),
            };
            if key.is_empty() || value.as_deref() == Some("") {
                error(
                    line_of(rule.entries.span().start),
                    &place("entries"),
                    format!(
                        "`{entry}` is not an entry (valid: \"key\" for any value, \"key=value\")"
                    ),
                );
            }
            entries.push((key.to_owned(), value));
        }
        if entries.is_empty() {
            error(
                line_of(rule.entries.span().start),
                &place("entries"),
                "name at least one entry, e.g. [\"seller\"]".into(),
            );
        }
        if rule.domain.get_ref().is_empty() {
            error(
                line_of(rule.domain.span().start),
                &place("domain"),
                "must not be empty".into(),
            );
        }
        if !raw.policies.contains_key(rule.policy.get_ref()) {
            let known: Vec<&str> = raw.policies.keys().map(String::as_str).collect();
            error(
                line_of(rule.policy.span().start),
                &place("policy"),
                format!(
                    "no policy `{}` (defined: {})",
                    rule.policy.get_ref(),
                    known.join(", ")
                ),
            );
        }
        descriptors.push(DescriptorRule {
            domain: rule.domain.get_ref().clone(),
            entries,
            policy: rule.policy.get_ref().clone(),
        });
    }
    if policies.is_empty() && raw.policies.is_empty() {
        error(
            0,
            "[policies]",
            "define at least one policy ([policies.NAME] with an algorithm)".into(),
        );
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.line);
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        listen,
        admin_token,
        timeout,
        max_keys,
        store: store.to_owned(),
        fallback_share,
        policies,
        rules,
        routes,
        grpc,
        descriptors,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_valid() {
        let config = parse(EXAMPLE, None).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.policies.len(), 3);
        assert!(config.admin_token.is_none());
    }

    #[test]
    fn the_documented_configs_are_valid() {
        let envoy = parse(include_str!("../../../docs/envoy/weir.toml"), None).unwrap();
        assert_eq!(
            (envoy.descriptors.len(), envoy.fallback_share),
            (3, 250_000)
        );
        assert_eq!(
            envoy.rules["seller-stock-read"].on_store_error,
            Some(OnStoreError::Deny)
        );
        assert_eq!(envoy.rules["per-ip"].on_store_error, None);
        parse(include_str!("../../../docs/bench/weir.toml"), None).unwrap();
    }

    #[test]
    fn store_rules_and_descriptors_are_checked() {
        let text = "[store]\nurl = \"redis://:x:y/\"\nfallback_share = 2\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\non_store_error = \"maybe\"\non_state_loss = \"half\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"k=\"]\npolicy = \"b\"\n";
        let errors = parse(text, None).unwrap_err().0;
        let places: Vec<(usize, &str)> =
            errors.iter().map(|e| (e.line, e.place.as_str())).collect();
        assert_eq!(
            places,
            [
                (2, "[store] url"),
                (3, "[store] fallback_share"),
                (9, "[policies.a] on_store_error"),
                (10, "[policies.a] on_state_loss"),
                (14, "[[descriptors]] #1 entries"),
                (15, "[[descriptors]] #1 policy"),
            ],
            "{errors:?}"
        );
        assert!(
            errors[0].message.starts_with("not a Redis URL"),
            "{errors:?}"
        );
        assert!(errors[2].message.contains("\"local\", \"allow\", \"deny\""));
    }

    #[test]
    fn every_error_is_reported_with_its_line() {
        let text = r#"
[server]
listen = "everywhere"

[store]
url = "mysql://127.0.0.1:6379"

[policies.a]
algorithm = "token-bucket"
capacity = 0
rate = "2/s"

[[routes]]
match = "GET /x/{id}"
identity = "path:nope"
policies = ["a", "b"]
upstream = "ftp://x"
"#;
        let errors = parse(text, None).unwrap_err().0;
        let lines: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
        assert_eq!(
            lines,
            [
                (3, "[server] listen"),
                (6, "[store] url"),
                (10, "[policies.a] capacity"),
                (15, "[[routes]] #1 identity"),
                (16, "[[routes]] #1 policies"),
                (17, "[[routes]] #1 upstream"),
            ],
            "{errors:?}"
        );
        assert!(errors[4].message.contains("no policy `b` (defined: a)"));
        let syntax = parse("[server\n", None).unwrap_err().0;
        assert_eq!(syntax[0].line, 1);
        let unknown = parse("[server]\nlisten = \"127.0.0.1:1\"\nport = 3\n", None)
            .unwrap_err()
            .0;
        assert_eq!(unknown[0].line, 3, "{unknown:?}");
        assert!(unknown[0].message.contains("unknown field `port`"));
    }

    #[test]
    fn routes_parse() {
        let text = "[policies.a]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\n\n[[routes]]\nmatch = \"GET /s/{seller}/stock\"\nidentity = \"path:seller\"\npolicies = [\"a\"]\nupstream = \"http://127.0.0.1:9\"\n";
        let config = parse(text, Some("from-the-environment".into())).unwrap();
        let route = &config.routes[0];
        assert_eq!(route.method, Some(Method::GET));
        assert_eq!(
            route.segments,
            [
                Segment::Literal("s".into()),
                Segment::Param("seller".into()),
                Segment::Literal("stock".into())
            ]
        );
        assert_eq!(route.identity, Identity::Path("seller".into()));
        assert_eq!(config.admin_token.as_deref(), Some("from-the-environment"));
    }
}
