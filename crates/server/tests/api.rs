//! The decision API, health, metrics and admin.

use crate::{send, start};

const CONFIG: &str = r#"
[server]
admin_token = "a-long-enough-admin-token"

[policies.api]
algorithm = "token-bucket"
capacity = 2
rate = "1/h"

[policies.window]
algorithm = "fixed-window"
limit = 5
window = "1h"

[policies.shaper]
algorithm = "leaky-bucket"
rate = "2/s"
queue = 3
"#;

#[tokio::test]
async fn decides_and_answers_with_ratelimit_fields() {
    let (addr, _) = start(CONFIG).await;
    let url = format!("http://{addr}/v1/check");
    let first = send("POST", &url, &[], r#"{"policy":"api","key":"842"}"#).await;
    assert_eq!(first.status, 200);
    let json = first.json();
    assert_eq!(json["allowed"], true);
    assert_eq!(json["policy"], "api");
    assert_eq!(json["limit"], 2);
    assert_eq!(json["remaining"], 1);
    assert_eq!(json["retry_after_ms"], 0);
    assert_eq!(json["reset_ms"], 3_600_000);
    assert_eq!(first.header("ratelimit-policy"), "\"api\";q=2;w=7200");
    assert_eq!(first.header("ratelimit"), "\"api\";r=1;t=3600");
    send("POST", &url, &[], r#"{"policy":"api","key":"842"}"#).await;
    let third = send(
        "POST",
        &url,
        &[],
        r#"{"policy":"api","key":"842","cost":1}"#,
    )
    .await;
    assert_eq!(third.status, 200, "a rejection is a decision");
    assert_eq!(third.json()["allowed"], false);
    let retry = third.json()["retry_after_ms"].as_u64().unwrap();
    assert!(
        (3_590_000..=3_600_000).contains(&retry),
        "an hour, less the time since: {retry}"
    );

    // Several policies: all or nothing.
    let both = r#"{"checks":[{"policy":"window","key":"k"},{"policy":"api","key":"k"}],"cost":2}"#;
    let all = send("POST", &url, &[], both).await.json();
    assert_eq!(all["allowed"], true);
    let again = send("POST", &url, &[], both).await.json();
    assert_eq!(again["allowed"], false, "api has no tokens left for k");
    assert_eq!(
        again["decisions"][0]["remaining"], 3,
        "the window, uncharged, as it stands"
    );
    let window = send(
        "POST",
        &url,
        &[],
        r#"{"policy":"window","key":"k","cost":3}"#,
    )
    .await
    .json();
    assert_eq!(
        window["allowed"], true,
        "the rejected request charged nothing: 5 - 2 = 3 left"
    );

    // The shaper reports its delay.
    let shaped: Vec<_> = [0, 1].iter().map(|_| url.clone()).collect();
    let mut delays = Vec::new();
    let first = std::time::Instant::now();
    for url in shaped {
        delays.push(
            send("POST", &url, &[], r#"{"policy":"shaper","key":"c"}"#)
                .await
                .json()["delay_ms"]
                .clone(),
        );
    }
    // The second waits for the next slot, 500 ms after the first.
    let between = u64::try_from(first.elapsed().as_millis()).unwrap();
    assert_eq!(delays[0], 0);
    let second = delays[1].as_u64().unwrap();
    assert!(
        second <= 500 && second + between >= 499,
        "{delays:?} {between} ms apart"
    );
}

#[tokio::test]
async fn bad_input_gets_its_own_4xx_and_charges_nothing() {
    let (addr, _) = start(CONFIG).await;
    let url = format!("http://{addr}/v1/check");
    for (body, status, code) in [
        (r#"{"policy":"api""#, 400, "MALFORMED_JSON"),
        ("not json", 400, "MALFORMED_JSON"),
        (r#"{"policy":"api"}"#, 422, "MISSING_FIELD"),
        (
            r#"{"policy":"api","key":"x","colour":"red"}"#,
            422,
            "INVALID_REQUEST",
        ),
        (r#"{"policy":"api","key":7}"#, 422, "INVALID_REQUEST"),
        (r#"{"policy":"nope","key":"x"}"#, 404, "UNKNOWN_POLICY"),
        (
            r#"{"policy":"api","key":"x","cost":3}"#,
            422,
            "COST_NEVER_FITS",
        ),
        (
            r#"{"policy":"api","key":"x","cost":0}"#,
            422,
            "INVALID_COST",
        ),
        (r#"{"checks":[]}"#, 422, "INVALID_REQUEST"),
        (r#"{"policy":"api","key":""}"#, 400, "MISSING_IDENTITY"),
        (r#"{"policy":"api","key":"   "}"#, 400, "MISSING_IDENTITY"),
        (
            r#"{"checks":[{"policy":"api","key":"x"},{"policy":"api","key":"\t"}]}"#,
            400,
            "MISSING_IDENTITY",
        ),
        (
            r#"{"checks":[{"policy":"api","key":"x"},{"policy":"nope","key":"x"}]}"#,
            404,
            "UNKNOWN_POLICY",
        ),
    ] {
        let reply = send("POST", &url, &[], body).await;
        assert_eq!(
            (reply.status, reply.json()["error"].as_str().unwrap()),
            (status, code),
            "{body}"
        );
        assert!(reply.json()["detail"].is_string());
    }
    // A release on a policy that holds no leases says so.
    let release = format!("http://{addr}/v1/release");
    let reply = send(
        "POST",
        &release,
        &[],
        r#"{"policy":"api","key":"x","lease":"00000000000000ab"}"#,
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["error"].as_str().unwrap()),
        (422, "NOT_A_CONCURRENCY_POLICY"),
        "{}",
        reply.body
    );
    let long = format!(r#"{{"policy":"api","key":"{}"}}"#, "k".repeat(600));
    assert_eq!(
        send("POST", &url, &[], &long).await.json()["error"],
        "KEY_TOO_LONG"
    );
    // The bound is on the key as the client sent it: 256 bytes.
    for (len, status) in [(255, 200), (256, 200), (257, 422)] {
        let body = format!(r#"{{"policy":"api","key":"{}"}}"#, "b".repeat(len));
        assert_eq!(send("POST", &url, &[], &body).await.status, status, "{len}");
    }
    let huge = format!(r#"{{"policy":"api","key":"{}"}}"#, "k".repeat(100_000));
    assert_eq!(send("POST", &url, &[], &huge).await.status, 413);
    let big_header = "h".repeat(40_000);
    let reply = send(
        "POST",
        &url,
        &[("x-big", &big_header)],
        r#"{"policy":"api","key":"x"}"#,
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["error"].as_str()),
        (431, Some("HEADERS_TOO_LARGE"))
    );
    // None of that charged x.
    assert_eq!(
        send("POST", &url, &[], r#"{"policy":"api","key":"x","cost":2}"#)
            .await
            .json()["allowed"],
        true
    );
}

#[tokio::test]
async fn policies_health_metrics_and_admin() {
    let (addr, _) = start(CONFIG).await;
    let base = format!("http://{addr}");
    let policies = send("GET", &format!("{base}/v1/policies"), &[], "")
        .await
        .json();
    assert_eq!(policies["policies"].as_array().unwrap().len(), 3);
    assert_eq!(
        send("GET", &format!("{base}/healthz"), &[], "")
            .await
            .status,
        200
    );
    assert_eq!(
        send("GET", &format!("{base}/readyz"), &[], "").await.json()["ready"],
        true
    );

    send(
        "POST",
        &format!("{base}/v1/check"),
        &[],
        r#"{"policy":"api","key":"m"}"#,
    )
    .await;
    let metrics = send("GET", &format!("{base}/metrics"), &[], "").await.body;
    for series in [
        "weir_decisions_total{policy=\"api\",outcome=\"allowed\"}",
        "weir_check_duration_seconds_bucket{store=\"memory\"",
        "weir_store_errors_total",
        "weir_build_info",
        "# HELP weir_decisions_total ",
        "# HELP weir_check_duration_seconds ",
        "weir_check_duration_seconds_bucket{store=\"memory\",le=\"0.00001\"}",
        "weir_check_duration_seconds_bucket{store=\"memory\",le=\"0.1\"}",
        "weir_http_requests_total{route=\"/v1/check\",status=\"200\"}",
        "weir_keys ",
        "weir_max_keys ",
        "process_resident_memory_bytes",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    // Every weir series is in the catalog, with its labels, and has its help.
    for line in metrics.lines().filter(|l| l.starts_with("weir_")) {
        let name = line.split(['{', ' ']).next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|b| weir_server::metrics::CATALOG.iter().any(|m| m.name == *b))
            .unwrap_or(name);
        let metric = weir_server::metrics::CATALOG
            .iter()
            .find(|m| m.name == base)
            .unwrap_or_else(|| panic!("{base} is not in the catalog"));
        for label in line
            .split_once('{')
            .map(|(_, l)| l.split_once('}').unwrap().0)
            .unwrap_or_default()
            .split(',')
            .filter(|l| !l.is_empty())
        {
            let label = label.split('=').next().unwrap();
            assert!(
                metric.labels.contains(&label) || label == "le",
                "{base}: label {label} is not in the catalog"
            );
        }
        assert!(
            metrics.contains(&format!("# HELP {base} ")),
            "{base} has no help"
        );
    }

    let key = format!("{base}/v1/keys/api/api:m");
    let auth = [("authorization", "Bearer a-long-enough-admin-token")];
    for headers in [
        &[][..],
        &[("authorization", "Bearer wrong")][..],
        &[("authorization", "a-long-enough-admin-token")][..],
    ] {
        let denied = send("GET", &key, headers, "").await;
        assert_eq!(
            (denied.status, denied.json()["error"].as_str().unwrap()),
            (401, "UNAUTHORIZED")
        );
        assert!(!denied.body.contains("remaining"), "leaks nothing");
    }
    let seen = send("GET", &key, &auth, "").await.json();
    assert_eq!(
        seen["next_check"]["remaining"], 0,
        "one token left, so a check now would leave 0"
    );
    assert_eq!(seen["exists"], true);
    let typo = send("GET", &format!("{base}/v1/keys/api/api:mm"), &auth, "").await;
    assert_eq!(typo.json()["exists"], false, "a typo is not a stored key");
    let reset = send("DELETE", &key, &auth, "").await.json();
    assert_eq!(
        (reset["reset"].as_bool(), reset["existed"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(reset["effect"].as_str().unwrap().contains("full allowance"));
    assert_eq!(
        send("GET", &key, &auth, "").await.json()["next_check"]["remaining"],
        1
    );
    // The identity as the client sent it: the decision API's unless a
    // source is named; the answer says which stored key it addressed.
    let sent = send("GET", &format!("{base}/v1/keys/api/m"), &auth, "")
        .await
        .json();
    assert_eq!(sent["stored_key"], "api:m", "{sent}");
    let header = format!("{base}/v1/keys/api/m?source=header:x-seller");
    let other = send("DELETE", &header, &auth, "").await.json();
    assert_eq!(other["stored_key"], "header:x-seller:m", "{other}");
    // Header names as a route takes them: case-insensitive.
    let upper = format!("{base}/v1/keys/api/m?source=header:X-Seller");
    let upper = send("GET", &upper, &auth, "").await.json();
    assert_eq!(upper["stored_key"], "header:x-seller:m", "{upper}");
    let bad = send(
        "GET",
        &format!("{base}/v1/keys/api/m?source=cookie"),
        &auth,
        "",
    )
    .await;
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert!(bad.body.contains("header:NAME"), "{}", bad.body);
    assert_eq!(
        send("GET", &format!("{base}/v1/keys/nope/x"), &auth, "")
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn admin_is_off_without_a_token() {
    let (addr, _) = start("[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n").await;
    let reply = send(
        "GET",
        &format!("http://{addr}/v1/keys/a/x"),
        &[("authorization", "Bearer x")],
        "",
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["error"].as_str().unwrap()),
        (404, "ADMIN_DISABLED")
    );
}

#[tokio::test]
async fn failed_admin_attempts_are_throttled_never_the_token_and_the_scheme_is_case_insensitive() {
    let config = "[server]\nadmin_token = \"a-long-enough-admin-token\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\n";
    let (addr, _) = start(config).await;
    let key = format!("http://{addr}/v1/keys/api/api:k");
    let good = [("authorization", "bearer a-long-enough-admin-token")];
    assert_eq!(
        send("GET", &key, &good, "").await.status,
        200,
        "lower-case scheme"
    );
    for _ in 0..5 {
        let wrong = send("GET", &key, &[("authorization", "Bearer guess")], "").await;
        assert_eq!(wrong.status, 401);
    }
    // Wrong tokens are refused for the rest of the minute…
    let locked = send("GET", &key, &[("authorization", "Bearer guess")], "").await;
    assert_eq!(
        (locked.status, locked.json()["error"].as_str()),
        (429, Some("ADMIN_THROTTLED"))
    );
    assert!(locked.header("retry-after").parse::<u64>().unwrap() <= 60);
    // …but whoever shares the address (a NAT, a /64) cannot lock the
    // token's holder out.
    assert_eq!(send("GET", &key, &good, "").await.status, 200);
}

#[tokio::test]
async fn usage_reported_after_the_fact_puts_a_tenant_into_debt() {
    // A policy name of its own: the metrics registry is the process's.
    let config =
        "[policies.api-tokens]\nalgorithm = \"token-bucket\"\ncapacity = 1000\nrate = \"100/s\"\n";
    let (addr, _) = start(config).await;
    let check = |body: &'static str| {
        let url = format!("http://{addr}/v1/check");
        async move { send("POST", &url, &[], body).await }
    };
    let report = |body: &'static str| {
        let url = format!("http://{addr}/v1/report");
        async move { send("POST", &url, &[], body).await }
    };
    // Admitted with a check of 1, then the answer's 2,500 tokens reported.
    assert_eq!(
        check(r#"{"policy":"api-tokens","key":"t1"}"#).await.status,
        200
    );
    let charged = report(r#"{"policy":"api-tokens","key":"t1","cost":2499}"#).await;
    assert_eq!(charged.status, 200, "{}", charged.body);
    let charged = charged.json();
    assert_eq!(
        (charged["allowed"].as_bool(), charged["remaining"].as_u64()),
        (Some(true), Some(0))
    );
    // 1,500 tokens of debt and 1 to spend, at 100/s: about 15 s.
    let wait = charged["retry_after_ms"].as_u64().unwrap();
    assert!((14_990..=15_010).contains(&wait), "{charged}");
    let refused = check(r#"{"policy":"api-tokens","key":"t1"}"#).await;
    assert_eq!(
        (refused.status, refused.json()["allowed"].as_bool()),
        (200, Some(false))
    );
    // More than 1,000 times the capacity is an invalid report.
    let too_much = report(r#"{"policy":"api-tokens","key":"t1","cost":1000001}"#).await;
    assert_eq!(too_much.status, 422, "{}", too_much.body);
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(
        metrics.contains("weir_reported_cost_total{policy=\"api-tokens\"} 2499"),
        "{metrics}"
    );
}
