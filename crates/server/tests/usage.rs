//! Usage reported after the fact by the gateway, in front of a fake LLM
//! that says how many tokens each answer used: in a JSON body, in the last
//! event of a streamed answer, in a header or a trailer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_testkit::Llm;
use weir_testkit::llm::usage_json;

use crate::{send, start};

/// 10 tokens, 10 a second; routes reading usage from each place.
fn config(llm: SocketAddr) -> String {
    format!(
        r#"
[policies.tokens]
algorithm = "token-bucket"
capacity = 10
rate = "10/s"

[policies.tokens-per-hour]
algorithm = "token-bucket"
capacity = 100
rate = "100/h"

[[routes]]
match = "POST /v1/chat/completions"
identity = "header:x-tenant"
policies = ["tokens"]
upstream = "http://{llm}"
usage = "json:/usage/total_tokens"

[[routes]]
match = "POST /header/v1/chat/completions"
identity = "header:x-tenant"
policies = ["tokens"]
upstream = "http://{llm}"
usage = "header:x-usage-tokens"

[[routes]]
match = "POST /metered"
identity = "header:x-tenant"
policies = ["tokens-per-hour"]
upstream = "http://{llm}"
usage = "json:/usage/total_tokens"
cost = "header:x-max-tokens"

[[routes]]
match = "POST /floored"
identity = "header:x-tenant"
policies = ["tokens-per-hour"]
upstream = "http://{llm}"
usage = "json:/usage/total_tokens"
cost = "header:x-max-tokens"
min_cost = 40
"#
    )
}

fn ask(tokens: u64, stream: bool) -> String {
    format!(r#"{{"usage":{tokens},"stream":{stream},"pause_ms":5}}"#)
}

/// A tenant that used 31 tokens with 10 in its bucket (1 charged on
/// admission, 30 reported) owes 21: refused, `Retry-After` 3 s (2.2 s),
/// refused still at 2 s, admitted again at 2.2 s.
async fn in_debt_until_paid(addr: SocketAddr, path: &str, tenant: &str, stream: bool) -> String {
    let url = format!("http://{addr}{path}");
    let who = [("x-tenant", tenant)];
    let answered = send("POST", &url, &who, &ask(31, stream)).await;
    let paid_from = Instant::now();
    assert_eq!(answered.status, 200, "{path} {tenant}");
    let refused = send("POST", &url, &who, &ask(1, false)).await;
    assert_eq!(refused.status, 429, "{path} {tenant}: {}", refused.body);
    assert_eq!(refused.header("retry-after"), "3", "{path} {tenant}");
    tokio::time::sleep_until((paid_from + Duration::from_millis(1950)).into()).await;
    let early = send("POST", &url, &who, &ask(1, false)).await;
    assert_eq!(
        early.status, 429,
        "{path} {tenant}: admitted before its debt was paid"
    );
    tokio::time::sleep_until((paid_from + Duration::from_millis(2200)).into()).await;
    let again = send("POST", &url, &who, &ask(1, false)).await;
    assert_eq!(
        again.status, 200,
        "{path} {tenant}: refused after its debt was paid"
    );
    answered.body
}

#[tokio::test]
async fn a_large_answer_puts_its_tenant_in_debt_until_paid() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let completions = "/v1/chat/completions";
    let header = "/header/v1/chat/completions";
    let (json, events, headed, trailed) = tokio::join!(
        in_debt_until_paid(addr, completions, "json", false),
        in_debt_until_paid(addr, completions, "events", true),
        in_debt_until_paid(addr, header, "header", false),
        in_debt_until_paid(addr, header, "trailer", true),
    );
    // The answers pass untouched.
    assert_eq!(json, usage_json(31));
    assert_eq!(headed, usage_json(31));
    for streamed in [events, trailed] {
        assert!(streamed.starts_with(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Rate\"}}],\"usage\":null}\n\n"
        ));
        assert!(streamed.ends_with(&format!("data: {}\n\ndata: [DONE]\n\n", usage_json(31))));
    }
}

#[tokio::test]
async fn the_admission_charge_is_deducted_and_bad_or_missing_usage_is_counted() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let url = format!("http://{addr}/metered");
    // 50 charged on admission, 80 used: 30 reported.
    let first = send(
        "POST",
        &url,
        &[("x-tenant", "t"), ("x-max-tokens", "50")],
        &ask(80, false),
    )
    .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit"), "\"tokens-per-hour\";r=50;t=1800");
    // Cost 0: refused only while in debt; the standing after both.
    let second = send(
        "POST",
        &url,
        &[("x-tenant", "t"), ("x-max-tokens", "0")],
        &ask(0, false),
    )
    .await;
    assert_eq!(second.status, 200);
    assert_eq!(
        second.header("ratelimit"),
        "\"tokens-per-hour\";r=20;t=2880"
    );
    // Less used than charged: no refund.
    let third = send(
        "POST",
        &url,
        &[("x-tenant", "t"), ("x-max-tokens", "20")],
        &ask(5, false),
    )
    .await;
    assert_eq!(third.header("ratelimit"), "\"tokens-per-hour\";r=0;t=3600");
    let bad = send(
        "POST",
        &url,
        &[("x-tenant", "u"), ("x-max-tokens", "lots")],
        &ask(1, false),
    )
    .await;
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert!(bad.body.contains("x-max-tokens"), "{}", bad.body);

    // No usage in the answer: the client gets it as sent, the miss is counted.
    let missing = r#"{"stream":false}"#;
    let answered = send(
        "POST",
        &format!("http://{addr}/v1/chat/completions"),
        &[("x-tenant", "m")],
        missing,
    )
    .await;
    assert_eq!(
        (answered.status, answered.body.as_str()),
        (200, r#"{"id":"chatcmpl-1","choices":[]}"#)
    );
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(
        metrics.contains("weir_usage_missing_total{route=\"POST /v1/chat/completions\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_reported_cost_total{policy=\"tokens-per-hour\"} 30"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_client_that_leaves_mid_answer_is_charged_all_the_same() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let body = r#"{"usage":31,"stream":true,"pause_ms":150}"#;
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: weir\r\nX-Tenant: gone\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 4096];
    let mut read = 0;
    while !String::from_utf8_lossy(&head[..read]).contains("data: ") {
        read += client.read(&mut head[read..]).await.unwrap();
    }
    drop(client);
    // The rest of the answer is read without the client, then charged.
    charged_after_leaving(&llm, addr, "gone").await;
}

/// Once the upstream has finished the answer of `tenant`, who left, its
/// usage is charged: `tenant` is refused within a few seconds.
async fn charged_after_leaving(llm: &Llm, addr: SocketAddr, tenant: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while llm.finished() == 0 {
        assert!(Instant::now() < deadline, "the answer never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("http://{addr}/v1/chat/completions");
    while send("POST", &url, &[("x-tenant", tenant)], &ask(1, false))
        .await
        .status
        != 429
    {
        assert!(
            Instant::now() < deadline,
            "{tenant}, who left, was never charged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `Accept-Encoding: gzip` from the client: the upstream is asked for an
/// answer weir can read, so the usage is still charged (and the client
/// gets the JSON uncompressed).
#[tokio::test]
async fn a_client_that_accepts_gzip_is_charged_all_the_same() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let who = [
        ("x-tenant", "zipped"),
        ("accept-encoding", "gzip, br, zstd"),
    ];
    let answered = send("POST", &url, &who, &ask(31, false)).await;
    assert_eq!(answered.status, 200);
    assert_eq!(answered.body, usage_json(31));
    let refused = send("POST", &url, &who, &ask(1, false)).await;
    assert_eq!(
        refused.status, 429,
        "31 tokens used of 10: {}",
        refused.body
    );
}

/// A client that hangs up before the answer's head: the upstream's work is
/// charged when its answer completes.
#[tokio::test]
async fn a_client_that_leaves_before_the_head_is_charged_all_the_same() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let body = r#"{"usage":31,"stream":false,"head_ms":400}"#;
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: weir\r\nX-Tenant: early\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(client);
    charged_after_leaving(&llm, addr, "early").await;
}

/// `min_cost`: an absent or lower declared cost is charged the floor.
#[tokio::test]
async fn min_cost_is_the_least_a_declared_cost_is_charged() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let url = format!("http://{addr}/floored");
    let cases = [
        (None, "\"tokens-per-hour\";r=60;t=1440"),
        (Some("0"), "\"tokens-per-hour\";r=20;t=2880"),
    ];
    for (declared, standing) in cases {
        let mut who = vec![("x-tenant", "floor")];
        who.extend(declared.map(|d| ("x-max-tokens", d)));
        let answered = send("POST", &url, &who, &ask(0, false)).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        assert_eq!(answered.header("ratelimit"), standing, "{declared:?}");
    }
    let above = [("x-tenant", "floor2"), ("x-max-tokens", "50")];
    let answered = send("POST", &url, &above, &ask(0, false)).await;
    assert_eq!(
        answered.header("ratelimit"),
        "\"tokens-per-hour\";r=50;t=1800"
    );
}
