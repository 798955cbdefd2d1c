//! A small gRPC load generator for `ShouldRateLimit` (`ghz` is not packaged
//! here). Against a running `weir serve --grpc ADDR`, or, without `--addr`,
//! a server started in this process on the example descriptor config.
//!
//! ```sh
//! cargo bench -p weir-server --bench grpc_load -- [--addr 127.0.0.1:8081] \
//!     [--concurrency 64] [--connections 4] [--seconds 10] [--keys 10000]
//! ```
//!
//! Prints requests per second, latency percentiles, the codes returned and
//! this generator's own CPU time per call (`client_cpu_us`, on Linux; with
//! no `--addr` it counts the server in this process too). On a machine
//! whose cores the generator shares with the server, that cost bounds any
//! server's rate: no server can answer more than `cores / (client + server
//! CPU per call)` calls a second.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const CONFIG: &str = r#"
[policies.seller]
algorithm = "token-bucket"
capacity = 100
rate = "50/s"

[[descriptors]]
domain = "bench"
entries = ["seller"]
policy = "seller"
"#;

struct Args {
    addr: Option<String>,
    concurrency: usize,
    connections: usize,
    seconds: u64,
    keys: u64,
}

fn args() -> Args {
    let mut args = Args {
        addr: None,
        concurrency: 64,
        connections: 4,
        seconds: 10,
        keys: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => args.addr = Some(value()),
            "--concurrency" => args.concurrency = value().parse().expect("--concurrency N"),
            "--connections" => args.connections = value().parse().expect("--connections N"),
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--keys" => args.keys = value().parse().expect("--keys N"),
            "--bench" => {}
            other => panic!(
                "unknown flag {other} (--addr, --concurrency, --connections, --seconds, --keys)"
            ),
        }
    }
    args
}

#[tokio::main]
async fn main() {
    let args = args();
    let addr = match &args.addr {
        Some(addr) => addr.clone(),
        None => {
            let config = weir_server::config::parse(CONFIG, &Default::default()).unwrap();
            let state = weir_server::AppState::new(weir_server::Shared::new(config, None).unwrap());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            tokio::spawn(weir_server::run_grpc(
                listener,
                state,
                std::future::pending(),
            ));
            addr
        }
    };
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("the rate limit service answers");
        channels.push(channel);
    }
    let cpu_before = cpu_ticks();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let workers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let mut client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
            let keys = args.keys.max(1);
            tokio::spawn(async move {
                let mut latencies = hdrhistogram::Histogram::<u64>::new(3).unwrap();
                let (mut ok, mut over, mut failed) = (0u64, 0u64, 0u64);
                let mut n = i as u64;
                while Instant::now() < deadline {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let request = RateLimitRequest {
                        domain: "bench".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "seller".into(),
                                value: (n % keys).to_string(),
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 0,
                    };
                    let started = Instant::now();
                    match client.should_rate_limit(request).await {
                        Ok(r) if r.get_ref().overall_code == 1 => ok += 1,
                        Ok(_) => over += 1,
                        Err(_) => failed += 1,
                    }
                    let _ = latencies.record(started.elapsed().as_micros() as u64);
                }
                (latencies, ok, over, failed)
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let (mut ok, mut over, mut failed) = (0, 0, 0);
    for worker in workers {
        let (latencies, o, v, f) = worker.await.unwrap();
        all.add(latencies).unwrap();
        (ok, over, failed) = (ok + o, over + v, failed + f);
    }
    let elapsed = started.elapsed().as_secs_f64().max(args.seconds as f64);
    let total = ok + over + failed;
    let client_cpu_us = match (cpu_before, cpu_ticks()) {
        (Some(before), Some(after)) => format!(
            "{:.1}",
            after.saturating_sub(before) as f64 * 1e6 / USER_HZ / total.max(1) as f64
        ),
        _ => "null".into(),
    };
    println!(
        "{{\"requests\": {total}, \"per_second\": {:.0}, \"ok\": {ok}, \"over_limit\": {over}, \"failed\": {failed}, \
         \"p50_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"max_us\": {}, \"concurrency\": {}, \"connections\": {}, \"client_cpu_us\": {client_cpu_us}}}",
        total as f64 / elapsed,
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99),
        all.value_at_quantile(0.999),
        all.max(),
        args.concurrency,
        args.connections
    );
}

/// The clock ticks of `/proc/[pid]/stat` (Linux's `USER_HZ`, 100 a second
/// on every architecture this runs on).
const USER_HZ: f64 = 100.0;

/// This process's CPU time (user + system) so far, in ticks, on Linux.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may
    // hold spaces: utime and stime are the 12th and 13th of them.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}
