//! Rolling limits out: shadow mode, reload, header styles.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::any;

use crate::{send, start};

async fn upstream() -> SocketAddr {
    let app = Router::new().fallback(any(|| async { "ok" }));
    weir_testkit::serve(app).await
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

#[tokio::test]
async fn overridden_keys_get_their_own_quota_or_none() {
    let up = upstream().await;
    let mut config = format!(
        r#"
[policies.api]
algorithm = "token-bucket"
capacity = 1
rate = "1/h"

[[routes]]
match = "GET /items"
identity = "header:x-tenant"
policies = ["api"]
upstream = "http://{up}"

[[overrides]]
policy = "api"
keys = ["big"]
capacity = 3

[[overrides]]
policy = "api"
keys = ["internal-batch"]
unlimited = true
"#
    );
    // A thousand more: each a hash entry, not a scan.
    for i in 0..1000 {
        config.push_str(&format!(
            "\n[[overrides]]\npolicy = \"api\"\nkeys = [\"tenant-{i}\"]\ncapacity = 2\n"
        ));
    }
    let (addr, _) = start(&config).await;
    let get = |tenant: &'static str| {
        let url = format!("http://{addr}/items");
        async move { send("GET", &url, &[("x-tenant", tenant)], "").await }
    };
    let statuses = |tenant: &'static str, n: usize| async move {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(get(tenant).await.status);
        }
        out
    };
    assert_eq!(statuses("small", 2).await, [200, 429]);
    assert_eq!(statuses("big", 4).await, [200, 200, 200, 429]);
    assert_eq!(statuses("tenant-500", 3).await, [200, 200, 429]);
    let batch = statuses("internal-batch", 50).await;
    assert!(batch.iter().all(|s| *s == 200), "unlimited: {batch:?}");
    let big = get("big").await;
    assert_eq!(big.header("ratelimit-policy"), "\"api\";q=3;w=10800");
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert_eq!(
        series(
            &metrics,
            "weir_decisions_total{policy=\"api\",outcome=\"unlimited\"}"
        ),
        50.0
    );
    // The decision API applies them too.
    let check = |key: &'static str| {
        let url = format!("http://{addr}/v1/check");
        async move {
            let body = format!(r#"{{"policy":"api","key":"{key}"}}"#);
            send("POST", &url, &[], &body).await.json()
        }
    };
    assert_eq!(check("big").await["limit"], 3);
    assert_eq!(check("small").await["limit"], 1);
}

#[test]
fn overrides_are_validated_like_policies() {
    let text = "[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n\n[[overrides]]\npolicy = \"api\"\nkeys = [\"a\"]\ncapacity = 0\n\n[[overrides]]\npolicy = \"nope\"\nkeys = [\"b\"]\nunlimited = true\n\n[[overrides]]\npolicy = \"api\"\nkeys = [\"a\"]\nunlimited = true\n";
    let errors = weir_server::config::parse(text, &Default::default())
        .unwrap_err()
        .0;
    let found: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
    assert_eq!(
        found,
        [
            (9, "[[overrides]] #1 capacity"),
            (12, "[[overrides]] #2 policy"),
            (18, "[[overrides]] #3 keys"),
        ],
        "{errors:#?}"
    );
}

#[tokio::test]
async fn header_styles_and_the_near_limit_signal() {
    let up = upstream().await;
    let config = |style: &str| {
        format!(
            "[server]\nheaders = \"{style}\"\nnear_limit_ratio = 0.8\n\n[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"1/h\"\n\n[[routes]]\nmatch = \"GET /items\"\nidentity = \"header:x-tenant\"\npolicies = [\"api\"]\nupstream = \"http://{up}\"\n"
        )
    };
    let (addr, _) = start(&config("x-ratelimit")).await;
    let url = format!("http://{addr}/items");
    let mut last = None;
    for _ in 0..11 {
        last = Some(send("GET", &url, &[("x-tenant", "t")], "").await);
    }
    let limited = last.unwrap();
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("x-ratelimit-limit"), "10");
    assert_eq!(limited.header("x-ratelimit-remaining"), "0");
    assert_eq!(limited.header("x-ratelimit-reset"), "36000");
    assert_eq!(limited.header("ratelimit"), "", "only the older fields");
    let api = send(
        "POST",
        &format!("http://{addr}/v1/check"),
        &[],
        r#"{"policy":"api","key":"k"}"#,
    )
    .await;
    assert_eq!(api.header("x-ratelimit-remaining"), "9");
    // 10 admitted by the gateway: those leaving 0 and 1 are under 20 %.
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert_eq!(
        series(&metrics, "weir_near_limit_total{policy=\"api\"}"),
        2.0,
        "{metrics}"
    );
    for (style, fields) in [("both", true), ("none", false)] {
        let (addr, _) = start(&config(style)).await;
        let url = format!("http://{addr}/items");
        let answer = send("GET", &url, &[("x-tenant", "t")], "").await;
        for name in ["ratelimit", "x-ratelimit-limit"] {
            assert_eq!(!answer.header(name).is_empty(), fields, "{style}: {name}");
        }
    }
}
