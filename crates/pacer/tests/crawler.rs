//! The example crawler, run as a user would, against two local servers that
//! record when each request arrives: one plain, one limited by weir (the
//! tower layer answering 429 with Retry-After; `weir serve` is not built yet).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use weir_limiter::{Limiter, Policy};
use weir_tower::{PeerKey, RateLimitLayer};

/// (arrival, path, status, Retry-After seconds)
type Log = Arc<Mutex<Vec<(Instant, String, u16, u64)>>>;

async fn record(State(log): State<Log>, request: Request, next: Next) -> Response {
    let (at, path) = (Instant::now(), request.uri().path().to_owned());
    let response = next.run(request).await;
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    log.lock()
        .unwrap()
        .push((at, path, response.status().as_u16(), retry_after));
    response
}

async fn serve(limited: bool) -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let mut app = Router::new().route("/{page}", get(|| async { "page" }));
    if limited {
        let limiter = Limiter::builder()
            .policy(
                "site",
                Policy::parse("token-bucket capacity=1 rate=1/s").unwrap(),
            )
            .build()
            .unwrap();
        app = app.layer(RateLimitLayer::new(Arc::new(limiter), "site", PeerKey).unwrap());
    }
    let app = app.layer(middleware::from_fn_with_state(log.clone(), record));
    let addr = weir_testkit::serve(app).await;
    (addr, log)
}

fn crawler() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = target.join("examples").join("crawler");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "-p", "weir-pacer", "--example", "crawler"])
            .status()
            .unwrap();
        assert!(built.success());
    }
    path
}

/// Scheduling on a loaded machine moves arrivals by a few milliseconds; the
/// exact guarantee is tested on the paused clock (`pacer.rs`).
const WIRE_TOLERANCE: Duration = Duration::from_millis(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crawler_paces_hosts_and_honours_retry_after() {
    let (plain, plain_log) = serve(false).await;
    let (limited, limited_log) = serve(true).await;
    let mut urls: Vec<String> = (0..4).map(|i| format!("http://{plain}/p{i}")).collect();
    urls.extend((0..3).map(|i| format!("http://{limited}/l{i}")));
    let binary = crawler();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary)
            .args(["--per-host", "4/s", "--global", "6/s"])
            .args(&urls)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let plain_log = plain_log.lock().unwrap().clone();
    let limited_log = limited_log.lock().unwrap().clone();
    // Every URL fetched; the limited host answered some 429s first.
    assert_eq!(plain_log.len(), 4);
    assert!(
        limited_log.iter().any(|e| e.2 == 429),
        "the limited host refused some"
    );
    assert_eq!(limited_log.iter().filter(|e| e.2 == 200).count(), 3);
    // One line per attempt, and the spacing per host at the end.
    let attempts = stdout.lines().filter(|l| l.split(' ').count() == 3).count();
    assert_eq!(attempts, plain_log.len() + limited_log.len(), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("spacing ")).count(),
        2,
        "{stdout}"
    );

    // No host ever saw two requests closer than 250 ms.
    for log in [&plain_log, &limited_log] {
        for pair in log.windows(2) {
            assert!(
                pair[1].0 - pair[0].0 + WIRE_TOLERANCE >= Duration::from_millis(250),
                "{stdout}"
            );
        }
    }
    // The global cap: no two requests anywhere closer than 1/6 s.
    let mut all: Vec<Instant> = plain_log.iter().chain(&limited_log).map(|e| e.0).collect();
    all.sort();
    for pair in all.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap + WIRE_TOLERANCE >= Duration::from_millis(166),
            "global gap {gap:?}\n{stdout}"
        );
    }
    // A 429 is retried no earlier than its Retry-After.
    for (i, refused) in limited_log.iter().enumerate().filter(|(_, e)| e.2 == 429) {
        let retry = limited_log[i + 1..]
            .iter()
            .find(|e| e.1 == refused.1)
            .expect("retried");
        assert!(
            retry.0 - refused.0 + WIRE_TOLERANCE >= Duration::from_secs(refused.3),
            "{stdout}"
        );
    }
}

#[test]
fn bad_urls_exit_2_and_say_why() {
    let output = Command::new(crawler())
        .args(["https://example.org/"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("only http:// URLs"));
}
