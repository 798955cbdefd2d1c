//! `weir serve` on a real Redis that is paused, killed, restarted empty and
//! slowed under a steady load; several `weir serve` processes sharing one
//! Redis; floods of identities. Everything is checked from outside.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::serve::{Server, temp};
use weir_testkit::RedisServer as Redis;

/// The store timeout of these tests.
const TIMEOUT: Duration = Duration::from_millis(100);
/// What a request may take beyond the timeout on a loaded two-core machine
/// (the bound under test is "the timeout plus a small margin").
const MARGIN: Duration = Duration::from_millis(400);

fn check(server: &Server, policy: &str, key: &str) -> (u16, serde_json::Value, Duration) {
    let started = Instant::now();
    let body = format!(r#"{{"policy":"{policy}","key":"{key}"}}"#);
    let (status, text) = server.request("POST", "/v1/check", &body);
    let took = started.elapsed();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    (status, json, took)
}

/// Set when dropped: the load threads' signal to stop.
#[derive(Default)]
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The value of one Prometheus series (0 when absent).
fn metric(server: &Server, series: &str) -> f64 {
    let (_, text) = server.request("GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn degraded(json: &serde_json::Value) -> bool {
    json["degraded"] == serde_json::Value::Bool(true)
}

/// Polls until a `local` check is decided by Redis again; how long it took.
fn recovery(server: &Server) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let (status, json, _) = check(server, "local", "probe");
        if status == 200 && !degraded(&json) {
            return started.elapsed();
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("weir did not go back to Redis");
}

/// While the store is unavailable, each policy follows its rule, within the
/// timeout plus the margin.
fn assert_rules_apply(server: &Server, phase: &str) {
    let (status, json, took) = check(server, "local", "rules");
    assert!(
        status == 200 && degraded(&json) && json["allowed"] == true,
        "{phase}: local {status} {json}"
    );
    // The limit applied is the fallback's: half of 100,000 (fallback_share).
    assert_eq!(json["limit"], 50_000, "{phase}: {json}");
    assert!(took <= TIMEOUT + MARGIN, "{phase}: local took {took:?}");
    let (status, json, took) = check(server, "open", "rules");
    assert!(
        status == 200 && degraded(&json) && json["allowed"] == true,
        "{phase}: allow {status} {json}"
    );
    assert!(took <= TIMEOUT + MARGIN, "{phase}: allow took {took:?}");
    let (status, json, took) = check(server, "closed", "rules");
    assert!(
        status == 503 && json["error"] == "STORE_UNAVAILABLE",
        "{phase}: deny {status} {json}"
    );
    assert!(took <= TIMEOUT + MARGIN, "{phase}: deny took {took:?}");
}

#[test]
fn redis_paused_killed_restarted_and_slowed_under_load() {
    let mut redis = Redis::start(&[]);
    // A generation marker from long ago: the store has not lost anything yet.
    redis.cli(&["SET", "rl:v1:generation", "1 0"]);
    let config = format!(
        r#"[store]
url = "{url}"
timeout = "100ms"
fallback_share = 0.5

[policies.local]
algorithm = "token-bucket"
capacity = 100000
rate = "100000/s"

[policies.open]
algorithm = "fixed-window"
limit = 1000000
window = "1s"
on_store_error = "allow"

[policies.closed]
algorithm = "fixed-window"
limit = 1000000
window = "1s"
on_store_error = "deny"

[policies.lossy]
algorithm = "token-bucket"
capacity = 5
rate = "1/m"
on_state_loss = "empty"

[policies.fresh]
algorithm = "token-bucket"
capacity = 5
rate = "1/m"
"#,
        url = redis.url()
    );
    let path = temp("faults.toml", &config);
    let server = Arc::new(Server::start(&["--config", path.to_str().unwrap()]));

    // A steady load on the `local` policy for the whole test — stopped also
    // when the test fails first, so that no load (and no weir) outlives it.
    let stop = StopOnDrop::default();
    let load: Vec<_> = (0..3)
        .map(|i| {
            let (server, stop) = (server.clone(), stop.0.clone());
            thread::spawn(move || {
                let (mut answered, mut degraded_seen, mut slowest) = (0u64, 0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let (status, json, took) = check(&server, "local", &format!("load-{i}"));
                    assert_eq!(status, 200, "the load is never refused: {json}");
                    answered += 1;
                    degraded_seen += u64::from(degraded(&json));
                    slowest = slowest.max(took);
                }
                (answered, degraded_seen, slowest)
            })
        })
        .collect();

    let (status, json, _) = check(&server, "closed", "before");
    assert!(status == 200 && !degraded(&json), "{json}");

    // Paused: calls time out, the breaker opens, every rule applies.
    redis.signal("STOP");
    thread::sleep(Duration::from_millis(400));
    assert_rules_apply(&server, "paused");
    let (_, ready) = server.request("GET", "/readyz", "");
    assert!(ready.contains(r#""store_up":false"#), "{ready}");
    assert_eq!(metric(&server, "weir_store_up"), 0.0);
    redis.signal("CONT");
    let back = recovery(&server);
    println!("paused: back on Redis {back:?} after SIGCONT");
    assert!(
        back < Duration::from_millis(1500),
        "back on Redis after {back:?}"
    );

    // Killed, then restarted empty: detected as a loss; `empty` keys start used up.
    redis.kill();
    thread::sleep(Duration::from_millis(400));
    assert_rules_apply(&server, "killed");
    redis.restart();
    let back = recovery(&server);
    println!("killed: back on Redis {back:?} after the restart");
    assert!(
        back < Duration::from_millis(1500),
        "back on Redis after a restart in {back:?}"
    );
    let (_, lossy, _) = check(&server, "lossy", "after-restart");
    assert_eq!(lossy["allowed"], false, "on_state_loss = empty: {lossy}");
    let (_, fresh, _) = check(&server, "fresh", "after-restart");
    assert!(
        fresh["allowed"] == true && fresh["remaining"] == 4,
        "on_state_loss = full: {fresh}"
    );
    assert_eq!(metric(&server, "weir_store_state_losses_total"), 1.0);

    // Slowed: a 600 ms stall of the server; requests still answer in time.
    let stall = {
        let port = redis.port.to_string();
        thread::spawn(move || {
            std::process::Command::new("redis-cli")
                .args(["-p", &port, "DEBUG", "SLEEP", "0.6"])
                .output()
                .unwrap()
        })
    };
    thread::sleep(Duration::from_millis(250));
    assert_rules_apply(&server, "slowed");
    stall.join().unwrap();
    recovery(&server);

    drop(stop);
    let mut total = (0, 0, Duration::ZERO);
    for handle in load {
        let (answered, degraded_seen, slowest) = handle.join().unwrap();
        total = (
            total.0 + answered,
            total.1 + degraded_seen,
            total.2.max(slowest),
        );
    }
    println!(
        "load: {} answered, {} degraded, slowest {:?}",
        total.0, total.1, total.2
    );
    assert!(
        total.1 > 0,
        "the load was decided locally during the faults"
    );
    assert!(
        total.2 <= TIMEOUT + MARGIN,
        "a request waited {:?}",
        total.2
    );
    assert!(metric(&server, "weir_fallback_decisions_total{policy=\"local\"}") > 0.0);
    assert!(metric(&server, "weir_store_errors_total{kind=\"timeout\"}") > 0.0);
    assert!(metric(&server, "weir_store_errors_total{kind=\"circuit_open\"}") > 0.0);
    assert_eq!(metric(&server, "weir_store_up"), 1.0);
}

/// A Redis that restarts while weir is idle is found by weir's own pings,
/// not by the next checks: none of them fails on a connection that the
/// restart broke (each runtime thread has one).
#[test]
fn an_idle_weir_reconnects_to_a_restarted_redis_before_its_next_checks() {
    let mut redis = Redis::start(&[]);
    let config = format!(
        r#"[store]
url = "{url}"
timeout = "100ms"

[policies.api]
algorithm = "token-bucket"
capacity = 1000
rate = "1000/s"
on_store_error = "deny"
"#,
        url = redis.url()
    );
    let path = temp("idle.toml", &config);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    // Checks on new connections, spread over the runtime threads; how many
    // Redis did not decide.
    let failed = |round: usize| {
        (0..40)
            .filter(|i| {
                let (status, json, _) = check(&server, "api", &format!("{round}-{i}"));
                status != 200 || degraded(&json)
            })
            .count()
    };
    assert_eq!(failed(0), 0);
    // By now every thread has opened its own connection.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(failed(1), 0);
    redis.restart();
    thread::sleep(Duration::from_millis(500));
    let (started, up) = (Instant::now(), r#""store_up":true"#);
    while !server.request("GET", "/readyz", "").1.contains(up) {
        assert!(started.elapsed() < Duration::from_secs(5), "back on Redis");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(failed(2), 0, "checks after the restart");
}

/// Twelve clients spread over `servers` check `policies` for one identity
/// until `run` has passed: admissions per policy, degraded answers, and the
/// time from the first request to the end of the last.
fn hammer(
    servers: &[Arc<Server>],
    policies: &'static [&'static str],
    run: Duration,
) -> (Vec<u64>, u64, f64) {
    let started = Instant::now();
    let clients: Vec<_> = (0..12)
        .map(|i| {
            let server = servers[i % servers.len()].clone();
            thread::spawn(move || {
                let (mut admitted, mut degraded_seen) = (vec![0u64; policies.len()], 0u64);
                while started.elapsed() < run {
                    for (policy, count) in policies.iter().zip(&mut admitted) {
                        let (status, json, _) = check(&server, policy, "shared");
                        assert_eq!(status, 200, "{json}");
                        *count += u64::from(json["allowed"] == true);
                        degraded_seen += u64::from(degraded(&json));
                    }
                }
                (admitted, degraded_seen)
            })
        })
        .collect();
    let (mut admitted, mut degraded_seen) = (vec![0u64; policies.len()], 0);
    for client in clients {
        let (a, d) = client.join().unwrap();
        admitted
            .iter_mut()
            .zip(a)
            .for_each(|(total, n)| *total += n);
        degraded_seen += d;
    }
    (admitted, degraded_seen, started.elapsed().as_secs_f64())
}

/// `count` servers of the config `name`.
fn servers(name: &str, count: usize, config: &str) -> Vec<Arc<Server>> {
    let path = temp(name, config);
    (0..count)
        .map(|_| Arc::new(Server::start(&["--config", path.to_str().unwrap()])))
        .collect()
}

/// Three `weir serve` processes on one Redis, twelve clients on one identity
/// for three seconds: never more admissions than the policies allow. (The
/// store's deadline is a second: this is about the bound, and fifteen
/// processes of debug builds on two busy cores can stall one call past the
/// default 50 ms, which would rightly be decided by the fallback.)
#[test]
fn three_servers_on_one_redis_never_exceed_the_bound() {
    let redis = Redis::start(&[]);
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"1s\"\n\n[policies.bucket]\nalgorithm = \"token-bucket\"\ncapacity = 20\nrate = \"50/s\"\n\n[policies.window]\nalgorithm = \"fixed-window\"\nlimit = 40\nwindow = \"1s\"\n",
        redis.url()
    );
    let servers = servers("three.toml", 3, &config);
    let (admitted, degraded_seen, elapsed) =
        hammer(&servers, &["bucket", "window"], Duration::from_secs(3));
    let (bucket, window) = (admitted[0], admitted[1]);
    let bucket_bound = 20 + (50.0 * elapsed).ceil() as u64;
    let window_bound = 40 * (elapsed.ceil() as u64 + 1);
    println!(
        "3 servers, {elapsed:.2} s: bucket {bucket} (bound {bucket_bound}), window {window} (bound {window_bound})"
    );
    assert_eq!(degraded_seen, 0);
    assert!(bucket <= bucket_bound, "{bucket} > {bucket_bound}");
    assert!(window <= window_bound, "{window} > {window_bound}");
    assert!(
        bucket >= 20 && window >= 40,
        "the policies admitted something: {bucket}, {window}"
    );
}

/// Three servers while Redis is paused for a second in the middle: each
/// decides locally with a third of the limit (`fallback_share`), so that
/// together they admit at most the policy's bound once more over the outage —
/// degraded, never unbounded.
#[test]
fn three_servers_through_a_redis_pause_stay_within_the_degraded_bound() {
    let redis = Redis::start(&[]);
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"50ms\"\nfallback_share = 0.333333\n\n[policies.bucket]\nalgorithm = \"token-bucket\"\ncapacity = 30\nrate = \"60/s\"\n",
        redis.url()
    );
    let servers = servers("three-paused.toml", 3, &config);
    let fault = {
        let pid = redis.pid();
        thread::spawn(move || {
            thread::sleep(Duration::from_secs(1));
            crate::signal(pid, "STOP");
            thread::sleep(Duration::from_secs(1));
            crate::signal(pid, "CONT");
        })
    };
    let (admitted, degraded_seen, elapsed) = hammer(&servers, &["bucket"], Duration::from_secs(3));
    fault.join().unwrap();
    // Redis's bucket over the whole run (its clock runs on while paused),
    // plus each instance's local bucket (capacity 9 = ⌊30 × 0.333333⌋,
    // refilling at a third of 60/s) while degraded: the pause, and up to half
    // a second around it (timeouts before the breaker opens, the probe after).
    let degraded_for = 1.5;
    let bound = 30 + (60.0 * elapsed).ceil() as u64 + 3 * 9 + (60.0 * degraded_for) as u64;
    println!(
        "3 servers, Redis paused 1 s of {elapsed:.2} s: {} admitted (bound {bound}), {degraded_seen} degraded",
        admitted[0]
    );
    assert!(degraded_seen > 0, "the pause was decided locally");
    assert!(admitted[0] <= bound, "{} > {bound}", admitted[0]);
}

/// A flood of identities: the in-process store stays within its key budget
/// and never forgets a limited key; on Redis every key has an expiry.
#[test]
fn floods_of_identities_are_bounded() {
    let limited = "[policies.tight]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n";
    let path = temp(
        "flood.toml",
        &format!("[store]\nmax_keys = 2000\n\n{limited}"),
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(check(&server, "tight", "victim").1["allowed"], true);
    let (mut full, mut admitted) = (0, 0);
    for i in 0..5000 {
        match check(&server, "tight", &format!("flood-{i}")) {
            (200, json, _) if json["allowed"] == true => admitted += 1,
            (503, json, _) if json["error"] == "LIMITER_FULL" => full += 1,
            (status, json, _) => panic!("{status} {json}"),
        }
    }
    assert_eq!(
        check(&server, "tight", "victim").1["allowed"],
        false,
        "still limited"
    );
    assert!(
        admitted <= 2000 && full >= 3000,
        "{admitted} admitted, {full} refused as full"
    );

    let redis = Redis::start(&[]);
    let path = temp(
        "flood-redis.toml",
        &format!("[store]\nurl = \"{}\"\n\n{limited}", redis.url()),
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    for i in 0..2000 {
        assert_eq!(check(&server, "tight", &format!("flood-{i}")).0, 200);
    }
    let without_expiry = redis.cli(&[
        "EVAL",
        "local n = 0 for _, k in ipairs(redis.call('KEYS', 'rl:v1:{*')) do if redis.call('PTTL', k) < 0 then n = n + 1 end end return {#redis.call('KEYS', 'rl:v1:{*'), n}",
        "0",
    ]);
    assert_eq!(
        without_expiry.split_whitespace().collect::<Vec<_>>(),
        ["2000", "0"],
        "keys, keys without expiry"
    );
}

/// The admin endpoints on Redis: inspecting charges nothing, a reset grants
/// the full allowance again; with the store down they say so (503).
#[test]
fn admin_endpoints_read_and_reset_redis() {
    let redis = Redis::start(&[]);
    let config = format!(
        "[server]\nadmin_token = \"a-long-enough-admin-token\"\n\n[store]\nurl = \"{}\"\n\n[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 3\nrate = \"1/h\"\n",
        redis.url()
    );
    let server = Server::start(&["--config", temp("admin.toml", &config).to_str().unwrap()]);
    let auth = "Authorization: Bearer a-long-enough-admin-token\r\n";
    check(&server, "api", "k");
    check(&server, "api", "k");
    for _ in 0..2 {
        let (status, body) = server.request_with("GET", "/v1/keys/api/api:k", auth, "");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (status, &json["next_check"]["remaining"], &json["exists"]),
            (200, &serde_json::json!(0), &serde_json::json!(true)),
            "{body}"
        );
    }
    let (_, body) = server.request_with("GET", "/v1/keys/api/api:typo", auth, "");
    assert!(body.contains(r#""exists":false"#), "{body}");
    let (status, body) = server.request_with("DELETE", "/v1/keys/api/api:k", auth, "");
    assert!(
        status == 200 && body.contains(r#""existed":true"#),
        "{body}"
    );
    assert_eq!(
        check(&server, "api", "k").1["remaining"],
        2,
        "a fresh allowance"
    );
    assert_eq!(server.request("GET", "/v1/keys/api/api:k", "").0, 401);

    redis.signal("STOP");
    for _ in 0..4 {
        check(&server, "api", "other"); // opens the breaker
    }
    let (status, body) = server.request_with("GET", "/v1/keys/api/api:k", auth, "");
    assert_eq!(status, 503, "{body}");
    redis.signal("CONT");
}

/// A brand-new Redis is not a lost state: `on_state_loss = "empty"`
/// policies admit their first requests, nothing is counted as lost, and the
/// log does not say "again". A loss afterwards is still detected.
#[test]
fn a_new_redis_is_not_a_lost_state() {
    let mut redis = Redis::start(&[]);
    let config = format!(
        "[store]\nurl = \"{}\"\n\n[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 3\nrate = \"1/h\"\non_state_loss = \"empty\"\n",
        redis.url()
    );
    let server = Server::start(&[
        "--config",
        temp("new-redis.toml", &config).to_str().unwrap(),
    ]);
    let connected = server.wait_for_log("store connected");
    assert!(!connected.contains("again"), "{connected}");
    let (status, first, _) = check(&server, "api", "first");
    assert_eq!(
        (status, &first["allowed"]),
        (200, &serde_json::json!(true)),
        "{first}"
    );
    assert_eq!(first["remaining"], 2, "a full allowance on a new store");
    assert_eq!(metric(&server, "weir_store_state_losses_total"), 0.0);

    // The store restarts empty under a running weir: that is a loss.
    redis.restart();
    let lost = (0..100).find_map(|_| {
        let (_, answer, _) = check(&server, "api", "first");
        std::thread::sleep(Duration::from_millis(20));
        (answer["degraded"] == false).then_some(answer)
    });
    let lost = lost.expect("back on Redis");
    assert_eq!(
        lost["allowed"], false,
        "used up when the loss was found: {lost}"
    );
    assert_eq!(metric(&server, "weir_store_state_losses_total"), 1.0);
}
