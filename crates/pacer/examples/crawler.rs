//! A polite crawler: every URL fetched with a pace per host and a global
//! cap, 429s and 503s retried no earlier than the server says.
//!
//! ```sh
//! cargo run --release --example crawler -- --per-host 2/s --global 5/s URL…
//! printf 'http://127.0.0.1:8080/a\n' | cargo run --release --example crawler -- -
//! ```
//!
//! Prints one line per attempt (`elapsed_ms host outcome`: an HTTP status,
//! `error (reason)` when no response came, `gave-up (reason)`), then the
//! spacing achieved per host; exits 0 when every URL was fetched, else 1.

use std::collections::{BTreeMap, VecDeque};
use std::io::BufRead;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use weir_core::units::parse_duration;
use weir_core::{Policy, Rate};
use weir_pacer::Pacer;
use weir_pacer::retry::{Next, RetryPolicy, after_failure, next_attempt};

/// A polite crawler: a pace per host and a global cap, 429s, 503s, failed
/// connections and timeouts retried with backoff, never earlier than the
/// server says.
#[derive(Debug, Parser)]
#[command(
    after_help = "Output: one line per attempt, `ELAPSED_MS HOST OUTCOME`, where OUTCOME is \
the HTTP status, `error (REASON)` when no response came (connection failed, \
timed out: retried with the same backoff), or `gave-up (REASON)`; then the \
spacing achieved per host.\n\nExit status: 0 when every URL got a final \
response (anything but 429 or 503), 1 when some URL gave up, 2 on bad \
arguments."
)]
struct Args {
    /// Pace per host: N/DURATION or N/UNIT.
    #[arg(long, default_value = "2/s")]
    per_host: String,
    /// Cap across all hosts.
    #[arg(long, default_value = "5/s")]
    global: String,
    /// Attempts per URL, the first included.
    #[arg(long, default_value_t = 5)]
    attempts: u32,
    /// Stop sending after this long (60s, 1500ms); no limit by default.
    #[arg(long)]
    deadline: Option<String>,
    /// The longest wait for one response (connect and headers).
    #[arg(long, default_value = "10s")]
    timeout: String,
    /// URLs to fetch (http://…), or `-` to read them from stdin, one per line.
    #[arg(required = true)]
    urls: Vec<String>,
}

type Sends = Arc<Mutex<BTreeMap<String, Vec<Duration>>>>;

fn shaper(flag: &str, rate: &str, queue: u64) -> Result<Policy, String> {
    let rate = Rate::parse(rate).map_err(|e| format!("--{flag}: `{rate}` is not valid: {e}"))?;
    Policy::leaky_bucket(rate, queue).map_err(|e| format!("--{flag}: {e}"))
}

/// URLs ordered round-robin across hosts, so one busy host does not take the
/// first slots of every other.
fn interleave(urls: Vec<(String, http::Uri)>) -> Vec<(String, http::Uri)> {
    let mut by_host: BTreeMap<String, VecDeque<(String, http::Uri)>> = BTreeMap::new();
    for (host, uri) in urls {
        by_host
            .entry(host.clone())
            .or_default()
            .push_back((host, uri));
    }
    let mut out = Vec::new();
    while by_host.values().any(|q| !q.is_empty()) {
        for queue in by_host.values_mut() {
            out.extend(queue.pop_front());
        }
    }
    out
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    let mut lines = args.urls.clone();
    if lines == ["-"] {
        lines = std::io::stdin()
            .lock()
            .lines()
            .map_while(Result::ok)
            .collect();
    }
    let mut urls = Vec::new();
    for line in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        let uri: http::Uri = line
            .parse()
            .map_err(|e| format!("`{line}` is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("`{line}`: only http:// URLs are supported"));
        }
        let host = uri
            .authority()
            .map(ToString::to_string)
            .ok_or_else(|| format!("`{line}` has no host"))?;
        urls.push((host, uri));
    }
    let queue = (urls.len() as u64)
        .saturating_mul(u64::from(args.attempts.max(1)))
        .max(1);
    let (per_host, global) = (
        shaper("per-host", &args.per_host, queue)?,
        shaper("global", &args.global, queue)?,
    );
    let pacer = Pacer::builder()
        .per_destination(per_host)
        .and_then(|b| b.global(global))
        .map_err(|e| e.to_string())?;
    let pacer = Arc::new(pacer.build());
    let deadline = match &args.deadline {
        Some(text) => {
            Some(Duration::from_nanos(parse_duration(text).map_err(|e| {
                format!("--deadline: `{text}` is not valid: {e}")
            })?))
        }
        None => None,
    };
    let timeout = Duration::from_nanos(
        parse_duration(&args.timeout)
            .map_err(|e| format!("--timeout: `{}` is not valid: {e}", args.timeout))?,
    );
    let patience = Patience {
        retry: RetryPolicy {
            max_attempts: args.attempts.max(1),
            deadline,
            ..RetryPolicy::default()
        },
        timeout,
    };
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let start = Instant::now();
    let sends: Sends = Arc::default();
    let tasks: Vec<_> = interleave(urls)
        .into_iter()
        .map(|(host, uri)| {
            let (pacer, client, sends) = (pacer.clone(), client.clone(), sends.clone());
            tokio::spawn(async move {
                fetch(&pacer, &client, &sends, patience, start, &host, uri).await
            })
        })
        .collect();
    let mut all_fetched = true;
    for task in tasks {
        all_fetched &= task.await.unwrap_or(false);
    }
    for (host, times) in sends.lock().map_err(|_| "a fetch panicked")?.iter() {
        let gaps: Vec<f64> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .collect();
        let min = gaps.iter().copied().fold(f64::INFINITY, f64::min);
        let mean = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
        match gaps.is_empty() {
            true => println!("spacing {host}: 1 request"),
            false => println!(
                "spacing {host}: {} requests, min gap {min:.1} ms, mean gap {mean:.1} ms",
                times.len()
            ),
        }
    }
    Ok(all_fetched)
}

/// How long to try: retries, and the wait for one response.
#[derive(Debug, Clone, Copy)]
struct Patience {
    retry: RetryPolicy,
    timeout: Duration,
}

/// Fetches one URL, retrying as the server asks; true when it was fetched.
async fn fetch(
    pacer: &Pacer,
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    sends: &Sends,
    Patience {
        retry: policy,
        timeout,
    }: Patience,
    start: Instant,
    host: &str,
    uri: http::Uri,
) -> bool {
    let mut rng = fastrand::Rng::new();
    let first = Instant::now();
    let deadline = policy.deadline.map(|d| first + d);
    for attempt in 1.. {
        let elapsed_ms = |at: Instant| (at - start).as_millis();
        if let Err(e) = pacer.acquire(host, 1, deadline).await {
            println!("{} {host} gave-up ({e})", elapsed_ms(Instant::now()));
            return false;
        }
        let sent = Instant::now();
        if let Ok(mut sends) = sends.lock() {
            sends.entry(host.to_owned()).or_default().push(sent - start);
        }
        let request = http::Request::get(uri.clone())
            .header("user-agent", "weir-crawler")
            .body(Empty::new());
        let request = match request {
            Ok(request) => request,
            Err(e) => {
                println!("{} {host} error ({e})", elapsed_ms(sent));
                return false;
            }
        };
        let failure = match tokio::time::timeout(timeout, client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(format!("{e:?}")),
            Err(_) => Err(format!("no response within {timeout:?}")),
        };
        let response = match failure {
            Ok(response) => response,
            Err(reason) => {
                println!("{} {host} error ({reason})", elapsed_ms(sent));
                match after_failure(&policy, attempt, first.elapsed(), &mut rng) {
                    Next::Retry(wait) => {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    Next::GiveUp(why) => {
                        println!("{} {host} gave-up ({why:?})", elapsed_ms(Instant::now()));
                        return false;
                    }
                    Next::Done => return false,
                }
            }
        };
        let (parts, body) = response.into_parts();
        let _ = body.collect().await; // read it all, so the connection is reused
        println!("{} {host} {}", elapsed_ms(sent), parts.status.as_u16());
        let now = SystemTime::now();
        match next_attempt(
            &policy,
            attempt,
            parts.status,
            &parts.headers,
            first.elapsed(),
            now,
            &mut rng,
        ) {
            Next::Done => return true,
            Next::GiveUp(why) => {
                println!("{} {host} gave-up ({why:?})", elapsed_ms(Instant::now()));
                return false;
            }
            Next::Retry(wait) => tokio::time::sleep(wait).await,
        }
    }
    false
}
