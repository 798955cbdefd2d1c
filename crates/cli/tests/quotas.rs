//! The quotas example (`docs/quotas/weir.toml`) as the README runs it: two
//! `weir serve` processes on one real Redis, limits and plans set with
//! `weir limits` through one and deciding through the other, each change
//! in the audit log, and `weir explain` naming the plan.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::serve::{Server, temp, weir};

const CONFIG: &str = include_str!("../../../docs/quotas/weir.toml");
const BILLING: &str = "the-billing-service-own-secret";

/// `weir ARGS` against `server` with `token`.
fn cli(server: &Server, token: &str, args: &[&str]) -> Output {
    weir()
        .args(args)
        .args(["--url", &format!("http://{}", server.addr)])
        .env("WEIR_ADMIN_TOKEN", token)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The limit `server` answers for `key` under `policy` (a probe: nothing
/// charged).
fn limit(server: &Server, policy: &str, key: &str) -> serde_json::Value {
    let body = format!(r#"{{"policy":"{policy}","key":"{key}","probe":true}}"#);
    let (_, answer) = server.request("POST", "/v1/check", &body);
    serde_json::from_str::<serde_json::Value>(&answer).unwrap()["limit"].clone()
}

#[test]
fn limits_and_plans_set_through_one_weir_decide_through_both() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let config = CONFIG.replace("redis://127.0.0.1:6379", &redis.url());
    let path = temp("quotas.toml", &config);
    let a = Server::start(&["--config", path.to_str().unwrap()]);
    let b = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(limit(&b, "monthly", "acme"), 10000);
    let set = cli(
        &a,
        BILLING,
        &[
            "limits",
            "set",
            "monthly",
            "acme",
            "limit=20000",
            "--for",
            "7d",
            "--reason",
            "launch week",
        ],
    );
    assert_eq!(stdout(&set)["after"]["set_by"], "billing");
    let audit = a.wait_for_log("audit: limit changed");
    for field in [
        "by=\"billing\"",
        "key=\"acme\"",
        "before=none",
        "\"limit\":20000",
        "reason=\"launch week\"",
    ] {
        assert!(audit.contains(field), "{field} in {audit}");
    }
    // Through the other weir within its poll (250 ms) and a round trip.
    let started = Instant::now();
    while limit(&b, "monthly", "acme") != 20000 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b never saw it"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let plan = cli(&b, BILLING, &["limits", "plan", "bob", "pro"]);
    assert_eq!(stdout(&plan)["after"]["plan"], "pro");
    let started = Instant::now();
    while limit(&a, "burst", "bob") != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a never saw the plan"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(limit(&a, "monthly", "bob"), 1_000_000);
    let explained = stdout(&cli(&a, BILLING, &["explain", "burst", "bob"]));
    assert_eq!(explained["plan"]["plan"], "pro", "{explained}");
    let listed = stdout(&cli(&a, BILLING, &["limits", "list"]));
    assert_eq!(listed["limits"].as_array().unwrap().len(), 2, "{listed}");
    let got = stdout(&cli(&b, BILLING, &["limits", "get", "monthly", "acme"]));
    assert_eq!(got["reason"], "launch week");
    let removed = cli(
        &a,
        "change-me-to-a-long-secret",
        &["limits", "delete", "monthly", "acme"],
    );
    assert_eq!(stdout(&removed)["before"]["limit"], 20000);
    assert!(
        a.wait_for_log("audit: limit changed")
            .contains("by=\"admin\"")
    );
    // Errors say what is wrong, and change nothing.
    let wrong = cli(
        &a,
        BILLING,
        &["limits", "set", "monthly", "acme", "capacity=5"],
    );
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("`capacity`"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    let missing = cli(&a, "", &["limits", "list"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("WEIR_ADMIN_TOKEN"));
}
