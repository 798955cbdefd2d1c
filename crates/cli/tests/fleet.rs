//! One hot key across a fleet (`docs/envoy/rlqs.yaml`, `rlqs.toml`): two
//! real Envoys with the `rate_limit_quota` filter, granted local buckets by
//! `weir serve` over the Rate Limit Quota Service, with skewed demand that
//! moves from one to the other, and the first killed mid-grant. Every
//! admission is recorded where it lands
//! (the upstream), and the count over every window is checked against one
//! bucket's bound, `C + L·N/P` (docs/SPEC.md, "Fleet grants").

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_testkit::free_port;

use crate::envoy::{call, envoy};
use crate::serve::{Server, temp};

/// An upstream that answers `200 ok` and records when each request came.
fn recording_upstream() -> (u16, Arc<Mutex<Vec<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let record = record.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                record.lock().unwrap().push(Instant::now());
                let mut stream = stream;
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    (port, seen)
}

/// The test's policy: 300 tokens, 20 a second, grants of 10 s.
const CAPACITY: u128 = 300;
const RATE: u128 = 20;

#[test]
fn a_fleet_of_envoys_admits_no_more_than_one_bucket() {
    let (grpc, upstream) = (free_port(), recording_upstream());
    let (port, seen) = upstream;
    let yaml = include_str!("../../../docs/envoy/rlqs.yaml")
        .replace("port_value: 9000", &format!("port_value: {port}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"));
    let (a_port, b_port) = (free_port(), free_port());
    let Some(a) = envoy("fleet-a", &yaml, a_port) else {
        return;
    };
    let Some(_b) = envoy("fleet-b", &yaml, b_port) else {
        return;
    };
    let toml = include_str!("../../../docs/envoy/rlqs.toml")
        .replace("capacity = 2000", &format!("capacity = {CAPACITY}"))
        .replace("rate = \"100/s\"", &format!("rate = \"{RATE}/s\""));
    assert!(
        toml.contains("capacity = 300"),
        "the example's numbers moved"
    );
    let weir = Server::start(&[
        "--config",
        temp("fleet.toml", &toml).to_str().unwrap(),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ]);
    let hot = |port: u16| call(port, "GET /", "x-tenant: acme\r\n", "").0;
    // Each Envoy is up and holds a grant: its first request is refused
    // (no assignment yet), a later one admitted.
    for port in [a_port, b_port] {
        let started = Instant::now();
        while hot(port) != 200 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no grant reached Envoy {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Skewed demand that moves: three senders on A and one on B for 8 s,
    // then the other way round for 8 s.
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(Mutex::new([0u64; 2]));
    let sender = |port: u16, which: usize, from: Duration, until: Duration| {
        let (stop, admitted) = (stop.clone(), admitted.clone());
        let start = Instant::now();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && start.elapsed() < until {
                if start.elapsed() < from {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                if call(port, "GET /", "x-tenant: acme\r\n", "").0 == 200 {
                    admitted.lock().unwrap()[which] += 1;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let (half, whole) = (Duration::from_secs(8), Duration::from_secs(16));
    let mut threads = Vec::new();
    for _ in 0..3 {
        threads.push(sender(a_port, 0, Duration::ZERO, half));
        threads.push(sender(b_port, 1, half, whole));
    }
    threads.push(sender(b_port, 1, Duration::ZERO, half));
    threads.push(sender(a_port, 0, half, whole));
    // Envoy A killed mid-grant, 4 s into B's turn: its grant stays
    // reserved until it expires, and B gets the rate after.
    std::thread::sleep(half + Duration::from_secs(4));
    drop(a);
    for thread in threads {
        thread.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let times = seen.lock().unwrap().clone();
    let first = times[0];
    // Every window between two admissions, widened by what delivery may
    // shift (the upstream sees an admission a little after Envoy made it).
    let jitter = Duration::from_millis(50);
    let mut worst = 0f64;
    for (i, a) in times.iter().enumerate() {
        for (n, b) in times[i..].iter().enumerate() {
            let length = b.duration_since(*a) + jitter;
            let count = (n + 1) as u128;
            let bound = CAPACITY * 1_000_000_000 + RATE * length.as_nanos();
            assert!(
                count * 1_000_000_000 <= bound,
                "{count} admitted within {length:?}: more than {CAPACITY} + {RATE}/s over it"
            );
            worst = worst.max(count as f64 * 1e9 / bound as f64);
        }
    }
    let [by_a, by_b] = *admitted.lock().unwrap();
    let span = times.last().unwrap().duration_since(first).as_secs_f64();
    let most = CAPACITY as f64 + RATE as f64 * span;
    eprintln!(
        "fleet: {} admitted in {span:.1} s (A {by_a}, B {by_b}); one bucket's bound over it {most:.0}: {:.0} % of it; the fullest window reached {:.0} % of its bound",
        times.len(),
        100.0 * times.len() as f64 / most,
        100.0 * worst
    );
    assert!(by_a > 0 && by_b > 0, "both Envoys admitted");
    drop(weir);
}
