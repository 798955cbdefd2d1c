//! `weir envoy-ratelimit` as a drop-in for envoyproxy/ratelimit: configured
//! only by its environment variables and its config files
//! (docs/envoy-ratelimit/), behind a real Envoy, on a real Redis; reloaded
//! when the runtime root's symlink is swapped, keeping the old config when
//! the new one is broken.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use weir_testkit::{RedisServer, free_port};

use crate::envoy::{call, envoy, upstream};
use crate::serve::{Server, request_at, weir};

/// A runtime root as envoyproxy/ratelimit's deployments have it:
/// `current`, a symlink to a version directory holding `config/`.
struct Runtime(std::path::PathBuf);

impl Runtime {
    fn new(test: &str) -> Self {
        let root = std::env::temp_dir().join(format!("weir-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Self(root)
    }

    /// Writes version `name` with `files` and points `current` at it, as
    /// their deployments do: a new symlink renamed over the old one.
    fn publish(&self, name: &str, files: &[(&str, &str)]) {
        let config = self.0.join(name).join("config");
        std::fs::create_dir_all(&config).unwrap();
        for (file, text) in files {
            std::fs::write(config.join(file), text).unwrap();
        }
        let next = self.0.join("next");
        let _ = std::fs::remove_file(&next);
        std::os::unix::fs::symlink(self.0.join(name), &next).unwrap();
        std::fs::rename(&next, self.0.join("current")).unwrap();
    }

    fn current(&self) -> String {
        self.0.join("current").display().to_string()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn example(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/envoy-ratelimit/config");
    std::fs::read_to_string(path.join(file)).unwrap()
}

/// Their variables, and nothing else (a `redis` of `None`: weir's
/// in-process store, `BACKEND_TYPE=memory`).
fn envoy_ratelimit(
    runtime: &Runtime,
    redis: Option<&str>,
    [port, grpc, debug]: [u16; 3],
) -> Command {
    let mut command = weir();
    command
        .arg("envoy-ratelimit")
        .env("RUNTIME_ROOT", runtime.current())
        .env("RUNTIME_SUBDIRECTORY", "")
        .env("RUNTIME_APPDIRECTORY", "config")
        .env("RUNTIME_WATCH_ROOT", "true")
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .env("REDIS_POOL_SIZE", "10")
        .env("USE_STATSD", "false")
        .env("LOG_LEVEL", "warn")
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .env("LIMIT_REMAINING_HEADER", "X-Left");
    match redis {
        Some(url) => command
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_TYPE", "SINGLE")
            .env("REDIS_URL", url.trim_start_matches("redis://")),
        None => command.env("BACKEND_TYPE", "memory"),
    };
    command
}

#[test]
fn weir_envoy_ratelimit_serves_their_files_behind_envoy_on_redis() {
    let redis = RedisServer::start(&[]);
    behind_envoy(Some(&redis.url()));
}

#[test]
fn weir_envoy_ratelimit_serves_their_files_behind_envoy_in_process() {
    behind_envoy(None);
}

/// Served behind a real Envoy: decisions, `/healthcheck`, `POST /json`,
/// `/rlconfig`, and a reload when the runtime root's symlink is swapped.
fn behind_envoy(redis: Option<&str>) {
    let (grpc, port, ingress, upstream) = (free_port(), free_port(), free_port(), upstream());
    let debug = free_port();
    let yaml = include_str!("../../../docs/envoy-ratelimit/envoy.yaml")
        .replace("port_value: 9000", &format!("port_value: {upstream}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let test = match redis {
        Some(_) => "envoy-ratelimit-redis",
        None => "envoy-ratelimit-memory",
    };
    let runtime = Runtime::new(test);
    let (shop, mongo) = (example("shop.yaml"), example("mongo.yaml"));
    runtime.publish("v1", &[("shop.yaml", &shop), ("mongo.yaml", &mongo)]);
    let served = Server::attach(&mut envoy_ratelimit(&runtime, redis, [port, grpc, debug]));
    // Variables that only tune theirs are named, not silently dropped.
    served.wait_for_log("REDIS_POOL_SIZE");
    let http = format!("127.0.0.1:{port}");
    let (status, _) = request_at_status(&http, "/healthcheck");
    assert_eq!(status, 200);
    // POST /json answers as theirs: 429 over the limit, 200 within.
    let ask = |body: &str| {
        let answer = request_at(&http, "POST", "/json", "", body);
        let status: u16 = answer[9..12].parse().unwrap();
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default(),
        )
    };
    let (status, body) = ask(
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"plan","value":"banned"}]}]}"#,
    );
    assert_eq!(
        (status, body["overallCode"].as_str()),
        (429, Some("OVER_LIMIT")),
        "{body}"
    );
    let (status, body) = ask(
        r#"{"domain":"mongo","descriptors":[{"entries":[{"key":"database","value":"users"}]}]}"#,
    );
    assert_eq!(
        (status, body["overallCode"].as_str()),
        (200, Some("OK")),
        "{body}"
    );
    assert_eq!(
        body["statuses"][0]["currentLimit"]["requestsPerUnit"], 500,
        "{body}"
    );
    let (status, _) = ask("not json");
    assert_eq!(status, 400);
    // Their debug page of the loaded limits.
    let (status, dump) = request_at_status(&format!("127.0.0.1:{debug}"), "/rlconfig");
    assert_eq!(status, 200);
    assert!(
        dump.contains("shop.path_/checkout: unit=SECOND requests_per_unit=5, shadow_mode: false"),
        "{dump}"
    );
    assert!(
        dump.contains("shop.remote_address_10.0.0.1: unlimited"),
        "{dump}"
    );
    let Some(envoy) = envoy(test, &yaml, ingress) else {
        return;
    };
    let get = |path: &str, headers: &str| call(ingress, &format!("GET {path}"), headers, "").0;
    let started = Instant::now();
    while get("/warm-up", "") != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Envoy did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // requests_per_unit: 0 refuses; a tenant and plan of no rule passes.
    let banned = "x-tenant: acme\r\nx-plan: banned\r\n";
    assert_eq!(get("/home", banned), 429);
    assert_eq!(get("/home", "x-tenant: beta\r\nx-plan: gold\r\n"), 200);
    // /checkout: 5 a second, each second a window of its own.
    let statuses: Vec<u16> = (0..12).map(|_| get("/checkout", "")).collect();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!((5..=10).contains(&admitted), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    // Their response headers (one renamed), beside weir's fields.
    let over = (0..20)
        .map(|_| call(ingress, "GET /checkout", "", ""))
        .find(|(status, _)| *status == 429)
        .expect("over the limit within 20 of 5 a second")
        .1;
    for field in [
        "ratelimit-limit: 5",
        "x-left: 0",
        "ratelimit-reset: ",
        "retry-after: ",
        "ratelimit-policy: ",
    ] {
        assert!(over.contains(field), "{field} in {over}");
    }
    // A new version: /blocked refused. The swap is picked up by itself.
    assert_eq!(get("/blocked", ""), 200);
    let blocked = format!(
        "{shop}\n  - key: path\n    value: /blocked\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n"
    );
    runtime.publish("v2", &[("shop.yaml", &blocked), ("mongo.yaml", &mongo)]);
    let started = Instant::now();
    while get("/blocked", "") != 429 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the swap was not picked up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A broken version: the old configuration keeps serving.
    runtime.publish(
        "v3",
        &[("shop.yaml", "domain: shop\ndescriptors:\n  - value: x\n")],
    );
    served.wait_for_log("descriptor has empty key");
    assert_eq!(get("/blocked", ""), 429, "the old configuration serves");
    drop(envoy);
}

/// The files imported: `weir config import envoy-ratelimit` prints a
/// configuration `weir serve` takes as it is, with a policy per limit.
#[test]
fn their_files_import_into_a_config_weir_serves() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/envoy-ratelimit/config");
    let out = weir()
        .args(["config", "import", "envoy-ratelimit", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = String::from_utf8(out.stdout).unwrap();
    assert!(toml.contains("[policies.shop-path_-checkout]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1s\""), "{toml}");
    assert!(
        toml.contains("refuse = true") && toml.contains("unlimited = true"),
        "{toml}"
    );
    let path = crate::serve::temp("imported.toml", &toml);
    let check = weir()
        .args(["config", "check", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // A bad file: named, with the descriptor, exit 2.
    let bad = std::env::temp_dir().join(format!("weir-import-bad-{}", std::process::id()));
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("x.yaml"), "domain: x\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n").unwrap();
    let out = weir()
        .args(["config", "import", "envoy-ratelimit", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("x.yaml")
            && said.contains("descriptor x.k: invalid rate limit unit 'fortnight'"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&bad);
}

/// Variables that ask for what weir does not do stop it at start, naming
/// the variable.
#[test]
fn unsupported_variables_are_errors_that_name_them() {
    let runtime = Runtime::new("envoy-ratelimit-unsupported");
    runtime.publish("v1", &[("mongo.yaml", &example("mongo.yaml"))]);
    for (name, value, says) in [
        ("BACKEND_TYPE", "memcache", "memcache is not supported"),
        ("USE_STATSD", "true", "USE_STATSD asks for statsd"),
        ("REDIS_TYPE", "RING", "expected SINGLE, SENTINEL or CLUSTER"),
        ("CONFIG_TYPE", "GRPC_XDS", "xDS is not supported"),
    ] {
        let ports = [free_port(), free_port(), free_port()];
        let out = envoy_ratelimit(&runtime, Some("127.0.0.1:1"), ports)
            .env(name, value)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {said}");
        assert!(said.contains(says), "{name}: {said}");
    }
}

/// `--print-config` shows the configuration as it is served, but for a
/// password inside `REDIS_URL`.
#[test]
fn print_config_shows_no_password() {
    let runtime = Runtime::new("envoy-ratelimit-print");
    runtime.publish("v1", &[("mongo.yaml", &example("mongo.yaml"))]);
    let ports = [free_port(), free_port(), free_port()];
    let out = envoy_ratelimit(&runtime, Some("weir:s3cret-77@127.0.0.1:6379"), ports)
        .arg("--print-config")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("url = \"redis://weir:***@127.0.0.1:6379\""),
        "{said}"
    );
    assert!(!said.contains("s3cret-77"), "{said}");
    // A config directory without files yet: served (nothing limited), as
    // theirs starts, not an error.
    runtime.publish("v2", &[]);
    let ports = [free_port(), free_port(), free_port()];
    let out = envoy_ratelimit(&runtime, None, ports)
        .arg("--print-config")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("No config files yet"), "{said}");
    let path = crate::serve::temp("no-files-yet.toml", &said);
    let checked = crate::serve::weir()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{why}");
}

/// One GET, its status.
fn request_at_status(addr: &str, path: &str) -> (u16, String) {
    let answer = request_at(addr, "GET", path, "", "");
    (answer[9..12].parse().unwrap_or(0), answer)
}

/// A limitador limits file imported: each limit a policy, its equality
/// conditions and variables a rule's entries; what weir's rules cannot
/// say (here a `!=`) named with its line, on stderr and in the output.
#[test]
fn a_limitador_file_imports_and_names_what_it_cannot_say() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/limitador/limits.yaml");
    let out = weir()
        .args(["config", "import", "limitador", file.to_str().unwrap()])
        .output()
        .unwrap();
    let (toml, said) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    // A limit left out is a failure unless asked for (--partial); the
    // output is printed either way.
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("--partial"), "{said}");
    let partial = weir()
        .args([
            "config",
            "import",
            "limitador",
            "--partial",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(partial.status.success());
    assert_eq!(String::from_utf8(partial.stdout).unwrap(), toml);
    assert!(
        toml.contains(
            "entries = [\"req.method=POST\", \"user_id\"]\npolicy = \"shop-per-user-writes\""
        ),
        "{toml}"
    );
    assert!(toml.contains("[policies.shop-per-user-writes]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"60s\""), "{toml}");
    assert!(toml.contains("entries = [\"tier=free\"]"), "{toml}");
    // limitador's older syntax, the key bare, says the same.
    assert!(
        toml.contains("entries = [\"req.method=GET\", \"user_id\"]"),
        "{toml}"
    );
    assert!(
        toml.contains("window starts at a counter's first hit"),
        "{toml}"
    );
    assert!(
        said.contains("limits.yaml:22: condition `descriptors[0]['req.path'] != '/health'`"),
        "{said}"
    );
    assert!(toml.contains("# Not translated:"), "{toml}");
    let path = crate::serve::temp("limitador.toml", &toml);
    let check = weir()
        .args(["config", "check", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
