//! Envoy's external authorization over gRPC
//! (`envoy.service.auth.v3.Authorization/Check`), on the gRPC listener: the
//! request's attributes (method, path, host, headers, source address) made
//! the forward-auth question, and weir's HTTP answer made Envoy's — an
//! `OkResponse` whose `response_headers_to_add` carry the `RateLimit`
//! field, or a `DeniedResponse` with the `429`, its headers and its body.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::HttpRequest;
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{
    Authorization, AuthorizationServer,
};
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::rpc;
use http::{HeaderMap, HeaderName, Method};
use tonic::{Request, Response, Status};

use crate::answer::MAX_HEADER_BYTES;
use crate::forward_auth::{Original, decide};
use crate::metrics::Meters;
use crate::state::AppState;

/// The most bytes of a refusal's body sent back to Envoy.
const MAX_BODY: usize = 16 * 1024;

/// The service; cheap to clone.
#[derive(Clone)]
pub(crate) struct Authorizer {
    state: Arc<AppState>,
}

impl Authorizer {
    pub(crate) fn service(state: Arc<AppState>) -> AuthorizationServer<Self> {
        AuthorizationServer::new(Self { state })
            .max_decoding_message_size(crate::answer::MAX_GRPC_MESSAGE)
    }
}

/// The request's headers, bounded as the HTTP listeners bound them:
/// `header_map` (raw) or `headers`, Envoy sends one of them.
fn headers(http: &HttpRequest) -> Result<HeaderMap, Status> {
    let raw = http.header_map.as_ref().map(|m| {
        (m.headers.iter())
            .map(|h| {
                let value = match h.raw_value.is_empty() {
                    true => h.value.as_bytes(),
                    false => &h.raw_value[..],
                };
                (h.key.as_str(), value)
            })
            .collect::<Vec<_>>()
    });
    let pairs = raw.unwrap_or_else(|| {
        (http.headers.iter())
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect()
    });
    let size: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_HEADER_BYTES {
        return Err(Status::invalid_argument(format!(
            "{size} bytes of headers; at most {MAX_HEADER_BYTES}"
        )));
    }
    let mut map = HeaderMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        // Pseudo-headers (`:path`, `:method`) are the attributes' own.
        if name.starts_with(':') {
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Status::invalid_argument(format!("`{name}` is not a header name")))?;
        let value = http::HeaderValue::from_bytes(value)
            .map_err(|_| Status::invalid_argument(format!("`{name}` has a value no header may")))?;
        map.append(name, value);
    }
    Ok(map)
}

/// An answer's headers as Envoy's.
fn header_options(headers: &HeaderMap) -> Vec<HeaderValueOption> {
    (headers.iter())
        .filter(|(name, _)| *name != http::header::CONTENT_LENGTH)
        .map(|(name, value)| HeaderValueOption {
            header: Some(HeaderValue {
                key: name.as_str().to_owned(),
                value: value.to_str().unwrap_or_default().to_owned(),
                ..HeaderValue::default()
            }),
            ..HeaderValueOption::default()
        })
        .collect()
}

/// Asks the forward-auth pipeline; its HTTP answer as Envoy's.
async fn check(state: &AppState, request: CheckRequest) -> Result<CheckResponse, Status> {
    let attributes = request.attributes.unwrap_or_default();
    let http = (attributes.request.and_then(|r| r.http))
        .ok_or_else(|| Status::invalid_argument("no attributes.request.http"))?;
    let source = (attributes.source.and_then(|s| s.address)).and_then(|a| match a.address {
        Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s)) => {
            let ip = s.address.parse::<IpAddr>().ok()?;
            let port = match s.port_specifier {
                Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            Some(SocketAddr::new(ip, u16::try_from(port).unwrap_or(0)))
        }
        _ => None,
    });
    let headers = headers(&http)?;
    let method = Method::from_bytes(http.method.as_bytes()).map_err(|_| {
        Status::invalid_argument(format!("`{}` is not an HTTP method", http.method))
    })?;
    let host = (!http.host.is_empty()).then_some(http.host.as_str());
    let shared = state.current();
    let (response, label) = match Original::new(method, &http.path, host) {
        Ok(original) => {
            let mut asked = http::Request::new(Body::empty());
            *asked.headers_mut() = headers;
            decide(&shared, original, asked, source).await
        }
        Err(e) => (axum::response::IntoResponse::into_response(e), None),
    };
    let status = response.status();
    Meters::answered("ext_authz", label.as_deref(), Meters::outcome(status));
    if status.is_server_error() {
        // Not a refusal: Envoy's failure_mode_allow decides.
        return Err(Status::unavailable(format!(
            "weir could not decide ({status})"
        )));
    }
    let (parts, body) = response.into_parts();
    if status.is_success() {
        return Ok(CheckResponse {
            status: Some(rpc::Status::default()),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                response_headers_to_add: header_options(&parts.headers),
                ..OkHttpResponse::default()
            })),
            ..CheckResponse::default()
        });
    }
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    Ok(CheckResponse {
        status: Some(rpc::Status {
            code: tonic::Code::PermissionDenied as i32,
            ..rpc::Status::default()
        }),
        http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
            status: Some(HttpStatus {
                code: i32::from(status.as_u16()),
            }),
            headers: header_options(&parts.headers),
            body: String::from_utf8_lossy(&body).into_owned(),
        })),
        ..CheckResponse::default()
    })
}

#[tonic::async_trait]
impl Authorization for Authorizer {
    async fn check(
        &self,
        request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        check(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }
}
