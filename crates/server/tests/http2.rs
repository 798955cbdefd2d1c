//! HTTP/2 clients that hold weir's work: an answer the client never lets
//! move (a window of 0, pings to look alive), and streams reset once they
//! were accepted. Over TLS (weir offers HTTP/2 by ALPN only).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use weir_testkit::Certs;

use crate::start;

/// An upstream: `/big` answers 256 KiB at once, `/slow` after 2 s.
async fn upstream() -> SocketAddr {
    let app = Router::new()
        .route("/big", get(|| async { vec![b'x'; 256 << 10] }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "late"
            }),
        );
    weir_testkit::serve(app).await
}

fn config(certs: &Certs, upstream: SocketAddr) -> String {
    format!(
        "[server]\nidle_timeout = \"1s\"\n\n[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n\
         [policies.jobs]\nalgorithm = \"concurrency\"\nlimit = 1\nlease = \"1h\"\n\n\
         [policies.many]\nalgorithm = \"gcra\"\nburst = 100000\nrate = \"100000/s\"\n\n\
         [[routes]]\nmatch = \"GET /big\"\nidentity = \"header:x-tenant\"\npolicies = [\"jobs\"]\nupstream = \"http://{upstream}\"\n\n\
         [[routes]]\nmatch = \"GET /slow\"\nidentity = \"peer\"\npolicies = [\"many\"]\nupstream = \"http://{upstream}\"\n",
        certs.path("server.pem").display(),
        certs.path("server-key.pem").display(),
    )
}

/// An HTTP/2 connection to `addr` over TLS, built by `builder`; the task
/// driving it ends when the connection does.
async fn connect(
    certs: &Certs,
    addr: SocketAddr,
    builder: &hyper::client::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = certs
        .connector(false, &[b"h2"])
        .connect(name, tcp)
        .await
        .unwrap();
    let (sender, connection) = builder
        .handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, driven)
}

fn get_as(path: &str, tenant: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(format!("https://localhost{path}"))
        .header("x-tenant", tenant)
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// A client that grants no flow-control window and pings every 200 ms
/// holds an answer that cannot move: its connection is closed within
/// `idle_timeout` and a few ticks, and the lease the answer held is
/// released (the tenant's next request is admitted).
#[tokio::test]
async fn an_answer_the_client_never_takes_ends_within_the_idle_timeout() {
    let certs = Certs::new("h2-held");
    let (addr, _) = start(&config(&certs, upstream().await)).await;
    let mut stalled =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    stalled
        .timer(hyper_util::rt::TokioTimer::new())
        .initial_stream_window_size(0)
        .keep_alive_interval(Duration::from_millis(200))
        .keep_alive_while_idle(true);
    let (mut sender, driven) = connect(&certs, addr, &stalled).await;
    let held = sender.send_request(get_as("/big", "acme")).await.unwrap();
    assert_eq!(held.status(), 200, "admitted; its body cannot move");
    let since = Instant::now();
    // Meanwhile the tenant's one slot is taken.
    let plain = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    let (mut other, _other) = connect(&certs, addr, &plain).await;
    let refused = other.send_request(get_as("/big", "acme")).await.unwrap();
    assert_eq!(refused.status(), 429, "one in flight per tenant");
    tokio::time::timeout(Duration::from_secs(6), driven)
        .await
        .expect("the held connection is closed")
        .unwrap();
    let took = since.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed at the idle timeout, whatever the pings: {took:?}"
    );
    drop(held);
    // The lease went with it.
    let (mut again, _again) = connect(&certs, addr, &plain).await;
    let admitted = again.send_request(get_as("/big", "acme")).await.unwrap();
    assert_eq!(admitted.status(), 200, "the held lease was released");
    let body = http_body_util::BodyExt::collect(admitted.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body.len(), 256 << 10, "a client that reads gets it whole");
}

/// Streams reset after weir accepted them (decided, forwarded) are work the
/// client throws away: more than 20 in 10 s close the connection.
#[tokio::test]
async fn resetting_accepted_streams_closes_the_connection() {
    let certs = Certs::new("h2-resets");
    let (addr, _) = start(&config(&certs, upstream().await)).await;
    let plain = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    let (mut sender, driven) = connect(&certs, addr, &plain).await;
    // A few cancellations are a client changing its mind: the connection
    // stays.
    for _ in 0..5 {
        let asked = sender.send_request(get_as("/slow", "a"));
        let _ = tokio::time::timeout(Duration::from_millis(50), asked).await;
    }
    sender.ready().await.unwrap();
    assert!(!driven.is_finished(), "five resets are allowed");
    let mut sent = 5;
    let closed = loop {
        if driven.is_finished() || sender.ready().await.is_err() {
            break true;
        }
        if sent == 200 {
            break false;
        }
        let asked = sender.send_request(get_as("/slow", "a"));
        let _ = tokio::time::timeout(Duration::from_millis(20), asked).await;
        sent += 1;
    };
    assert!(closed, "still open after {sent} resets");
    assert!(sent <= 40, "closed soon after the 20th reset: {sent}");
}
