//! A concurrency policy through the gateway: a lease held from admission
//! until the answer's body ends, the client goes away or the upstream
//! fails; renewed while a long answer streams; one slot per request
//! whatever the route's cost.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_testkit::Llm;

use crate::{send, start};

/// Tokens per minute with usage reports, and at most 2 in flight per
/// tenant: the pair a team serving an LLM wants.
fn config(llm: &Llm, lease: &str) -> String {
    format!(
        r#"
[policies.tokens]
algorithm = "token-bucket"
capacity = 10000
rate = "10000/m"

[policies.inflight]
algorithm = "concurrency"
limit = 2
lease = "{lease}"

[[routes]]
match = "POST /v1/chat/completions"
identity = "header:x-tenant"
policies = ["tokens", "inflight"]
upstream = "http://{}"
cost = "header:x-max-tokens"
usage = "json:/usage/total_tokens"

[[routes]]
match = "POST /down"
identity = "header:x-tenant"
policies = ["inflight"]
upstream = "http://127.0.0.1:9"
"#,
        llm.addr
    )
}

async fn chat(url: &str, tenant: &str, body: &str) -> weir_testkit::Reply {
    let headers = [("x-tenant", tenant), ("x-max-tokens", "0")];
    send("POST", url, &headers, body).await
}

/// The attack of the issue: 20 concurrent 6,000-token calls declaring 0
/// tokens against 10,000 a minute. The rate admits them all (the debt
/// comes after); the concurrency limit admits 2, and the others are
/// refused with the policy named and the in-flight capacity reported.
#[tokio::test]
async fn twenty_concurrent_calls_are_held_to_two_in_flight() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(&llm, "10m")).await;
    let url = format!("http://{addr}/v1/chat/completions");
    // Answers of 3 s: every call arrives while the first two stream.
    let body = r#"{"usage":6000,"stream":true,"pause_ms":1000}"#;
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { chat(&url, "acme", body).await })
        })
        .collect();
    let mut replies = Vec::new();
    for call in calls {
        replies.push(call.await.unwrap());
    }
    let admitted = replies.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        admitted,
        2,
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    let refused = replies.iter().find(|r| r.status == 429).unwrap();
    assert!(refused.body.contains("inflight"), "{}", refused.body);
    assert!(
        refused
            .header("ratelimit-policy")
            .contains(r#""inflight";q=2;qu="concurrent-requests""#),
        "{}",
        refused.header("ratelimit-policy")
    );
    // An upper bound: the earliest expiry, 10 minutes; a release comes first.
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!((590..=600).contains(&retry), "{retry}");
    // Both answers ended, their 12,000 tokens reported: the rate now
    // refuses (the debt), and the leases are back at once (the route with
    // only the concurrency policy, same identity, is admitted).
    let again = chat(&url, "acme", r#"{"usage":10}"#).await;
    assert_eq!(again.status, 429, "{}", again.body);
    assert!(again.body.contains("tokens"), "{}", again.body);
    let down = send(
        "POST",
        &format!("http://{addr}/down"),
        &[("x-tenant", "acme")],
        "",
    )
    .await;
    assert_eq!(
        down.status, 502,
        "admitted, then the upstream failed: {}",
        down.body
    );
}

/// Reads an answer's head from `stream` (up to its blank line).
async fn head(stream: &mut tokio::net::TcpStream) -> String {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        seen.push(byte[0]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A slow answer's client hangs up mid-stream: its lease is released then,
/// not when it would expire. An upstream that fails releases it too.
#[tokio::test]
async fn a_client_that_hangs_up_or_a_failed_upstream_gives_the_slot_back() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(&llm, "10m")).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let body = r#"{"usage":1,"stream":true,"pause_ms":2000}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Tenant: acme\r\nX-Max-Tokens: 0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        assert!(head(&mut stream).await.starts_with("HTTP/1.1 200"));
        streams.push(stream);
    }
    assert_eq!(chat(&url, "acme", "{}").await.status, 429, "two streaming");
    drop(streams.pop());
    // The release is sent as the connection closes.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = 429;
    while status == 429 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = chat(&url, "acme", r#"{"usage":1}"#).await.status;
    }
    assert_eq!(status, 200, "the slot of the client that left is free");
    // The upstream is down: 502, and the slot is given back.
    let down = format!("http://{addr}/down");
    for _ in 0..3 {
        let reply = send("POST", &down, &[("x-tenant", "other")], "").await;
        assert_eq!(reply.status, 502, "{}", reply.body);
    }
}

/// An answer that streams longer than the lease: renewed while it runs
/// (a third request stays refused past the lease), released when it ends.
#[tokio::test]
async fn a_long_answer_renews_its_lease_while_it_streams() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(&llm, "1s")).await;
    let url = format!("http://{addr}/v1/chat/completions");
    // Four events 1.2 s apart: 3.6 s, more than three leases (renewed
    // every 500 ms: a loaded machine has room to be late).
    let body = r#"{"usage":1,"stream":true,"pause_ms":1200}"#;
    let started = Instant::now();
    let long: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { chat(&url, "acme", body).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(3000) {
        let reply = chat(&url, "acme", r#"{"usage":1}"#).await;
        assert_eq!(
            reply.status,
            429,
            "at {:?}: both slots are held",
            started.elapsed()
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused > 10);
    for call in long {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200);
        assert!(reply.body.contains("[DONE]"), "streamed to its end");
    }
    assert_eq!(chat(&url, "acme", r#"{"usage":1}"#).await.status, 200);
}

/// A lease taken through the decision API and never released expires on
/// time, and is counted as expired unreleased.
#[tokio::test]
async fn an_unreleased_lease_expires_on_time_and_is_counted() {
    let config = r#"
[policies.jobs]
algorithm = "concurrency"
limit = 1
lease = "2s"
"#;
    let (addr, _) = start(config).await;
    let url = format!("http://{addr}/v1/check");
    let body = r#"{"policy":"jobs","key":"crashed"}"#;
    let taken = send("POST", &url, &[], body).await.json();
    assert!(taken["lease"].is_string(), "{taken}");
    let taken_at = Instant::now();
    let refused = send("POST", &url, &[], body).await.json();
    assert_eq!(refused["allowed"], false);
    assert!(refused["retry_after_ms"].as_u64().unwrap() <= 2000);
    tokio::time::sleep(Duration::from_millis(2050).saturating_sub(taken_at.elapsed())).await;
    let after = send("POST", &url, &[], body).await.json();
    assert_eq!(after["allowed"], true, "expired: {after}");
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("weir_leases_expired_total{policy=\"jobs\"}"))
        .unwrap_or_default();
    assert!(line.ends_with(" 1"), "{line}");
    assert!(
        metrics.contains("weir_leases_in_use{policy=\"jobs\"} 1"),
        "the second lease"
    );
}

/// A concurrency policy's override and shadow mode through the decision
/// API: an override gives its identity another limit (and its own leases);
/// a shadow concurrency policy that would refuse takes no lease and lets
/// the request through; several policies take a lease only when all admit.
#[tokio::test]
async fn overrides_shadow_and_several_policies_apply_to_leases() {
    let config = r#"
[policies.jobs]
algorithm = "concurrency"
limit = 1
lease = "10m"

[policies.watch]
algorithm = "concurrency"
limit = 1
lease = "10m"
shadow = true

[policies.daily]
algorithm = "fixed-window"
limit = 3
window = "1d"

[[overrides]]
policy = "jobs"
keys = ["vip"]
limit = 2
"#;
    let (addr, _) = start(config).await;
    let url = format!("http://{addr}/v1/check");
    let check = |policy: &'static str, key: &'static str| {
        let url = url.clone();
        async move {
            let body = format!(r#"{{"policy":"{policy}","key":"{key}"}}"#);
            send("POST", &url, &[], &body).await.json()
        }
    };
    assert_eq!(check("jobs", "vip").await["allowed"], true);
    assert_eq!(
        check("jobs", "vip").await["allowed"],
        true,
        "the override's limit: 2"
    );
    assert_eq!(check("jobs", "vip").await["allowed"], false);
    assert_eq!(check("jobs", "plain").await["allowed"], true);
    assert_eq!(
        check("jobs", "plain").await["allowed"],
        false,
        "the policy's: 1"
    );
    let first = check("watch", "w").await;
    assert!(first["lease"].is_string(), "{first}");
    let shadowed = check("watch", "w").await;
    assert_eq!(
        shadowed["allowed"], true,
        "shadow: never refuses: {shadowed}"
    );
    assert_eq!(shadowed["shadow_limited"], true);
    assert!(
        shadowed.get("lease").is_none(),
        "and takes no lease: {shadowed}"
    );
    // Several policies: the lease only when every policy admits.
    let both = r#"{"checks":[{"policy":"daily","key":"d"},{"policy":"jobs","key":"d"}]}"#;
    let all = send("POST", &url, &[], both).await.json();
    assert_eq!(all["allowed"], true, "{all}");
    let lease = all["decisions"][1]["lease"].as_str().unwrap().to_owned();
    let refused = send("POST", &url, &[], both).await.json();
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["decisions"][0]["remaining"], 2, "daily not charged");
    let release = format!(r#"{{"policy":"jobs","key":"d","lease":"{lease}"}}"#);
    let released = send("POST", &format!("http://{addr}/v1/release"), &[], &release).await;
    assert_eq!(released.json()["allowed"], true);
    assert_eq!(send("POST", &url, &[], both).await.json()["allowed"], true);
}
