//! A tower layer that rate-limits requests with weir: for axum and hyper
//! services, over any weir [`Store`] — the in-process [`Limiter`], a shared
//! Redis (`weir_redis::RedisStore`), or your own.
//!
//! Each request's identity comes from a [`KeyExtractor`]: a closure, a
//! trusted header ([`HeaderKey`]), the peer address ([`PeerKey`](struct@PeerKey)), or the
//! client address behind proxies you trust ([`ForwardedKey`]). Its cost
//! comes from a [`Cost`] (1, or a closure). The layer checks one or several
//! policies all-or-nothing. A rejected request is answered at once with
//! `429 Too Many Requests`, `Retry-After` (whole seconds, rounded up, never
//! 0; the largest among the refusing policies), `Cache-Control: no-store`,
//! the IETF draft `RateLimit-Policy` and `RateLimit` fields and the body
//! `{"error":"RATE_LIMITED","policy":"<name>"}` ([`Limited`], the same answer
//! `weir serve` gives). An admitted request is passed on (after its `delay`,
//! for a leaky-bucket shaper) and its response carries the `RateLimit`
//! fields too.
//!
//! ```no_run
//! use std::sync::Arc;
//! use axum::{routing::get, Router};
//! use weir_limiter::{Limiter, Policy};
//! use weir_tower::{HeaderKey, RateLimitLayer};
//!
//! let limiter = Arc::new(Limiter::builder()
//!     .policy("per-key", Policy::parse("token-bucket capacity=10 rate=2/s").unwrap())
//!     .policy("per-day", Policy::parse("fixed-window limit=10000 window=1d").unwrap())
//!     .build().unwrap());
//! let layer = RateLimitLayer::builder(limiter)
//!     .policy("per-key")
//!     .policy("per-day")
//!     .build(HeaderKey::new("x-api-key"))
//!     .unwrap()
//!     // Uploads cost one per started megabyte.
//!     .cost(|request: &http::Request<axum::body::Body>| {
//!         let bytes = request.headers().get("content-length")
//!             .and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).unwrap_or(0);
//!         bytes.div_ceil(1 << 20).max(1)
//!     });
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! ```
//!
//! Identities are untrusted input: a key longer than 256 bytes or not valid
//! UTF-8 is refused (`422 KEY_TOO_LONG`, `400 MISSING_IDENTITY`), never
//! truncated into another key. An extractor that cannot work as the service
//! is set up (the peer address without axum's `ConnectInfo`) answers `500`
//! naming the fix, on every request, rather than a silent `400`.
//!
//! A **concurrency** policy (`concurrency limit=N lease=D`) bounds the
//! requests in flight (one slot each, whatever the layer's cost): its lease
//! is held from admission for the life of
//! the response future and its body ([`LeaseBody`]), and released when the
//! body ends or is dropped (the client went away, the service failed). The
//! layer does not renew it: give the policy a lease longer than your
//! slowest response, or hold a [`weir_limiter::LeaseGuard`] yourself.
//!
//! tonic services are not supported: a gRPC client needs `RESOURCE_EXHAUSTED`
//! in a gRPC status, not an HTTP `429`.

mod headers;
mod lease_body;

use std::borrow::Cow;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;
use weir_core::store::{self, Store};
use weir_limiter::{
    AllDecision, CheckError, Clock, DEFAULT_MAX_KEY_LEN as MAX_IDENTITY, Error, Limiter, Policy,
};

pub use headers::{
    HeaderStyle, Limited, Part, append_fields, error_body, fields, fields_in, quota,
    rate_limit_policy, retry_after_seconds,
};
pub use lease_body::{Held, LeaseBody};

/// Why a request has no identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// The request carries none (answered `400 MISSING_IDENTITY`).
    Missing,
    /// The extractor cannot work as the service is set up: a programming
    /// error, answered `500` with this fix.
    Misconfigured(&'static str),
}

/// Where a request's identity comes from.
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key to limit this request under.
    fn key<'a>(&self, request: &'a Request<B>) -> Result<Cow<'a, str>, KeyError>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn key<'a>(&self, request: &'a Request<B>) -> Result<Cow<'a, str>, KeyError> {
        self(request).map(Cow::Owned).ok_or(KeyError::Missing)
    }
}

/// The value of a header set by a **trusted** proxy (for example
/// `x-seller-id` after authentication). Clients must not be able to set it.
#[derive(Debug, Clone)]
pub struct HeaderKey(HeaderName);

impl HeaderKey {
    /// Reads the header `name`.
    ///
    /// # Panics
    /// If `name` is not a valid header name (a programming error).
    #[allow(clippy::expect_used)]
    pub fn new(name: &str) -> Self {
        Self(HeaderName::try_from(name).expect("a valid header name"))
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn key<'a>(&self, request: &'a Request<B>) -> Result<Cow<'a, str>, KeyError> {
        let mut values = request.headers().get_all(&self.0).iter();
        match (values.next(), values.next()) {
            // One value, not empty: a second one would be a second identity.
            (Some(value), None) => match value.to_str() {
                Ok(v) if !v.is_empty() => Ok(Cow::Borrowed(v)),
                _ => Err(KeyError::Missing),
            },
            _ => Err(KeyError::Missing),
        }
    }
}

/// The connection's peer address, from axum's `ConnectInfo<SocketAddr>` or a
/// `SocketAddr` request extension.
fn peer<B>(request: &Request<B>) -> Result<IpAddr, KeyError> {
    let extensions = request.extensions();
    let addr = extensions.get::<SocketAddr>().copied();
    #[cfg(feature = "axum")]
    let addr = addr.or_else(|| {
        extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|info| info.0)
    });
    addr.map(|a| a.ip()).ok_or(KeyError::Misconfigured(
        "the peer address is not available: serve the app with `into_make_service_with_connect_info::<SocketAddr>()` (axum), or insert a `SocketAddr` request extension",
    ))
}

/// The key of a client at `ip`: its address when the prefix is the whole
/// address (`192.0.2.7`), else its network (`2001:db8:1:2::/64`), so that
/// the addresses a client rotates through inside its network are one key.
/// An IPv4-mapped IPv6 address is its IPv4 address.
pub fn network_key(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> String {
    let ip = ip.to_canonical();
    let (prefix, whole) = match ip {
        IpAddr::V4(_) => (ipv4_prefix, 32),
        IpAddr::V6(_) => (ipv6_prefix, 128),
    };
    match ipnet::IpNet::new(ip, prefix.min(whole)) {
        Ok(net) if prefix < whole => net.trunc().to_string(),
        _ => ip.to_string(),
    }
}

/// The peer's IP address (not the port); an IPv6 peer as its /64, the
/// network one host or LAN is given (the addresses it rotates through are
/// one key): [`PeerKey::prefixes`] for others. Behind a proxy every client
/// has the proxy's address: use [`ForwardedKey`] there.
#[derive(Debug, Clone, Copy)]
pub struct PeerKey {
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

/// [`PeerKey::default`], as a value.
#[allow(non_upper_case_globals)]
pub const PeerKey: PeerKey = PeerKey {
    ipv4_prefix: 32,
    ipv6_prefix: 64,
};

impl Default for PeerKey {
    fn default() -> Self {
        PeerKey
    }
}

impl PeerKey {
    /// Clients as their networks of these prefix lengths (IPv4 1 to 32,
    /// IPv6 1 to 128; 32 and 128 key every address apart).
    pub fn prefixes(ipv4_prefix: u8, ipv6_prefix: u8) -> Self {
        Self {
            ipv4_prefix,
            ipv6_prefix,
        }
    }
}

impl<B> KeyExtractor<B> for PeerKey {
    fn key<'a>(&self, request: &'a Request<B>) -> Result<Cow<'a, str>, KeyError> {
        let ip = peer(request)?;
        Ok(Cow::Owned(network_key(
            ip,
            self.ipv4_prefix,
            self.ipv6_prefix,
        )))
    }
}

/// The client's address behind `hops` proxies you trust, each appending the
/// address it received the request from: the `hops`-th address from the
/// right of `X-Forwarded-For` (or of the `for=` items of `Forwarded`).
/// Addresses further left are the client's own claims and are ignored; a
/// request with fewer entries than `hops` did not come through the proxies
/// and has no identity.
#[derive(Debug, Clone, Copy)]
pub struct ForwardedKey {
    hops: usize,
    standard: bool,
}

impl ForwardedKey {
    /// From `X-Forwarded-For`, behind `hops` (at least 1) trusted proxies.
    pub fn x_forwarded_for(hops: usize) -> Self {
        Self {
            hops: hops.max(1),
            standard: false,
        }
    }

    /// From `Forwarded` (RFC 7239), behind `hops` (at least 1) trusted
    /// proxies.
    pub fn forwarded(hops: usize) -> Self {
        Self {
            hops: hops.max(1),
            standard: true,
        }
    }
}

impl<B> KeyExtractor<B> for ForwardedKey {
    fn key<'a>(&self, request: &'a Request<B>) -> Result<Cow<'a, str>, KeyError> {
        let name = if self.standard {
            http::header::FORWARDED
        } else {
            HeaderName::from_static("x-forwarded-for")
        };
        let mut entries: Vec<&str> = Vec::new();
        for value in request.headers().get_all(name) {
            let value = value.to_str().map_err(|_| KeyError::Missing)?;
            entries.extend(value.split(',').map(str::trim));
        }
        let entry = entries
            .len()
            .checked_sub(self.hops)
            .map(|i| entries[i])
            .ok_or(KeyError::Missing)?;
        let address = match self.standard {
            false => entry,
            true => entry
                .split(';')
                .find_map(|pair| {
                    let (key, value) = pair.trim().split_once('=')?;
                    key.eq_ignore_ascii_case("for").then_some(value)
                })
                .ok_or(KeyError::Missing)?,
        };
        // `"[2001:db8::1]:4711"`, `192.0.2.1:80`, `192.0.2.1`.
        let address = address.trim_matches('"');
        let ip = match address.strip_prefix('[') {
            Some(rest) => rest.split(']').next().and_then(|a| a.parse().ok()),
            None => address
                .parse::<IpAddr>()
                .ok()
                .or_else(|| address.parse::<SocketAddr>().ok().map(|s| s.ip())),
        };
        ip.map(|ip: IpAddr| Cow::Owned(ip.to_string()))
            .ok_or(KeyError::Missing)
    }
}

/// What one request costs.
pub trait Cost<B>: Clone + Send + Sync + 'static {
    /// The charge for `request` (at least 1).
    fn cost(&self, request: &Request<B>) -> u64;
}

/// Every request costs 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct One;

impl<B> Cost<B> for One {
    fn cost(&self, _: &Request<B>) -> u64 {
        1
    }
}

impl<B, F> Cost<B> for F
where
    F: Fn(&Request<B>) -> u64 + Clone + Send + Sync + 'static,
{
    fn cost(&self, request: &Request<B>) -> u64 {
        self(request).max(1)
    }
}

/// Why a request got no decision from the store.
#[derive(Debug)]
enum Refused {
    Invalid(CheckError),
    Full,
    Unavailable,
}

/// One policy of a layer, resolved once.
#[derive(Debug)]
struct Limit {
    name: String,
    policy: Policy,
    field: http::HeaderValue,
    limit: u64,
}

#[derive(Debug)]
struct Shared<S> {
    store: S,
    limits: Vec<Limit>,
    /// [`Builder::charge_on`]: admitted by a probe, charged after the
    /// answer when its status says so.
    charge_on: Option<fn(StatusCode) -> bool>,
}

impl<S: Store + Clone + 'static> Shared<S> {
    /// The request's decision, and the leases its admission took.
    async fn decide(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<(AllDecision, Option<Held<S>>), Refused> {
        let checks = self.checks(key, cost, |c| store::Check {
            probe: self.charge_on.is_some(),
            ..c
        });
        let checked = match self.store.decide(&checks, store::Mode::CHARGE).await {
            Ok(checked) => checked,
            Err(store::Error::Invalid(e)) => return Err(Refused::Invalid(e)),
            // The key table is full of limited keys: refuse, never admit.
            Err(store::Error::Full { .. }) => return Err(Refused::Full),
            Err(_) => return Err(Refused::Unavailable),
        };
        let leases = (self.limits.iter())
            .zip(&checked.all.decisions)
            .filter_map(|(l, d)| Some((l.name.clone(), l.policy, d.lease?)))
            .collect();
        let held = Held::new(self.store.clone(), key, leases, false);
        Ok((checked.all, held))
    }

    /// The store checks of a request of `cost` by `key`, as `made`
    /// finishes them.
    fn checks<'a>(
        &'a self,
        key: &'a str,
        cost: u64,
        made: impl Fn(store::Check<'a>) -> store::Check<'a>,
    ) -> smallvec::SmallVec<[store::Check<'a>; 4]> {
        (self.limits.iter())
            .map(|l| {
                made(store::Check::from(weir_core::Check {
                    name: &l.name,
                    policy: &l.policy,
                    key,
                    cost: l.policy.request_cost(cost, None),
                }))
            })
            .collect()
    }

    /// Charges an answer `charge_on` counts (a report of the request's
    /// cost to every policy); a store that cannot take it leaves it
    /// uncharged.
    async fn charge(&self, key: &str, cost: u64) {
        let reports = self.checks(key, cost, |c| store::Check { report: true, ..c });
        let _ = self.store.decide(&reports, store::Mode::CHARGE).await;
    }

    fn parts(&self, all: &AllDecision) -> Vec<Part<'_>> {
        self.limits
            .iter()
            .zip(&all.decisions)
            .map(|(l, d)| Part {
                name: &l.name,
                field: &l.field,
                limit: l.limit,
                decision: *d,
            })
            .collect()
    }

    fn first_name(&self) -> &str {
        self.limits.first().map_or("", |l| l.name.as_str())
    }
}

/// Builds a [`RateLimitLayer`] over a [`Store`].
#[derive(Debug)]
pub struct Builder<S> {
    store: S,
    policies: Vec<(String, Option<Policy>)>,
    charge_on: Option<fn(StatusCode) -> bool>,
}

impl<S: Store> Builder<S> {
    /// Adds a policy the store keeps (the in-process limiter's), by name: a
    /// request must pass all of them (and is charged by all, or by none).
    pub fn policy(mut self, name: impl Into<String>) -> Self {
        self.policies.push((name.into(), None));
        self
    }

    /// Adds a policy by name and parameters, for a store told them with
    /// every check (Redis).
    pub fn policy_with(mut self, name: impl Into<String>, policy: Policy) -> Self {
        self.policies.push((name.into(), Some(policy)));
        self
    }

    /// Charges only the answers whose status `charged` picks ("count only
    /// the failed logins": `|s| s == 401 || s == 403`): a request is
    /// admitted by a probe of its cost (docs/SPEC.md), which charges
    /// nothing, and charged its cost once its answer is one of those. A
    /// request whose client goes away before its answer is not charged.
    pub fn charge_on(mut self, charged: fn(StatusCode) -> bool) -> Self {
        self.charge_on = Some(charged);
        self
    }

    /// The layer, with identities from `extractor`, each request costing 1
    /// (see [`RateLimitLayer::cost`]); fails on an unknown policy or none.
    pub fn build<K>(self, extractor: K) -> Result<RateLimitLayer<K, S>, Error> {
        if self.policies.is_empty() {
            return Err(Error::Config("name at least one policy".into()));
        }
        let limits = self
            .policies
            .iter()
            .map(|(name, given)| {
                let policy = given
                    .or_else(|| self.store.parameters(name))
                    .ok_or_else(|| CheckError::UnknownPolicy(name.clone()))?;
                Ok(Limit {
                    name: name.clone(),
                    field: rate_limit_policy(name, &policy),
                    limit: quota(&policy).0,
                    policy,
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                limits,
                charge_on: self.charge_on,
            }),
            extractor,
            cost: One,
        })
    }
}

/// Rate-limits a service with one or more policies of a [`Store`]: the
/// in-process [`Limiter`] (shared in an `Arc`), a `weir_redis::RedisStore`,
/// or any other.
#[derive(Debug)]
pub struct RateLimitLayer<K, S = Arc<Limiter>, F = One> {
    shared: Arc<Shared<S>>,
    extractor: K,
    cost: F,
}

impl<K: Clone, S, F: Clone> Clone for RateLimitLayer<K, S, F> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
            cost: self.cost.clone(),
        }
    }
}

impl<K, C: Clock + Send + Sync + 'static> RateLimitLayer<K, Arc<Limiter<C>>> {
    /// Limits requests under the limiter's policy `policy`, each costing 1.
    pub fn new(limiter: Arc<Limiter<C>>, policy: &str, extractor: K) -> Result<Self, Error> {
        RateLimitLayer::builder(limiter)
            .policy(policy)
            .build(extractor)
    }
}

impl RateLimitLayer<()> {
    /// Starts a layer over `store`: name its policies, then
    /// [`Builder::build`] it with a key extractor.
    pub fn builder<S: Store>(store: S) -> Builder<S> {
        Builder {
            store,
            policies: Vec::new(),
            charge_on: None,
        }
    }
}

impl<K, S, F> RateLimitLayer<K, S, F> {
    /// Charges each request what `cost` says (a closure over the request,
    /// at least 1) instead of 1.
    pub fn cost<G>(self, cost: G) -> RateLimitLayer<K, S, G> {
        RateLimitLayer {
            shared: self.shared,
            extractor: self.extractor,
            cost,
        }
    }
}

impl<T, K: Clone, S, F: Clone> Layer<T> for RateLimitLayer<K, S, F> {
    type Service = RateLimit<T, K, S, F>;

    fn layer(&self, inner: T) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
            cost: self.cost.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
#[derive(Debug)]
pub struct RateLimit<T, K, S = Arc<Limiter>, F = One> {
    inner: T,
    shared: Arc<Shared<S>>,
    extractor: K,
    cost: F,
}

impl<T: Clone, K: Clone, S, F: Clone> Clone for RateLimit<T, K, S, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
            cost: self.cost.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<T, K, S, F, ReqB, ResB> Service<Request<ReqB>> for RateLimit<T, K, S, F>
where
    T: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    T::Future: Send,
    K: KeyExtractor<ReqB>,
    S: Store + Clone + 'static,
    F: Cost<ReqB>,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<LeaseBody<ResB>>;
    type Error = T::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = self.shared.clone();
        let policy = shared.first_name().to_owned();
        let key = match self.extractor.key(&request) {
            Ok(key) => key.into_owned(),
            Err(KeyError::Missing) => {
                let refused = refusal(StatusCode::BAD_REQUEST, "MISSING_IDENTITY", &policy, None);
                return Box::pin(async move { Ok(refused) });
            }
            Err(KeyError::Misconfigured(fix)) => {
                let refused = refusal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "MISCONFIGURED",
                    &policy,
                    Some(fix),
                );
                return Box::pin(async move { Ok(refused) });
            }
        };
        if key.len() > MAX_IDENTITY {
            let detail = format!("an identity is at most {MAX_IDENTITY} bytes");
            let refused = refusal(
                StatusCode::UNPROCESSABLE_ENTITY,
                "KEY_TOO_LONG",
                &policy,
                Some(&detail),
            );
            return Box::pin(async move { Ok(refused) });
        }
        let cost = self.cost.cost(&request);
        // The service that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (all, held) = match shared.decide(&key, cost).await {
                Ok(decided) => decided,
                Err(refused) => {
                    let (status, code, detail) = match refused {
                        Refused::Invalid(CheckError::KeyTooLong { .. }) => {
                            (StatusCode::UNPROCESSABLE_ENTITY, "KEY_TOO_LONG", None)
                        }
                        Refused::Invalid(e) => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "COST_NEVER_FITS",
                            Some(e.to_string()),
                        ),
                        Refused::Full => (StatusCode::SERVICE_UNAVAILABLE, "LIMITER_FULL", None),
                        Refused::Unavailable => {
                            (StatusCode::SERVICE_UNAVAILABLE, "STORE_UNAVAILABLE", None)
                        }
                    };
                    return Ok(refusal(status, code, &policy, detail.as_deref()));
                }
            };
            let parts = shared.parts(&all);
            if let Some(first) = all.decisions.iter().position(|d| !d.allowed) {
                return Ok(Limited {
                    policy: parts[first].name,
                    retry_after: all.retry_after(),
                    parts: &parts,
                    style: HeaderStyle::Ietf,
                }
                .response());
            }
            let delay = all.decisions.iter().map(|d| d.delay).max().unwrap_or(0);
            if delay > 0 {
                tokio::time::sleep(Duration::from_nanos(delay)).await;
            }
            let headers = fields(&parts);
            // Held while the service runs: dropped with this future if the
            // client leaves, or if the service fails.
            let response = inner.call(request).await?;
            if shared
                .charge_on
                .is_some_and(|charged| charged(response.status()))
            {
                shared.charge(&key, cost).await;
            }
            let mut response = response.map(|body| LeaseBody::holding(body, held));
            response.headers_mut().extend(headers);
            Ok(response)
        })
    }
}

fn refusal<B: From<String>>(
    status: StatusCode,
    error: &str,
    policy: &str,
    detail: Option<&str>,
) -> Response<B> {
    let body = match detail {
        None => error_body(error, policy),
        Some(detail) => format!(
            r#"{{"error":"{error}","policy":{},"detail":{}}}"#,
            serde_json::Value::from(policy),
            serde_json::Value::from(detail)
        ),
    };
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(1));
    }
    response
}
