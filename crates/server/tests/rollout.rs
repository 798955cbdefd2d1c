//! Rolling limits out: shadow mode, reload, header styles.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::any;

use crate::{send, start};

async fn upstream() -> SocketAddr {
    let app = Router::new().fallback(any(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn series(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_shadow_policy_forwards_everything_and_counts_what_it_would_refuse() {
    let up = upstream().await;
    let config = format!(
        r#"
[policies.trial]
algorithm = "fixed-window"
limit = 2
window = "1h"
shadow = true

[policies.enforced]
algorithm = "token-bucket"
capacity = 100
rate = "1/h"

[[routes]]
match = "GET /items"
identity = "header:x-tenant"
policies = ["trial", "enforced"]
upstream = "http://{up}"
"#
    );
    let (addr, _) = start(&config).await;
    let url = format!("http://{addr}/items");
    for i in 0..5 {
        let reply = send("GET", &url, &[("x-tenant", "t1")], "").await;
        assert_eq!(reply.status, 200, "request {i} forwarded");
        // Clients see the enforced policy only.
        assert!(
            !reply.header("ratelimit").contains("trial"),
            "{:?}",
            reply.headers
        );
    }
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    let limited = series(
        &metrics,
        "weir_decisions_total{policy=\"trial\",outcome=\"shadow_limited\"}",
    );
    assert_eq!(limited, 3.0, "{metrics}");
    // The enforced policy was charged for all five.
    let check = r#"{"checks":[{"policy":"trial","key":"x"},{"policy":"enforced","key":"x"}]}"#;
    let answer = send("POST", &format!("http://{addr}/v1/check"), &[], check)
        .await
        .json();
    assert_eq!(answer["allowed"], true);
    send("POST", &format!("http://{addr}/v1/check"), &[], check).await;
    let again = send("POST", &format!("http://{addr}/v1/check"), &[], check)
        .await
        .json();
    assert_eq!(again["allowed"], true, "{again}");
    assert_eq!(again["decisions"][0]["shadow_limited"], true, "{again}");
    assert_eq!(
        again["decisions"][1]["remaining"], 97,
        "charged all three: {again}"
    );
}
