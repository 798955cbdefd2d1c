//! `[[routes]]`: the gateway's routes — a method and path pattern, where
//! the caller's identity comes from, the policies checked and the upstream.

use std::time::Duration;

use http::{HeaderName, Method, Uri};
use serde::Deserialize;
use toml::Spanned;

use super::{Report, TableId};

/// A gateway route.
#[derive(Debug, Clone)]
pub struct Route {
    /// As written (`GET /sellers/{seller}/stock`).
    pub text: String,
    /// The same, shared: its metrics label.
    pub label: std::sync::Arc<str>,
    /// The method, or any when the pattern has none.
    pub method: Option<Method>,
    /// The path pattern, segment by segment.
    pub segments: Vec<Segment>,
    /// `host`: the request's host it matches (lower case, without a port),
    /// or with a leading `*.` any host under that domain; none: any host.
    pub host_match: Option<String>,
    /// Where the identity comes from.
    pub identity: Identity,
    /// Its scope ([`Identity::scope`]), made once.
    pub scope: String,
    /// `identity = [first, then, …]`: the sources after the first, with
    /// their scopes, tried in order while the ones before are absent.
    pub fallbacks: Vec<(Identity, String)>,
    /// Policies checked all-or-nothing.
    pub policies: Vec<TableId>,
    /// Per policy (in the order of `policies`), an identity of its own
    /// with its scope (`{ policy = "login-account", identity =
    /// "header:x-account" }`): the policy counts that instead of the
    /// route's — per address and per account on one login route.
    pub keyed: Vec<Option<(Identity, String)>>,
    /// `scheme://authority` of the upstream: `http`, or `https` (TLS,
    /// the upstream's certificate verified); none: the route answers
    /// forward-auth only (`/v1/auth`: a proxy in front forwards).
    pub upstream: Option<Uri>,
    /// `upstream_ca`: the roots an `https` upstream's certificate is
    /// verified against, instead of the system's (a PEM file, read when
    /// the first connection is made; checked here).
    pub upstream_ca: Option<std::path::PathBuf>,
    /// Its authority as the `Host` field the upstream is sent, made once.
    pub host: Option<http::HeaderValue>,
    /// The longest a shaper may delay a request before it is refused.
    pub max_wait: Duration,
    /// The longest wait for the upstream's response head (connecting
    /// included): past it, `504`.
    pub timeout: Duration,
    /// The largest request body forwarded: past it, `413`.
    pub max_body: u64,
    /// `identity_case = "lower"`: identities are lower-cased (for an
    /// upstream that ignores case); `"exact"` (the default): compared byte
    /// for byte.
    pub fold_case: bool,
    /// `usage`: where the answer's actual cost is found; what it exceeds
    /// the admission charge by is reported as soon as it is read.
    pub usage: Option<Usage>,
    /// `usage_missing`: the usage charged for an answer that says none
    /// (an OpenAI-style stream whose client did not ask for usage); none:
    /// only the admission charge (counted in `weir_usage_missing_total`).
    pub usage_missing: Option<u64>,
    /// `cost`: what a request is charged on admission.
    pub cost: Cost,
    /// `concurrency_cost`: what a request holds of its concurrency
    /// policies while it runs — 1 (the default) or another fixed number,
    /// or `None` (`"cost"`) for the route's `cost`.
    pub concurrency_cost: Option<u64>,
    /// `charge_on`: only answers of these statuses are charged — a request
    /// is admitted by a probe of its cost and charged after its answer
    /// when the status matches ("count only the failed logins").
    pub charge_on: Option<ChargeOn>,
    /// `exempt`: client networks this route does not limit.
    pub exempt: crate::addresses::AddressList,
}

/// `charge_on = [401, 403, "5xx"]` and `charge_on_hangup`: which answers a
/// request is charged for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeOn {
    /// Inclusive ranges of statuses.
    ranges: Vec<(u16, u16)>,
    /// `charge_on_hangup` (default true): a request whose client went away
    /// before its answer is charged (a client cannot dodge the count by
    /// hanging up on a slow failure).
    pub on_hangup: bool,
}

impl ChargeOn {
    /// Whether an answer of `status` is charged.
    pub fn matches(&self, status: u16) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&status))
    }

    /// One status as written: `401`, `"401"`, `"4xx"` or `"500-504"`.
    fn range(value: &toml::Value) -> Option<(u16, u16)> {
        let status = |n: i64| u16::try_from(n).ok().filter(|s| (100..=599).contains(s));
        match value {
            toml::Value::Integer(n) => status(*n).map(|s| (s, s)),
            toml::Value::String(text) => {
                let text = text.trim();
                if let Some(class) = text.strip_suffix("xx").filter(|c| c.len() == 1) {
                    let c: u16 = class.parse().ok().filter(|c| (1..=5).contains(c))?;
                    return Some((c * 100, c * 100 + 99));
                }
                let (a, b) = text.split_once('-').unwrap_or((text, text));
                let (a, b) = (
                    status(a.trim().parse().ok()?)?,
                    status(b.trim().parse().ok()?)?,
                );
                (a <= b).then_some((a, b))
            }
            _ => None,
        }
    }
}

impl Route {
    /// Whether weir reads the request header `name` (lower case) on this
    /// route: an identity source or the cost.
    pub fn reads(&self, name: &str) -> bool {
        let identity = std::iter::once(&self.identity)
            .chain(self.fallbacks.iter().map(|(i, _)| i))
            .chain(self.keyed.iter().flatten().map(|(i, _)| i));
        identity
            .into_iter()
            .any(|i| matches!(i, Identity::Header(h) if h.as_str() == name))
            || matches!(&self.cost, Cost::Header { name: h, .. } if h.as_str() == name)
    }
}

/// Where an upstream's answer says what it actually cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// `header:NAME`: a response header, or a trailer.
    Header(HeaderName),
    /// `json:/pointer`: a JSON pointer into an `application/json` body, or
    /// into the `data:` events of a `text/event-stream` answer (the last
    /// event that holds it wins).
    Json(String),
}

/// The admission charge of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// The same for every request (the default: 1).
    Fixed(u64),
    /// `header:NAME`: a request header's decimal value, never less than
    /// `min` (`min_cost`); absent, `min` (1 without `min_cost`).
    Header {
        /// The header.
        name: HeaderName,
        /// `min_cost`, if set.
        min: Option<u64>,
    },
}

/// One path segment of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must be equal.
    Literal(String),
    /// Any one segment, named.
    Param(String),
    /// `{*name}`, last: the rest of the path, any number of segments.
    Rest(String),
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
    /// A query parameter (`query:NAME`), percent-decoded.
    Query(String),
    /// A cookie (`cookie:NAME`).
    Cookie(String),
    /// The route itself (`route`): every caller shares one key, a limit on
    /// the whole route (Kong's `limit_by = "service"`).
    Route,
    /// A claim of a JSON Web Token the gateway verifies (`jwt:CLAIM`, with
    /// `[jwt]`): a token that does not verify is refused, never read.
    Jwt(String),
}

impl Identity {
    /// An identity source as written: `header:NAME` (a header name of at
    /// most 64 characters, compared in lower case), `path:PARAM`, `peer`,
    /// `query:NAME`, `cookie:NAME` (names of at most 64 characters) or
    /// `route`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let named = |name: &str| {
            !name.is_empty() && name.len() <= 64 && !name.contains(['=', ';', '&', ' '])
        };
        match text.split_once(':') {
            _ if text == "peer" => Ok(Self::Peer),
            _ if text == "route" => Ok(Self::Route),
            Some(("query", name)) if named(name) => Ok(Self::Query(name.to_owned())),
            Some(("cookie", name)) if named(name) => Ok(Self::Cookie(name.to_owned())),
            Some(("jwt", name)) if named(name) => Ok(Self::Jwt(name.to_owned())),
            Some(("header", name)) => match HeaderName::try_from(name) {
                Ok(name) if name.as_str().len() <= 64 => Ok(Self::Header(name)),
                _ => Err(format!(
                    "`{name}` is not a header name of at most 64 characters"
                )),
            },
            Some(("path", name)) if super::valid_name(name) => Ok(Self::Path(name.to_owned())),
            _ => Err(format!(
                "`{text}` is not an identity (valid: \"header:NAME\", \"path:PARAM\", \"query:NAME\", \"cookie:NAME\", \"jwt:CLAIM\", \"peer\", \"route\", or a list of them)"
            )),
        }
    }

    /// The scope that keeps identities of different sources apart in one
    /// policy's keys (`header:x-id` never equals `peer`).
    pub fn scope(&self) -> String {
        match self {
            Self::Header(name) => format!("header:{name}"),
            Self::Path(name) => format!("path:{name}"),
            Self::Peer => "peer".to_owned(),
            Self::Query(name) => format!("query:{name}"),
            Self::Cookie(name) => format!("cookie:{name}"),
            Self::Route => "route".to_owned(),
            Self::Jwt(name) => format!("jwt:{name}"),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    #[serde(rename = "match")]
    pattern: Spanned<String>,
    identity: Spanned<toml::Value>,
    host: Option<Spanned<String>>,
    upstream_ca: Option<Spanned<String>>,
    policies: Spanned<Vec<toml::Value>>,
    upstream: Option<Spanned<String>>,
    max_wait: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_body: Option<Spanned<toml::Value>>,
    identity_case: Option<Spanned<String>>,
    usage: Option<Spanned<String>>,
    usage_missing: Option<Spanned<u64>>,
    cost: Option<Spanned<toml::Value>>,
    min_cost: Option<Spanned<u64>>,
    concurrency_cost: Option<Spanned<toml::Value>>,
    charge_on: Option<Spanned<toml::Value>>,
    charge_on_hangup: Option<Spanned<bool>>,
    exempt: Option<Spanned<Vec<String>>>,
}

/// The default upstream timeout and body bound.
const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_BODY: u64 = 10 << 20;

/// A size: bytes, or a number and a unit (`64KiB`, `10MiB`, `1GiB`).
fn size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "kiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(scale)
}

/// One identity source as written: `header:NAME`, `path:PARAM` (a
/// parameter of `segments`) or `peer`.
fn source(text: &str, segments: &[Segment]) -> Result<Identity, String> {
    match Identity::parse(text)? {
        Identity::Path(name)
            if !segments.contains(&Segment::Param(name.clone()))
                && !segments.contains(&Segment::Rest(name.clone())) =>
        {
            Err(format!("the match has no `{{{name}}}` segment"))
        }
        identity => Ok(identity),
    }
}

/// The methods a route may name.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Where an error is: `[[routes]] #N key`.
type Place<'a> = &'a dyn Fn(&str) -> String;

pub(super) fn parse(
    raw: &[Raw],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    leased: &dyn Fn(TableId) -> bool,
    report: &mut Report<'_>,
) -> Vec<Route> {
    let mut routes = Vec::new();
    for (i, raw) in raw.iter().enumerate() {
        let place = |key: &str| format!("[[routes]] #{} {key}", i + 1);
        let pattern = raw.pattern.get_ref().trim();
        let (method, segments) = matched(raw, &place, report);
        let mut sources = identities(raw, &segments, &place, report).into_iter();
        let identity = sources.next();
        let fallbacks = sources.map(|s| (s.clone(), s.scope())).collect();
        let (policies, keyed) = policies(raw, &segments, resolve, known, &place, report);
        own_identities(raw, &policies, &keyed, leased, &place, report);
        let upstream = upstream(raw, &place, report);
        let https = upstream
            .as_ref()
            .is_ok_and(|u| u.as_ref().is_some_and(|u| u.scheme_str() == Some("https")));
        let upstream_ca = upstream_ca(raw, https, &place, report);
        let max_wait = super::duration(
            raw.max_wait.as_ref(),
            Duration::from_secs(10),
            &place("max_wait"),
            report,
        );
        let timeout = super::duration(raw.timeout.as_ref(), TIMEOUT, &place("timeout"), report);
        let max_body = max_body(raw, &place, report);
        let fold_case = fold_case(raw, &place, report);
        let usage = usage(raw, &place, report);
        let host_match = raw.host.as_ref().and_then(|h| {
            let host = h.get_ref().trim().to_ascii_lowercase();
            let name = host.strip_prefix("*.").unwrap_or(&host);
            let valid = !name.is_empty()
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !valid {
                let message = format!(
                    "`{}` is not a host name such as \"api.example.com\" or \"*.example.com\"",
                    h.get_ref()
                );
                report.error(&h.span(), &place("host"), message);
            }
            valid.then_some(host)
        });
        let usage_missing = raw.usage_missing.as_ref().map(|m| *m.get_ref());
        if let (Some(m), None) = (&raw.usage_missing, &usage) {
            report.error(
                &m.span(),
                &place("usage_missing"),
                "needs `usage`: it is charged for an answer that does not say its usage",
            );
        }
        let cost = cost(raw, &place, report);
        let concurrency_cost = concurrency_cost(raw, &place, report);
        let charge_on = charge_on(raw, &policies, leased, &place, report);
        if raw.upstream.is_none() {
            forward_auth_only(raw, &policies, leased, &place, report);
        }
        if let (Some(identity), Ok(upstream)) = (identity, upstream) {
            routes.push(Route {
                text: pattern.to_owned(),
                label: std::sync::Arc::from(pattern),
                method,
                segments,
                host_match,
                scope: identity.scope(),
                identity,
                fallbacks,
                policies,
                keyed,
                host: (upstream.as_ref().and_then(Uri::authority))
                    .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok()),
                upstream,
                upstream_ca,
                max_wait,
                timeout,
                max_body,
                fold_case,
                usage,
                usage_missing,
                cost,
                concurrency_cost,
                charge_on,
                exempt: super::server::address_list(raw.exempt.as_ref(), &place("exempt"), report),
            });
        }
    }
    routes
}

/// `match`: the method, if one is named, and the path's segments.
fn matched(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> (Option<Method>, Vec<Segment>) {
    let pattern = raw.pattern.get_ref().trim();
    let at = raw.pattern.span();
    let (method, path) = match pattern.split_once(' ') {
        Some((m, p)) if METHODS.contains(&m) => (Method::from_bytes(m.as_bytes()).ok(), p.trim()),
        Some((m, p)) => {
            report.error(
                &at,
                &place("match"),
                format!(
                    "`{m}` is not an HTTP method (valid: {})",
                    METHODS.join(", ")
                ),
            );
            (None, p.trim())
        }
        None => (None, pattern),
    };
    let mut segments = Vec::new();
    if !path.starts_with('/') {
        report.error(
            &at,
            &place("match"),
            "the path must start with `/`, e.g. \"GET /sellers/{seller}/stock\"",
        );
    }
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) if super::valid_name(name) => {
                segments.push(Segment::Param(name.to_owned()));
            }
            Some(rest) if rest.strip_prefix('*').is_some_and(super::valid_name) => {
                if i + 1 < parts.len() {
                    report.error(
                        &at,
                        &place("match"),
                        format!("`{{{rest}}}` takes the rest of the path: it comes last, as in \"GET /api/{{*rest}}\""),
                    );
                }
                segments.push(Segment::Rest(rest[1..].to_owned()));
            }
            Some(name) => report.error(
                &at,
                &place("match"),
                format!("`{{{name}}}` is not a parameter name"),
            ),
            None => segments.push(Segment::Literal((*part).to_owned())),
        }
    }
    (method, segments)
}

/// `identity`: one source, or a list tried in order.
fn identities(
    raw: &Raw,
    segments: &[Segment],
    place: Place<'_>,
    report: &mut Report<'_>,
) -> Vec<Identity> {
    let at = raw.identity.span();
    let texts: Option<Vec<&str>> = match raw.identity.get_ref() {
        toml::Value::String(text) => Some(vec![text.as_str()]),
        toml::Value::Array(list) if !list.is_empty() => list.iter().map(|v| v.as_str()).collect(),
        _ => None,
    };
    let Some(texts) = texts else {
        report.error(
            &at,
            &place("identity"),
            "is not an identity: a source such as \"header:x-api-key\", or a list of them tried in order, such as [\"header:x-api-key\", \"peer\"]",
        );
        return Vec::new();
    };
    texts
        .into_iter()
        .filter_map(|text| {
            source(text, segments)
                .map_err(|e| report.error(&at, &place("identity"), e))
                .ok()
        })
        .collect()
}

/// `policies`: each named once, each defined; a name, or `{ policy =
/// NAME, identity = SOURCE }` for a policy that counts an identity of its
/// own.
fn policies(
    raw: &Raw,
    segments: &[Segment],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    place: Place<'_>,
    report: &mut Report<'_>,
) -> (Vec<TableId>, Vec<Option<(Identity, String)>>) {
    let at = raw.policies.span();
    if raw.policies.get_ref().is_empty() {
        report.error(&at, &place("policies"), "name at least one policy");
    }
    let (mut policies, mut keyed) = (Vec::new(), Vec::new());
    for entry in raw.policies.get_ref() {
        let (name, own) = match entry {
            toml::Value::String(name) => (name.as_str(), None),
            toml::Value::Table(t) => match (
                t.get("policy").and_then(|p| p.as_str()),
                t.get("identity").and_then(|i| i.as_str()),
            ) {
                (Some(name), Some(identity)) if t.len() == 2 => match source(identity, segments) {
                    Ok(own) => (name, Some((own.clone(), own.scope()))),
                    Err(e) => {
                        report.error(&at, &place("policies"), format!("`{name}`'s identity: {e}"));
                        continue;
                    }
                },
                _ => {
                    report.error(&at, &place("policies"), "an entry is a policy's name, or { policy = \"NAME\", identity = \"SOURCE\" }");
                    continue;
                }
            },
            _ => {
                report.error(
                    &at,
                    &place("policies"),
                    "an entry is a policy's name, or { policy = \"NAME\", identity = \"SOURCE\" }",
                );
                continue;
            }
        };
        match resolve(name) {
            Some(id) if policies.contains(&id) => {
                report.error(&at, &place("policies"), format!("`{name}` is named twice"))
            }
            Some(id) => {
                policies.push(id);
                keyed.push(own);
            }
            None => report.error(
                &at,
                &place("policies"),
                format!("no policy `{name}` (defined: {})", known()),
            ),
        }
    }
    (policies, keyed)
}

/// A policy with an identity of its own counts another key than the
/// route's: it cannot be a concurrency policy (the request's lease is held
/// under the route's key) nor share a route with `usage` (the answer's
/// usage is charged to the route's key).
fn own_identities(
    raw: &Raw,
    policies: &[TableId],
    keyed: &[Option<(Identity, String)>],
    leased: &dyn Fn(TableId) -> bool,
    place: Place<'_>,
    report: &mut Report<'_>,
) {
    let own: Vec<TableId> = (policies.iter().zip(keyed))
        .filter(|(_, k)| k.is_some())
        .map(|(&p, _)| p)
        .collect();
    if own.is_empty() {
        return;
    }
    if own.iter().any(|&p| leased(p)) {
        report.error(
            &raw.policies.span(),
            &place("policies"),
            "a concurrency policy counts the route's identity: give it no identity of its own",
        );
    }
    if raw.usage.is_some() {
        report.error(
            &raw.policies.span(),
            &place("policies"),
            "`usage` charges the route's identity: a route with `usage` gives its policies no identity of their own",
        );
    }
}

/// `upstream`: `http://authority` or `https://authority`; none: a
/// forward-auth route (`Ok(None)`).
fn upstream(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> Result<Option<Uri>, ()> {
    let Some(written) = &raw.upstream else {
        return Ok(None);
    };
    match written.get_ref().parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some()
                && uri.path_and_query().is_none_or(|p| p.as_str() == "/") =>
        {
            Ok(Some(uri))
        }
        _ => {
            report.error(
                &written.span(),
                &place("upstream"),
                format!(
                    "`{}` is not an upstream such as \"http://127.0.0.1:9000\" or \"https://api.internal\" (a scheme and an authority, no path)",
                    written.get_ref()
                ),
            );
            Err(())
        }
    }
}

/// A route without an upstream answers forward-auth only, where nothing
/// follows the answer: no concurrency policy (nothing would release its
/// lease) and no `usage` (weir never sees the upstream's answer; report
/// it with `POST /v1/report`).
fn forward_auth_only(
    raw: &Raw,
    policies: &[TableId],
    leased: &dyn Fn(TableId) -> bool,
    place: Place<'_>,
    report: &mut Report<'_>,
) {
    if policies.iter().any(|&p| leased(p)) {
        report.error(
            &raw.policies.span(),
            &place("policies"),
            "a concurrency policy needs an upstream: forward-auth (a route without `upstream`) has no end of the request to release its lease at",
        );
    }
    if let Some(usage) = &raw.usage {
        report.error(
            &usage.span(),
            &place("usage"),
            "needs an upstream: forward-auth never sees the answer (report usage with POST /v1/report)",
        );
    }
}

/// `charge_on` (and `charge_on_hangup`): the statuses charged. A route
/// that charges only some answers admits by probing, so it can hold no
/// concurrency policy (a probe takes no lease) and no `usage` (one charge
/// after the answer: either its usage or its status decides it).
fn charge_on(
    raw: &Raw,
    policies: &[TableId],
    leased: &dyn Fn(TableId) -> bool,
    place: Place<'_>,
    report: &mut Report<'_>,
) -> Option<ChargeOn> {
    let Some(value) = &raw.charge_on else {
        if let Some(h) = &raw.charge_on_hangup {
            report.error(
                &h.span(),
                &place("charge_on_hangup"),
                "applies with `charge_on`: set it too, or drop this",
            );
        }
        return None;
    };
    let listed = match value.get_ref() {
        toml::Value::Array(items) if !items.is_empty() => {
            items.iter().map(ChargeOn::range).collect()
        }
        one => Some(ChargeOn::range(one).into_iter().collect()),
    };
    let Some(ranges) = listed.filter(|r: &Vec<(u16, u16)>| !r.is_empty()) else {
        report.error(
            &value.span(),
            &place("charge_on"),
            "is not a list of statuses (valid: [401, 403], [\"4xx\"], [\"500-504\"]: whole statuses 100 to 599, a class, or a range)",
        );
        return None;
    };
    if policies.iter().any(|&p| leased(p)) {
        report.error(
            &value.span(),
            &place("charge_on"),
            "a route that charges only some answers admits by probing, which takes no lease: it cannot hold a concurrency policy",
        );
    }
    if raw.usage.is_some() {
        report.error(
            &value.span(),
            &place("charge_on"),
            "either `usage` or `charge_on` says what an answer costs, not both",
        );
    }
    Some(ChargeOn {
        ranges,
        on_hangup: raw.charge_on_hangup.as_ref().is_none_or(|h| *h.get_ref()),
    })
}

/// `upstream_ca`: a PEM file of roots, for an `https` upstream.
fn upstream_ca(
    raw: &Raw,
    https: bool,
    place: Place<'_>,
    report: &mut Report<'_>,
) -> Option<std::path::PathBuf> {
    let ca = raw.upstream_ca.as_ref()?;
    let path = std::path::PathBuf::from(ca.get_ref());
    let problem = match (https, std::fs::read(&path)) {
        (false, _) => Some("is for an https upstream".to_owned()),
        (true, Err(e)) => Some(format!("cannot read `{}`: {e}", path.display())),
        (true, Ok(pem)) if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") => {
            Some(format!("`{}` holds no PEM certificate", path.display()))
        }
        (true, Ok(_)) => None,
    };
    match problem {
        Some(message) => {
            report.error(&ca.span(), &place("upstream_ca"), message);
            None
        }
        None => Some(path),
    }
}

/// `max_body`: bytes, or a size with its unit.
fn max_body(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> u64 {
    let Some(v) = &raw.max_body else {
        return MAX_BODY;
    };
    let parsed = match v.get_ref() {
        toml::Value::Integer(n) => u64::try_from(*n).ok(),
        toml::Value::String(s) => size(s),
        _ => None,
    };
    parsed.unwrap_or_else(|| {
        report.error(
            &v.span(),
            &place("max_body"),
            "is not a size such as 1048576, \"64KiB\" or \"10MiB\"",
        );
        MAX_BODY
    })
}

/// `identity_case`: `"lower"` folds identities to lower case.
fn fold_case(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> bool {
    match raw
        .identity_case
        .as_ref()
        .map(|c| (c, c.get_ref().as_str()))
    {
        None | Some((_, "exact")) => false,
        Some((_, "lower")) => true,
        Some((c, other)) => {
            report.error(
                &c.span(),
                &place("identity_case"),
                format!("`{other}` is not valid (valid: \"exact\", \"lower\")"),
            );
            false
        }
    }
}

/// `usage`: where the answer says what it cost.
fn usage(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> Option<Usage> {
    let u = raw.usage.as_ref()?;
    let parsed = match u.get_ref().split_once(':') {
        Some(("header", name)) => HeaderName::try_from(name).ok().map(Usage::Header),
        Some(("json", pointer)) if pointer.starts_with('/') => {
            Some(Usage::Json(pointer.to_owned()))
        }
        _ => None,
    };
    if parsed.is_none() {
        report.error(
            &u.span(),
            &place("usage"),
            format!(
                "`{}` is not a usage source (valid: \"header:NAME\", \"json:/pointer\" such as \"json:/usage/total_tokens\")",
                u.get_ref()
            ),
        );
    }
    parsed
}

/// `concurrency_cost`: 1 unless it says otherwise.
fn concurrency_cost(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> Option<u64> {
    let Some(v) = &raw.concurrency_cost else {
        return Some(1);
    };
    match v.get_ref() {
        toml::Value::Integer(n) if *n >= 1 => u64::try_from(*n).ok(),
        toml::Value::String(s) if s == "cost" => None,
        _ => {
            report.error(
                &v.span(),
                &place("concurrency_cost"),
                "is not what a request holds of a concurrency policy (valid: a whole number of at least 1, or \"cost\" for the route's cost)",
            );
            Some(1)
        }
    }
}

/// `cost` and `min_cost`: the admission charge.
fn cost(raw: &Raw, place: Place<'_>, report: &mut Report<'_>) -> Cost {
    let cost = match &raw.cost {
        None => Cost::Fixed(1),
        Some(v) => {
            let parsed = match v.get_ref() {
                toml::Value::Integer(n) => u64::try_from(*n).ok().map(Cost::Fixed),
                toml::Value::String(s) => s
                    .strip_prefix("header:")
                    .and_then(|name| HeaderName::try_from(name).ok())
                    .map(|name| Cost::Header {
                        name,
                        min: raw.min_cost.as_ref().map(|m| *m.get_ref()),
                    }),
                _ => None,
            };
            parsed.unwrap_or_else(|| {
                report.error(
                    &v.span(),
                    &place("cost"),
                    "is not an admission charge (valid: a whole number such as 1, or \"header:NAME\")",
                );
                Cost::Fixed(1)
            })
        }
    };
    if let (Some(min), Cost::Fixed(_)) = (&raw.min_cost, &cost) {
        report.error(
            &min.span(),
            &place("min_cost"),
            "applies to a cost a client declares: set cost = \"header:NAME\" too, or drop min_cost",
        );
    }
    cost
}
