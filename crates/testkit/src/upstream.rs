//! The one test server: an axum app served on a free loopback port (a
//! gateway's upstream, the service behind a layer), with each connection's
//! peer address given to it as axum's `ConnectInfo`.

use std::net::SocketAddr;

/// Serves `app` on a free loopback port until the runtime ends; its
/// address. Handlers may read `ConnectInfo<SocketAddr>`.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}
