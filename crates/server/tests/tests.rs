//! `weir serve` over real sockets: the decision API and the gateway in front
//! of a real upstream server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod abuse;
mod api;
mod envoy;
mod forward_auth;
mod fuzz;
mod gateway;
mod grants;
mod guarded;
mod hardening;
mod http2;
mod leases;
mod limits;
mod resp;
mod rollout;
mod structure;
mod tls;
mod usage;

use std::net::SocketAddr;
use std::sync::Arc;

use weir_server::{AppState, Shared, config};
pub(crate) use weir_testkit::send;

/// Starts `weir serve` on `config_text` on a free loopback port.
pub(crate) async fn start(config_text: &str) -> (SocketAddr, Arc<AppState>) {
    let config = config::parse(config_text, &Default::default()).unwrap();
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
