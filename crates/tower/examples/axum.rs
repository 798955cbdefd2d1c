//! An axum app limited per client IP: 5 requests at once, then 1 a second.
//!
//! ```sh
//! cargo run -p weir-tower --example axum
//! for i in $(seq 7); do curl -si localhost:3000/hello | head -1; done
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use weir_limiter::{Limiter, Policy};
use weir_tower::{PeerKey, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::builder()
        .policy("hello", Policy::parse("token-bucket capacity=5 rate=1/s")?)
        .max_keys(100_000)
        .build()?;
    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(Arc::new(limiter), "hello", PeerKey)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}/hello", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
