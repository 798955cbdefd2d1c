//! The gRPC listener: the Envoy rate limit service, Envoy's external
//! authorization (`ext_authz`) and the standard gRPC health service over
//! HTTP/2 (prior knowledge, as Envoy and gRPC clients
//! speak it), their tonic-generated services served by hyper directly.
//!
//! tonic's transport server wraps every call in its own layers — a router
//! (axum's), a `grpc-timeout` service, error recovery, a future mapped and
//! boxed at each step — a measurable share of an in-memory call's
//! instructions (docs/BENCHMARKS.md). What those layers did that a caller can see is
//! kept: a `grpc-timeout` header is honoured (a call still running at its
//! deadline is answered `DEADLINE_EXCEEDED`), and a method served by
//! neither service is answered `UNIMPLEMENTED`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::auth::v3::authorization_server::AuthorizationServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper_util::server::graceful::Watcher;
use tokio::net::TcpListener;
use tower_service::Service;

use crate::envoy::RateLimiter;
use crate::ext_authz::Authorizer;
use crate::rlqs::Quotas;
use crate::serve::{Accepted, Activity, InFlight, Open, Protocol, listen};
use crate::state::AppState;
use crate::tls::{Alpn, Tls};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

type Answer = Pin<Box<dyn Future<Output = Result<Response<tonic::body::Body>, Infallible>> + Send>>;

const RLS: &str = "/envoy.service.ratelimit.v3.RateLimitService/";
const AUTHZ: &str = "/envoy.service.auth.v3.Authorization/";
const HEALTH: &str = "/grpc.health.v1.Health/";
const RLQS: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";

/// The services, cloned for each call (their state is behind `Arc`s).
#[derive(Clone)]
struct Grpc<H> {
    rls: RateLimitServiceServer<RateLimiter>,
    authz: AuthorizationServer<Authorizer>,
    rlqs: RateLimitQuotaServiceServer<Quotas>,
    health: H,
}

impl<H> hyper::service::Service<Request<Incoming>> for Grpc<H>
where
    H: Service<Request<Incoming>, Response = Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    H::Future: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Answer {
        let deadline = grpc_timeout(request.headers());
        let path = request.uri().path();
        // The services are always ready (tonic's generated servers say so).
        let answer: Answer = if path.starts_with(RLS) {
            self.rls.clone().call(request)
        } else if path.starts_with(AUTHZ) {
            self.authz.clone().call(request)
        } else if path.starts_with(RLQS) {
            self.rlqs.clone().call(request)
        } else if path.starts_with(HEALTH) {
            Box::pin(self.health.clone().call(request))
        } else {
            return Box::pin(std::future::ready(Ok(
                tonic::Status::unimplemented("").into_http()
            )));
        };
        match deadline {
            None => answer,
            Some(deadline) => Box::pin(async move {
                match tokio::time::timeout(deadline, answer).await {
                    Ok(answered) => answered,
                    Err(_) => Ok(tonic::Status::deadline_exceeded(
                        "the call's grpc-timeout passed",
                    )
                    .into_http()),
                }
            }),
        }
    }
}

/// The `grpc-timeout` header (up to 8 digits and a unit: `H`, `M`, `S`,
/// `m`, `u` or `n`); one that does not parse is ignored, as tonic does.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at_checked(text.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// A service that counts its calls in flight for the connection's
/// watchdog, as the HTTP/1.1 listeners' does.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<tonic::body::Body>,
            Error = Infallible,
            Future = Answer,
        >,
{
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Guarded;

    fn call(&self, request: Request<Incoming>) -> Guarded {
        let guard = InFlight::start(&self.activity);
        Guarded {
            answer: self.inner.call(request),
            guard,
        }
    }
}

/// A call's answer, counted in flight until it is ready (no second box:
/// the answer is boxed already, so it is `Unpin`).
struct Guarded {
    answer: Answer,
    guard: InFlight,
}

impl Future for Guarded {
    type Output = Result<Response<tonic::body::Body>, Infallible>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let polled = self.answer.as_mut().poll(cx);
        if polled.is_ready() {
            self.guard.finish();
        }
        polled
    }
}

/// Serves the Envoy rate limit service and the standard gRPC health service
/// on `listener` until `shutdown` completes, through the listeners' one
/// accept loop (`serve::listen`): `[server]`'s connection caps, header and idle
/// timeouts, and a drain within `shutdown_timeout`, so a peer that keeps
/// its connection open cannot hold the process up.
pub async fn run_grpc(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = grpc_tls(&state)?;
    serve_grpc(listener, state, tls, Arc::default(), shutdown).await
}

/// `[server.grpc_tls]`, loaded now: one for all the listener's threads, so
/// that every thread serves the same (last good) certificate.
pub(crate) fn grpc_tls(state: &AppState) -> std::io::Result<Option<Tls>> {
    let files = state.current().config.server.grpc_tls.clone();
    files
        .map(|files| Tls::new(&files, Alpn::Grpc).map_err(std::io::Error::other))
        .transpose()
}

/// [`run_grpc`], its connections counted in `open` (shared by the
/// listener's threads).
pub(crate) async fn serve_grpc(
    listener: TcpListener,
    state: Arc<AppState>,
    tls: Option<Tls>,
    open: Arc<Mutex<Open>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RateLimiter>>()
        .await;
    health
        .set_serving::<AuthorizationServer<Authorizer>>()
        .await;
    let limits = state.current().config.server.limits;
    let service = Grpc {
        rls: RateLimiter::service(state.clone()),
        authz: Authorizer::service(state.clone()),
        rlqs: Quotas::service(state),
        health: health_service,
    };
    let protocol = match tls {
        Some(tls) => Protocol::Http2Tls(tls),
        None => Protocol::Http2,
    };
    let http2 = move |accepted: Accepted, watcher: Watcher| {
        let counted = Counted {
            inner: service.clone(),
            activity: accepted.activity,
        };
        let connection =
            crate::serve::http2(crate::serve::GRPC_STREAMS).serve_connection(accepted.io, counted);
        watcher.watch(connection)
    };
    listen(listener, limits, open, shutdown, protocol, http2).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_grpc_defines_them() {
        let parse = |text: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", text.parse().unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(parse("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "123456789m", "10x", "1.5S", "-1S", "S1"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
