//! The example crawler against `weir serve` answering 429 in front of a plain
//! upstream: every page is fetched in the end, politely.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// A minimal upstream: answers every request `200 ok`, recording its path.
fn upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut first = String::new();
                    if reader.read_line(&mut first).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 2 {
                        line.clear();
                    }
                    log.lock()
                        .unwrap()
                        .push(first.split(' ').nth(1).unwrap_or("").to_owned());
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                }
            });
        }
    });
    (addr, seen)
}

fn crawler() -> PathBuf {
    let weir = PathBuf::from(env!("CARGO_BIN_EXE_weir"));
    let path = weir.parent().unwrap().join("examples").join("crawler");
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

#[test]
fn the_crawler_gets_every_page_past_weir_serve() {
    let (up, seen) = upstream();
    let config = format!(
        "[policies.site]\nalgorithm = \"token-bucket\"\ncapacity = 1\nrate = \"2/s\"\n\n\
         [[routes]]\nmatch = \"GET /{{page}}\"\nidentity = \"peer\"\npolicies = [\"site\"]\nupstream = \"http://{up}\"\n"
    );
    let dir = std::env::temp_dir().join(format!("weir-crawl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("weir.toml");
    std::fs::write(&file, config).unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(serve.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "weir serve started"
        );
        if let Some(addr) = line.trim().strip_prefix("weir listening on http://") {
            break addr.to_owned();
        }
    };
    let urls: Vec<String> = (0..4).map(|i| format!("http://{addr}/page{i}")).collect();
    let output = Command::new(crawler())
        .args(["--per-host", "4/s", "--global", "10/s"])
        .args(&urls)
        .output()
        .unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut pages = seen.lock().unwrap().clone();
    pages.sort();
    assert_eq!(pages, ["/page0", "/page1", "/page2", "/page3"], "{stdout}");
    let attempts: Vec<(u64, u16)> = stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((f.next()?.parse().ok()?, f.nth(1)?.parse().ok()?))
        })
        .collect();
    assert!(
        attempts.iter().any(|a| a.1 == 429),
        "weir refused some: {stdout}"
    );
    // One host: its attempts are at least a pace (250 ms) apart, give or
    // take the scheduling of two processes.
    let mut times: Vec<u64> = attempts.iter().map(|a| a.0).collect();
    times.sort_unstable();
    assert!(times.windows(2).all(|w| w[1] - w[0] >= 230), "{stdout}");
}

#[test]
fn connection_failures_say_error_and_are_retried() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = Command::new(crawler())
        .args(["--per-host", "100/s", "--attempts", "3"])
        .arg(format!("http://127.0.0.1:{port}/x"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let outcomes: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("spacing"))
        .filter_map(|l| l.split(' ').nth(2))
        .collect();
    assert_eq!(outcomes, ["error", "error", "error", "gave-up"], "{stdout}");
    let help = Command::new(crawler()).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit status: 0 when"));
}
