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

[policies.tokens-unsaid]
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
match = "POST /missing"
identity = "header:x-tenant"
policies = ["tokens-unsaid"]
upstream = "http://{llm}"
usage = "json:/usage/total_tokens"
usage_missing = 60

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

/// Sends `body` to `path` as `tenant` over a raw connection and reads the
/// answer until it holds `until`; the connection stays open, unread after.
async fn read_until(
    addr: SocketAddr,
    path: &str,
    tenant: &str,
    body: &str,
    until: &str,
) -> tokio::net::TcpStream {
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: weir\r\nX-Tenant: {tenant}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(until) {
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("the part of the answer asked for arrives")
            .unwrap();
        assert!(
            n > 0,
            "closed before `{until}`: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    client
}

/// The usage is charged when weir reads it, not when the answer ends: an
/// upstream that sends the usage event and then holds the stream open for
/// seconds (or a client that stops reading there) defers nothing. Server-
/// sent events and JSON lines (Ollama's `application/x-ndjson`) alike.
#[tokio::test]
async fn usage_is_charged_as_soon_as_it_is_read() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let url = format!("http://{addr}/v1/chat/completions");
    for (tenant, ndjson) in [("events", false), ("lines", true)] {
        let body = format!(r#"{{"usage":31,"stream":true,"ndjson":{ndjson},"hold_ms":4000}}"#);
        let open = read_until(addr, "/v1/chat/completions", tenant, &body, "total_tokens").await;
        // 1 charged on admission and 30 on reading, of 10: in debt while the
        // answer is still open.
        let next = send("POST", &url, &[("x-tenant", tenant)], &ask(1, false)).await;
        assert_eq!(
            next.status, 429,
            "{tenant}: charged before the answer ended"
        );
        assert_eq!(llm.finished(), 0, "{tenant}: the answer is still open");
        drop(open);
    }
}

/// An answer that says no usage is charged the route's `usage_missing`
/// (an OpenAI stream whose client did not ask for usage).
#[tokio::test]
async fn an_answer_without_usage_is_charged_usage_missing() {
    let llm = Llm::start().await;
    let (addr, _) = start(&config(llm.addr)).await;
    let url = format!("http://{addr}/missing");
    let who = [("x-tenant", "silent")];
    // 100 an hour: 1 on admission, then the 59 that the 60 of a stream that
    // said none exceeds it by.
    let streamed = send("POST", &url, &who, r#"{"stream":true}"#).await;
    assert_eq!(streamed.status, 200);
    let answered = send("POST", &url, &who, r#"{"usage":1}"#).await;
    assert_eq!(answered.status, 200);
    let left: u64 = answered
        .header("ratelimit")
        .split("r=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(left, 100 - 60 - 1, "{}", answered.header("ratelimit"));
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
