//! The bounds that keep a listener on the internet up, over real sockets:
//! timeouts, connection caps, per-policy key budgets, new keys per address,
//! and the internal listener.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{send, start};

const POLICY: &str = "[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n";

/// Reads until the server closes; how long that took and what it sent.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Duration, String) {
    let started = Instant::now();
    let mut seen = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut seen)).await;
    assert!(read.is_ok(), "still open after {within:?}");
    (
        started.elapsed(),
        String::from_utf8_lossy(&seen).into_owned(),
    )
}

#[tokio::test]
async fn half_sent_and_idle_connections_are_closed_on_time() {
    let config =
        format!("[server]\nheader_timeout = \"300ms\"\nidle_timeout = \"600ms\"\n\n{POLICY}");
    let (addr, _) = start(&config).await;
    // A request line without its final CRLF.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (took, _) = until_closed(&mut half, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");
    let timed_out = |phase: &str| format!("weir_connections_timed_out_total{{phase=\"{phase}\"}}");
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(metrics.contains(&timed_out("header")), "{metrics}");
    // A keep-alive connection after one request.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (took, answer) = until_closed(&mut idle, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        took >= Duration::from_millis(500),
        "idle for its timeout: {took:?}"
    );
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(metrics.contains(&timed_out("idle")), "{metrics}");
}

#[tokio::test]
async fn a_slow_body_fails_and_a_slow_header_is_not_a_slow_body() {
    let config = format!("[server]\nbody_timeout = \"300ms\"\n\n{POLICY}");
    let (addr, _) = start(&config).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"po")
        .await
        .unwrap();
    let (_, answer) = until_closed(&mut slow, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("BAD_BODY"), "{answer}");
}

/// A body dripped a byte at a time, each byte well inside `body_timeout`:
/// the whole body's deadline still ends it, on the decision API and the
/// playground, with a length or chunked.
#[tokio::test]
async fn a_dripping_body_is_cut_off_at_its_deadline() {
    let config = format!("[server]\nbody_deadline = \"600ms\"\n\n{POLICY}");
    let (addr, _) = start(&config).await;
    let heads = [
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 65000\r\n\r\n",
        "POST /v1/simulate HTTP/1.1\r\nHost: x\r\nContent-Length: 65000\r\n\r\n",
        "POST /v1/report HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    ];
    for head in heads {
        let drip = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = drip.into_split();
        write.write_all(head.as_bytes()).await.unwrap();
        let piece: &[u8] = match head.contains("chunked") {
            true => b"1\r\n{\r\n",
            false => b"{",
        };
        let dripping = async {
            while write.write_all(piece).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Fresh clients are served meanwhile.
                let health = send("GET", &format!("http://{addr}/healthz"), &[], "").await;
                assert_eq!(health.status, 200);
            }
            std::future::pending::<()>().await;
        };
        let started = Instant::now();
        let mut answer = Vec::new();
        tokio::select! {
            _ = read.read_to_end(&mut answer) => {}
            () = dripping => {}
            () = tokio::time::sleep(Duration::from_secs(3)) => panic!("{head}: still open"),
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(500),
            "{head}: closed after {took:?}"
        );
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{head}: {answer}");
        assert!(answer.contains("BODY_TIMEOUT"), "{answer}");
    }
}

#[tokio::test]
async fn the_connection_cap_holds_while_normal_requests_succeed() {
    let config = format!("[server]\nmax_connections_per_ip = 8\n\n{POLICY}");
    let (addr, _) = start(&config).await;
    // Seven held connections (idle), then one left for normal traffic.
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut normal = TcpStream::connect(addr).await.unwrap();
    normal
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (_, answer) = until_closed(&mut normal, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(normal);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The cap: one more held connection, and the next is refused.
    held.push(TcpStream::connect(addr).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    let (_, answer) = until_closed(&mut over, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    // Room again once they go.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        send("GET", &format!("http://{addr}/healthz"), &[], "")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_flood_on_one_policy_leaves_new_identities_on_another() {
    let config = "[store]\nmax_keys = 1000\n\n[policies.slow]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\nmax_keys = 50\n\n[policies.other]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n";
    let (addr, _) = start(config).await;
    let url = format!("http://{addr}/v1/check");
    let check = |policy: &'static str, i: usize| {
        let url = url.clone();
        async move {
            let body = format!(r#"{{"policy":"{policy}","key":"id-{i}"}}"#);
            send("POST", &url, &[], &body).await
        }
    };
    let mut full = 0;
    for i in 0..80 {
        let reply = check("slow", i).await;
        if reply.status == 503 {
            assert_eq!(reply.json()["error"], "LIMITER_FULL");
            full += 1;
        }
    }
    assert_eq!(full, 30, "the flooded policy holds its own 50 keys");
    for i in 0..20 {
        assert_eq!(
            check("other", i).await.status,
            200,
            "a new identity elsewhere"
        );
    }
}

#[tokio::test]
async fn new_keys_per_address_are_capped_before_anything_is_stored() {
    let config = format!("[server]\nnew_keys_per_ip = 3\n\n{POLICY}");
    let (addr, state) = start(&config).await;
    let url = format!("http://{addr}/v1/check");
    let check = |key: &'static str| {
        let url = url.clone();
        async move {
            let body = format!(r#"{{"policy":"api","key":"{key}"}}"#);
            send("POST", &url, &[], &body).await
        }
    };
    for key in ["a", "b", "c"] {
        assert_eq!(check(key).await.status, 200);
    }
    let fourth = check("d").await;
    assert_eq!(
        (fourth.status, fourth.json()["error"].as_str()),
        (429, Some("NEW_KEYS_LIMITED"))
    );
    assert_eq!(fourth.header("retry-after"), "1");
    assert_eq!(check("a").await.status, 200, "known keys go on");
    // A report creates keys too: the same guard.
    let report = send(
        "POST",
        &format!("http://{addr}/v1/report"),
        &[],
        r#"{"policy":"api","key":"e","cost":1}"#,
    )
    .await;
    assert_eq!(
        report.json()["error"],
        "NEW_KEYS_LIMITED",
        "{}",
        report.body
    );
    assert_eq!(
        state.current().backend.local().len(),
        3,
        "d and e were not stored"
    );
}

/// With default settings, a flood of new identities on one policy leaves
/// new identities on another: each has its share of `[store] max_keys`.
#[tokio::test]
async fn by_default_a_flood_on_one_policy_leaves_new_identities_on_another() {
    let config = "[store]\nmax_keys = 90\n\n[policies.slow]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n\n[policies.other]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n";
    let (addr, _) = start(config).await;
    let url = format!("http://{addr}/v1/check");
    let check = |policy: &str, i: usize| {
        let body = format!(r#"{{"policy":"{policy}","key":"k{i}"}}"#);
        let url = url.clone();
        async move { send("POST", &url, &[], &body).await }
    };
    let mut full = 0;
    for i in 0..60 {
        full += usize::from(check("slow", i).await.status == 503);
    }
    assert_eq!(full, 30, "the flooded policy holds its share, 90 / 3");
    for i in 0..30 {
        assert_eq!(
            check("other", i).await.status,
            200,
            "a new identity elsewhere"
        );
    }
}

#[tokio::test]
async fn with_an_internal_listener_the_public_one_serves_only_routes() {
    let config = "[server]\ninternal = \"127.0.0.1:0\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n";
    let config = weir_server::config::parse(config, &Default::default()).unwrap();
    let state = weir_server::AppState::new(weir_server::Shared::new(config, None).unwrap());
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let internal = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_addr, internal_addr) =
        (public.local_addr().unwrap(), internal.local_addr().unwrap());
    tokio::spawn(weir_server::run(
        public,
        state.clone(),
        std::future::pending(),
    ));
    tokio::spawn(weir_server::run_internal(
        internal,
        state,
        std::future::pending(),
    ));
    let body = r#"{"policy":"api","key":"k"}"#;
    for path in [
        "/v1/check",
        "/metrics",
        "/v1/policies",
        "/readyz",
        "/v1/keys/api/api:k",
    ] {
        let reply = send("POST", &format!("http://{public_addr}{path}"), &[], body).await;
        assert_eq!(reply.status, 404, "{path} is not public");
    }
    assert_eq!(
        send("GET", &format!("http://{public_addr}/healthz"), &[], "")
            .await
            .status,
        200
    );
    assert_eq!(
        send(
            "POST",
            &format!("http://{internal_addr}/v1/check"),
            &[],
            body
        )
        .await
        .status,
        200
    );
    assert_eq!(
        send("GET", &format!("http://{internal_addr}/metrics"), &[], "")
            .await
            .status,
        200
    );
}
