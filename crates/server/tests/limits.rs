//! Limits managed by API, over real sockets: per-key settings and plans
//! set, read, listed and removed behind the admin token; what decides a
//! key (setting, plan, file override, policy); a boost that ends at its
//! second; and two weir on one Redis that see each other's changes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::{send, start};

const TOKEN: &str = "Bearer a-long-enough-admin-token";
const ALICE: &str = "Bearer alice-has-her-own-token";

fn config(store: &str) -> String {
    format!(
        r#"
[server]
admin_token = "a-long-enough-admin-token"

[server.admin_tokens]
alice = "alice-has-her-own-token"

{store}

[policies.monthly]
algorithm = "fixed-window"
limit = 2
window = "1h"

[policies.burst]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"

[[overrides]]
policy = "monthly"
keys = ["filed"]
limit = 5

[plans.pro]
policies = {{ monthly = {{ limit = 10 }}, burst = {{ multiplier = 2 }} }}

[plans.internal]
policies = {{ monthly = {{ unlimited = true }} }}
"#
    )
}

/// How many checks of cost 1 `key` is admitted under `policy` (at most 50).
async fn admitted(addr: SocketAddr, policy: &str, key: &str) -> usize {
    let body = format!(r#"{{"policy":"{policy}","key":"{key}"}}"#);
    let url = format!("http://{addr}/v1/check");
    for n in 0..50 {
        if send("POST", &url, &[], &body).await.json()["allowed"] != true {
            return n;
        }
    }
    50
}

async fn put(addr: SocketAddr, path: &str, token: &str, body: &str) -> weir_testkit::Reply {
    send(
        "PUT",
        &format!("http://{addr}{path}"),
        &[("authorization", token)],
        body,
    )
    .await
}

/// A per-key limit decides its key, read back with who set it and why;
/// the API's setting wins over the file's override; the admin token is
/// needed; bad input is refused naming the field; removing it gives the
/// key back to the policy.
#[tokio::test]
async fn a_per_key_limit_is_set_read_listed_and_removed() {
    let (addr, _) = start(&config("")).await;
    let set = put(
        addr,
        "/v1/limits/monthly/acme",
        ALICE,
        r#"{"limit": 4, "reason": "trial"}"#,
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let set = set.json();
    assert_eq!(set["before"], serde_json::Value::Null);
    assert_eq!(set["after"]["limit"], 4);
    assert_eq!(set["after"]["set_by"], "alice");
    assert_eq!(admitted(addr, "monthly", "acme").await, 4);
    assert_eq!(admitted(addr, "monthly", "other").await, 2);
    // The file's override, then the API's over it.
    assert_eq!(admitted(addr, "monthly", "filed").await, 5);
    put(addr, "/v1/limits/monthly/filed", TOKEN, r#"{"limit": 7}"#).await;
    assert_eq!(
        admitted(addr, "monthly", "filed").await,
        7,
        "in a count of its own"
    );
    let got = send(
        "GET",
        &format!("http://{addr}/v1/limits/monthly/acme"),
        &[("authorization", TOKEN)],
        "",
    )
    .await;
    assert_eq!(got.json()["reason"], "trial");
    let page = send(
        "GET",
        &format!("http://{addr}/v1/limits?policy=monthly&limit=1"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(page["limits"][0]["key"], "acme", "{page}");
    assert_eq!(page["next"], "acme", "{page}");
    let rest = send(
        "GET",
        &format!("http://{addr}/v1/limits?policy=monthly&after=acme"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(rest["limits"][0]["key"], "filed", "{rest}");
    assert_eq!(rest["next"], serde_json::Value::Null);
    // Refused: no token, a wrong field, a parameter the policy lacks, a
    // past expiry, an unknown policy.
    assert_eq!(
        put(addr, "/v1/limits/monthly/acme", "", r#"{"limit": 4}"#)
            .await
            .status,
        401
    );
    for (body, field) in [
        (r#"{"limit": "many"}"#, "`limit`"),
        (r#"{"capacity": 9}"#, "`capacity`"),
        (r#"{"multiplier": 0}"#, "`multiplier`"),
        (
            r#"{"limit": 3, "expires_at": "2001-01-01T00:00:00Z"}"#,
            "`expires_at`",
        ),
        (r#"{"limit": 3, "unlimited": true}"#, "`unlimited`"),
        ("[1]", "JSON object"),
    ] {
        let refused = put(addr, "/v1/limits/monthly/acme", TOKEN, body).await;
        assert_eq!(refused.status, 422, "{body}: {}", refused.body);
        assert!(refused.body.contains(field), "{body}: {}", refused.body);
    }
    assert_eq!(
        put(addr, "/v1/limits/yearly/acme", TOKEN, r#"{"limit": 1}"#)
            .await
            .status,
        404
    );
    let removed = send(
        "DELETE",
        &format!("http://{addr}/v1/limits/monthly/acme"),
        &[("authorization", TOKEN)],
        "",
    )
    .await;
    assert_eq!(removed.json()["before"]["limit"], 4);
    let again = send(
        "DELETE",
        &format!("http://{addr}/v1/limits/monthly/acme"),
        &[("authorization", TOKEN)],
        "",
    )
    .await;
    assert_eq!(again.status, 404);
    // Its count under the policy was kept, untouched by the setting's.
    assert_eq!(admitted(addr, "monthly", "acme").await, 2);
}

/// A plan changes every policy it sets at once; a per-key setting wins
/// over the plan; unlimited and multiplier settings; explain says which
/// applied.
#[tokio::test]
async fn a_plan_sets_every_policy_at_once_and_explain_names_it() {
    let (addr, _) = start(&config("")).await;
    let plan = put(
        addr,
        "/v1/keys/acme/plan",
        TOKEN,
        r#"{"plan": "pro", "reason": "upgrade"}"#,
    )
    .await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert_eq!(admitted(addr, "monthly", "acme").await, 10);
    assert_eq!(
        admitted(addr, "burst", "acme").await,
        6,
        "capacity 3, twice"
    );
    let explained = send(
        "GET",
        &format!("http://{addr}/v1/explain?policy=burst&key=acme"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(explained["plan"]["plan"], "pro", "{explained}");
    assert_eq!(explained["override"], "burst@plan:pro", "{explained}");
    assert_eq!(
        explained["parameters"], "token-bucket capacity=6 rate=1/30m",
        "{explained}"
    );
    put(addr, "/v1/keys/bob/plan", TOKEN, r#"{"plan": "internal"}"#).await;
    assert_eq!(admitted(addr, "monthly", "bob").await, 50, "unlimited");
    assert_eq!(
        admitted(addr, "burst", "bob").await,
        3,
        "the plan does not set it"
    );
    put(addr, "/v1/limits/monthly/bob", TOKEN, r#"{"limit": 1}"#).await;
    assert_eq!(
        admitted(addr, "monthly", "bob").await,
        1,
        "the key's own setting wins"
    );
    let explained = send(
        "GET",
        &format!("http://{addr}/v1/explain?policy=monthly&key=bob"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(explained["limit"]["limit"], 1, "{explained}");
    let unknown = put(addr, "/v1/keys/acme/plan", TOKEN, r#"{"plan": "gold"}"#).await;
    assert!(
        unknown.body.contains("configured: internal, pro"),
        "{}",
        unknown.body
    );
    let got = send(
        "GET",
        &format!("http://{addr}/v1/keys/acme/plan"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(got["reason"], "upgrade");
}

/// A temporary boost decides until the second of `expires_at`, and the
/// policy from that second on.
#[tokio::test]
async fn a_boost_ends_at_its_second() {
    let (addr, _) = start(&config("")).await;
    let end = jiff::Timestamp::now().as_second() + 2;
    let at = jiff::Timestamp::from_second(end).unwrap();
    let body = format!(r#"{{"multiplier": 3, "expires_at": "{at}"}}"#);
    assert_eq!(
        put(addr, "/v1/limits/monthly/acme", TOKEN, &body)
            .await
            .status,
        200
    );
    let check = format!("http://{addr}/v1/check");
    let one = r#"{"policy":"monthly","key":"acme","probe":true}"#;
    let limit = |answer: serde_json::Value| {
        answer["limit"]
            .as_u64()
            .unwrap_or_else(|| panic!("{answer}"))
    };
    assert_eq!(limit(send("POST", &check, &[], one).await.json()), 6);
    // Checked across the boundary: 6 until the second, 2 from it on.
    loop {
        let before = jiff::Timestamp::now().as_second();
        let answer = limit(send("POST", &check, &[], one).await.json());
        let after = jiff::Timestamp::now().as_second();
        if after < end {
            assert_eq!(answer, 6);
        } else if before >= end {
            assert_eq!(answer, 2);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two weir on one Redis: a change made through either decides through
/// both, within the poll (`limits_feed::POLL`, 250 ms) and a round trip;
/// a weir started later loads what was set before it.
#[tokio::test]
async fn two_weir_on_one_redis_see_each_others_changes() {
    let redis = weir_testkit::RedisServer::start(&[]);
    shared_through(&redis.url()).await;
}

/// The same on a Redis Cluster of three nodes: the records and their log
/// share one slot.
#[tokio::test]
async fn two_weir_on_a_redis_cluster_see_each_others_changes() {
    let cluster = weir_testkit::Cluster::start();
    shared_through(&cluster.url()).await;
}

async fn shared_through(url: &str) {
    let store = format!("[store]\nurl = \"{url}\"");
    let (a, _) = start(&config(&store)).await;
    let (b, _) = start(&config(&store)).await;
    let seen_by = |addr: SocketAddr, key: &'static str| async move {
        let started = Instant::now();
        let body = format!(r#"{{"policy":"monthly","key":"{key}","probe":true}}"#);
        while started.elapsed() < Duration::from_secs(10) {
            let answer = send("POST", &format!("http://{addr}/v1/check"), &[], &body)
                .await
                .json();
            if answer["limit"] == 10 {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{key} not seen by {addr} in 10 s");
    };
    assert_eq!(
        put(a, "/v1/keys/acme/plan", TOKEN, r#"{"plan": "pro"}"#)
            .await
            .status,
        200
    );
    let waited = seen_by(b, "acme").await;
    eprintln!("a plan set through one weir decided through the other after {waited:?}");
    // Both count one balance: 10 in all, whichever weir is asked.
    let (mut n, body) = (0, r#"{"policy":"monthly","key":"acme"}"#);
    for i in 0..30 {
        let addr = if i % 2 == 0 { a } else { b };
        n += usize::from(
            send("POST", &format!("http://{addr}/v1/check"), &[], body)
                .await
                .json()["allowed"]
                == true,
        );
    }
    assert_eq!(n, 10);
    assert_eq!(
        put(b, "/v1/keys/bob/plan", TOKEN, r#"{"plan": "pro"}"#)
            .await
            .status,
        200
    );
    seen_by(a, "bob").await;
    let removed = send(
        "DELETE",
        &format!("http://{a}/v1/keys/bob/plan"),
        &[("authorization", TOKEN)],
        "",
    )
    .await;
    assert_eq!(removed.json()["before"]["plan"], "pro", "{}", removed.body);
    let (late, _) = start(&config(&store)).await;
    seen_by(late, "acme").await;
    let listed = send(
        "GET",
        &format!("http://{late}/v1/limits"),
        &[("authorization", TOKEN)],
        "",
    )
    .await
    .json();
    assert_eq!(listed["total_keys"], 1, "bob's plan was removed: {listed}");
}
