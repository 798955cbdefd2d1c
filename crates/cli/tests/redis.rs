//! Two `weir` processes hammering one key through one Redis never admit
//! more than the policy allows between them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn two_processes_share_one_balance() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let url = redis.url();
    let started = Instant::now();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_weir"))
                .args([
                    "bench",
                    "--algorithm",
                    "token-bucket",
                    "--capacity",
                    "20",
                    "--rate",
                    "50/s",
                ])
                .args([
                    "--keys",
                    "1",
                    "--threads",
                    "1",
                    "--concurrency",
                    "8",
                    "--duration",
                    "2s",
                    "--store",
                    &url,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let elapsed = started.elapsed();
    drop(redis);
    let mut admitted = 0u64;
    for output in &outputs {
        assert!(output.status.success());
        let text = String::from_utf8_lossy(&output.stdout);
        let allowed = text
            .split("\"allowed\":")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap();
        admitted += allowed.parse::<u64>().unwrap();
        assert!(text.contains("\"store_errors\":0"), "{text}");
    }
    // C + d·N/P over the whole time both ran (a bound, not a timing claim).
    let bound = 20 + (elapsed.as_secs_f64() * 50.0).ceil() as u64;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 20, "at least the burst: {admitted}");
}

/// Two `weir serve` gateways on one Redis in front of a fake LLM: the
/// tokens one answer used through the first are a debt the second refuses
/// the tenant for, with a `Retry-After` that includes it.
#[test]
fn usage_reported_through_one_gateway_is_owed_at_the_other() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(weir_testkit::Llm::start());
    let config = format!(
        r#"
[store]
url = "{}"

[policies.tokens]
algorithm = "token-bucket"
capacity = 1000
rate = "1000/m"

[[routes]]
match = "POST /v1/chat/completions"
identity = "header:x-tenant"
policies = ["tokens"]
upstream = "http://{}"
usage = "json:/usage/total_tokens"
"#,
        redis.url(),
        llm.addr
    );
    let path = crate::serve::temp("usage-redis.toml", &config);
    let path = path.to_str().unwrap();
    let (a, b) = (
        crate::serve::Server::start(&["--config", path]),
        crate::serve::Server::start(&["--config", path]),
    );
    let tenant = "X-Tenant: acme\r\n";
    let ask = |tokens: u64| format!(r#"{{"usage":{tokens},"stream":true}}"#);
    // 1 on admission, 3,000 reported: 999 - 3,000 = -2,001 tokens.
    let (status, body) = a.request_with("POST", "/v1/chat/completions", tenant, &ask(3001));
    assert_eq!(status, 200);
    assert!(body.contains("\"total_tokens\":3001"), "{body}");
    let refused = b.request_full("POST", "/v1/chat/completions", tenant, &ask(1));
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // 2,002 tokens at 1,000 a minute: 120.12 s, less what has refilled.
    let retry = refused
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_owned)
        })
        .unwrap();
    let retry: u64 = retry.trim().parse().unwrap();
    assert!((119..=121).contains(&retry), "{refused}");
    // Another tenant is untouched.
    let (status, _) = b.request_with(
        "POST",
        "/v1/chat/completions",
        "X-Tenant: other\r\n",
        &ask(1),
    );
    assert_eq!(status, 200);
}

/// `new_keys_per_ip` on Redis: the script tells which keys a request
/// created; a client out of its share is refused a new key before
/// anything is stored, and its known keys go on — checks and reports alike.
#[test]
fn new_keys_per_address_are_capped_on_redis() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let config = format!(
        "[server]\nnew_keys_per_ip = 3\n\n[store]\nurl = \"{}\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
        redis.url()
    );
    let path = crate::serve::temp("redis-new-keys.toml", &config);
    let server = crate::serve::Server::start(&["--config", path.to_str().unwrap()]);
    let check = |key: &str| {
        let body = format!(r#"{{"policy":"api","key":"{key}"}}"#);
        server.request("POST", "/v1/check", &body)
    };
    for key in ["a", "b", "c"] {
        assert_eq!(check(key).0, 200, "{key}");
    }
    let (status, body) = check("d");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("NEW_KEYS_LIMITED"), "{body}");
    let report = r#"{"policy":"api","key":"e","cost":1}"#;
    let (status, body) = server.request("POST", "/v1/report", report);
    assert!(
        status == 429 && body.contains("NEW_KEYS_LIMITED"),
        "{status} {body}"
    );
    assert_eq!(check("a").0, 200, "known keys go on");
    let stored = redis.cli(&["--scan"]);
    assert!(
        stored.contains("a") && !stored.contains(":d") && !stored.contains(":e"),
        "{stored}"
    );
    assert_eq!(
        stored.lines().filter(|l| l.contains("api")).count(),
        3,
        "{stored}"
    );
}

/// `weir serve` on a Redis that speaks TLS only, asks for a client
/// certificate and a password: connected through `[store]`'s TLS keys and a
/// password file, deciding on Redis — and the password in no output, not
/// even when it is written inside the URL.
#[test]
fn serve_reaches_a_tls_redis_with_a_password_it_never_shows() {
    const PASSWORD: &str = "pw-0f5a9c1e";
    let certs = weir_testkit::Certs::new("serve-tls");
    let redis = weir_testkit::RedisServer::start_tls(&certs, &["--requirepass", PASSWORD]);
    let password_file = crate::serve::temp("redis-password", &format!("{PASSWORD}\n"));
    let store = |url: &str, password: &str| {
        format!(
            "[store]\nurl = \"{url}\"\ntimeout = \"2s\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{password}\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
            certs.path("ca.pem").display(),
            certs.path("client.pem").display(),
            certs.path("client-key.pem").display(),
        )
    };
    let by_file = store(
        &redis.url(),
        &format!("password_file = \"{}\"", password_file.display()),
    );
    let inside = store(
        &format!("rediss://:{PASSWORD}@localhost:{}", redis.port),
        "",
    );
    for (name, config) in [("tls-file.toml", &by_file), ("tls-inside.toml", &inside)] {
        let path = crate::serve::temp(name, config);
        let checked = crate::serve::weir()
            .args(["config", "check"])
            .arg(&path)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
        assert!(checked.status.success(), "{said}");
        assert!(said.contains("store rediss://"), "{said}");
        assert!(!said.contains(PASSWORD), "{said}");

        let server = crate::serve::Server::start(&["--config", path.to_str().unwrap()]);
        let connected = server.wait_for_log("store connected");
        let (status, body) = server.request("POST", "/v1/check", r#"{"policy":"api","key":"k"}"#);
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"degraded\":false"), "{body}");
        let (_, ready) = server.request("GET", "/readyz", "");
        let logs = server.logs_for(std::time::Duration::from_millis(300));
        for text in std::iter::once(&connected)
            .chain(&logs)
            .chain([&ready, &body])
        {
            assert!(!text.contains(PASSWORD), "{text}");
        }
    }
    let stored = redis_keys(&certs, &redis, PASSWORD);
    assert!(stored.contains("api"), "{stored}");
}

/// The keys of a TLS-only Redis, through `redis-cli --tls`.
fn redis_keys(
    certs: &weir_testkit::Certs,
    redis: &weir_testkit::RedisServer,
    password: &str,
) -> String {
    let out = Command::new("redis-cli")
        .args(["--tls", "-h", "localhost", "-p", &redis.port.to_string()])
        .arg("--cacert")
        .arg(certs.path("ca.pem"))
        .arg("--cert")
        .arg(certs.path("client.pem"))
        .arg("--key")
        .arg(certs.path("client-key.pem"))
        .args(["--no-auth-warning", "-a", password, "--scan"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Through Sentinel, the master killed under load: no request fails, every
/// answer comes within the store timeout and a margin, answers are degraded
/// only until the promotion, weir is on the new master within 1 s of it,
/// and `/readyz` names it.
#[test]
fn a_sentinel_failover_under_load_is_followed() {
    let mut group = weir_testkit::Sentinels::start();
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"50ms\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 1000000\nrate = \"100000/s\"\n",
        group.url()
    );
    let path = crate::serve::temp("sentinel.toml", &config);
    let server = crate::serve::Server::start(&["--config", path.to_str().unwrap()]);
    server.wait_for_log("store connected");
    let (_, ready) = server.request("GET", "/readyz", "");
    let first = group.nodes[0].port;
    assert!(
        ready.contains(&format!("\"master\":\"127.0.0.1:{first}\"")),
        "{ready}"
    );

    // One client, a check after another, each answer timed and noted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (addr, stop) = (server.addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                let body = r#"{"policy":"api","key":"k"}"#;
                let answer = crate::serve::request_at(&addr, "POST", "/v1/check", "", body);
                answers.push((started, started.elapsed(), answer));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            answers
        })
    };
    std::thread::sleep(std::time::Duration::from_secs(1));
    let killed = Instant::now();
    group.nodes[0].kill();
    let replica = group.nodes[1].port;
    while group.master_port() != Some(replica) {
        assert!(killed.elapsed().as_secs() < 30, "no failover within 30 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let promoted = Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = load.join().unwrap();

    let back = promoted + std::time::Duration::from_secs(1);
    for (at, took, answer) in &answers {
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // 50 ms of store timeout, and a margin for a loaded debug build.
        assert!(took.as_millis() < 750, "{took:?}: {answer}");
        // A check sent just before the kill may be decided after it.
        let degraded = answer.contains("\"degraded\":true");
        assert!(
            !degraded || (*at + *took >= killed && *at <= back),
            "degraded outside the failover: {:?} after the kill",
            at.duration_since(killed)
        );
    }
    assert!(
        answers.iter().any(|(at, _, _)| *at > back),
        "answers after the promotion"
    );
    let (_, ready) = server.request("GET", "/readyz", "");
    assert!(
        ready.contains(&format!("\"master\":\"127.0.0.1:{replica}\"")),
        "{ready}"
    );
    let (_, stats) = server.request("GET", "/v1/stats", "");
    assert!(
        stats.contains(&format!("\"master\":\"127.0.0.1:{replica}\"")),
        "{stats}"
    );
    let (_, metrics) = server.request("GET", "/metrics", "");
    for (node, up) in [(replica, 1), (first, 0)] {
        let line = format!("weir_store_node_up{{node=\"127.0.0.1:{node}\"}} {up}");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}

/// A concurrency policy through the decision API of two weir processes
/// sharing one Redis: a lease taken at one is held at both, released at the
/// other, renewed, and useless on another key or policy.
#[test]
fn leases_taken_at_one_weir_are_released_at_the_other() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let config = format!(
        r#"
[store]
url = "{}"

[policies.jobs]
algorithm = "concurrency"
limit = 2
lease = "10m"

[policies.exports]
algorithm = "concurrency"
limit = 1
lease = "10m"
"#,
        redis.url()
    );
    let path = crate::serve::temp("leases-redis.toml", &config);
    let path = path.to_str().unwrap();
    let (a, b) = (
        crate::serve::Server::start(&["--config", path]),
        crate::serve::Server::start(&["--config", path]),
    );
    leases_through_the_api(&a, &b);
}

/// The lease API's contract, with `a` and `b` serving one store (or `a`
/// twice, in process).
pub(crate) fn leases_through_the_api(a: &crate::serve::Server, b: &crate::serve::Server) {
    let json = |(status, body): (u16, String)| {
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let check = |s: &crate::serve::Server, policy: &str, key: &str| {
        let body = format!(r#"{{"policy":"{policy}","key":"{key}"}}"#);
        json(s.request_with("POST", "/v1/check", "", &body))
    };
    let on = |s: &crate::serve::Server, op: &str, policy: &str, key: &str, lease: &str| {
        let body = format!(r#"{{"policy":"{policy}","key":"{key}","lease":"{lease}"}}"#);
        s.request_with("POST", &format!("/v1/{op}"), "", &body)
    };
    let first = check(a, "jobs", "acme");
    assert_eq!(
        (first["allowed"].as_bool(), first["remaining"].as_u64()),
        (Some(true), Some(1))
    );
    let lease = first["lease"]
        .as_str()
        .expect("an admission answers its lease")
        .to_owned();
    let second = check(b, "jobs", "acme");
    let other = second["lease"].as_str().unwrap().to_owned();
    assert_ne!(lease, other);
    let full = check(a, "jobs", "acme");
    assert_eq!(full["allowed"], false, "two in flight: {full}");
    assert!(full.get("lease").is_none());
    assert_eq!(
        full["retry_after_ms"].as_u64().map(|ms| ms > 590_000),
        Some(true),
        "{full}"
    );
    // Another key or policy: the lease finds nothing there.
    assert_eq!(
        json(on(b, "release", "jobs", "other", &lease))["allowed"],
        false
    );
    assert_eq!(
        json(on(b, "release", "exports", "acme", &lease))["allowed"],
        false
    );
    assert_eq!(check(a, "jobs", "acme")["allowed"], false, "still held");
    // Released at the other weir: room for one.
    let released = json(on(b, "release", "jobs", "acme", &lease));
    assert_eq!(
        (
            released["allowed"].as_bool(),
            released["remaining"].as_u64()
        ),
        (Some(true), Some(1))
    );
    assert_eq!(
        json(on(a, "release", "jobs", "acme", &lease))["allowed"],
        false,
        "released once"
    );
    let renewed = json(on(a, "renew", "jobs", "acme", &other));
    assert_eq!(renewed["allowed"], true, "{renewed}");
    assert_eq!(renewed["reset_ms"], 600_000);
    let third = check(b, "jobs", "acme");
    assert_eq!(third["allowed"], true);
    // Bad input: a clear 422 that names the field.
    let (status, body) = on(a, "release", "jobs", "acme", "not-a-lease");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("lease"), "{body}");
    let (status, body) = a.request_with(
        "POST",
        "/v1/report",
        "",
        r#"{"policy":"jobs","key":"acme"}"#,
    );
    assert_eq!(status, 422, "a concurrency policy takes no reports: {body}");
}

/// The same contract on the in-process store: one weir.
#[test]
fn leases_through_the_api_in_process() {
    let config = r#"
[policies.jobs]
algorithm = "concurrency"
limit = 2
lease = "10m"

[policies.exports]
algorithm = "concurrency"
limit = 1
lease = "10m"
"#;
    let path = crate::serve::temp("leases-memory.toml", config);
    let a = crate::serve::Server::start(&["--config", path.to_str().unwrap()]);
    leases_through_the_api(&a, &a);
}

/// Two gateways sharing one Redis hold one in-flight limit between them:
/// slow answers streaming through one fill it for both; a client that hangs
/// up gives its slot back to both; an upstream that fails gives its slot
/// back; an answer in flight at a gateway that is killed keeps its slot
/// only until its lease expires.
#[test]
fn two_gateways_share_one_in_flight_limit() {
    use std::io::{BufRead, BufReader, Write};
    let redis = weir_testkit::RedisServer::start(&[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(weir_testkit::Llm::start());
    let config = format!(
        r#"
[store]
url = "{}"

[policies.inflight]
algorithm = "concurrency"
limit = 2
lease = "2s"

[[routes]]
match = "POST /v1/chat/completions"
identity = "header:x-tenant"
policies = ["inflight"]
upstream = "http://{}"

[[routes]]
match = "POST /down"
identity = "header:x-tenant"
policies = ["inflight"]
upstream = "http://127.0.0.1:9"
"#,
        redis.url(),
        llm.addr
    );
    let path = crate::serve::temp("inflight-redis.toml", &config);
    let path = path.to_str().unwrap();
    let (a, b) = (
        crate::serve::Server::start(&["--config", path]),
        crate::serve::Server::start(&["--config", path]),
    );
    let tenant = "X-Tenant: acme\r\n";
    // A streaming answer (events 3 s apart: longer than the lease) held
    // open by a client that reads its head and waits.
    let slow = |server: &crate::serve::Server| {
        let body = r#"{"usage":1,"stream":true,"pause_ms":3000}"#;
        let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: weir\r\n{tenant}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        reader
    };
    let status = |server: &crate::serve::Server, path: &str| {
        let answer = server.request_full("POST", path, tenant, "{}");
        answer[9..12].parse::<u16>().unwrap()
    };
    // Polls until `server` admits (any status but 429), within `within`.
    let admitted_within = |server: &crate::serve::Server, within: Duration| {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if status(server, "/down") != 429 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    };
    let first = slow(&a);
    let _second = slow(&b);
    assert_eq!(
        status(&a, "/down"),
        429,
        "two in flight, one at each gateway"
    );
    assert_eq!(status(&b, "/down"), 429);
    // Past the 2 s lease, both are still held: renewed while they stream.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(status(&b, "/down"), 429, "renewed, not expired");
    // The client at `a` hangs up: its slot is back, at `b` too.
    drop(first);
    assert!(
        admitted_within(&b, Duration::from_secs(1)),
        "released when the client left"
    );
    // `/down` fails upstream (502): each request gave its slot back.
    for _ in 0..4 {
        assert!(admitted_within(&a, Duration::from_secs(1)));
    }
    // A gateway killed with an answer in flight: its lease expires.
    let c = crate::serve::Server::start(&["--config", path]);
    let _held = slow(&c);
    assert_eq!(status(&a, "/down"), 429, "one at b, one at c");
    let killed = Instant::now();
    drop(c);
    assert!(
        admitted_within(&a, Duration::from_secs(4)),
        "the crashed holder's lease expired"
    );
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "not before its lease could expire: {waited:?}"
    );
}

/// Credentials Redis refuses stop `weir serve` at start, naming the user
/// and not the password; `weir simulate --store` and `weir bench --store`
/// read `WEIR_REDIS_PASSWORD` as `weir serve` does, and never show a
/// password in an error either.
#[test]
fn refused_credentials_stop_serve_and_no_command_shows_the_password() {
    const PASSWORD: &str = "right-pw-4c1d";
    let redis = weir_testkit::RedisServer::start(&[]);
    redis.cli(&["CONFIG", "SET", "requirepass", PASSWORD]);
    let wrong = crate::serve::temp("wrong-password", "wrong-pw-9e2a\n");
    let config = format!(
        "[store]\nurl = \"redis://weir@127.0.0.1:{}\"\npassword_file = \"{}\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
        redis.port,
        wrong.display()
    );
    let path = crate::serve::temp("wrong-credentials.toml", &config);
    let served = crate::serve::weir()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&served.stderr);
    assert!(!served.status.success(), "{said}");
    assert!(
        said.contains("refused the credentials of user `weir`"),
        "{said}"
    );
    assert!(!said.contains("wrong-pw"), "{said}");

    let trace = crate::serve::temp("trace.csv", "time,key\n0,a\n");
    let inside = format!("redis://:wrong-pw-9e2a@127.0.0.1:{}", redis.port);
    let plain = format!("redis://127.0.0.1:{}", redis.port);
    let simulate = |url: &str, password: Option<&str>| {
        let mut command = crate::serve::weir();
        command
            .args([
                "simulate",
                "--algorithm",
                "gcra",
                "--burst",
                "2",
                "--rate",
                "1/s",
                "--trace",
            ])
            .arg(&trace)
            .args(["--store", url])
            .env_remove("WEIR_REDIS_PASSWORD");
        if let Some(password) = password {
            command.env("WEIR_REDIS_PASSWORD", password);
        }
        command.output().unwrap()
    };
    let refused = simulate(&inside, None);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("redis://:***@127.0.0.1"), "{said}");
    assert!(!said.contains("wrong-pw"), "{said}");
    let by_env = simulate(&plain, Some(PASSWORD));
    let said = String::from_utf8_lossy(&by_env.stderr);
    assert!(
        by_env.status.success(),
        "WEIR_REDIS_PASSWORD is read: {said}"
    );

    let bench = crate::serve::weir()
        .args([
            "bench",
            "--algorithm",
            "gcra",
            "--burst",
            "2",
            "--rate",
            "1/s",
        ])
        .args(["--duration", "1s", "--store", &inside])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bench.stderr);
    assert!(!bench.status.success(), "{said}");
    assert!(!said.contains("wrong-pw"), "{said}");
}

/// `weir bench` on a store whose every call fails (here Redis refuses the
/// script) reports no rate for what it did not decide, and exits 1.
#[test]
fn bench_fails_loudly_when_the_store_fails() {
    let redis = weir_testkit::RedisServer::start(&[]);
    redis.cli(&["ACL", "SETUSER", "default", "-evalsha", "-eval"]);
    let bench = crate::serve::weir()
        .args([
            "bench",
            "--algorithm",
            "gcra",
            "--burst",
            "2",
            "--rate",
            "1/s",
        ])
        .args(["--duration", "500ms", "--store", &redis.url()])
        .output()
        .unwrap();
    let (out, said) = (
        String::from_utf8_lossy(&bench.stdout),
        String::from_utf8_lossy(&bench.stderr),
    );
    assert!(!bench.status.success(), "{out}{said}");
    assert!(said.contains("checks failed at the store"), "{said}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["decisions_per_sec"], 0.0, "{report}");
}
