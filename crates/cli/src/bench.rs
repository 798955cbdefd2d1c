//! `weir bench`: a closed loop of checks on a store (in process, or Redis
//! with `--store`), from several threads over many keys; one JSON object out.
//! With a concurrency policy, each decision is a pair: a check, and the
//! release of the lease it took.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use hdrhistogram::Histogram;
use weir_core::units::parse_duration;
use weir_limiter::Limiter;

use crate::policy_flags::PolicyFlags;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    policy: PolicyFlags,
    /// Distinct keys, checked in turn.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Threads checking at once.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// How long to run (an integer and a unit: 5s, 500ms).
    #[arg(long, default_value = "5s")]
    duration: String,
    /// The cost of each check.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The key budget of the store.
    #[arg(long, default_value_t = weir_limiter::DEFAULT_MAX_KEYS)]
    max_keys: usize,
    /// `memory` (the in-process store), or a `redis://` / `redis-cluster://` URL.
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// With a Redis store: checks in flight at once (pipelined on one
    /// multiplexed connection).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// The percentage of checks (0–100) made by ten flooding identities,
    /// checked so often that they stay over their limit; the rest walk
    /// `--keys` as usual.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100))]
    over_limit: u64,
    /// With a Redis store: send every check to Redis, even one Redis has
    /// already promised to refuse (the refusal cache is on by default).
    #[arg(long)]
    no_refusal_cache: bool,
}

/// One latency sample every this many checks (timing each would double the
/// cost of the fastest checks).
const SAMPLE_EVERY: u64 = 16;

#[derive(Debug)]
struct Tally {
    decisions: u64,
    allowed: u64,
    refused: u64,
    latency: Histogram<u64>,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let policy = args
        .policy
        .policy()?
        .ok_or_else(|| anyhow!("--algorithm is required"))?;
    let duration = parse_duration(&args.duration)
        .map_err(|e| anyhow!("--duration: `{}` is not valid: {e}", args.duration))?;
    if args.keys == 0 || args.threads == 0 {
        return Err(anyhow!("--keys and --threads must be at least 1"));
    }
    policy
        .validate_cost(args.cost)
        .map_err(|e| anyhow!("--cost: {e}"))?;
    if args.store != "memory" {
        return run_redis(args, policy, duration);
    }
    let limiter = Arc::new(
        Limiter::builder()
            .policy("bench", policy)
            .max_keys(args.max_keys)
            .build()?,
    );
    let keys: Arc<Vec<String>> = Arc::new((0..args.keys).map(|i| format!("key-{i}")).collect());
    let deadline = Instant::now() + Duration::from_nanos(duration);
    let start = Instant::now();
    let workers: Vec<_> = (0..args.threads)
        .map(|t| {
            let (limiter, keys, cost) = (limiter.clone(), keys.clone(), args.cost);
            thread::spawn(move || work(&limiter, &keys, cost, t, deadline))
        })
        .collect();
    let total = Tally::joined(workers)?;
    let extra =
        serde_json::json!({ "refused_new_keys": total.refused, "keys_stored": limiter.len() });
    let report = total.report(&policy, args, start.elapsed().as_secs_f64(), extra);
    println!("{report}");
    // A run whose calls failed did not measure what it says: an error.
    if total.refused > 0 {
        bail!(
            "{} of {} checks failed at the store ({}): the rates above count only the {} decided",
            total.refused,
            total.decisions,
            weir_redis::redacted(&args.store),
            total.decisions - total.refused
        );
    }
    Ok(())
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            decisions: 0,
            allowed: 0,
            refused: 0,
            latency: histogram()?,
        })
    }

    /// The sum of what `threads` counted.
    fn joined(threads: Vec<thread::JoinHandle<anyhow::Result<Self>>>) -> anyhow::Result<Self> {
        let mut total = Self::new()?;
        for thread in threads {
            total.add(
                &thread
                    .join()
                    .map_err(|_| anyhow!("a bench thread panicked"))??,
            )?;
        }
        Ok(total)
    }

    fn add(&mut self, other: &Self) -> anyhow::Result<()> {
        self.decisions += other.decisions;
        self.allowed += other.allowed;
        self.refused += other.refused;
        self.latency
            .add(&other.latency)
            .context("merging latencies")
    }

    /// The JSON report: the common fields, then `extra`.
    fn report(
        &self,
        policy: &weir_core::Policy,
        args: &Args,
        seconds: f64,
        extra: serde_json::Value,
    ) -> serde_json::Value {
        let mut report = serde_json::json!({
            "policy": policy.to_string(),
            "keys": args.keys,
            "threads": args.threads,
            "decisions": self.decisions - self.refused,
            "seconds": seconds,
            // Only what was decided: a failed call is not a decision.
            "decisions_per_sec": (self.decisions - self.refused) as f64 / seconds,
            "allowed": self.allowed,
            "rejected": self.decisions - self.allowed - self.refused,
            "p50_ns": self.latency.value_at_quantile(0.5),
            "p99_ns": self.latency.value_at_quantile(0.99),
            "peak_rss_bytes": peak_rss_bytes(),
        });
        if let (Some(report), serde_json::Value::Object(extra)) = (report.as_object_mut(), extra) {
            report.extend(extra);
        }
        report
    }
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("latency histogram")
}

fn work(
    limiter: &Limiter,
    keys: &[String],
    cost: u64,
    thread: usize,
    deadline: Instant,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new()?;
    let bench = limiter.policy("bench")?;
    // Each thread walks all keys in order from its own starting point: the
    // harness's reads are sequential, the store's are random (hashed).
    let mut i = thread * 7919 % keys.len();
    loop {
        for _ in 0..1024 {
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            let sampled = tally.decisions % SAMPLE_EVERY == 0;
            let began = sampled.then(Instant::now);
            match limiter.check(&keys[i], cost) {
                Ok(d) => {
                    tally.allowed += u64::from(d.allowed);
                    // A concurrency policy's pair: the lease released.
                    if let Some(lease) = d.lease {
                        limiter.release(bench, &keys[i], lease)?;
                    }
                }
                Err(weir_limiter::Error::TooManyKeys { .. }) => tally.refused += 1,
                Err(e) => return Err(e.into()),
            }
            if let Some(began) = began {
                let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                tally.latency.saturating_record(ns.max(1));
            }
            tally.decisions += 1;
        }
        if Instant::now() >= deadline {
            return Ok(tally);
        }
    }
}

/// The process's peak resident set (`VmHWM`), in bytes; 0 where unknown.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// The same closed loop against a Redis store, on the Redis clock:
/// `concurrency` checks in flight, spread over `threads` threads, each a
/// current-thread runtime with a store (a multiplexed connection and its
/// batches) of its own — as a server with a runtime per core would.
fn run_redis(args: &Args, policy: weir_core::Policy, duration: u64) -> anyhow::Result<()> {
    let keys: Arc<Vec<String>> = Arc::new((0..args.keys).map(|i| format!("key-{i}")).collect());
    let deadline = Instant::now() + Duration::from_nanos(duration);
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads)
        .map(|thread| {
            let keys = keys.clone();
            let (url, cache) = (args.store.clone(), !args.no_refusal_cache);
            let (cost, over_limit) = (args.cost, args.over_limit);
            // This thread's share of the checks in flight.
            let tasks: Vec<usize> = (0..args.concurrency.max(1))
                .filter(|t| t % args.threads == thread)
                .collect();
            thread::spawn(move || -> anyhow::Result<Tally> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let store = crate::store_flag::redis_store(&url)
                        .await?
                        .with_timeout(Duration::from_secs(1))
                        .with_refusal_cache(cache);
                    let tasks: Vec<_> = tasks
                        .into_iter()
                        .map(|t| {
                            let (store, keys) = (store.clone(), keys.clone());
                            tokio::spawn(closed_loop(
                                store,
                                policy,
                                keys,
                                (cost, over_limit),
                                t,
                                deadline,
                            ))
                        })
                        .collect();
                    let mut total = Tally::new()?;
                    for task in tasks {
                        total.add(&task.await??)?;
                    }
                    Ok(total)
                })
            })
        })
        .collect();
    let total = Tally::joined(threads)?;
    let extra = serde_json::json!({
        "store": args.store, "concurrency": args.concurrency, "store_errors": total.refused,
        "refusal_cache": !args.no_refusal_cache, "over_limit_percent": args.over_limit,
    });
    let report = total.report(&policy, args, start.elapsed().as_secs_f64(), extra);
    println!("{report}");
    // A run whose calls failed did not measure what it says: an error.
    if total.refused > 0 {
        bail!(
            "{} of {} checks failed at the store ({}): the rates above count only the {} decided",
            total.refused,
            total.decisions,
            weir_redis::redacted(&args.store),
            total.decisions - total.refused
        );
    }
    Ok(())
}

/// One check in flight at a time until `deadline`: `over_limit` percent of
/// them by ten flooding identities, the rest walking `keys`.
async fn closed_loop(
    store: weir_redis::RedisStore,
    policy: weir_core::Policy,
    keys: Arc<Vec<String>>,
    (cost, over_limit): (u64, u64),
    task: usize,
    deadline: Instant,
) -> anyhow::Result<Tally> {
    let flood: Vec<String> = (0..10).map(|i| format!("flood-{i}")).collect();
    let mut tally = Tally::new()?;
    let mut i = task * 7919 % keys.len();
    while Instant::now() < deadline {
        let n = tally.decisions + task as u64;
        let key = match n % 100 < over_limit {
            true => &flood[n as usize % flood.len()],
            false => {
                i = (i + 1) % keys.len();
                &keys[i]
            }
        };
        let began = Instant::now();
        let mut decision = store.check("bench", &policy, key, cost, None).await;
        // A concurrency policy's pair: the lease released.
        if let Ok(weir_core::Decision {
            lease: Some(lease), ..
        }) = decision
        {
            let release = weir_redis::LeaseOp::Release(lease);
            let released = store.on_lease("bench", &policy, key, release, None).await;
            decision = decision.and_then(|d| released.map(|_| d));
        }
        let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        tally.latency.saturating_record(ns.max(1));
        match decision {
            Ok(d) => tally.allowed += u64::from(d.allowed),
            Err(_) => tally.refused += 1,
        }
        tally.decisions += 1;
    }
    Ok(tally)
}
