//! `weir serve` and `weir config` as real processes: start with no config,
//! check configs, reload on SIGHUP, stop on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

/// A running `weir serve`, its address, and its stderr lines.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
    log: std::sync::Mutex<mpsc::Receiver<String>>,
}

impl Server {
    pub(crate) fn start(args: &[&str]) -> Self {
        Self::spawn(weir(), args)
    }

    /// [`Server::start`] with the process's address space capped at `kib`
    /// KiB (`ulimit -v`): an allocation past it fails, and the server dies.
    /// glibc's malloc arenas are capped too: each reserves 64 MiB of address
    /// space, and threads contending on a busy machine make more of them,
    /// which would measure the machine's load rather than weir's memory.
    pub(crate) fn start_capped(kib: u64, args: &[&str]) -> Self {
        let mut sh = Command::new("sh");
        let script = format!("ulimit -v {kib} && exec \"$0\" \"$@\"");
        sh.args(["-c", &script, env!("CARGO_BIN_EXE_weir")])
            .env("MALLOC_ARENA_MAX", "2");
        Self::spawn(sh, args)
    }

    pub(crate) fn spawn(mut command: Command, args: &[&str]) -> Self {
        Self::attach(
            command
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(args),
        )
    }

    /// Runs `command` (a weir that serves) until it says where it listens.
    pub(crate) fn attach(command: &mut Command) -> Self {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let (tx, log) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let addr = loop {
            let line = log
                .recv_timeout(Duration::from_secs(20))
                .expect("weir starts");
            if let Some(addr) = line
                .strip_prefix("weir listening on http://")
                .or_else(|| line.strip_prefix("weir listening on https://"))
            {
                break addr.to_owned();
            }
            // JSON logs: the same, as a log object.
            let json = serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default();
            if json["fields"]["message"] == "weir listening" {
                let url = json["fields"]["url"].as_str().unwrap();
                break url.split("://").last().unwrap().to_owned();
            }
        };
        let log = std::sync::Mutex::new(log);
        Self { child, addr, log }
    }

    /// One HTTP/1.1 request; the status and body.
    pub(crate) fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.request_with(method, path, "", body)
    }

    /// [`Server::request`] with extra header lines (`"Name: value\r\n"…`).
    pub(crate) fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> (u16, String) {
        let response = self.request_full(method, path, headers, body);
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// The whole answer, head and body, as sent.
    pub(crate) fn request_full(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> String {
        request_at(&self.addr, method, path, headers, body)
    }

    fn signal(&self, name: &str) {
        crate::signal(self.child.id(), name);
    }

    /// Every log line written within `within`.
    pub(crate) fn logs_for(&self, within: Duration) -> Vec<String> {
        let until = std::time::Instant::now() + within;
        let log = self.log.lock().unwrap();
        let mut lines = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match log.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        lines
    }

    pub(crate) fn wait_for_log(&self, needle: &str) -> String {
        loop {
            let line = self
                .log
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no log line with {needle}"));
            if line.contains(needle) {
                return line;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request to `addr` (a server's, for threads that must not
/// keep the server alive): the whole answer, head and body.
pub(crate) fn request_at(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: weir\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

pub(crate) fn temp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn serves_the_example_with_no_config_and_stops_on_sigterm() {
    let mut server = Server::start(&[]);
    let (status, body) = server.request("POST", "/v1/check", r#"{"policy":"api","key":"me"}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""allowed":true"#), "{body}");
    assert_eq!(server.request("GET", "/healthz", "").0, 200);
    let (_, metrics) = server.request("GET", "/metrics", "");
    assert!(metrics.contains("weir_decisions_total"), "{metrics}");
    assert!(
        !metrics.contains("weir_grpc"),
        "no gRPC series with gRPC off"
    );
    server.signal("TERM");
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn config_example_passes_check_and_errors_name_their_lines() {
    let example = weir().args(["config", "example"]).output().unwrap();
    assert!(example.status.success());
    let path = temp("example.toml", &String::from_utf8(example.stdout).unwrap());
    let check = weir()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let bad = temp(
        "bad.toml",
        "[server]\nlisten = \"nowhere\"\n\n[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 0\nrate = \"2/s\"\n",
    );
    let check = weir().args(["config", "check"]).arg(&bad).output().unwrap();
    assert_eq!(check.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(
        stderr.contains("bad.toml:line 2: [server] listen: `nowhere` is not an address"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.toml:line 6: [policies.a] capacity:"),
        "{stderr}"
    );
}

/// A store URL written wrong is shown in the error with its password
/// hidden, however it is wrong.
#[test]
fn config_check_never_shows_a_password_in_a_malformed_url() {
    for (n, url) in [
        "redis//weir:pw-8d1f@cache:6379",
        "weir:pw-8d1f@cache:6379",
        "redis://weir:pw-8d1f@cache:notaport",
    ]
    .iter()
    .enumerate()
    {
        let bad = temp(
            &format!("bad-url-{n}.toml"),
            &format!(
                "[store]\nurl = \"{url}\"\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n"
            ),
        );
        let check = weir().args(["config", "check"]).arg(&bad).output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        assert_eq!(check.status.code(), Some(2), "{url}: {said}");
        assert!(said.contains("[store] url"), "{url}: {said}");
        assert!(!said.contains("pw-8d1f"), "{url}: {said}");
        assert!(
            !said.contains("InvalidClientConfig"),
            "what is wrong, not a kind: {said}"
        );
    }
    let check = weir()
        .args(["config", "check"])
        .arg(temp("bad-url-port.toml", "[store]\nurl = \"redis://cache:notaport\"\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr);
    assert!(
        said.contains("invalid port number") && said.contains("redis://[USER:PASSWORD@]HOST:PORT"),
        "{said}"
    );
}

#[test]
fn sighup_reloads_and_a_bad_config_keeps_the_old_one() {
    let one = "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"1/h\"\n\n[policies.b]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n";
    let path = temp("reload.toml", one);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let check = |s: &Server| {
        s.request("POST", "/v1/check", r#"{"policy":"a","key":"k"}"#)
            .1
    };
    assert!(check(&server).contains(r#""allowed":true"#));
    assert!(check(&server).contains(r#""allowed":false"#));
    let check_b = |s: &Server| {
        s.request("POST", "/v1/check", r#"{"policy":"b","key":"k"}"#)
            .1
    };
    assert!(check_b(&server).contains(r#""allowed":true"#));

    // A broken file is rejected; the old config keeps serving, state and all.
    std::fs::write(&path, "[policies.a]\nalgorithm = \"token-bucket\"\n").unwrap();
    server.signal("HUP");
    server.wait_for_log("reload rejected");
    assert!(check(&server).contains(r#""allowed":false"#));

    // A valid new config takes over: `a` changed keeps each key's tokens
    // (none left, now out of 5), `c` is new.
    let changed = one.replace("capacity = 1", "capacity = 5")
        + "\n[policies.c]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n";
    std::fs::write(&path, changed).unwrap();
    server.signal("HUP");
    let carried = server.wait_for_log("parameters changed");
    assert!(
        carried.contains("\"a\"") && !carried.contains("\"b\""),
        "{carried}"
    );
    let fresh = server.wait_for_log("are new");
    assert!(fresh.contains("\"c\""), "{fresh}");
    server.wait_for_log("reloaded");
    let (_, policies) = server.request("GET", "/v1/policies", "");
    assert!(
        policies.contains("token-bucket capacity=5 rate=1/h"),
        "{policies}"
    );
    let a = check(&server);
    assert!(
        a.contains(r#""allowed":false"#) && a.contains(r#""remaining":0"#),
        "a changed bucket keeps the tokens it had: {a}"
    );
    assert!(
        check_b(&server).contains(r#""allowed":false"#),
        "an unchanged policy keeps its keys"
    );
}

#[test]
fn serves_grpc_beside_http_and_stops_both_on_sigterm() {
    let mut server = Server::start(&["--grpc", "127.0.0.1:0"]);
    let line = server.wait_for_log("rate limit service (gRPC) on ");
    let grpc = line.rsplit(' ').next().unwrap().to_owned();
    assert!(TcpStream::connect(&grpc).is_ok(), "gRPC listens on {grpc}");
    assert_eq!(server.request("GET", "/healthz", "").0, 200);
    server.signal("TERM");
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn a_half_sent_request_or_an_idle_grpc_peer_cannot_hold_a_stopping_weir_past_its_deadline() {
    let config = "[server]\nshutdown_timeout = \"1s\"\nheader_timeout = \"1m\"\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n";
    let mut server = Server::start(&[
        "--config",
        temp("shutdown.toml", config).to_str().unwrap(),
        "--grpc",
        "127.0.0.1:0",
    ]);
    let line = server.wait_for_log("rate limit service (gRPC) on ");
    let idle = TcpStream::connect(line.rsplit(' ').next().unwrap()).unwrap();
    let mut half = TcpStream::connect(&server.addr).unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stopping = std::time::Instant::now();
    server.signal("TERM");
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "still running past the 1 s shutdown deadline"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((half, idle));
}

/// Polls `probe` until it holds or `within` passes.
fn eventually(within: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < within {
        if probe() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn bucket(capacity: u32) -> String {
    format!(
        "[server]\nadmin_token = \"a-long-enough-admin-token\"\n\n[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = {capacity}\nrate = \"1/h\"\n"
    )
}

fn spec(server: &Server) -> String {
    server.request("GET", "/v1/policies", "").1
}

#[test]
fn the_config_file_is_watched_edited_in_place_or_swapped_like_a_configmap() {
    // Kubernetes' layout: weir.toml -> ..data/weir.toml, ..data -> ..v1.
    let dir = std::env::temp_dir().join(format!("weir-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/weir.toml"), bucket(1)).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/weir.toml", dir.join("weir.toml")).unwrap();
    let file = dir.join("weir.toml");
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    assert!(spec(&server).contains("capacity=1 "), "{}", spec(&server));

    // The ConfigMap is updated: a new directory, and ..data swapped to it.
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/weir.toml"), bucket(2)).unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    assert!(
        eventually(Duration::from_secs(2), || spec(&server)
            .contains("capacity=2 ")),
        "the swap was seen within 2 s: {}",
        spec(&server)
    );

    // A broken edit (in place) changes nothing; a good one is applied.
    std::fs::write(
        dir.join("..v2/weir.toml"),
        "[policies.a]\nalgorithm = \"nope\"\n",
    )
    .unwrap();
    server.wait_for_log("reload rejected");
    assert!(spec(&server).contains("capacity=2 "));
    std::fs::write(dir.join("..v2/weir.toml"), bucket(3)).unwrap();
    assert!(
        eventually(Duration::from_secs(2), || spec(&server)
            .contains("capacity=3 ")),
        "the edit was seen within 2 s"
    );
    let (_, metrics) = server.request("GET", "/metrics", "");
    assert!(
        metrics.contains("weir_config_reloads_total{result=\"error\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("weir_config_info{hash="), "{metrics}");
    assert!(
        metrics.contains("weir_config_last_reload_timestamp_seconds"),
        "{metrics}"
    );

    // An operator asks for a reload: answered with the result.
    let auth = "Authorization: Bearer a-long-enough-admin-token\r\n";
    let (status, body) = server.request_with("POST", "/v1/admin/reload", auth, "");
    assert_eq!(
        (status, body.contains(r#""reloaded":"unchanged""#)),
        (200, true),
        "{body}"
    );
    std::fs::write(
        dir.join("..v2/weir.toml"),
        "[policies.a]\nalgorithm = \"nope\"\n",
    )
    .unwrap();
    let (status, body) = server.request_with("POST", "/v1/admin/reload", auth, "");
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("CONFIG_INVALID") && body.contains("weir.toml:"),
        "{body}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_logs_are_one_object_per_line() {
    let text = bucket(5).replace("[server]\n", "[server]\nlog_format = \"json\"\n");
    let config = temp("json-logs.toml", &text);
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let line = server.wait_for_log("watching the configuration file");
    let log: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    // Every line is JSON (the listening one was read as JSON to start),
    // a reload's too.
    let changed = bucket(6).replace("[server]\n", "[server]\nlog_format = \"json\"\n");
    std::fs::write(&config, changed).unwrap();
    server.signal("HUP");
    let reloaded = server.wait_for_log("configuration reloaded");
    let mut lines = server.logs_for(Duration::from_millis(300));
    lines.push(reloaded);
    for line in lines {
        assert!(
            serde_json::from_str::<serde_json::Value>(&line).is_ok(),
            "{line}"
        );
    }
    assert_eq!(log["level"], "INFO", "{line}");
    let message = &log["fields"]["message"];
    assert_eq!(message, "watching the configuration file", "{line}");
    let file = log["fields"]["file"].as_str().unwrap();
    assert!(file.ends_with("json-logs.toml"), "{line}");
    assert!(log["timestamp"].is_string(), "{line}");
    let bad = temp("bad-logs.toml", "[server]\nlog_format = \"xml\"\n");
    let out = weir()
        .args(["config", "check", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("log_format") && err.contains("\"json\""),
        "{err}"
    );
}

/// The playground and `weir simulate --plot` under hostile numbers: a
/// nanosecond window over centuries, the last representable time and the
/// first past it, the largest costs. Under a 1 GiB address-space cap every
/// request is answered (`200`, or `422` saying what is wrong), none with a
/// panic's text, and the server stays up.
#[test]
fn hostile_playground_requests_are_answered_within_a_memory_cap() {
    let server = Server::start_capped(1 << 20, &[]);
    let policies = [
        "fixed-window limit=1 window=1ns",
        "sliding-log limit=1 window=1ns",
        "sliding-counter limit=1 window=1ns",
        "token-bucket capacity=1 rate=1/1ns",
        "gcra burst=1 rate=1/1ns",
        "leaky-bucket rate=1/1ns queue=1",
        "fixed-window limit=4294967295 window=365d",
        "leaky-bucket rate=1/365d queue=4294967295",
    ];
    let traces = [
        "time\n0\n9000000000\n",
        "time\n0\n18446744073.709551615\n",
        "time\n18446744073.709551615\n18446744073.709551615\n",
        "time\n18446744073.709551616\n",
        "time\n-1\n",
        "time,key,cost\n0,a,4294967295\n0.000000001,a,18446744073709551615\n",
        "time,key\n0,a\n0.000000001,b\n0.000000002,a\n3000000000,a\n",
    ];
    for policy in policies {
        for trace in traces {
            let body = serde_json::json!({ "policies": [policy], "trace": trace }).to_string();
            let (status, answer) = server.request("POST", "/v1/simulate", &body);
            assert!(
                status == 200 || status == 422,
                "{policy} over {trace:?}: {status} {answer}"
            );
            assert!(!answer.contains("panicked"), "{answer}");
            assert!(answer.len() < 4 << 20, "{} bytes", answer.len());
        }
    }
    let all = serde_json::json!({ "policies": &policies[..6], "trace": traces[0] }).to_string();
    let (status, answer) = server.request("POST", "/v1/simulate", &all);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(server.request("GET", "/healthz", "").0, 200);

    // The same through `weir simulate --compare --plot`, under the same cap.
    let trace = temp("hostile.csv", traces[0]);
    let plot = temp("hostile.svg", "");
    let out = Command::new("sh")
        .args(["-c", "ulimit -v 1048576 && exec \"$0\" \"$@\""])
        .env("MALLOC_ARENA_MAX", "2")
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(["simulate", "--compare", "--policy", policies[0], "--plot"])
        .arg(&plot)
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&plot).unwrap().len() < 4 << 20);
}

/// A served file deleted: one error line, however often the watcher fires
/// while it is gone; restored as it was, one line saying so; changed, one
/// line saying what changed.
#[test]
fn reloads_log_each_outcome_once() {
    let path = temp("logged.toml", &bucket(1));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    server.wait_for_log("watching the configuration file");
    // The file as served at start: nothing to say.
    server.signal("HUP");
    let quiet = server.logs_for(Duration::from_millis(600));
    assert!(
        !quiet.iter().any(|l| l.contains("configuration unchanged")),
        "{quiet:#?}"
    );
    std::fs::remove_file(&path).unwrap();
    for _ in 0..4 {
        server.signal("HUP");
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines = server.logs_for(Duration::from_millis(1500));
    let rejected = lines
        .iter()
        .filter(|l| l.contains("reload rejected"))
        .count();
    assert_eq!(rejected, 1, "{lines:#?}");
    std::fs::write(&path, bucket(1)).unwrap();
    server.wait_for_log("configuration unchanged");
    std::fs::write(&path, bucket(2).replace("[policies.a]", "[policies.b]")).unwrap();
    let line = server.wait_for_log("configuration reloaded");
    assert!(
        line.contains("policies added: b") && line.contains("policies removed: a"),
        "{line}"
    );
    // Applied, the file is the one served: a signal after is not news.
    server.signal("HUP");
    let quiet = server.logs_for(Duration::from_millis(600));
    assert!(
        !quiet.iter().any(|l| l.contains("configuration unchanged")),
        "{quiet:#?}"
    );
}

/// `[server] access_log`: one line per gateway request, JSON with JSON
/// logs, at `log_level`; the identity only with `access_log_identity`.
#[test]
fn the_access_log_has_a_line_per_gateway_request() {
    let config = |identity: bool| {
        format!(
            "[server]\nlog_format = \"json\"\nlog_level = \"warn\"\naccess_log = true\naccess_log_identity = {identity}\n\n[policies.one]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n[[routes]]\nmatch = \"GET /r\"\nidentity = \"header:x-id\"\npolicies = [\"one\"]\nupstream = \"http://127.0.0.1:1\"\n"
        )
    };
    for identity in [false, true] {
        let path = temp(&format!("access-{identity}.toml"), &config(identity));
        // RUST_LOG, when set, takes log_level's place: unset here.
        let mut command = weir();
        command.env_remove("RUST_LOG");
        let server = Server::spawn(command, &["--config", path.to_str().unwrap()]);
        let (down, _) =
            server.request_with("GET", "/r", "x-id: acme\r\nx-request-id: req-7\r\n", "");
        let (limited, _) = server.request_with("GET", "/r", "x-id: acme\r\n", "");
        // Requests that match no route have their line too.
        let (unrouted, _) = server.request("GET", "/nowhere", "");
        let (bad, _) = server.request("GET", "/a/../r", "");
        assert_eq!((down, limited, unrouted, bad), (502, 429, 404, 400));
        let lines = server.logs_for(Duration::from_millis(500));
        let access: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|l: &serde_json::Value| l["fields"]["message"] == "access")
            .collect();
        assert_eq!(access.len(), 4, "{lines:#?}");
        let fields = |i: usize, name: &str| access[i]["fields"][name].clone();
        // The client's request id, or one of weir's own; the client; the path.
        assert_eq!(fields(0, "id"), "req-7");
        assert_eq!(fields(1, "id").as_str().unwrap().len(), 16);
        assert_eq!(
            (fields(1, "client"), fields(1, "path")),
            ("127.0.0.1".into(), "/r".into())
        );
        assert_eq!(
            (fields(2, "status"), fields(2, "route"), fields(2, "path")),
            (404.into(), "".into(), "/nowhere".into())
        );
        assert_eq!(
            (fields(3, "status"), fields(3, "outcome")),
            (400.into(), "invalid".into())
        );
        // Whole microseconds: no float noise.
        let latency = fields(1, "latency_ms").as_f64().unwrap();
        assert_eq!((latency * 1000.0).round() / 1000.0, latency, "{latency}");
        assert_eq!(
            (fields(0, "status"), fields(0, "outcome")),
            (502.into(), "admitted".into())
        );
        assert_eq!(
            (fields(1, "status"), fields(1, "outcome")),
            (429.into(), "limited".into())
        );
        assert_eq!(
            (fields(1, "route"), fields(1, "policy")),
            ("GET /r".into(), "one".into())
        );
        assert!(fields(1, "latency_ms").is_f64());
        assert_eq!(
            fields(1, "identity").as_str() == Some("acme"),
            identity,
            "{:?}",
            access[1]
        );
        // log_level = "warn": the upstream's failure is logged, no info line but the access log.
        let infos = lines.iter().filter(|l| {
            l.contains("\"INFO\"") && !l.contains("\"access\"") && !l.contains("weir listening")
        });
        assert_eq!(infos.count(), 0, "{lines:#?}");
    }
}

/// Every thread of the listener serves the last certificate that loaded:
/// rotated to a new pair, then the files written badly, no handshake shows
/// the first pair again (each thread once kept a pair of its own, and one
/// that missed the rotation went back to the first).
#[test]
fn a_bad_certificate_write_keeps_the_last_good_one_on_every_thread() {
    let (first, rotated) = (
        weir_testkit::Certs::new("cli-rotate-first"),
        weir_testkit::Certs::new("cli-rotate-second"),
    );
    let live = weir_testkit::Certs::new("cli-rotate-live");
    for file in ["server.pem", "server-key.pem"] {
        std::fs::copy(first.path(file), live.path(file)).unwrap();
    }
    let both = [first.read("ca.pem"), rotated.read("ca.pem")].concat();
    std::fs::write(first.path("ca.pem"), both).unwrap();
    let config = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
        live.path("server.pem").display(),
        live.path("server-key.pem").display()
    );
    let path = temp("rotate-threads.toml", &config);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shown = || runtime.block_on(first.shown(addr)).unwrap();
    let replace = |file: &str, bytes: &[u8]| {
        let staged = live.path(&format!("{file}.staged"));
        std::fs::write(&staged, bytes).unwrap();
        std::fs::rename(&staged, live.path(file)).unwrap();
    };
    assert_eq!(shown(), first.leaf());
    std::thread::sleep(Duration::from_millis(1_100));
    replace("server.pem", &rotated.read("server.pem"));
    replace("server-key.pem", &rotated.read("server-key.pem"));
    // One handshake that sees the new pair, then the files broken at once.
    let seen = eventually(Duration::from_secs(5), || shown() == rotated.leaf());
    assert!(seen, "the rotated pair is served");
    replace("server-key.pem", b"not a key");
    std::thread::sleep(Duration::from_millis(1_100));
    for _ in 0..20 {
        assert_eq!(
            shown(),
            rotated.leaf(),
            "the last good pair, on every thread"
        );
    }
}

/// At `log_level = "debug"` (envoyproxy/ratelimit's LOG_LEVEL=debug), the
/// Envoy face logs a line per request — its domain, descriptor count and
/// answer, never the entries' values.
#[test]
fn the_envoy_face_logs_each_request_at_debug() {
    let text = "[server]\nenvoy_json = true\nlog_level = \"debug\"\n\n[policies.one]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n[[descriptors]]\ndomain = \"shop\"\nentries = [\"user\"]\npolicy = \"one\"\n";
    let path = temp("envoy-debug.toml", text);
    let mut command = weir();
    command.env_remove("RUST_LOG");
    let server = Server::spawn(command, &["--config", path.to_str().unwrap()]);
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"secret-identity-9"}]}]}"#;
    for expected in [200, 429] {
        assert_eq!(server.request("POST", "/json", body).0, expected);
    }
    let lines = server.logs_for(Duration::from_millis(500));
    let logged: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("rate limit request"))
        .collect();
    assert_eq!(logged.len(), 2, "{lines:#?}");
    assert!(
        logged[1].contains("OVER_LIMIT") && logged[1].contains("shop"),
        "{}",
        logged[1]
    );
    assert!(
        lines.iter().all(|l| !l.contains("secret-identity-9")),
        "{lines:#?}"
    );
}

/// A client certificate refused by an mTLS listener is said at warn (with
/// why), not only at debug: a setup problem its operator must see.
#[test]
fn a_refused_client_certificate_is_logged_with_why() {
    let certs = weir_testkit::Certs::new("cli-mtls-log");
    let config = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
        certs.path("server.pem").display(),
        certs.path("server-key.pem").display(),
        certs.path("ca.pem").display()
    );
    let path = temp("mtls-log.toml", &config);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Without a certificate: refused in the handshake (TLS 1.3: at the
    // first read).
    let _ =
        runtime.block_on(certs.request(addr, false, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    let line = server.wait_for_log("certificate was refused");
    assert!(line.contains("WARN") || line.contains("warn"), "{line}");
}

/// `weir healthcheck` asks a TLS listener: trusting the CA given with
/// `--ca` it passes; without it (the system's roots do not know a test CA)
/// it fails saying why, and `--ca` on a plain URL is refused.
#[test]
fn healthcheck_asks_a_tls_listener() {
    let certs = weir_testkit::Certs::new("cli-healthcheck");
    let config = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n",
        certs.path("server.pem").display(),
        certs.path("server-key.pem").display()
    );
    let path = temp("healthcheck-tls.toml", &config);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let port = server.addr.rsplit(':').next().unwrap();
    let url = format!("https://localhost:{port}/readyz");
    let ca = certs.path("ca.pem");
    let trusted = weir()
        .args(["healthcheck", &url, "--ca", ca.to_str().unwrap()])
        .output()
        .unwrap();
    let said = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(trusted.status.success(), "{}", said(&trusted));
    let untrusted = weir().args(["healthcheck", &url]).output().unwrap();
    assert_eq!(untrusted.status.code(), Some(1), "{}", said(&untrusted));
    assert!(said(&untrusted).contains(&url), "{}", said(&untrusted));
    let plain = format!("http://localhost:{port}/readyz");
    let wrong = weir()
        .args(["healthcheck", &plain, "--ca", ca.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(2), "{}", said(&wrong));
    assert!(said(&wrong).contains("--ca"), "{}", said(&wrong));
}
