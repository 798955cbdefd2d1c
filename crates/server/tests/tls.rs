//! TLS on weir's listeners, over real sockets, with certificates the test
//! makes: HTTP/1.1 and HTTP/2 (ALPN), `X-Forwarded-Proto: https`, client
//! certificates required (mTLS), a plaintext request closed, a certificate
//! rotated under load, and gRPC over TLS.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::any;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_testkit::Certs;

use crate::start;

/// An upstream that answers with the `X-Forwarded-Proto` it was sent.
async fn upstream() -> SocketAddr {
    let app = Router::new().fallback(any(|request: Request| async move {
        let proto = request.headers().get("x-forwarded-proto").cloned();
        format!(
            "proto={}",
            proto
                .map(|p| p.to_str().unwrap().to_owned())
                .unwrap_or_default()
        )
    }));
    weir_testkit::serve(app).await
}

fn config(certs: &Certs, client_ca: bool, upstream: SocketAddr) -> String {
    let client_ca = match client_ca {
        true => format!("client_ca = \"{}\"\n", certs.path("ca.pem").display()),
        false => String::new(),
    };
    format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n{client_ca}\n[policies.p]\nalgorithm = \"gcra\"\nburst = 100000\nrate = \"100000/s\"\n\n[[routes]]\nmatch = \"GET /up\"\nidentity = \"peer\"\npolicies = [\"p\"]\nupstream = \"http://{upstream}\"\n",
        certs.path("server.pem").display(),
        certs.path("server-key.pem").display(),
    )
}

const GET_UP: &str = "GET /up HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn the_public_listener_speaks_tls_and_h2_and_closes_plaintext() {
    let certs = Certs::new("listener-tls");
    let (addr, _) = start(&config(&certs, false, upstream().await)).await;
    let answer = certs.request(addr, false, GET_UP).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("proto=https"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("ratelimit-policy"),
        "{answer}"
    );

    // HTTP/2 when the client offers it (ALPN), with the same answers.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = certs
        .connector(false, &[b"h2", b"http/1.1"])
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    for _ in 0..3 {
        let request = http::Request::get("https://localhost/up")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"proto=https");
    }

    // Plaintext to the TLS port: no HTTP answer, the connection closed.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(GET_UP.as_bytes()).await.unwrap();
    let mut said = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut said)).await;
    assert!(read.is_ok(), "closed, not left hanging");
    assert!(
        !String::from_utf8_lossy(&said).contains("HTTP/1.1"),
        "{said:?}"
    );
}

#[tokio::test]
async fn client_certificates_are_required_with_a_client_ca() {
    let certs = Certs::new("listener-mtls");
    let (addr, _) = start(&config(&certs, true, upstream().await)).await;
    let with = certs.request(addr, true, GET_UP).await.unwrap();
    assert!(with.starts_with("HTTP/1.1 200"), "{with}");
    // Without one, the handshake (or, TLS 1.3, the first read) fails.
    let without = certs.request(addr, false, GET_UP).await;
    assert!(
        without.as_ref().map_or(true, |a| !a.contains("HTTP/1.1")),
        "{without:?}"
    );
}

/// The certificate files replaced under load (as cert-manager renews, or a
/// Secret's symlink swaps): new handshakes get the new certificate, no
/// request fails, and a broken pair in between leaves the old one serving.
#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_failed_request() {
    let (old, new) = (Certs::new("rotate-old"), Certs::new("rotate-new"));
    // What weir serves from: a copy of the old pair, replaced below.
    let live = Certs::new("rotate-live");
    for file in ["server.pem", "server-key.pem"] {
        std::fs::copy(old.path(file), live.path(file)).unwrap();
    }
    let (addr, _) = start(&config(&live, false, upstream().await)).await;
    // Clients trust both CAs, and tell which certificate they were shown.
    let both = [old.read("ca.pem"), new.read("ca.pem")].concat();
    std::fs::write(old.path("ca.pem"), both).unwrap();
    let new_leaf = rustls::pki_types::pem::PemObject::pem_slice_iter(&new.read("server.pem"))
        .next()
        .map(|c: Result<rustls::pki_types::CertificateDer<'static>, _>| c.unwrap())
        .unwrap();
    let connector = old.connector(false, &[b"http/1.1"]);
    let load = tokio::spawn(async move {
        let (mut failed, mut shown_new) = (0, 0);
        let until = tokio::time::Instant::now() + Duration::from_millis(4_500);
        while tokio::time::Instant::now() < until {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let Ok(mut tls) = connector.connect(name, tcp).await else {
                failed += 1;
                continue;
            };
            let is_new =
                tls.get_ref().1.peer_certificates().and_then(|c| c.first()) == Some(&new_leaf);
            tls.write_all(GET_UP.as_bytes()).await.unwrap();
            let mut answer = String::new();
            let _ = tls.read_to_string(&mut answer).await;
            failed += usize::from(!answer.starts_with("HTTP/1.1 200"));
            shown_new += usize::from(is_new);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (failed, shown_new)
    });
    // A broken pair first (a key that is not a key): logged, not served.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let replace = |file: &str, bytes: &[u8]| {
        let staged = live.path(&format!("{file}.staged"));
        std::fs::write(&staged, bytes).unwrap();
        std::fs::rename(&staged, live.path(file)).unwrap();
    };
    replace("server-key.pem", b"not a key");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    replace("server.pem", &new.read("server.pem"));
    replace("server-key.pem", &new.read("server-key.pem"));
    let (failed, shown_new) = load.await.unwrap();
    assert_eq!(failed, 0, "no request failed through the rotation");
    assert!(shown_new > 0, "new handshakes got the new certificate");
}

/// The Envoy rate limit service over TLS with client certificates
/// required: a gRPC client with one is answered, one without is not.
#[tokio::test]
async fn the_rate_limit_service_answers_over_mtls_only() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let certs = Certs::new("grpc-mtls");
    let config = format!(
        "[server]\ngrpc = \"127.0.0.1:0\"\n\n[server.grpc_tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\n[policies.seller]\nalgorithm = \"token-bucket\"\ncapacity = 3\nrate = \"1/h\"\n\n[[descriptors]]\ndomain = \"kartly\"\nentries = [\"seller\"]\npolicy = \"seller\"\n",
        certs.path("server.pem").display(),
        certs.path("server-key.pem").display(),
        certs.path("ca.pem").display(),
    );
    let config = weir_server::config::parse(&config, &Default::default()).unwrap();
    let state = weir_server::AppState::new(weir_server::Shared::new(config, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weir_server::run_grpc(
        listener,
        state,
        std::future::pending(),
    ));
    let endpoint = tonic::transport::Endpoint::from_static("http://localhost");
    let client = |with_cert: bool| {
        let connector = certs.connector(with_cert, &[b"h2"]);
        endpoint.connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
    };
    let request = || RateLimitRequest {
        domain: "kartly".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "seller".into(),
                value: "7".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let channel = client(true).await.unwrap();
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK: {answer:?}");
    let refused = match client(false).await {
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request())
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(refused, "no client certificate, no answer");
}

/// A client that connects to a TLS port and never finishes its handshake is
/// closed at `header_timeout`, as one that never finishes a head is.
#[tokio::test]
async fn a_stalled_handshake_is_closed_at_the_header_timeout() {
    let certs = Certs::new("listener-stall");
    let text = format!(
        "[server]\nheader_timeout = \"1s\"\n\n{}",
        config(&certs, false, upstream().await)
    );
    let (addr, _) = start(&text).await;
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "not before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "at the timeout: {took:?}");
}

/// An upstream that speaks TLS only, with `certs`' server certificate
/// (`localhost`, 127.0.0.1), answering `secure` to everything.
async fn tls_upstream(certs: &Certs) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&certs.read("server.pem"))
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_slice(&certs.read("server-key.pem")).unwrap();
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"secure")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// `https://` upstreams: reached over TLS, the certificate verified for
/// the upstream's host name against `upstream_ca` (or the system's roots,
/// which do not know this test's CA: `502`, never an unverified answer).
#[tokio::test]
async fn an_https_upstream_is_reached_over_verified_tls() {
    let certs = Certs::new("https-upstream");
    let upstream = tls_upstream(&certs).await;
    let route = |ca: &str| {
        format!(
            "[policies.p]\nalgorithm = \"gcra\"\nburst = 100\nrate = \"100/s\"\n\n[[routes]]\nmatch = \"GET /s\"\nidentity = \"peer\"\npolicies = [\"p\"]\nupstream = \"https://localhost:{}\"\n{ca}",
            upstream.port()
        )
    };
    let ca = format!("upstream_ca = \"{}\"\n", certs.path("ca.pem").display());
    let (addr, _) = start(&route(&ca)).await;
    for _ in 0..3 {
        let answer = crate::send("GET", &format!("http://{addr}/s"), &[], "").await;
        assert_eq!((answer.status, answer.body.as_str()), (200, "secure"));
    }
    let (untrusted, _) = start(&route("")).await;
    let answer = crate::send("GET", &format!("http://{untrusted}/s"), &[], "").await;
    assert_eq!(answer.status, 502, "{}", answer.body);
    // A CA for a plain upstream is a mistake the config names.
    let plain = route(&ca).replace("https://", "http://");
    let error = weir_server::config::parse(&plain, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("upstream_ca") && error.contains("https"),
        "{error}"
    );
}

/// A certificate that does not load is an error of the configuration as
/// it is read (its file, line and table), not of the first handshake.
#[test]
fn a_certificate_that_does_not_load_names_its_line() {
    let certs = Certs::new("unloadable");
    let missing = certs.path("missing.pem");
    let text = format!(
        "[policies.p]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n\n[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        missing.display(),
        certs.path("server-key.pem").display()
    );
    let path = certs.path("weir.toml");
    std::fs::write(&path, text).unwrap();
    let error = weir_server::reload::Source::file(Some(path.clone()))
        .load()
        .unwrap_err();
    let expected = format!(
        "{}:line 7: [server.tls]: cannot read {}",
        path.display(),
        missing.display()
    );
    assert!(error.starts_with(&expected), "{error}");
}
