//! A tower layer that rate-limits requests with a weir [`Limiter`]: for axum,
//! hyper and tonic services.
//!
//! Each request's identity comes from a [`KeyExtractor`] (a closure, a
//! trusted header with [`HeaderKey`], or the peer address with [`PeerKey`]).
//! A rejected request is answered at once with `429 Too Many Requests`,
//! `Retry-After` (whole seconds, rounded up, never 0), `Cache-Control:
//! no-store`, the IETF draft `RateLimit-Policy` and `RateLimit` fields and the
//! body `{"error":"RATE_LIMITED","policy":"<name>"}`. An admitted request is
//! passed on (after its `delay`, for a leaky-bucket shaper) and its response
//! carries the `RateLimit` fields too.
//!
//! ```no_run
//! use std::sync::Arc;
//! use axum::{routing::get, Router};
//! use weir_limiter::{Limiter, Policy};
//! use weir_tower::{HeaderKey, RateLimitLayer};
//!
//! let limiter = Arc::new(Limiter::builder()
//!     .policy("api", Policy::parse("token-bucket capacity=10 rate=2/s").unwrap())
//!     .build().unwrap());
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter, "api", HeaderKey::new("x-api-key")).unwrap());
//! ```
//!
//! Identities are untrusted input: a key longer than the limiter's bound or
//! not valid UTF-8 is refused (`422 KEY_TOO_LONG`, `400 MISSING_IDENTITY`),
//! never truncated into another key.

mod headers;

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;
use weir_limiter::{Check, CheckError, Clock, Decision, Error, Limiter, PolicyId, SystemClock};

pub use headers::{
    Limited, Part, error_body, fields, quota, rate_limit_policy, retry_after_seconds,
};

/// Where a request's identity comes from.
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key to limit this request under; `None` when the request carries
    /// no usable identity (answered with `400`).
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Cow<'a, str>>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Cow<'a, str>> {
        self(request).map(Cow::Owned)
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
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Cow<'a, str>> {
        let value = request.headers().get(&self.0)?.to_str().ok()?;
        (!value.is_empty()).then_some(Cow::Borrowed(value))
    }
}

/// The peer's IP address (not the port), from axum's
/// `ConnectInfo<SocketAddr>` or a `SocketAddr` request extension.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerKey;

impl<B> KeyExtractor<B> for PeerKey {
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Cow<'a, str>> {
        let extensions = request.extensions();
        let addr = extensions.get::<SocketAddr>().copied();
        #[cfg(feature = "axum")]
        let addr = addr.or_else(|| {
            extensions
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|info| info.0)
        });
        addr.map(|a| Cow::Owned(a.ip().to_string()))
    }
}

/// Rate-limits a service with one policy of a [`Limiter`].
#[derive(Debug)]
pub struct RateLimitLayer<K, C = SystemClock> {
    shared: Arc<Shared<C>>,
    extractor: K,
}

impl<K: Clone, C> Clone for RateLimitLayer<K, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

#[derive(Debug)]
struct Shared<C> {
    limiter: Arc<Limiter<C>>,
    id: PolicyId,
    policy: String,
    /// `RateLimit-Policy`, the same for every response.
    field: http::HeaderValue,
    limit: u64,
}

impl<C> Shared<C> {
    fn part(&self, decision: Decision) -> Part<'_> {
        Part {
            name: &self.policy,
            field: &self.field,
            limit: self.limit,
            decision,
        }
    }
}

impl<K, C: Clock> RateLimitLayer<K, C> {
    /// Limits requests under the limiter's policy `policy`, each costing 1.
    pub fn new(limiter: Arc<Limiter<C>>, policy: &str, extractor: K) -> Result<Self, Error> {
        let id = limiter.policy(policy)?;
        let found = limiter
            .policies()
            .nth(id.index())
            .map(|(_, p)| *p)
            .ok_or_else(|| CheckError::UnknownPolicy(policy.to_owned()))?;
        Ok(Self {
            shared: Arc::new(Shared {
                limiter,
                id,
                policy: policy.to_owned(),
                field: rate_limit_policy(policy, &found),
                limit: quota(&found).0,
            }),
            extractor,
        })
    }
}

impl<S, K: Clone, C> Layer<S> for RateLimitLayer<K, C> {
    type Service = RateLimit<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
#[derive(Debug)]
pub struct RateLimit<S, K, C = SystemClock> {
    inner: S,
    shared: Arc<Shared<C>>,
    extractor: K,
}

impl<S: Clone, K: Clone, C> Clone for RateLimit<S, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, K, C, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor<ReqB>,
    C: Clock + 'static,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = self.shared.clone();
        let decision = match self.extractor.key(&request) {
            None => Err(refusal(
                StatusCode::BAD_REQUEST,
                "MISSING_IDENTITY",
                &shared.policy,
            )),
            Some(key) => shared
                .limiter
                .check_one(Check::new(shared.id, &key))
                .map_err(|e| match e {
                    Error::Invalid(CheckError::KeyTooLong { .. }) => refusal(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "KEY_TOO_LONG",
                        &shared.policy,
                    ),
                    // The key table is full of limited keys: refuse, never admit.
                    _ => refusal(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "LIMITER_FULL",
                        &shared.policy,
                    ),
                }),
        };
        let decision = match decision {
            Ok(decision) => decision,
            Err(response) => return Box::pin(async move { Ok(response) }),
        };
        if !decision.allowed {
            let limited = Limited {
                policy: &shared.policy,
                retry_after: decision.retry_after,
                parts: &[shared.part(decision)],
            }
            .response();
            return Box::pin(async move { Ok(limited) });
        }
        // The service that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if decision.delay > 0 {
                tokio::time::sleep(Duration::from_nanos(decision.delay)).await;
            }
            let mut response = inner.call(request).await?;
            response
                .headers_mut()
                .extend(fields(&[shared.part(decision)]));
            Ok(response)
        })
    }
}

fn refusal<B: From<String>>(status: StatusCode, error: &str, policy: &str) -> Response<B> {
    let mut response = Response::new(B::from(error_body(error, policy)));
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
