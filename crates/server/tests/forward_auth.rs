//! Forward-auth (`/v1/auth`): a proxy in front asks weir about the original
//! request, described by the headers nginx, Traefik and Caddy send, or by
//! the path Envoy's HTTP ext_authz appends; weir matches its own routes,
//! identifies the client behind trusted proxies only, and decides as the
//! gateway would. Over real sockets.

use crate::{send, start};

const CONFIG: &str = r#"
[server]
trusted_proxies = ["127.0.0.1/32"]

[policies.login]
algorithm = "token-bucket"
capacity = 3
rate = "3/10m"

[policies.tenant]
algorithm = "token-bucket"
capacity = 2
rate = "1/h"

[[routes]]
match = "POST /login"
identity = "peer"
policies = ["login"]

[[routes]]
match = "GET /t/{tenant}/items"
identity = "path:tenant"
policies = ["tenant"]
"#;

/// The same key however the proxy describes the request: nginx's headers,
/// Traefik's and Caddy's, and Envoy's path; the client is the address the
/// trusted proxy names; refused with the gateway's `429`.
#[tokio::test]
async fn every_proxy_describes_the_same_request() {
    let (addr, _) = start(CONFIG).await;
    let auth = format!("http://{addr}/v1/auth");
    let client = ("x-forwarded-for", "203.0.113.7");
    let nginx = [
        ("x-original-uri", "/login?next=%2F"),
        ("x-original-method", "POST"),
        client,
    ];
    let traefik = [
        ("x-forwarded-uri", "/login"),
        ("x-forwarded-method", "POST"),
        client,
    ];
    let first = send("GET", &auth, &nginx, "").await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("ratelimit"), "\"login\";r=2;t=200");
    assert_eq!(send("GET", &auth, &traefik, "").await.status, 200);
    // Envoy's HTTP ext_authz: the original method and path, after the prefix.
    let envoy = send("POST", &format!("{auth}/login"), &[client], "").await;
    assert_eq!(envoy.status, 200);
    let limited = send("GET", &auth, &nginx, "").await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), "200");
    assert!(limited.header("ratelimit").starts_with("\"login\";r=0;t="));
    assert!(
        limited.body.contains("\"policy\":\"login\""),
        "{}",
        limited.body
    );
    // Another client has its own count.
    let other = [
        ("x-original-uri", "/login"),
        ("x-original-method", "POST"),
        ("x-forwarded-for", "203.0.113.8"),
    ];
    assert_eq!(send("GET", &auth, &other, "").await.status, 200);
    // Path parameters identify as on the gateway.
    let tenant = |t: &str| format!("/t/{t}/items");
    for expected in [200, 200, 429] {
        let a = [("x-forwarded-uri", tenant("a"))];
        let a = [(a[0].0, a[0].1.as_str())];
        assert_eq!(send("GET", &auth, &a, "").await.status, expected);
    }
    let b = send("GET", &format!("{auth}{}", tenant("b")), &[], "").await;
    assert_eq!(b.status, 200);
    // Counted per face, route and outcome.
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "").await;
    for series in [
        r#"weir_face_answers_total{face="forward_auth",route="POST /login",outcome="limited"}"#,
        r#"weir_face_answers_total{face="forward_auth",route="GET /t/{tenant}/items",outcome="admitted"}"#,
    ] {
        assert!(
            metrics.body.contains(series),
            "{series} in {}",
            metrics.body
        );
    }
}

/// A client that is not a trusted proxy names no other client: its
/// `X-Forwarded-For` and `X-Real-IP` are ignored, and it is counted as
/// itself.
#[tokio::test]
async fn forwarding_headers_count_only_from_trusted_proxies() {
    let config = CONFIG.replace("127.0.0.1/32", "10.0.0.0/8");
    let (addr, _) = start(&config).await;
    let auth = format!("http://{addr}/v1/auth/login");
    for (i, expected) in [200, 200, 200, 429].into_iter().enumerate() {
        let spoofed = format!("198.51.100.{i}");
        let headers = [
            ("x-forwarded-for", spoofed.as_str()),
            ("x-real-ip", spoofed.as_str()),
        ];
        assert_eq!(
            send("POST", &auth, &headers, "").await.status,
            expected,
            "request {i}"
        );
    }
    // From a trusted proxy, X-Real-IP alone names the client.
    let (addr, _) = start(CONFIG).await;
    let auth = format!("http://{addr}/v1/auth/login");
    for (i, expected) in [200, 200, 200, 429, 200].into_iter().enumerate() {
        let real = if i < 4 { "192.0.2.1" } else { "192.0.2.2" };
        let reply = send("POST", &auth, &[("x-real-ip", real)], "").await;
        assert_eq!(reply.status, expected, "request {i}");
    }
}

/// What is not a decision: a request no route matches is not limited (no
/// fields); two headers naming different requests, or a path that is not
/// canonical, are refused (`422`, `400`) before anything is charged; a route
/// without an upstream is not the gateway's (`404`).
#[tokio::test]
async fn what_forward_auth_does_not_decide() {
    let (addr, _) = start(CONFIG).await;
    let auth = format!("http://{addr}/v1/auth");
    let free = send("GET", &auth, &[("x-original-uri", "/elsewhere")], "").await;
    assert_eq!((free.status, free.header("ratelimit")), (200, ""));
    let conflicting = [
        ("x-original-uri", "/elsewhere"),
        ("x-forwarded-uri", "/login"),
        ("x-forwarded-method", "POST"),
    ];
    let refused = send("GET", &auth, &conflicting, "").await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.body.contains("x-original-uri"), "{}", refused.body);
    let dotted = send("GET", &auth, &[("x-original-uri", "/t/a/../b/items")], "").await;
    assert_eq!(dotted.status, 400, "{}", dotted.body);
    let gateway = send("POST", &format!("http://{addr}/login"), &[], "").await;
    assert_eq!(gateway.status, 404, "{}", gateway.body);
    assert!(gateway.body.contains("/v1/auth"), "{}", gateway.body);
    // None of them charged the login count.
    for expected in [200, 200, 200, 429] {
        assert_eq!(
            send("POST", &format!("{auth}/login"), &[], "").await.status,
            expected
        );
    }
}

/// A route without an upstream cannot hold a concurrency policy (nothing
/// would release its lease) or meter usage (weir never sees the answer).
#[test]
fn a_forward_auth_route_has_no_lease_and_no_usage() {
    let leased = "[policies.c]\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"30s\"\n\n[[routes]]\nmatch = \"GET /x\"\nidentity = \"peer\"\npolicies = [\"c\"]\n";
    let error = weir_server::config::parse(leased, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("line 9: [[routes]] #1 policies: a concurrency policy needs an upstream"),
        "{error}"
    );
    let metered = "[policies.t]\nalgorithm = \"token-bucket\"\ncapacity = 100\nrate = \"10/s\"\n\n[[routes]]\nmatch = \"POST /x\"\nidentity = \"peer\"\npolicies = [\"t\"]\nusage = \"header:x-tokens\"\n";
    let error = weir_server::config::parse(metered, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("[[routes]] #1 usage: needs an upstream"),
        "{error}"
    );
}

mod grpc {
    use envoy_types::pb::envoy::config::core::v3::address::Address;
    use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
    use envoy_types::pb::envoy::config::core::v3::{self as core, SocketAddress};
    use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
        HttpRequest, Peer, Request,
    };
    use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
    use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
    use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};
    use weir_server::{AppState, Shared, config};

    async fn client(text: &str) -> AuthorizationClient<tonic::transport::Channel> {
        let config = config::parse(text, &Default::default()).unwrap();
        let state = AppState::new(Shared::new(config, None).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(weir_server::run_grpc(
            listener,
            state,
            std::future::pending(),
        ));
        AuthorizationClient::connect(format!("http://{addr}"))
            .await
            .unwrap()
    }

    fn check(source: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> CheckRequest {
        let peer = Peer {
            address: Some(core::Address {
                address: Some(Address::SocketAddress(SocketAddress {
                    address: source.into(),
                    port_specifier: Some(PortSpecifier::PortValue(40000)),
                    ..SocketAddress::default()
                })),
            }),
            ..Peer::default()
        };
        let http = HttpRequest {
            method: method.into(),
            path: path.into(),
            host: "app.example".into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ..HttpRequest::default()
        };
        CheckRequest {
            attributes: Some(AttributeContext {
                source: Some(peer),
                request: Some(Request {
                    http: Some(http),
                    ..Request::default()
                }),
                ..AttributeContext::default()
            }),
        }
    }

    /// The source address is the client, unless it is a trusted proxy
    /// (then `X-Forwarded-For` names it); admitted: OK with the field to
    /// add to the answer; refused: PERMISSION_DENIED with the `429`, its
    /// headers and weir's body; a request no route matches: OK, no field.
    #[tokio::test]
    async fn ext_authz_decides_from_the_attributes() {
        let mut authz = client(super::CONFIG).await;
        let from = |source| {
            check(
                source,
                "POST",
                "/login?next=/",
                &[("x-forwarded-for", "192.0.2.9")],
            )
        };
        for i in 0..3 {
            let answer = authz
                .check(from("198.51.100.1"))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.status.unwrap().code, 0, "request {i}");
            let Some(HttpResponse::OkResponse(ok)) = answer.http_response else {
                panic!("{i}")
            };
            let field = ok
                .response_headers_to_add
                .iter()
                .find(|h| h.header.as_ref().unwrap().key == "ratelimit");
            let value = &field.unwrap().header.as_ref().unwrap().value;
            assert!(
                value.starts_with(&format!("\"login\";r={};", 2 - i)),
                "{value}"
            );
        }
        let refused = authz
            .check(from("198.51.100.1"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            refused.status.unwrap().code,
            tonic::Code::PermissionDenied as i32
        );
        let Some(HttpResponse::DeniedResponse(denied)) = refused.http_response else {
            panic!()
        };
        assert_eq!(denied.status.unwrap().code, 429);
        assert!(
            denied.body.contains("\"policy\":\"login\""),
            "{}",
            denied.body
        );
        let header = |name: &str| {
            denied
                .headers
                .iter()
                .any(|h| h.header.as_ref().unwrap().key == name)
        };
        assert!(header("retry-after") && header("ratelimit") && header("ratelimit-policy"));
        // From the trusted proxy, the address it names is the client: a
        // new key.
        let behind = authz.check(from("127.0.0.1")).await.unwrap().into_inner();
        assert_eq!(behind.status.unwrap().code, 0);
        let free = check("198.51.100.1", "GET", "/elsewhere", &[]);
        let free = authz.check(free).await.unwrap().into_inner();
        let Some(HttpResponse::OkResponse(ok)) = free.http_response else {
            panic!()
        };
        assert!(ok.response_headers_to_add.is_empty());
        // Headers past the bound are refused, not decided.
        let big = "x".repeat(40 * 1024);
        let error = authz
            .check(check("198.51.100.1", "POST", "/login", &[("x-big", &big)]))
            .await
            .unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
    }
}
