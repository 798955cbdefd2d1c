//! What a listener serves: the router of the decision API, admin,
//! metrics and the dashboard, the gateway's requests straight to the
//! gateway, and what every request goes through (bounded headers and body
//! pieces, counted answers).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::{MethodRouter, delete, get, post};

use crate::answer::{ApiError, BodyTimedOut, MAX_HEADER_BYTES};
use crate::routing::RouteLabel;
use crate::state::AppState;
use crate::{api, envoy, envoy_json, forward_auth, gateway, limits_api, metrics, tls, ui};

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// Everything: the decision API, admin, metrics, health and the
    /// gateway routes (no `[server] internal` listener).
    All,
    /// The gateway routes and `/healthz` (the public side when there is an
    /// internal listener).
    Public,
    /// The decision API, admin, `/metrics`, `/v1/policies`, `/readyz` and
    /// `/healthz` (`[server] internal`).
    Internal,
}

/// Every route but `/healthz` that the public face of a split listener
/// does not serve: the decision API, admin, metrics and the dashboard. One
/// list, from which [`app`] builds the router and [`App::gateway`] tells the
/// API's paths from the gateway routes'.
fn api_routes() -> [(&'static str, MethodRouter<Arc<AppState>>); 21] {
    [
        ("/v1/check", post(api::check)),
        ("/v1/report", post(api::report)),
        ("/v1/release", post(api::release)),
        ("/v1/renew", post(api::renew)),
        ("/v1/policies", get(api::policies)),
        (
            "/v1/keys/{policy}/{key}",
            get(api::inspect_key).delete(api::reset_key),
        ),
        ("/v1/bans/{policy}/{key}", delete(api::lift_ban)),
        ("/v1/limits", get(limits_api::list)),
        (
            "/v1/limits/{policy}/{key}",
            get(limits_api::get_limit)
                .put(limits_api::set_limit)
                .delete(limits_api::remove_limit),
        ),
        // `{policy}` is the key here: one name per place in the path.
        (
            "/v1/keys/{policy}/plan",
            get(limits_api::get_plan)
                .put(limits_api::set_plan)
                .delete(limits_api::remove_plan),
        ),
        ("/v1/explain", get(api::explain)),
        ("/v1/admin/reload", post(api::reload)),
        ("/readyz", get(api::readyz)),
        ("/metrics", get(api::metrics)),
        ("/rlconfig", get(envoy::rlconfig)),
        ("/v1/stats", get(ui::stats)),
        ("/v1/top", get(ui::top)),
        ("/v1/simulate", post(ui::simulate)),
        ("/ui", get(ui::page)),
        ("/ui/app.js", get(ui::script)),
        ("/ui/style.css", get(ui::style)),
    ]
}

/// The liveness paths every listener answers: weir's, and the one
/// envoyproxy/ratelimit's probes ask.
const HEALTH: [&str; 2] = ["/healthz", "/healthcheck"];

/// Where `[server] envoy_json` answers.
const ENVOY_JSON: &str = "/json";

/// The router of one listener. Every path no API route takes goes to the
/// gateway routes (on the public side).
pub fn app(state: Arc<AppState>, face: Face) -> Router {
    let mut router = HEALTH
        .into_iter()
        .fold(Router::new(), |r, path| r.route(path, get(api::healthz)));
    if face != Face::Public {
        for (path, handler) in api_routes() {
            router = router.route(path, handler);
        }
    }
    if face != Face::Internal {
        let auth = axum::routing::any(forward_auth::auth);
        router = router
            .route(forward_auth::PATH, auth.clone())
            .route(&format!("{}/{{*original}}", forward_auth::PATH), auth);
        if state.current().config.server.envoy_json {
            router = router.route(ENVOY_JSON, axum::routing::post(envoy_json::json));
        }
        router = router.fallback(gateway::fallback);
    }
    router
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            every_request,
        ))
        .with_state(state)
}

/// What a listener serves: the gateway's requests straight to the gateway
/// (no router, no middleware stack: one boxed future per request, as a
/// plain hyper service), everything else through [`app`]'s router.
#[derive(Debug, Clone)]
pub struct App {
    router: Router,
    gateway: Option<Arc<AppState>>,
    face: Face,
    /// `[server] envoy_json`: `POST /json` goes to the router.
    envoy_json: bool,
    /// The API's paths outside `/v1/` ([`api_routes`]), and [`HEALTH`].
    api_paths: Arc<[&'static str]>,
    /// `[server.tls]` (the internal face: `[server.internal_tls]`).
    tls: Option<tls::TlsFiles>,
    /// Its acceptor once loaded: one for every thread of the listener, so
    /// that all serve the same certificate, the last good one.
    loaded: Arc<std::sync::Mutex<Option<tls::Tls>>>,
}

impl App {
    /// The service of a listener with `face`.
    pub fn new(state: Arc<AppState>, face: Face) -> Self {
        let api = api_routes().map(|(path, _)| path);
        let outside = api.into_iter().filter(|p| !p.starts_with("/v1/"));
        let server = &state.current().config.server;
        let tls = match face {
            Face::Internal => server.internal_tls.clone(),
            Face::All | Face::Public => server.tls.clone(),
        };
        Self {
            tls,
            loaded: Arc::default(),
            router: app(state.clone(), face),
            gateway: (face != Face::Internal).then_some(state),
            face,
            envoy_json: server.envoy_json,
            api_paths: HEALTH.into_iter().chain(outside).collect(),
        }
    }

    /// The listener's TLS, loaded now (a pair that does not load is an
    /// error naming the file).
    pub(crate) fn tls(&self) -> Result<Option<tls::Tls>, String> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tls) = &*loaded {
            return Ok(Some(tls.clone()));
        }
        let tls = tls::Tls::new(files, tls::Alpn::Http)?;
        *loaded = Some(tls.clone());
        Ok(Some(tls))
    }

    /// The state, when `path` goes to the gateway directly: any path the
    /// router has no route for (a path it might have — under `/v1/` — goes
    /// through the router, which answers it as [`app`] does).
    pub(crate) fn gateway(&self, path: &str) -> Option<&Arc<AppState>> {
        if path == ENVOY_JSON && self.envoy_json {
            return None;
        }
        let api = match self.face {
            Face::Public => HEALTH.contains(&path) || forward_auth::answers(path),
            Face::All | Face::Internal => {
                path.starts_with("/v1/") || self.api_paths.contains(&path)
            }
        };
        self.gateway.as_ref().filter(|_| !api)
    }

    /// The router, for every other request.
    pub(crate) fn router(&self) -> &Router {
        &self.router
    }
}

/// What every request goes through, as one layer (one boxed future, not
/// one per rule): [`bounded_and_counted`].
async fn every_request(
    state: axum::extract::State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let path = path.as_ref().map(axum::extract::MatchedPath::as_str);
    bounded_and_counted(&state, path, request, |request| async {
        let response = next.run(request).await;
        let label = response
            .extensions()
            .get::<RouteLabel>()
            .map(|l| l.0.clone());
        (response, label)
    })
    .await
}

/// Headers over [`MAX_HEADER_BYTES`] refused with `431`, the body's pieces
/// bounded in time ([`bound_body`]), and every answer counted in
/// `weir_http_requests_total{route,status}` — a gateway route as written,
/// an API path as routed (`path`), or `unmatched`.
pub(crate) async fn bounded_and_counted<F>(
    state: &Arc<AppState>,
    path: Option<&str>,
    request: axum::extract::Request,
    next: impl FnOnce(axum::extract::Request) -> F,
) -> axum::response::Response
where
    F: Future<Output = (axum::response::Response, Option<Arc<str>>)>,
{
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    let (response, label) = match size > MAX_HEADER_BYTES {
        true => (
            axum::response::IntoResponse::into_response(ApiError::HeadersTooLarge(size)),
            None,
        ),
        false => next(bound_body(state, request)).await,
    };
    let route = match (&label, path) {
        (Some(label), _) => label,
        (None, Some(path)) => path,
        (None, None) => "unmatched",
    };
    metrics::Meters::http(route, response.status().as_u16());
    response
}

/// Bounds the wait for each piece of a request body by `[server]
/// body_timeout`: a client that stops sending mid-body fails the read
/// (answered `400`, or `408` by the decision API) instead of holding the
/// request.
fn bound_body(state: &AppState, request: axum::extract::Request) -> axum::extract::Request {
    use hyper::body::Body as _;
    if request.body().is_end_stream() {
        return request;
    }
    let timeout = state.current().config.server.limits.body_timeout;
    request.map(|body| axum::body::Body::new(TimeoutBody::new(body, timeout)))
}

/// A body that fails when no frame arrives within `timeout` of the last.
/// The timer is armed only when a frame is not ready at once, so a body
/// that came with its head costs none.
#[derive(Debug)]
pub(crate) struct TimeoutBody<B> {
    body: B,
    timeout: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> TimeoutBody<B> {
    /// `body`, each frame awaited at most `timeout`.
    pub(crate) fn new(body: B, timeout: Duration) -> Self {
        Self {
            body,
            timeout,
            sleep: None,
        }
    }
}

impl<B> hyper::body::Body for TimeoutBody<B>
where
    B: hyper::body::Body + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = B::Data;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                // The next wait starts afresh.
                this.sleep = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
