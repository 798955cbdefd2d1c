//! `weir serve` over real sockets: the decision API and the gateway in front
//! of a real upstream server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod api;
mod envoy;
mod fuzz;
mod gateway;

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use weir_server::{AppState, Shared, config};

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.to_str().unwrap())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// Starts `weir serve` on `config_text` on a free loopback port.
pub(crate) async fn start(config_text: &str) -> (SocketAddr, Arc<AppState>) {
    let config = config::parse(config_text, None).unwrap();
    let state = AppState::new(Shared::new(config, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = state.clone();
    tokio::spawn(async move {
        weir_server::run(listener, served, std::future::pending())
            .await
            .unwrap()
    });
    (addr, state)
}

pub(crate) async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}
