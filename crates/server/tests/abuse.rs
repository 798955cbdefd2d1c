//! Abuse, over real sockets: probes that charge nothing, penalties that ban
//! and grow, only failed logins counted, address lists, IPv6 clients that
//! rotate inside their /64, and bans shared by two weir on one Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::any;

use crate::{send, start};

const TOKEN: &str = "Bearer a-long-enough-admin-token";

/// A login service: `200` for the right password (`x-password: right`),
/// `401` for any other; counts the requests it saw.
async fn login_service() -> (SocketAddr, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    let app = Router::new().fallback(any(move |request: Request| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            match request.headers().get("x-password").map(|v| v.as_bytes()) {
                Some(b"right") => (StatusCode::OK, "welcome"),
                _ => (StatusCode::UNAUTHORIZED, "wrong password"),
            }
        }
    }));
    (weir_testkit::serve(app).await, seen)
}

fn login_config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        r#"
[server]
admin_token = "a-long-enough-admin-token"
trusted_proxies = ["127.0.0.1/32"]
{extra}

[policies.login]
algorithm = "fixed-window"
limit = 5
window = "10m"
penalty = {{ ban = "15m", factor = 4, max = "1d", memory = "1d" }}

[[routes]]
match = "POST /login"
identity = "peer"
policies = ["login"]
upstream = "http://{upstream}"
charge_on = [401, 403]
"#
    )
}

/// Probes answer as checks and charge nothing; a refusal bans, the answer
/// says so (`banned`, `banned_until`), the ban outlasts the bucket's own
/// wait, it is counted and marked on the dashboard, and an admin lifts it.
#[tokio::test]
async fn probes_charge_nothing_and_a_ban_is_answered_counted_and_lifted() {
    let (addr, _) = start(
        r#"
[server]
admin_token = "a-long-enough-admin-token"

[policies.pin]
algorithm = "token-bucket"
capacity = 2
rate = "1/s"
penalty = { ban = "1h" }
"#,
    )
    .await;
    let check = format!("http://{addr}/v1/check");
    let probe = r#"{"policy":"pin","key":"card-7","probe":true}"#;
    for _ in 0..5 {
        let answer = send("POST", &check, &[], probe).await.json();
        assert_eq!(answer["allowed"], true, "{answer}");
        assert_eq!(answer["remaining"], 1, "as if charged: {answer}");
    }
    let one = r#"{"policy":"pin","key":"card-7"}"#;
    // Until the bucket refuses (its refill between requests aside): the
    // decision API answers 200 with its decision.
    let mut body = send("POST", &check, &[], one).await.json();
    for _ in 0..10 {
        if body["allowed"] == false {
            break;
        }
        body = send("POST", &check, &[], one).await.json();
    }
    assert_eq!(body["allowed"], false, "{body}");
    assert_eq!(body["banned"], true, "{body}");
    assert!(
        body["banned_until"].as_str().unwrap().ends_with('Z'),
        "{body}"
    );
    assert!(
        body["retry_after_ms"].as_u64().unwrap() > 3_590_000,
        "{body}"
    );
    // Two seconds later the bucket has tokens again, but the key is banned.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let banned = send("POST", &check, &[], probe).await.json();
    assert_eq!(
        (banned["allowed"].clone(), banned["banned"].clone()),
        (false.into(), true.into())
    );
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(
        metrics.contains("weir_bans_total{policy=\"pin\"} 1"),
        "{metrics}"
    );
    let auth = [("authorization", TOKEN)];
    let top = send(
        "GET",
        &format!("http://{addr}/v1/top?policy=pin"),
        &auth,
        "",
    )
    .await
    .json();
    assert!(top["top"][0]["banned_until_ms"].as_u64().is_some(), "{top}");
    // Lifted by an admin: the bucket's own standing decides again.
    let bans = format!("http://{addr}/v1/bans/pin/card-7");
    assert_eq!(send("DELETE", &bans, &[], "").await.status, 401);
    let lifted = send("DELETE", &bans, &auth, "").await.json();
    assert_eq!(lifted["lifted"], true, "{lifted}");
    let after = send("POST", &check, &[], one).await.json();
    assert_eq!(after["allowed"], true, "{after}");
    assert!(after.get("banned").is_none(), "{after}");
    let again = send("DELETE", &bans, &auth, "").await.json();
    assert_eq!(again["lifted"], false);
}

/// The login case: only failed logins are counted (five in ten minutes),
/// then the address is banned for fifteen minutes — right password or not,
/// through the gateway and through forward-auth — while other clients and
/// successful logins are never charged.
#[tokio::test]
async fn only_failed_logins_count_and_a_ban_shuts_the_address_out() {
    let (upstream, seen) = login_service().await;
    let (addr, _) = start(&login_config(upstream, "")).await;
    let login = format!("http://{addr}/login");
    let from = |ip: &'static str, password: &'static str| {
        [("x-forwarded-for", ip), ("x-password", password)]
    };
    for _ in 0..20 {
        let ok = send("POST", &login, &from("203.0.113.7", "right"), "").await;
        assert_eq!(ok.status, 200, "successes are never charged");
    }
    for i in 0..5 {
        let failed = send("POST", &login, &from("203.0.113.7", "guess"), "").await;
        assert_eq!(failed.status, 401, "failure {i} reaches the service");
    }
    let banned = send("POST", &login, &from("203.0.113.7", "right"), "").await;
    assert_eq!(banned.status, 429, "{}", banned.body);
    assert_eq!(banned.header("retry-after"), "900");
    assert_eq!(banned.json()["banned"], true, "{}", banned.body);
    assert!(
        banned.json()["banned_until"].as_str().is_some(),
        "{}",
        banned.body
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        25,
        "the banned attempt never reached it"
    );
    // Banned through forward-auth too: the same route, the same key.
    let auth = send(
        "GET",
        &format!("http://{addr}/v1/auth"),
        &[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-original-uri", "/login"),
            ("x-original-method", "POST"),
        ],
        "",
    )
    .await;
    assert_eq!(auth.status, 429);
    // Another address is not charged for any of it.
    let other = send("POST", &login, &from("203.0.113.8", "right"), "").await;
    assert_eq!(other.status, 200);
    assert!(other.header("ratelimit").starts_with("\"login\";r=4;t="));
}

/// A client rotating its IPv6 address inside its /64 is one client (its
/// key names the network); another /64 is another client.
#[tokio::test]
async fn an_ipv6_client_rotating_inside_its_64_is_one_client() {
    let (upstream, _) = login_service().await;
    let (addr, _) = start(&login_config(upstream, "")).await;
    let login = format!("http://{addr}/login");
    let addresses: Vec<String> = (1..=6)
        .map(|i| format!("2001:db8:1:2:{i:x}::{i}"))
        .collect();
    let mut statuses = Vec::new();
    for ip in &addresses {
        let headers = [("x-forwarded-for", ip.as_str()), ("x-password", "guess")];
        statuses.push(send("POST", &login, &headers, "").await.status);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429]);
    let next = [
        ("x-forwarded-for", "2001:db8:1:3::1"),
        ("x-password", "guess"),
    ];
    assert_eq!(send("POST", &login, &next, "").await.status, 401);
    // The admin API addresses the network as the key.
    let inspect = send(
        "GET",
        &format!("http://{addr}/v1/keys/login/2001:db8:1:2::%2F64?source=peer"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(inspect["stored_key"], "peer:2001:db8:1:2::/64", "{inspect}");
    assert_eq!(inspect["exists"], true, "{inspect}");
}

/// `deny` answers `403` before anything is charged; `allow` and a route's
/// `exempt` are never limited; thousands of networks are answered alike.
#[tokio::test]
async fn address_lists_deny_and_exempt_by_network() {
    let (upstream, seen) = login_service().await;
    // 4,096 denied /24s, and the documentation networks allowed.
    let deny: Vec<String> = (0..4096)
        .map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256))
        .collect();
    let extra = format!(
        "deny = [{}, \"2001:db8:dead::/48\"]\nallow = [\"198.51.100.0/24\"]",
        deny.join(", ")
    );
    let (addr, _) = start(&login_config(upstream, &extra)).await;
    let login = format!("http://{addr}/login");
    for denied in ["10.0.0.1", "10.15.255.254", "2001:db8:dead:1::1"] {
        let headers = [("x-forwarded-for", denied), ("x-password", "right")];
        let answer = send("POST", &login, &headers, "").await;
        assert_eq!(answer.status, 403, "{denied}: {}", answer.body);
        assert!(answer.body.contains("DENIED"), "{}", answer.body);
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "a denied request is never forwarded"
    );
    // Just past the list: limited as anyone.
    let near = [("x-forwarded-for", "10.16.0.1"), ("x-password", "guess")];
    assert_eq!(send("POST", &login, &near, "").await.status, 401);
    // An allowed client is never limited, and carries no fields.
    for _ in 0..10 {
        let headers = [("x-forwarded-for", "198.51.100.9"), ("x-password", "guess")];
        let answer = send("POST", &login, &headers, "").await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.header("ratelimit"), "");
    }
    let metrics = send("GET", &format!("http://{addr}/metrics"), &[], "")
        .await
        .body;
    assert!(
        metrics.contains("weir_address_lists_total{list=\"deny\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_address_lists_total{list=\"exempt\"} 10"),
        "{metrics}"
    );
}

/// A bad list entry is a config error naming it and what is valid.
#[tokio::test]
async fn a_bad_network_is_a_config_error() {
    let error = weir_server::config::parse(
        "[server]\ndeny = [\"10.0.0.0/33\"]\n\n[policies.p]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\nexempt = [\"nope\"]\npenalty = { ban = \"1m\", max = \"1s\" }\n",
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("[server] deny") && error.contains("10.0.0.0/33"),
        "{error}"
    );
    assert!(
        error.contains("[policies.p] exempt") && error.contains("`nope`"),
        "{error}"
    );
    assert!(error.contains("[policies.p] penalty.max"), "{error}");
}

/// Two weir on one Redis: a ban begun through one is answered by the other.
#[tokio::test]
async fn two_weir_on_one_redis_see_the_same_bans() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let config = format!(
        "[store]\nurl = \"{}\"\n\n[policies.card]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\npenalty = {{ ban = \"10m\" }}\n",
        redis.url()
    );
    let (a, _) = start(&config).await;
    let (b, _) = start(&config).await;
    let one = r#"{"policy":"card","key":"card-9"}"#;
    let at = |addr: SocketAddr| format!("http://{addr}/v1/check");
    assert_eq!(send("POST", &at(a), &[], one).await.status, 200);
    let refused = send("POST", &at(b), &[], one).await.json();
    assert_eq!(refused["banned"], true, "{refused}");
    let from_a = send("POST", &at(a), &[], one).await.json();
    assert_eq!(from_a["banned"], true, "{from_a}");
    assert!(
        from_a["retry_after_ms"].as_u64().unwrap() > 590_000,
        "{from_a}"
    );
    // A flood of the banned key: answered from the refusal cache, which
    // holds the ban until it ends, with no script call per request.
    let calls = || {
        let stats = redis.cli(&["INFO", "commandstats"]);
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>()
    };
    let before = calls();
    for _ in 0..50 {
        let banned = send("POST", &at(a), &[], one).await.json();
        assert_eq!(banned["banned"], true, "{banned}");
    }
    assert!(
        calls() - before <= 1,
        "{} script calls for 50 banned requests",
        calls() - before
    );
}

/// Credential stuffing through the gateway: many accounts tried from one
/// /64 are stopped by the address's ban, one account tried from many
/// addresses by the account's; a bystander is never charged.
#[tokio::test]
async fn credential_stuffing_is_stopped_per_address_and_per_account() {
    let (upstream, seen) = login_service().await;
    let config = format!(
        r#"
[server]
trusted_proxies = ["127.0.0.1/32"]

[policies.login-ip]
algorithm = "fixed-window"
limit = 5
window = "10m"
penalty = {{ ban = "15m", factor = 4, max = "1d", memory = "1d" }}

[policies.login-account]
algorithm = "fixed-window"
limit = 5
window = "10m"
penalty = {{ ban = "15m", factor = 4, max = "1d", memory = "1d" }}

[[routes]]
match = "POST /login"
identity = "peer"
policies = ["login-ip", {{ policy = "login-account", identity = "header:x-account" }}]
upstream = "http://{upstream}"
charge_on = [401]
"#
    );
    let (addr, _) = start(&config).await;
    let login = format!("http://{addr}/login");
    let attempt = |ip: String, account: String| {
        let login = login.clone();
        async move {
            let headers = [
                ("x-forwarded-for", ip.as_str()),
                ("x-account", account.as_str()),
                ("x-password", "guess"),
            ];
            send("POST", &login, &headers, "").await.status
        }
    };
    // Many accounts from one /64, rotating addresses: five reach the
    // service, then the network is banned.
    let mut statuses = Vec::new();
    for i in 0..50 {
        statuses.push(attempt(format!("2001:db8:7:7::{i:x}"), format!("user{i}")).await);
    }
    assert_eq!(statuses[..5], [401; 5]);
    assert!(statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    // One account from many addresses: five reach it, then it is banned.
    let mut statuses = Vec::new();
    for i in 0..50 {
        statuses.push(attempt(format!("198.51.100.{i}"), "victim".to_owned()).await);
    }
    assert_eq!(statuses[..5], [401; 5]);
    assert!(statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        10,
        "the service saw ten guesses, not a hundred"
    );
    // A bystander, from elsewhere, to their own account.
    let headers = [
        ("x-forwarded-for", "203.0.113.50"),
        ("x-account", "bob"),
        ("x-password", "right"),
    ];
    let bob = send("POST", &login, &headers, "").await;
    assert_eq!(bob.status, 200, "{}", bob.body);
    // A request without the account header names no account: refused.
    let anonymous = send("POST", &login, &[("x-forwarded-for", "203.0.113.51")], "").await;
    assert_eq!(anonymous.status, 400, "{}", anonymous.body);
}

/// "Why was I limited?": the routes, the override, the parameters and
/// penalty in force, the key's debt and ban — and nothing charged.
#[tokio::test]
async fn explain_says_why_a_key_is_limited_and_charges_nothing() {
    let (addr, _) = start(
        r#"
[server]
admin_token = "a-long-enough-admin-token"

[policies.tokens]
algorithm = "token-bucket"
capacity = 100
rate = "100/h"
penalty = { ban = "10m" }

[[overrides]]
policy = "tokens"
keys = ["big-customer"]
capacity = 1000
rate = "1000/h"

[[routes]]
match = "POST /v1/chat"
identity = "header:x-tenant"
policies = ["tokens"]
"#,
    )
    .await;
    let auth = [("authorization", TOKEN)];
    let explain = |key: &str| {
        let url = format!("http://{addr}/v1/explain?policy=tokens&key={key}");
        async move { send("GET", &url, &auth, "").await.json() }
    };
    let fresh = explain("acme").await;
    assert_eq!(fresh["exists"], false, "{fresh}");
    assert_eq!(fresh["parameters"], "token-bucket capacity=100 rate=100/h");
    assert_eq!(fresh["penalty"], "ban=10m factor=1 max=10m memory=10m");
    assert_eq!(fresh["routes"][0], "POST /v1/chat");
    assert_eq!(fresh["next_check"]["remaining"], 99);
    let big = explain("big-customer").await;
    assert_eq!(big["override"], "tokens@override-1", "{big}");
    assert_eq!(big["parameters"], "token-bucket capacity=1000 rate=1000/h");
    // Usage past the limit: in debt, not banned (a report never bans).
    let report = r#"{"policy":"tokens","key":"acme","cost":150}"#;
    send("POST", &format!("http://{addr}/v1/report"), &[], report).await;
    let debt = explain("acme").await;
    assert_eq!(
        (debt["in_debt"].clone(), debt["banned"].clone()),
        (true.into(), false.into()),
        "{debt}"
    );
    assert_eq!(
        explain("acme").await["in_debt"],
        true,
        "explaining charged nothing"
    );
    // The next check is refused, and bans.
    let check = r#"{"policy":"tokens","key":"acme"}"#;
    send("POST", &format!("http://{addr}/v1/check"), &[], check).await;
    let banned = explain("acme").await;
    assert_eq!(banned["banned"], true, "{banned}");
    assert!(banned["banned_until"].as_str().is_some());
    // Without the token: no explanation.
    let url = format!("http://{addr}/v1/explain?policy=tokens&key=acme");
    assert_eq!(send("GET", &url, &[], "").await.status, 401);
}

/// A shadow policy with a penalty bans as if enforced — and never refuses —
/// alike in process and on Redis, alone and beside another policy.
#[tokio::test]
async fn a_shadow_penalty_bans_as_if_enforced_in_every_store() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let policies = "[policies.probation]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\nshadow = true\npenalty = { ban = \"10m\" }\n\n[policies.overall]\nalgorithm = \"token-bucket\"\ncapacity = 100\nrate = \"1/s\"\n";
    let memory = start(policies).await.0;
    let shared = start(&format!("[store]\nurl = \"{}\"\n\n{policies}", redis.url()))
        .await
        .0;
    let mut answers = Vec::new();
    for addr in [memory, shared] {
        let check = format!("http://{addr}/v1/check");
        let mut seen = Vec::new();
        for body in [
            r#"{"policy":"probation","key":"t1"}"#,
            r#"{"policy":"probation","key":"t1"}"#,
            r#"{"policy":"probation","key":"t1"}"#,
            r#"{"checks":[{"policy":"probation","key":"t2"},{"policy":"overall","key":"t2"}]}"#,
            r#"{"checks":[{"policy":"probation","key":"t2"},{"policy":"overall","key":"t2"}]}"#,
            r#"{"checks":[{"policy":"probation","key":"t2"},{"policy":"overall","key":"t2"}]}"#,
        ] {
            let answer = send("POST", &check, &[], body).await.json();
            let one = answer.get("decisions").map_or(&answer, |d| &d[0]);
            seen.push((
                answer["allowed"].clone(),
                one["banned"].clone(),
                one["shadow_limited"].clone(),
            ));
        }
        answers.push(seen);
    }
    assert_eq!(answers[0], answers[1]);
    assert!(
        answers[0].iter().all(|(allowed, _, _)| *allowed == true),
        "{:?}",
        answers[0]
    );
    assert_eq!(
        answers[0][1].1, true,
        "the refusal banned: {:?}",
        answers[0]
    );
    assert_eq!(
        answers[0][4].1, true,
        "beside another policy too: {:?}",
        answers[0]
    );
}
