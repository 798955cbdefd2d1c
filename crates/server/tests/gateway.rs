//! The gateway in front of a real upstream server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::routing::any;
use tokio::sync::Notify;

use crate::{send, start};

type Seen = Arc<Mutex<Vec<(Instant, String, String)>>>;

/// An upstream that echoes what it received and records when.
async fn upstream() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let app = Router::new().fallback(any(move |request: Request| {
        let log = log.clone();
        async move {
            let line = format!("{} {}", request.method(), request.uri());
            let host = request
                .headers()
                .get("host")
                .map(|h| h.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                .await
                .unwrap();
            log.lock()
                .unwrap()
                .push((Instant::now(), line.clone(), host));
            format!("{line} {}", String::from_utf8_lossy(&body))
        }
    }));
    let addr = weir_testkit::serve(app).await;
    (addr, seen)
}

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"
[policies.seller-stock-read]
algorithm = "token-bucket"
capacity = 2
rate = "1/10s"

[policies.per-endpoint]
algorithm = "sliding-log"
limit = 100
window = "1h"

[policies.crawl]
algorithm = "leaky-bucket"
rate = "5/s"
queue = 2

[[routes]]
match = "GET /sellers/{{seller}}/stock"
identity = "header:x-seller-id"
policies = ["seller-stock-read", "per-endpoint"]
upstream = "http://{upstream}"

[[routes]]
match = "POST /items/{{item}}"
identity = "path:item"
policies = ["seller-stock-read"]
upstream = "http://{upstream}"

[[routes]]
match = "GET /crawl"
identity = "peer"
policies = ["crawl"]
upstream = "http://{upstream}"
max_wait = "300ms"

[[routes]]
match = "GET /down"
identity = "peer"
policies = ["per-endpoint"]
upstream = "http://127.0.0.1:9"
"#
    )
}

#[tokio::test]
async fn forwards_admitted_requests_and_answers_the_rest_with_429() {
    let (up, seen) = upstream().await;
    let (addr, _) = start(&config(up)).await;
    let url = format!("http://{addr}/sellers/842/stock?fresh=1");
    let seller = [("x-seller-id", "842")];

    let ok = send("GET", &url, &seller, "").await;
    assert_eq!(
        (ok.status, ok.body.as_str()),
        (200, "GET /sellers/842/stock?fresh=1 ")
    );
    assert_eq!(
        ok.header("ratelimit"),
        "\"seller-stock-read\";r=1;t=10, \"per-endpoint\";r=99;t=3600"
    );
    assert_eq!(
        seen.lock().unwrap()[0].2,
        up.to_string(),
        "Host is the upstream's"
    );
    send("GET", &url, &seller, "").await;

    let limited = send("GET", &url, &seller, "").await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), "10");
    assert_eq!(limited.header("cache-control"), "no-store");
    assert_eq!(
        limited.header("ratelimit-policy"),
        "\"seller-stock-read\";q=2;w=20, \"per-endpoint\";q=100;w=3600"
    );
    assert_eq!(
        limited.header("ratelimit"),
        "\"seller-stock-read\";r=0;t=20, \"per-endpoint\";r=98;t=3600"
    );
    assert_eq!(
        limited.body,
        r#"{"error":"RATE_LIMITED","policy":"seller-stock-read"}"#
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "the 429 was not forwarded");

    // Bodies are forwarded; identities from the path are keys of their own.
    let post = send("POST", &format!("http://{addr}/items/9"), &[], "payload").await;
    assert_eq!(post.body, "POST /items/9 payload");
    // A missing or oversized identity is a 4xx, never a shared bucket.
    let missing = send("GET", &url, &[], "").await;
    assert_eq!(
        (missing.status, missing.json()["error"].as_str().unwrap()),
        (400, "MISSING_IDENTITY")
    );
    // One bound on what the client sent, whatever its source: 256 bytes.
    for (len, status) in [
        (200, 200),
        (238, 200),
        (255, 200),
        (256, 200),
        (257, 422),
        (300, 422),
    ] {
        let identity = format!("{len:0>len$}");
        let reply = send("GET", &url, &[("x-seller-id", &identity)], "").await;
        assert_eq!(reply.status, status, "{len} bytes: {}", reply.body);
        if status == 422 {
            assert_eq!(reply.json()["error"], "KEY_TOO_LONG");
        }
    }
    assert_eq!(
        send("GET", &format!("http://{addr}/elsewhere"), &[], "")
            .await
            .status,
        404
    );
    // The path of a route with another method: 405, naming the method.
    let wrong = send("DELETE", &format!("http://{addr}/items/9"), &[], "").await;
    assert_eq!((wrong.status, wrong.header("allow")), (405, "POST"));
    // An unreachable upstream is a 502 with a JSON error.
    let down = send("GET", &format!("http://{addr}/down"), &[], "").await;
    assert_eq!(
        (down.status, down.json()["error"].as_str().unwrap()),
        (502, "UPSTREAM_UNAVAILABLE")
    );
}

/// Gateway requests skip the router (`weir_server::App`); the API's paths
/// still win over a route that would take them, as the router's would.
#[tokio::test]
async fn api_paths_win_over_routes_and_the_rest_is_the_gateways() {
    let (up, seen) = upstream().await;
    let text = format!(
        r#"
[policies.open]
algorithm = "token-bucket"
capacity = 100
rate = "1/s"

[[routes]]
match = "GET /v1/{{anything}}"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"

[[routes]]
match = "GET /{{anything}}"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&text).await;
    let get = async |path: &str| send("GET", &format!("http://{addr}{path}"), &[], "").await;
    // The API's own paths, answered by weir.
    assert_eq!(
        get("/v1/policies").await.json()["policies"][0]["name"],
        "open"
    );
    for path in ["/healthz", "/readyz", "/metrics", "/ui"] {
        let reply = get(path).await;
        assert_eq!(reply.status, 200, "{path}");
        assert!(reply.header("ratelimit").is_empty(), "{path} was forwarded");
    }
    assert!(seen.lock().unwrap().is_empty());
    // Under /v1/ but no API path, and anything else: the routes.
    for path in ["/v1/other", "/other", "/metricsz"] {
        let reply = get(path).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (200, format!("GET {path} ").as_str())
        );
    }
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_shaper_delays_on_the_wire_and_max_wait_refuses() {
    let (up, seen) = upstream().await;
    let (addr, _) = start(&config(up)).await;
    let url = format!("http://{addr}/crawl");
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { send("GET", &url, &[], "").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        if reply.status == 429 {
            // Refused for its wait: no free slot is reported.
            assert!(
                reply.header("ratelimit").contains(";r=0;"),
                "{:?}",
                reply.headers
            );
        }
        statuses.push(reply.status);
    }
    statuses.sort_unstable();
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    for series in [
        "weir_decisions_total{policy=\"crawl\",outcome=\"rejected\"}",
        "weir_http_requests_total{route=\"GET /crawl\",status=\"429\"}",
        "weir_upstream_duration_seconds_bucket{route=\"GET /crawl\"",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    // 5/s: slots at 0 and 200 ms; the next would wait 400 ms, past the
    // route's max_wait of 300 ms: refused, uncharged, so the fourth too.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let arrivals: Vec<Instant> = seen.lock().unwrap().iter().map(|(at, _, _)| *at).collect();
    assert_eq!(arrivals.len(), 2);
    // The delay, measured on the wire (a few ms of scheduling allowed).
    let gap = arrivals[1] - arrivals[0];
    assert!(gap >= Duration::from_millis(190), "{gap:?}");
}

#[tokio::test]
async fn a_client_that_leaves_while_waiting_is_never_forwarded() {
    use tokio::io::AsyncWriteExt;
    let (up, seen) = upstream().await;
    let (addr, _) = start(&config(up)).await;
    // Take the shaper's free slot, so the next request waits 200 ms.
    assert_eq!(
        send("GET", &format!("http://{addr}/crawl"), &[], "")
            .await
            .status,
        200
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /crawl HTTP/1.1\r\nHost: weir\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(stream); // gone while queued
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the waiter that left was not forwarded"
    );
}

/// An upstream that answers in HTTP/1.0 and records the request head.
async fn old_upstream() -> (SocketAddr, Arc<Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let head: Arc<Mutex<String>> = Arc::default();
    let seen = head.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = vec![0u8; 8192];
            let n = stream.read(&mut buffer).await.unwrap_or(0);
            *seen.lock().unwrap() = String::from_utf8_lossy(&buffer[..n]).to_lowercase();
            let _ = stream
                .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
        }
    });
    (addr, head)
}

#[tokio::test]
async fn clients_get_http_1_1_and_the_upstream_gets_forwarding_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, head) = old_upstream().await;
    let config = format!(
        "[policies.p]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n\n[[routes]]\nmatch = \"GET /old\"\nidentity = \"peer\"\npolicies = [\"p\"]\nupstream = \"http://{up}\"\n"
    );
    let (addr, _) = start(&config).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"GET /old HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 7.7.7.7\r\nX-Real-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nConnection: close, x-secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let head = head.lock().unwrap().clone();
    assert!(head.contains("x-forwarded-host: shop.example"), "{head}");
    assert!(
        head.contains("x-forwarded-for: 127.0.0.1\r\n"),
        "spoofed XFF replaced: {head}"
    );
    assert!(head.contains("x-forwarded-proto: http"), "{head}");
    assert!(
        !head.contains("6.6.6.6") && !head.contains("7.7.7.7"),
        "an untrusted peer's claims dropped: {head}"
    );
    assert!(
        !head.contains("x-secret"),
        "named in Connection: stripped: {head}"
    );
    for hop in ["keep-alive:", "proxy-authorization:", "connection: close"] {
        assert!(!head.contains(hop), "hop-by-hop {hop} stripped: {head}");
    }
    assert!(head.contains(&format!("host: {up}")), "{head}");
}

/// What an untrusted client says of itself through other proxies' headers
/// never reaches the upstream, `Connection` cannot strip the identity weir
/// charged, and an HTTP/1.1 request without `Host` is refused (it would
/// leave the client's own `X-Forwarded-Host` to the upstream).
#[tokio::test]
async fn untrusted_forwarding_claims_are_removed_and_a_missing_host_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, head) = old_upstream().await;
    let config = format!(
        "[policies.p]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n\n[[routes]]\nmatch = \"GET /old\"\nidentity = \"header:x-tenant\"\npolicies = [\"p\"]\nupstream = \"http://{up}\"\n"
    );
    let (addr, _) = start(&config).await;
    let ask = |request: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    };
    let claims = [
        "true-client-ip",
        "x-client-ip",
        "cf-connecting-ip",
        "fastly-client-ip",
        "x-cluster-client-ip",
        "x-original-url",
        "x-rewrite-url",
        "x-original-uri",
        "x-forwarded-port",
        "x-forwarded-server",
        "x-forwarded-prefix",
        "x-forwarded-uri",
        "x-host",
    ];
    let sent: String = claims.iter().map(|c| format!("{c}: 6.6.6.6\r\n")).collect();
    let request = format!(
        "GET /old HTTP/1.1\r\nHost: shop.example\r\nX-Tenant: acme\r\nConnection: close, x-tenant\r\n{sent}\r\n"
    );
    let answer = ask(Box::leak(request.into_boxed_str())).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = head.lock().unwrap().clone();
    assert!(
        !seen.contains("6.6.6.6"),
        "an untrusted client's claims: {seen}"
    );
    assert!(
        seen.contains("x-tenant: acme"),
        "the identity weir charged reaches the upstream: {seen}"
    );
    head.lock().unwrap().clear();
    let answer = ask("GET /old HTTP/1.1\r\nX-Tenant: acme\r\nX-Forwarded-Host: evil.example\r\nConnection: close\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("MISSING_HOST"), "{answer}");
    assert!(head.lock().unwrap().is_empty(), "never forwarded");
}

/// An upstream that records paths and answers at once, except `/hang`,
/// which it never answers.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let app = Router::new().fallback(any(move |request: Request| {
        let log = log.clone();
        async move {
            let path = request.uri().to_string();
            log.lock().unwrap().push(path.clone());
            if path == "/hang" {
                std::future::pending::<()>().await;
            }
            let body = axum::body::to_bytes(request.into_body(), 64 << 20)
                .await
                .map_or(0, |b| b.len());
            format!("{path} {body}")
        }
    }));
    let addr = weir_testkit::serve(app).await;
    (addr, seen)
}

fn hardened(up: SocketAddr) -> String {
    format!(
        r#"
[policies.one]
algorithm = "token-bucket"
capacity = 1
rate = "1/h"

[policies.open]
algorithm = "token-bucket"
capacity = 1000
rate = "1000/s"

[[routes]]
match = "GET /shops/{{shop}}/items"
identity = "path:shop"
policies = ["one"]
upstream = "http://{up}"

[[routes]]
match = "GET /seller"
identity = "header:x-seller-id"
policies = ["one"]
upstream = "http://{up}"

[[routes]]
match = "GET /files/{{name}}"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"

[[routes]]
match = "GET /hang"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"
timeout = "300ms"

[[routes]]
match = "POST /upload"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"
max_body = "1KiB"
"#
    )
}

#[tokio::test]
async fn paths_and_identities_are_canonical() {
    let (up, seen) = recording_upstream().await;
    let (addr, _) = start(&hardened(up)).await;
    let get = |path: &'static str| async move {
        let url = format!("http://{addr}{path}");
        send("GET", &url, &[], "").await
    };
    assert_eq!(get("/shops/carol/items").await.status, 200);
    // The same shop, however it is spelled: the same (spent) bucket.
    assert_eq!(get("/shops/%63arol/items").await.status, 429);
    // Ways to read one path as two are refused, never forwarded.
    for path in [
        "/shops/carol;x=1/items",
        "/files/..%2Fsecret.txt",
        "/files/%2e%2e",
        "/shops/carol%2Fx/items",
        "/files/a%5Cb",
        "/files/a%00b",
        "/shops//items",
    ] {
        let reply = get(path).await;
        assert_eq!(
            (reply.status, reply.json()["error"].as_str()),
            (400, Some("BAD_PATH")),
            "{path}: {}",
            reply.body
        );
    }
    // The upstream receives exactly the path that was matched.
    assert_eq!(get("/files/caf%C3%A9%20menu").await.status, 200);
    let paths = seen.lock().unwrap().clone();
    assert_eq!(paths, ["/shops/carol/items", "/files/caf%C3%A9%20menu"]);

    // A second identity header, or a list, is no identity.
    let url = format!("http://{addr}/seller");
    let twice = send(
        "GET",
        &url,
        &[("x-seller-id", "a"), ("x-seller-id", "b")],
        "",
    )
    .await;
    assert_eq!(twice.status, 400);
    let list = send("GET", &url, &[("x-seller-id", "a, b")], "").await;
    assert_eq!(list.status, 400);
    assert_eq!(
        send("GET", &url, &[("x-seller-id", " ")], "").await.status,
        400
    );
}

#[tokio::test]
async fn the_upstream_side_is_bounded() {
    let (up, _) = recording_upstream().await;
    let (addr, _) = start(&hardened(up)).await;
    let hang = send("GET", &format!("http://{addr}/hang"), &[], "").await;
    assert_eq!(
        (hang.status, hang.json()["error"].as_str()),
        (504, Some("UPSTREAM_TIMEOUT"))
    );
    let url = format!("http://{addr}/upload");
    let small = send("POST", &url, &[], &"x".repeat(1024)).await;
    assert_eq!((small.status, small.body.as_str()), (200, "/upload 1024"));
    let large = send("POST", &url, &[], &"x".repeat(1025)).await;
    assert_eq!(
        (large.status, large.json()["error"].as_str()),
        (413, Some("BODY_TOO_LARGE"))
    );
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_client_is_the_key_and_the_chain_is_kept() {
    let (up, seen) = old_upstream().await;
    let config = format!(
        "[server]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n[policies.p]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n\n[[routes]]\nmatch = \"GET /old\"\nidentity = \"peer\"\npolicies = [\"p\"]\nupstream = \"http://{up}\"\n"
    );
    let (addr, _) = start(&config).await;
    let url = format!("http://{addr}/old");
    let from = |chain: &'static str| {
        let url = url.clone();
        async move {
            send("GET", &url, &[("x-forwarded-for", chain)], "")
                .await
                .status
        }
    };
    assert_eq!(from("198.51.100.7").await, 200);
    // The same client, whatever it claims left of what the proxy wrote.
    assert_eq!(from("1.2.3.4, 198.51.100.7").await, 429);
    // Another client behind the same proxy: its own bucket.
    assert_eq!(from("198.51.100.8").await, 200);
    let head = seen.lock().unwrap().clone();
    assert!(
        head.contains("x-forwarded-for: 198.51.100.8, 127.0.0.1\r\n"),
        "{head}"
    );
}

/// An HTTP/1.1 upstream on raw sockets that counts the connections it
/// accepts and answers each connection's requests one after another:
/// `/slow` streams `ab` then, once `release` is notified, `cd` (telling
/// `started` in between); anything else is answered `ok`. With
/// `close_each`, a connection is closed after its first answer, with no
/// `Connection: close` (as an upstream's idle timeout closes one).
async fn counting_upstream(
    close_each: bool,
) -> (SocketAddr, Arc<AtomicUsize>, Arc<Notify>, Arc<Notify>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (count, tell, wait) = (accepted.clone(), started.clone(), release.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (tell, wait) = (tell.clone(), wait.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                    if head.starts_with("GET /slow ") {
                        let first =
                            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n";
                        stream.get_mut().write_all(first).await.unwrap();
                        tell.notify_one();
                        wait.notified().await;
                        stream
                            .get_mut()
                            .write_all(b"2\r\ncd\r\n0\r\n\r\n")
                            .await
                            .unwrap();
                    } else {
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        stream.get_mut().write_all(ok).await.unwrap();
                    }
                    if close_each {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted, started, release)
}

fn counted(up: SocketAddr) -> String {
    format!(
        r#"
[policies.open]
algorithm = "token-bucket"
capacity = 1000
rate = "1000/s"

[[routes]]
match = "GET /c/{{n}}"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"

[[routes]]
match = "GET /slow"
identity = "peer"
policies = ["open"]
upstream = "http://{up}"
"#
    )
}

#[tokio::test]
async fn upstream_connections_are_reused_and_one_the_upstream_closed_is_not_a_failure() {
    let (up, accepted, _, _) = counting_upstream(false).await;
    let (addr, _) = start(&counted(up)).await;
    for n in 0..10 {
        let reply = send("GET", &format!("http://{addr}/c/{n}"), &[], "").await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one kept-alive connection"
    );

    // Every pooled connection is closed by the upstream after its answer:
    // each request still gets its answer, on a new connection.
    let (up, accepted, _, _) = counting_upstream(true).await;
    let (addr, _) = start(&counted(up)).await;
    for n in 0..10 {
        let reply = send("GET", &format!("http://{addr}/c/{n}"), &[], "").await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (200, "ok"),
            "request {n}"
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn no_request_is_sent_behind_an_answer_still_arriving() {
    let (up, accepted, started, release) = counting_upstream(false).await;
    let (addr, _) = start(&counted(up)).await;
    let url = format!("http://{addr}/slow");
    let slow = tokio::spawn(async move { send("GET", &url, &[], "").await });
    started.notified().await;
    // The slow answer's connection is busy until its body ends: this
    // request gets a connection of its own, and its answer at once.
    let url = format!("http://{addr}/c/1");
    let reply = tokio::time::timeout(Duration::from_secs(10), send("GET", &url, &[], ""))
        .await
        .expect("not queued behind the slow answer");
    assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    release.notify_one();
    let slow = slow.await.unwrap();
    assert_eq!((slow.status, slow.body.as_str()), (200, "abcd"));
    // Both connections are back in the pool now.
    for n in 0..4 {
        let reply = send("GET", &format!("http://{addr}/c/{n}"), &[], "").await;
        assert_eq!(reply.status, 200);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A client body that breaks off — cut short of its length, or a chunk that
/// does not parse — is the client's fault: `400 BAD_BODY`, never counted as
/// an upstream error, and no upstream address in any answer.
#[tokio::test]
async fn a_client_body_that_breaks_off_is_a_bad_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, _) = upstream().await;
    let (addr, _) = start(&config(up)).await;
    let cases: [&[u8]; 2] = [
        b"POST /items/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
        b"POST /items/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
    ];
    for request in cases {
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client.write_all(request).await.unwrap();
        client.shutdown().await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("BAD_BODY"), "{answer}");
    }
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(
        !metrics.contains("weir_upstream_errors_total{route=\"POST /items/{item}\""),
        "{metrics}"
    );
    // An upstream that is down: 502, without its address.
    let (addr, _) = start(&config("127.0.0.1:1".parse().unwrap())).await;
    let down = send("POST", &format!("http://{addr}/items/c"), &[], "{}").await;
    assert_eq!(down.status, 502, "{}", down.body);
    assert!(!down.body.contains("127.0.0.1"), "{}", down.body);
}

/// `identity = ["header:x-api-key", "peer"]`: the key when sent, else the
/// address — two key spaces that never meet.
#[tokio::test]
async fn an_identity_falls_back_to_the_next_source() {
    let (up, _) = upstream().await;
    let config = format!(
        r#"
[policies.one]
algorithm = "fixed-window"
limit = 1
window = "1h"

[[routes]]
match = "GET /fallback"
identity = ["header:x-api-key", "peer"]
policies = ["one"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&config).await;
    let url = format!("http://{addr}/fallback");
    let keyed = [("x-api-key", "acme")];
    assert_eq!(send("GET", &url, &keyed, "").await.status, 200);
    assert_eq!(
        send("GET", &url, &keyed, "").await.status,
        429,
        "acme's one"
    );
    assert_eq!(
        send("GET", &url, &[], "").await.status,
        200,
        "the address's own"
    );
    assert_eq!(
        send("GET", &url, &[("x-api-key", " ")], "").await.status,
        429,
        "blank: the address"
    );
    assert_eq!(
        send("GET", &url, &[("x-api-key", "other")], "")
            .await
            .status,
        200
    );
    let bad = weir_server::config::parse(
        &config.replace(
            r#"["header:x-api-key", "peer"]"#,
            r#"["header:x-api-key", "body:id"]"#,
        ),
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("identity") && bad.contains("body:id"), "{bad}");
}

/// Identities from a query parameter (percent-decoded) or a cookie, and a
/// limit on a whole route whoever calls (`identity = "route"`): each has
/// its own key space, and two values of one source are refused, never
/// taken as either.
#[tokio::test]
async fn identities_from_a_query_a_cookie_or_the_whole_route() {
    let (up, _) = upstream().await;
    let config = format!(
        r#"
[policies.one]
algorithm = "fixed-window"
limit = 1
window = "1h"

[[routes]]
match = "GET /q"
identity = "query:api_key"
policies = ["one"]
upstream = "http://{up}"

[[routes]]
match = "GET /c"
identity = "cookie:session"
policies = ["one"]
upstream = "http://{up}"

[[routes]]
match = "GET /all"
identity = "route"
policies = ["one"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&config).await;
    let get = |path: &str, headers: &[(&'static str, &'static str)]| {
        let (url, headers) = (format!("http://{addr}{path}"), headers.to_vec());
        async move { send("GET", &url, &headers, "").await.status }
    };
    assert_eq!(get("/q?api_key=a%63me&x=1", &[]).await, 200);
    assert_eq!(
        get("/q?x=2&api_key=acme", &[]).await,
        429,
        "the same key, decoded"
    );
    assert_eq!(get("/q?api_key=other", &[]).await, 200);
    assert_eq!(get("/q?api_key=a&api_key=b", &[]).await, 400, "two values");
    assert_eq!(get("/q", &[]).await, 400, "none");
    let cookie = |v: &'static str| [("cookie", v)];
    assert_eq!(get("/c", &cookie("theme=dark; session=s1")).await, 200);
    assert_eq!(get("/c", &cookie("session=s1")).await, 429);
    assert_eq!(get("/c", &cookie("session=s2")).await, 200);
    assert_eq!(get("/c", &cookie("session=s3; session=s4")).await, 400);
    // The whole route: the first caller's one, then everyone's refusal.
    assert_eq!(get("/all", &[("x-a", "1")]).await, 200);
    assert_eq!(get("/all", &[("x-b", "2")]).await, 429);
}

/// `weir_queue_depth` is the requests a shaper holds now: two while two
/// wait, none once they are released.
#[tokio::test]
async fn queue_depth_counts_the_requests_held_now() {
    let (up, _) = upstream().await;
    let config = format!(
        "[policies.queued]\nalgorithm = \"leaky-bucket\"\nrate = \"5/s\"\nqueue = 2\n\n[[routes]]\nmatch = \"GET /queued\"\nidentity = \"peer\"\npolicies = [\"queued\"]\nupstream = \"http://{up}\"\nmax_wait = \"1s\"\n"
    );
    let (addr, _) = start(&config).await;
    let url = format!("http://{addr}/queued");
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { send("GET", &url, &[], "").await })
        })
        .collect();
    let depth = || async {
        let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
            .await
            .body;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("weir_queue_depth{policy=\"queued\"}"))
            .map(str::to_owned);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(depth().await, Some(2.0), "released at 200 and 400 ms");
    for task in tasks {
        assert_eq!(task.await.unwrap().status, 200);
    }
    assert_eq!(depth().await, Some(0.0));
}

/// A catch-all segment (`{*rest}`, last) takes the rest of the path, any
/// number of segments, and is forwarded as it came; routes are tried in
/// order, so a route before it still wins its own paths.
#[tokio::test]
async fn a_catch_all_route_takes_the_rest_of_the_path() {
    let (up, seen) = recording_upstream().await;
    let config = format!(
        r#"
[policies.many]
algorithm = "gcra"
burst = 100
rate = "100/s"

[[routes]]
match = "GET /api/health"
identity = "peer"
policies = ["many"]
upstream = "http://{up}"

[[routes]]
match = "GET /api/{{*rest}}"
identity = "path:rest"
policies = ["many"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&config).await;
    for (path, status) in [
        ("/api/health", 200),
        ("/api/v1/items/7", 200),
        // Matched, with nothing for the identity: refused, never a shared key.
        ("/api/", 400),
        ("/api", 404),
        ("/other/x", 404),
    ] {
        let got = send("GET", &format!("http://{addr}{path}"), &[], "")
            .await
            .status;
        assert_eq!(got, status, "{path}");
    }
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|p| p.starts_with("/api/v1/items/7")),
        "{seen:?}"
    );
    let bad = weir_server::config::parse(
        &config.replace("/api/{*rest}", "/api/{*rest}/more"),
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("comes last"), "{bad}");
}

/// Routes by host: `host = "api.example.com"`, or `"*.example.com"` for
/// any host under it (the port and case aside); a route without one
/// matches any host.
#[tokio::test]
async fn routes_match_by_host() {
    let (up, _) = upstream().await;
    let config = format!(
        r#"
[policies.one]
algorithm = "fixed-window"
limit = 1
window = "1h"

[policies.many]
algorithm = "gcra"
burst = 100
rate = "100/s"

[[routes]]
match = "GET /x"
host = "api.example.com"
identity = "route"
policies = ["one"]
upstream = "http://{up}"

[[routes]]
match = "GET /x"
host = "*.shop.example"
identity = "peer"
policies = ["many"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&config).await;
    let get = |host: &'static str| {
        let url = format!("http://{addr}/x");
        async move { send("GET", &url, &[("host", host)], "").await.status }
    };
    assert_eq!(get("API.example.com:8080").await, 200);
    assert_eq!(get("api.example.com").await, 429, "the one route's key");
    for _ in 0..3 {
        assert_eq!(get("eu.shop.example").await, 200, "the wildcard's route");
    }
    assert_eq!(
        get("shop.example").await,
        404,
        "the domain itself is not under it"
    );
    assert_eq!(get("other.example").await, 404);
    let bad = weir_server::config::parse(
        &config.replace("*.shop.example", "shop example"),
        &Default::default(),
    );
    assert!(bad.unwrap_err().to_string().contains("host"));
}

/// Identities from a claim of a JSON Web Token the gateway verifies: an
/// HMAC secret or a public key (here ES256); the expiry, issuer and
/// audience checked. A token that does not verify is `401 INVALID_TOKEN`,
/// never read, never passed over for the next source; no token falls back.
#[tokio::test]
async fn identities_from_verified_jwt_claims() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let (up, _) = upstream().await;
    let dir = std::env::temp_dir().join(format!("weir-jwt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = "an-hmac-secret-of-at-least-32-bytes!";
    std::fs::write(dir.join("secret"), format!("{secret}\n")).unwrap();
    let (private, public) = weir_testkit::tls::ec_key_pair();
    std::fs::write(dir.join("public.pem"), &public).unwrap();
    let config = |keys: &str| {
        format!(
            r#"
[jwt]
{keys}
issuer = "https://auth.example"
audience = "api"

[policies.one]
algorithm = "fixed-window"
limit = 1
window = "1h"

[[routes]]
match = "GET /me"
identity = ["jwt:tenant", "peer"]
policies = ["one"]
upstream = "http://{up}"
"#
        )
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |tenant: &str, exp: u64, iss: &str| serde_json::json!({"tenant": tenant, "exp": exp, "iss": iss, "aud": "api"});
    let hs = |c: serde_json::Value| {
        encode(
            &Header::new(Algorithm::HS256),
            &c,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let es = |c: serde_json::Value| {
        let key = EncodingKey::from_ec_pem(private.as_bytes()).unwrap();
        encode(&Header::new(Algorithm::ES256), &c, &key).unwrap()
    };
    // A JWKS of one symmetric key, `kid` "k1": tokens name the key they use.
    let k = base64url(secret.as_bytes());
    let jwks = format!(r#"{{"keys":[{{"kty":"oct","kid":"k1","alg":"HS256","k":"{k}"}}]}}"#);
    std::fs::write(dir.join("jwks.json"), jwks).unwrap();
    let kid = |c: serde_json::Value| {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        encode(&header, &c, &EncodingKey::from_secret(secret.as_bytes())).unwrap()
    };
    let iss = "https://auth.example";
    for (keys, sign) in [
        (
            format!("secret_file = \"{}\"", dir.join("secret").display()),
            &hs as &dyn Fn(serde_json::Value) -> String,
        ),
        (
            format!("public_key = \"{}\"", dir.join("public.pem").display()),
            &es,
        ),
        (
            format!("jwks_file = \"{}\"", dir.join("jwks.json").display()),
            &kid,
        ),
    ] {
        let (addr, _) = start(&config(&keys)).await;
        let url = format!("http://{addr}/me");
        let get = |token: Option<String>| {
            let url = url.clone();
            async move {
                let bearer = token.map(|t| format!("Bearer {t}"));
                let headers: Vec<(&str, &str)> = bearer
                    .iter()
                    .map(|b| ("authorization", b.as_str()))
                    .collect();
                let reply = send("GET", &url, &headers, "").await;
                let error = match reply.status {
                    400.. => reply.json()["error"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    _ => String::new(),
                };
                (reply.status, error)
            }
        };
        let acme = sign(claims("acme", now + 600, iss));
        assert_eq!(get(Some(acme.clone())).await.0, 200, "{keys}");
        assert_eq!(get(Some(acme)).await.0, 429, "acme's one: {keys}");
        assert_eq!(get(Some(sign(claims("beta", now + 600, iss)))).await.0, 200);
        // Expired, another issuer, a forged signature: refused, never read.
        for bad in [
            sign(claims("gamma", now - 3600, iss)),
            sign(claims("gamma", now + 600, "https://evil.example")),
            hs(claims("gamma", now + 600, iss)).replace('.', ".x"),
        ] {
            assert_eq!(
                get(Some(bad)).await,
                (401, "INVALID_TOKEN".to_owned()),
                "{keys}"
            );
        }
        // No token: the next source, the address.
        assert_eq!(get(None).await.0, 200);
    }
    // A route that reads a claim needs [jwt].
    let error =
        weir_server::config::parse(&config("").replace("[jwt]\n\n", ""), &Default::default());
    assert!(error.unwrap_err().to_string().contains("[jwt]"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Base64url without padding, as JWKs write keys.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}
