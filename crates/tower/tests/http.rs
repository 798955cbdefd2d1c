use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use weir_limiter::{FakeClock, Limiter, Policy};
use weir_testkit::{Reply, send};
use weir_tower::{HeaderKey, PeerKey, RateLimitLayer};

async fn serve(app: Router) -> SocketAddr {
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

async fn get_with(addr: SocketAddr, header: Option<(&str, &str)>) -> Reply {
    let headers: Vec<(&str, &str)> = header.into_iter().collect();
    send("GET", &format!("http://{addr}/hello"), &headers, "").await
}

fn limiter(spec: &str) -> Arc<Limiter<FakeClock>> {
    let policy = Policy::parse(spec).unwrap();
    Arc::new(
        Limiter::builder()
            .policy("api", policy)
            .clock(FakeClock::at(0))
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn rejects_with_429_and_the_ratelimit_fields() {
    let layer = RateLimitLayer::new(
        limiter("token-bucket capacity=2 rate=1/10s"),
        "api",
        HeaderKey::new("x-user"),
    )
    .unwrap();
    let addr = serve(
        Router::new()
            .route("/hello", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    let user = Some(("x-user", "842"));

    let first = get_with(addr, user).await;
    assert_eq!((first.status, first.body.as_str()), (200, "hello"));
    assert_eq!(first.header("ratelimit-policy"), "\"api\";q=2;w=20");
    assert_eq!(first.header("ratelimit"), "\"api\";r=1;t=10");
    assert_eq!(
        get_with(addr, user).await.header("ratelimit"),
        "\"api\";r=0;t=20"
    );

    let third = get_with(addr, user).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.header("retry-after"), "10");
    assert_eq!(third.header("cache-control"), "no-store");
    assert_eq!(third.header("content-type"), "application/json");
    assert_eq!(third.header("ratelimit-policy"), "\"api\";q=2;w=20");
    assert_eq!(third.header("ratelimit"), "\"api\";r=0;t=20");
    assert_eq!(third.body, r#"{"error":"RATE_LIMITED","policy":"api"}"#);

    // Another identity has its own allowance.
    assert_eq!(get_with(addr, Some(("x-user", "17"))).await.status, 200);
    // No identity (400), or one over the 256-byte bound (422), nothing charged.
    let missing = get_with(addr, None).await;
    assert_eq!(
        (missing.status, missing.body.as_str()),
        (400, r#"{"error":"MISSING_IDENTITY","policy":"api"}"#)
    );
    for (len, status) in [(255, 200), (256, 200), (257, 422)] {
        let identity = "x".repeat(len);
        let reply = get_with(addr, Some(("x-user", &identity))).await;
        assert_eq!(reply.status, status, "{len} bytes");
    }
}

#[tokio::test]
async fn retry_after_is_never_zero_and_peers_are_keys() {
    // 1000/s: the wait is a millisecond, reported as 1 second, never 0.
    let layer = RateLimitLayer::new(limiter("gcra burst=1 rate=1000/s"), "api", PeerKey).unwrap();
    let addr = serve(
        Router::new()
            .route("/hello", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    assert_eq!(get_with(addr, None).await.status, 200);
    let second = get_with(addr, None).await;
    assert_eq!((second.status, second.header("retry-after")), (429, "1"));
}

#[tokio::test]
async fn a_shaper_delays_instead_of_rejecting() {
    let layer = RateLimitLayer::new(
        limiter("leaky-bucket rate=100/s queue=2"),
        "api",
        HeaderKey::new("x-user"),
    )
    .unwrap();
    let addr = serve(
        Router::new()
            .route("/hello", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    let user = Some(("x-user", "crawler"));
    let replies = futures_join(addr, user).await;
    let mut statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "one served, two queued, one over the queue"
    );
}

async fn futures_join(addr: SocketAddr, user: Option<(&'static str, &'static str)>) -> Vec<Reply> {
    let tasks: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { get_with(addr, user).await }))
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    replies
}

#[test]
fn an_unknown_policy_is_an_error() {
    assert!(RateLimitLayer::new(limiter("gcra burst=1 rate=1/s"), "nope", PeerKey).is_err());
}
