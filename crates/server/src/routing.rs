//! A gateway request's route and identity: the path decoded once into its
//! canonical form, the first route whose host, path and method match, the
//! client behind trusted proxies, the identity from its source (bounded,
//! scoped), the overrides for it and the admission cost — everything a
//! face needs before it asks the engine, and nothing about forwarding.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use axum::extract::Request;
use http::{HeaderMap, Method, header};
use ipnet::IpNet;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::addresses::AddressList;
use crate::answer::ApiError;
use crate::backend::{InlineVec, scoped_key};
use crate::config::{Cost, Identity, Route, Segment, TableId};
use crate::state::Shared;

/// The path parameters when `path` matches the route's pattern.
fn path_matches<'a>(route: &'a Route, path: &'a str) -> Option<InlineVec<(&'a str, &'a str)>> {
    // What is left of the path after the segments matched so far; `None`
    // once it has none left.
    let mut left = Some(path.strip_prefix('/').unwrap_or(path));
    let mut params = InlineVec::new();
    for segment in &route.segments {
        let now = left?;
        if let Segment::Rest(name) = segment {
            params.push((name.as_str(), now));
            return Some(params);
        }
        let (part, after) = match now.split_once('/') {
            Some((part, after)) => (part, Some(after)),
            None => (now, None),
        };
        match segment {
            Segment::Literal(text) if text == part => {}
            Segment::Param(name) if !part.is_empty() => params.push((name.as_str(), part)),
            _ => return None,
        }
        left = after;
    }
    left.is_none().then_some(params)
}

/// Whether `host` (the request's, lower case, no port) is one `route`
/// serves.
fn host_matches(route: &Route, host: Option<&str>) -> bool {
    let Some(wanted) = &route.host_match else {
        return true;
    };
    let Some(host) = host else {
        return false;
    };
    match wanted.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
        None => host == wanted,
    }
}

/// The host a request names (`Host`, or HTTP/2's `:authority`), lower
/// case, without its port.
pub(crate) fn request_host(request: &Request) -> Option<String> {
    let named = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))?;
    Some(host_name(named))
}

/// A `Host` value's name, lower case, without its port.
pub(crate) fn host_name(named: &str) -> String {
    let host = match named.rsplit_once(':') {
        // An IPv6 literal keeps its colons: its port follows `]`.
        Some((host, port))
            if (!host.contains(':') || host.ends_with(']'))
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            host
        }
        _ => named,
    };
    host.to_ascii_lowercase()
}

/// What a canonical path may hold unencoded when forwarded (each `/` in it
/// separates segments: an encoded one is refused by [`canonical`]).
const PATH: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b';');

/// The request path, percent-decoded once: what routes are matched against
/// and identities taken from. Refused (`400 BAD_PATH`): an encoded `/` or
/// `\`, a `\`, NUL or `;` anywhere, `.` and `..` segments, empty segments
/// and anything that does not decode to UTF-8 — each a way to make the
/// limiter and the upstream read one path as two.
pub(crate) fn canonical(raw: &str) -> Result<Cow<'_, str>, ApiError> {
    let bad = |why: &str| Err(ApiError::BadPath(format!("{why}: {}", raw.escape_debug())));
    let encoded = |c: &str| {
        raw.as_bytes()
            .windows(3)
            .any(|w| w[0] == b'%' && w[1..].eq_ignore_ascii_case(c.as_bytes()))
    };
    // Nothing encoded (nearly every path): the path as sent, UTF-8 already.
    let decoded = match raw.contains('%') {
        false => Cow::Borrowed(raw),
        true if encoded("2f") || encoded("5c") => {
            return bad("an encoded `/` or `\\` in the path");
        }
        true => match percent_decode_str(raw).decode_utf8() {
            Ok(decoded) => decoded,
            Err(_) => return bad("the path does not decode to UTF-8"),
        },
    };
    // One pass over the bytes: the forbidden ones, and each segment (what
    // follows a `/`) when it ends.
    let bytes = decoded.as_bytes();
    let mut segment: Option<usize> = None;
    for i in 0..=bytes.len() {
        let byte = bytes.get(i).copied();
        match byte {
            Some(b'\\' | 0 | b';') => return bad("`\\`, NUL or `;` in the path"),
            Some(b'/') | None => {}
            Some(_) => continue,
        }
        if let Some(start) = segment {
            match &bytes[start..i] {
                b"." | b".." => return bad("a `.` or `..` segment in the path"),
                b"" if byte.is_some() => return bad("an empty segment in the path"),
                _ => {}
            }
        }
        segment = Some(i + 1);
    }
    Ok(decoded)
}

/// A canonical path, encoded once for the upstream.
pub(crate) fn encode(path: &str) -> Cow<'_, str> {
    Cow::from(utf8_percent_encode(path, PATH))
}

/// The client's address: the peer, or — when the peer is a trusted proxy —
/// the right-most address of `X-Forwarded-For` that is not a trusted proxy
/// (the addresses left of it are the client's own claims), or, without
/// `X-Forwarded-For`, its `X-Real-IP`.
pub(crate) fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut chain: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    // A proxy that names the client in `X-Real-IP` only (nginx's
    // `proxy_set_header X-Real-IP $remote_addr`): one hop.
    if chain.is_empty()
        && let Some(real) = headers.get("x-real-ip").and_then(|v| v.to_str().ok())
    {
        chain.push(real);
    }
    let mut client = peer;
    for entry in chain.iter().rev() {
        // Not an address where a trusted proxy wrote: keep the last hop.
        let Ok(ip) = entry.trim().parse::<IpAddr>() else {
            return client;
        };
        client = ip;
        if !is_trusted(&ip) {
            break;
        }
    }
    client
}

/// The caller's identity as sent, and its stored key: from the route's
/// first source that holds one (absent or blank: the next).
fn identity<'r>(
    route: &Route,
    request: &'r Request,
    params: &[(&'r str, &'r str)],
    client: Client<'_>,
    jwt: Option<&crate::config::Jwt>,
) -> Result<(Cow<'r, str>, String), ApiError> {
    let fallbacks = route
        .fallbacks
        .iter()
        .map(|(source, scope)| (source, scope));
    let mut blank = None;
    for (source, scope) in std::iter::once((&route.identity, &route.scope)).chain(fallbacks) {
        if *source == Identity::Route {
            // Every caller shares the route's key: its pattern as written.
            let value = Cow::Owned(route.text.clone());
            let key = scoped_key(scope, &value)?;
            return Ok((value, key));
        }
        let value = match source_value(source, request, params, client, jwt)? {
            Some(v) if !v.trim().is_empty() => v,
            Some(_) => {
                blank.get_or_insert(scope);
                continue;
            }
            None => continue,
        };
        let value = match route.fold_case {
            true => Cow::Owned(value.to_lowercase()),
            false => value,
        };
        let key = scoped_key(scope, &value)?;
        return Ok((value, key));
    }
    Err(ApiError::MissingIdentity(
        match (blank, route.fallbacks.is_empty()) {
            (Some(scope), true) => format!("the {scope} is empty"),
            (None, true) => format!("no {}", route.scope),
            (_, false) => {
                let scopes = route.fallbacks.iter().map(|(_, scope)| scope.as_str());
                let all: Vec<&str> = std::iter::once(route.scope.as_str())
                    .chain(scopes)
                    .collect();
                format!("none of {} holds an identity", all.join(", "))
            }
        },
    ))
}

/// What one identity source holds for the request, as sent.
fn source_value<'r>(
    source: &Identity,
    request: &'r Request,
    params: &[(&'r str, &'r str)],
    client: Client<'_>,
    jwt: Option<&crate::config::Jwt>,
) -> Result<Option<Cow<'r, str>>, ApiError> {
    Ok(match source {
        Identity::Header(name) => {
            let mut values = request.headers().get_all(name).iter();
            let (first, second) = (values.next(), values.next());
            let text = first.and_then(|v| v.to_str().ok());
            // Two values, or a list, would be two identities.
            if second.is_some() || text.is_some_and(|t| t.contains(',')) {
                return Err(ApiError::MissingIdentity(format!(
                    "one `{name}` header with one value, not a list"
                )));
            }
            text.map(Cow::Borrowed)
        }
        Identity::Path(name) => params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| Cow::Borrowed(*v)),
        // The client's address, or its network (`ipv6_prefix`).
        Identity::Peer => client.ip.map(|ip| Cow::Owned(client.limits.peer_key(ip))),
        Identity::Query(name) => {
            let query = request.uri().query().unwrap_or_default();
            let mut values = form_urlencoded::parse(query.as_bytes()).filter(|(n, _)| n == name);
            let (first, second) = (values.next(), values.next());
            if second.is_some() {
                return Err(ApiError::MissingIdentity(format!(
                    "one `{name}` query parameter, not two"
                )));
            }
            first.map(|(_, v)| Cow::Owned(v.into_owned()))
        }
        Identity::Cookie(name) => {
            let mut values = request
                .headers()
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .filter_map(|pair| pair.trim().split_once('='))
                .filter(|(n, _)| n == name);
            let (first, second) = (values.next(), values.next());
            if second.is_some() {
                return Err(ApiError::MissingIdentity(format!(
                    "one `{name}` cookie, not two"
                )));
            }
            first.map(|(_, v)| Cow::Borrowed(v.trim_matches('"')))
        }
        // One key for every caller: the route's (handled by `identity`).
        Identity::Route => None,
        // A token that is there must verify: never read unverified, never
        // passed over for the next source.
        Identity::Jwt(claim) => {
            let Some(jwt) = jwt else {
                return Err(ApiError::InvalidToken(
                    "no [jwt] to verify tokens with".into(),
                ));
            };
            let Some(value) = request.headers().get(&jwt.header) else {
                return Ok(None);
            };
            let text = value.to_str().unwrap_or_default().trim();
            let token = match jwt.header == header::AUTHORIZATION {
                true => match text.split_once(' ') {
                    Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                    _ => return Err(ApiError::InvalidToken("not a Bearer token".into())),
                },
                false => text,
            };
            match jwt.claim(token, claim) {
                Ok(value) => value.map(Cow::Owned),
                Err(refused) => return Err(ApiError::InvalidToken(refused.0)),
            }
        }
    })
}

/// A route and the path's parameters.
pub(crate) struct Matched<'a> {
    pub(crate) route: &'a Route,
    pub(crate) params: InlineVec<(&'a str, &'a str)>,
}

/// The first route for the request, or `404`, or `405` with the methods
/// the path allows.
pub(crate) fn route<'a>(
    shared: &'a Shared,
    method: &Method,
    host: Option<&str>,
    path: &'a str,
) -> Result<Matched<'a>, ApiError> {
    let mut allowed: Vec<&str> = Vec::new();
    for route in &shared.config.routes {
        if !host_matches(route, host) {
            continue;
        }
        let Some(params) = path_matches(route, path) else {
            continue;
        };
        match &route.method {
            Some(m) if m != method => allowed.push(m.as_str()),
            _ => return Ok(Matched { route, params }),
        }
    }
    match allowed.is_empty() {
        true => Err(ApiError::NotFound(format!("no route for {method} {path}"))),
        false => Err(ApiError::MethodNotAllowed {
            allow: allowed.join(", "),
            detail: format!("{path} allows {}", allowed.join(", ")),
        }),
    }
}

/// The client, as a `peer` identity reads it: its address behind trusted
/// proxies, keyed as its network only when a source asks.
#[derive(Clone, Copy)]
struct Client<'a> {
    ip: Option<IpAddr>,
    limits: &'a crate::config::ConnectionLimits,
}

/// A request ready to decide.
pub(crate) struct Identified {
    /// The policies that decide it, its overrides resolved.
    pub(crate) ids: InlineVec<TableId>,
    /// Per policy of `ids`, the stored key of its own identity, if it has
    /// one (`None`: it counts the route's).
    pub(crate) own_keys: InlineVec<Option<String>>,
    /// The route's stored key.
    pub(crate) key: String,
    /// What it is charged on admission.
    pub(crate) cost: u64,
    /// The client's address (behind trusted proxies, the one they name).
    pub(crate) client: Option<IpAddr>,
    /// The identity as sent, for the access log (with `access_log_identity`).
    pub(crate) identity: Option<String>,
}

/// What a matched request is before it is decided: its body within the
/// route's bound, its identity (and the overrides for it), its admission
/// cost.
pub(crate) fn identify(
    shared: &Shared,
    route: &Route,
    params: &[(&str, &str)],
    request: &Request,
    peer: Option<SocketAddr>,
) -> Result<Identified, ApiError> {
    // A body announced over the route's bound is refused before anything
    // is charged.
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > route.max_body) {
        let max = usize::try_from(route.max_body).unwrap_or(usize::MAX);
        return Err(ApiError::BodyTooLarge(max));
    }
    let server = &shared.config.server;
    let client = peer.map(|p| client_ip(request.headers(), p.ip(), &server.trusted_proxies));
    // The address lists, against the client as identified.
    let listed =
        |list: &AddressList| client.is_some_and(|ip| !list.is_empty() && list.contains(ip));
    if listed(&server.deny) {
        metrics::counter!(crate::metrics::ADDRESS_LISTS, "list" => "deny").increment(1);
        return Err(ApiError::Denied);
    }
    let exempt = listed(&server.allow) || listed(&route.exempt);
    let jwt = shared.config.jwt.as_ref();
    let peer = Client {
        ip: client,
        limits: &server.limits,
    };
    let (sent, key) = identity(route, request, params, peer, jwt)?;
    // An overridden identity is decided by its override; an exempt client
    // by none of them.
    let (mut ids, mut own_keys) = (InlineVec::new(), InlineVec::new());
    let mut resolver = shared.resolver();
    for (&policy, own) in route.policies.iter().zip(&route.keyed) {
        if exempt || listed(&shared.table.get(policy).exempt) {
            continue;
        }
        let (sent, key) = match own {
            None => (Cow::Borrowed(sent.as_ref()), None),
            Some((source, scope)) => {
                let value = source_value(source, request, params, peer, jwt)?
                    .filter(|v| !v.trim().is_empty())
                    .ok_or_else(|| ApiError::MissingIdentity(format!("no {scope}")))?;
                let value = match route.fold_case {
                    true => Cow::Owned(value.to_lowercase()),
                    false => value,
                };
                let key = scoped_key(scope, &value)?;
                (value, Some(key))
            }
        };
        ids.push(resolver.resolve(policy, &sent));
        own_keys.push(key);
    }
    if ids.len() < route.policies.len() {
        metrics::counter!(crate::metrics::ADDRESS_LISTS, "list" => "exempt").increment(1);
    }
    let cost = admission(route, request.headers())?;
    Ok(Identified {
        identity: server.access_log_identity.then(|| sent.to_string()),
        ids,
        own_keys,
        key,
        cost,
        client,
    })
}

/// What a request is charged on admission: the route's `cost`.
pub(crate) fn admission(route: &Route, headers: &HeaderMap) -> Result<u64, ApiError> {
    match &route.cost {
        Cost::Fixed(n) => Ok(*n),
        Cost::Header { name, min } => match headers.get(name) {
            None => Ok(min.unwrap_or(1)),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|cost| cost.max(min.unwrap_or(0)))
                .ok_or_else(|| {
                    ApiError::InvalidRequest(format!(
                        "`{name}` must be a whole number of at least 0"
                    ))
                }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_the_right_most_untrusted_address() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let xff = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", v.parse().unwrap());
            h
        };
        // An untrusted peer's claims are ignored.
        assert_eq!(
            client_ip(&xff("1.1.1.1"), ip("203.0.113.9"), &trusted),
            ip("203.0.113.9")
        );
        // Behind two trusted proxies: the first untrusted from the right.
        let h = xff("6.6.6.6, 198.51.100.7, 10.0.0.2");
        assert_eq!(client_ip(&h, ip("10.0.0.1"), &trusted), ip("198.51.100.7"));
        // Garbage written left of the client changes nothing.
        let h = xff("nonsense, 198.51.100.7");
        assert_eq!(client_ip(&h, ip("10.0.0.1"), &trusted), ip("198.51.100.7"));
        // A trusted proxy without a chain: the proxy itself.
        assert_eq!(
            client_ip(&HeaderMap::new(), ip("10.0.0.1"), &trusted),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn canonical_paths() {
        assert_eq!(
            canonical("/shops/%63arol/items").unwrap(),
            "/shops/carol/items"
        );
        for good in ["/", "/a/", "/a/b", "/.a/b..", "/a.b/...", "*"] {
            assert_eq!(canonical(good).unwrap(), good);
            assert!(matches!(canonical(good).unwrap(), Cow::Borrowed(_)));
        }
        for bad in [
            "/a/../b", "/a/%2e", "/a%2Fb", "/a;b", "/a\\b", "/a%00", "/a//b", "/%ff", "/.",
            "/a/..", "//", "/a%5c", "/a%3b",
        ] {
            assert!(canonical(bad).is_err(), "{bad}");
        }
        assert_eq!(encode("/café menu/a?b"), "/caf%C3%A9%20menu/a%3Fb");
    }
}

/// The route an answer is counted under, set by the gateway behind the
/// router (the per-core listener hands it over directly).
#[derive(Debug, Clone)]
pub(crate) struct RouteLabel(pub(crate) std::sync::Arc<str>);
