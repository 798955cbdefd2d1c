use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use weir_core::store::Store;
use weir_limiter::{FakeClock, Limiter, Policy};
use weir_testkit::{Reply, send, serve};
use weir_tower::{ForwardedKey, HeaderKey, PeerKey, RateLimitLayer};

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

fn hello() -> Router {
    Router::new().route("/hello", get(|| async { "hello" }))
}

#[tokio::test]
async fn several_policies_all_or_nothing_with_a_cost_per_request() {
    let limiter = Arc::new(
        Limiter::builder()
            .policy(
                "burst",
                Policy::parse("token-bucket capacity=10 rate=1/h").unwrap(),
            )
            .policy(
                "daily",
                Policy::parse("fixed-window limit=6 window=1d").unwrap(),
            )
            .clock(FakeClock::at(0))
            .build()
            .unwrap(),
    );
    // A request's cost is its `x-units` header (1 without it).
    let units = |request: &http::Request<axum::body::Body>| {
        request
            .headers()
            .get("x-units")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let layer = RateLimitLayer::builder(limiter.clone())
        .policy("burst")
        .policy("daily")
        .build(HeaderKey::new("x-user"))
        .unwrap()
        .cost(units);
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/hello");
    let four = send("GET", &url, &[("x-user", "a"), ("x-units", "4")], "").await;
    assert_eq!(four.status, 200);
    assert_eq!(
        four.header("ratelimit"),
        "\"burst\";r=6;t=14400, \"daily\";r=2;t=86400"
    );
    // 3 more fit the bucket (6 left) but not the day (2 left): refused by
    // "daily", and the bucket is not charged either.
    let three = send("GET", &url, &[("x-user", "a"), ("x-units", "3")], "").await;
    assert_eq!(three.status, 429);
    assert_eq!(three.json()["policy"], "daily");
    assert_eq!(three.header("retry-after"), "86400");
    let two = send("GET", &url, &[("x-user", "a"), ("x-units", "2")], "").await;
    assert_eq!(
        two.header("ratelimit"),
        "\"burst\";r=4;t=21600, \"daily\";r=0;t=86400"
    );
    // A second identity header is not a second chance: no identity at all.
    let twice = send("GET", &url, &[("x-user", "a"), ("x-user", "b")], "").await;
    assert_eq!(twice.status, 400);
}

#[tokio::test]
async fn the_redis_store_shares_one_balance() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let store = weir_redis::RedisStore::connect(&redis.url()).await.unwrap();
    let policy = Policy::parse("token-bucket capacity=2 rate=1/h").unwrap();
    let layer = || {
        RateLimitLayer::builder(store.clone())
            .policy_with("api", policy)
            .build(HeaderKey::new("x-user"))
            .unwrap()
    };
    // Two services, one Redis: one balance.
    let one = serve(hello().layer(layer())).await;
    let two = serve(hello().layer(layer())).await;
    let user = [("x-user", "shared")];
    assert_eq!(
        send("GET", &format!("http://{one}/hello"), &user, "")
            .await
            .status,
        200
    );
    assert_eq!(
        send("GET", &format!("http://{two}/hello"), &user, "")
            .await
            .status,
        200
    );
    let third = send("GET", &format!("http://{one}/hello"), &user, "").await;
    assert_eq!((third.status, third.header("retry-after")), (429, "3600"));
    // Redis gone: refused with 503, never admitted unlimited.
    drop(redis);
    let down = send(
        "GET",
        &format!("http://{two}/hello"),
        &[("x-user", "new")],
        "",
    )
    .await;
    assert_eq!(
        (down.status, down.json()["error"].as_str()),
        (503, Some("STORE_UNAVAILABLE"))
    );
}

#[tokio::test]
async fn the_client_behind_trusted_proxies_is_the_key() {
    let layer = RateLimitLayer::new(
        limiter("token-bucket capacity=1 rate=1/h"),
        "api",
        ForwardedKey::x_forwarded_for(1),
    )
    .unwrap();
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/hello");
    // One trusted proxy appended the client's address: the right-most entry.
    let first = send(
        "GET",
        &url,
        &[("x-forwarded-for", "6.6.6.6, 192.0.2.7")],
        "",
    )
    .await;
    assert_eq!(first.status, 200);
    // A client cannot escape its bucket by claiming another address.
    let spoofed = send(
        "GET",
        &url,
        &[("x-forwarded-for", "1.2.3.4, 192.0.2.7")],
        "",
    )
    .await;
    assert_eq!(spoofed.status, 429);
    assert_eq!(
        send("GET", &url, &[("x-forwarded-for", "192.0.2.8")], "")
            .await
            .status,
        200
    );
    // Not through the proxy at all: no identity.
    assert_eq!(send("GET", &url, &[], "").await.status, 400);

    let layer = RateLimitLayer::new(
        limiter("token-bucket capacity=1 rate=1/h"),
        "api",
        ForwardedKey::forwarded(1),
    )
    .unwrap();
    let addr = serve(hello().layer(layer)).await;
    let url = format!("http://{addr}/hello");
    let header = [(
        "forwarded",
        "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
    )];
    assert_eq!(send("GET", &url, &header, "").await.status, 200);
    let again = [("forwarded", "for=\"[2001:db8::1]\"")];
    assert_eq!(send("GET", &url, &again, "").await.status, 429);
}

#[tokio::test]
async fn the_peer_address_without_connect_info_fails_loudly() {
    let layer = RateLimitLayer::new(limiter("gcra burst=1 rate=1/s"), "api", PeerKey).unwrap();
    // Served without `ConnectInfo`, as a service that forgot it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = hello().layer(layer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let reply = send("GET", &format!("http://{addr}/hello"), &[], "").await;
    assert_eq!(reply.status, 500);
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("into_make_service_with_connect_info"),
        "{}",
        reply.body
    );
}

/// A service whose `/slow` answers stream a tick every 20 ms until
/// `release` is notified (a write is how a server learns that its client
/// hung up).
fn slow(release: Arc<tokio::sync::Notify>) -> Router {
    Router::new().route(
        "/slow",
        get(move || {
            let release = release.clone();
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(1);
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            _ = release.notified() => break,
                            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {
                                if tx.send(Ok("tick\n".to_owned())).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = tx.send(Ok("last part\n".to_owned())).await;
                });
                axum::body::Body::from_stream(tokio_stream_from(rx))
            }
        }),
    )
}

/// The receiver as a stream of body chunks.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Reads a response's head from a raw connection.
async fn head_of(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
        seen.push(byte[0]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A concurrency policy in the layer, in process and on Redis: its lease
/// is held while the response streams, released when its body ends or its
/// client hangs up.
#[tokio::test]
async fn a_concurrency_policy_holds_its_slot_for_the_life_of_the_body() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let store = weir_redis::RedisStore::connect(&redis.url()).await.unwrap();
    let policy = Policy::parse("concurrency limit=1 lease=10m").unwrap();
    let limiter = Limiter::builder().policy("api", policy).build().unwrap();
    holds_its_slot_for_the_life_of_the_body(Arc::new(limiter), policy).await;
    holds_its_slot_for_the_life_of_the_body(store, policy).await;
}

/// The concurrency test over one store.
async fn holds_its_slot_for_the_life_of_the_body<S: Store + Clone + 'static>(
    store: S,
    policy: Policy,
) {
    {
        let release = Arc::new(tokio::sync::Notify::new());
        let layer = RateLimitLayer::builder(store)
            .policy_with("api", policy)
            .build(HeaderKey::new("x-user"))
            .unwrap();
        let addr = serve(slow(release.clone()).layer(layer)).await;
        let url = format!("http://{addr}/slow");
        let user = [("x-user", "u")];
        let request = "GET /slow HTTP/1.1\r\nHost: x\r\nX-User: u\r\n\r\n";
        let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut held, request.as_bytes())
            .await
            .unwrap();
        assert!(head_of(&mut held).await.starts_with("HTTP/1.1 200"));
        let refused = send("GET", &url, &user, "").await;
        assert_eq!(
            refused.status, 429,
            "the slot is held while the body streams"
        );
        assert!(
            refused
                .header("ratelimit-policy")
                .contains("concurrent-requests")
        );
        // Asks until admitted (letting each admitted answer end), within 5 s.
        let admitted = || async {
            tokio::time::timeout(std::time::Duration::from_secs(5), async {
                loop {
                    let request = tokio::spawn({
                        let url = url.clone();
                        async move { send("GET", &url, &[("x-user", "u")], "").await }
                    });
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    release.notify_waiters();
                    let reply = request.await.unwrap();
                    if reply.status == 200 {
                        return reply;
                    }
                }
            })
            .await
        };
        // The client hangs up mid-body: the slot comes back.
        drop(held);
        let first = admitted().await.expect("admitted once the client left");
        assert!(first.body.ends_with("last part\n"), "{}", first.body);
        // That answer ended: its slot is back.
        assert!(admitted().await.is_ok(), "released when the body ended");
    }
}

/// `charge_on`: only the failed answers are charged (a probe admits), and
/// a penalty bans the key once they are spent.
#[tokio::test]
async fn only_answers_charge_on_picks_are_charged() {
    let limiter = Arc::new(
        Limiter::builder()
            .policy(
                "login",
                Policy::parse("fixed-window limit=3 window=1h").unwrap(),
            )
            .penalty(
                "login",
                weir_core::Penalty::new(900_000_000_000, None, None, None).unwrap(),
            )
            .clock(FakeClock::at(0))
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(limiter)
        .policy("login")
        .charge_on(|status| status == http::StatusCode::UNAUTHORIZED)
        .build(HeaderKey::new("x-user"))
        .unwrap();
    let login = |headers: axum::http::HeaderMap| async move {
        match headers.get("x-password").map(|v| v.as_bytes()) {
            Some(b"right") => (axum::http::StatusCode::OK, "welcome"),
            _ => (axum::http::StatusCode::UNAUTHORIZED, "no"),
        }
    };
    let addr = serve(Router::new().route("/login", get(login)).layer(layer)).await;
    let url = format!("http://{addr}/login");
    let attempt = |password: &'static str| {
        let url = url.clone();
        async move {
            send(
                "GET",
                &url,
                &[("x-user", "ann"), ("x-password", password)],
                "",
            )
            .await
        }
    };
    for _ in 0..10 {
        assert_eq!(attempt("right").await.status, 200, "successes are free");
    }
    for _ in 0..3 {
        assert_eq!(attempt("guess").await.status, 401);
    }
    // Banned 15 minutes, but the window itself ends later: the later wait.
    let banned = attempt("right").await;
    assert_eq!((banned.status, banned.header("retry-after")), (429, "3600"));
}

/// An IPv6 peer is its /64: the addresses it rotates through share a key.
#[test]
fn peers_are_their_networks() {
    use weir_tower::network_key;
    let ip = |s: &str| s.parse().unwrap();
    assert_eq!(
        network_key(ip("2001:db8:1:2::a"), 32, 64),
        "2001:db8:1:2::/64"
    );
    assert_eq!(
        network_key(ip("2001:db8:1:2:ffff::1"), 32, 64),
        "2001:db8:1:2::/64"
    );
    assert_eq!(network_key(ip("2001:db8::1"), 32, 128), "2001:db8::1");
    assert_eq!(network_key(ip("192.0.2.7"), 32, 64), "192.0.2.7");
    assert_eq!(network_key(ip("::ffff:192.0.2.7"), 24, 64), "192.0.2.0/24");
    let _default: PeerKey = PeerKey;
    let _other = PeerKey::prefixes(24, 56);
}
