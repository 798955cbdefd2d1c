//! Two `weir` processes hammering one key through one Redis never admit
//! more than the policy allows between them.

use std::process::{Command, Stdio};
use std::time::Instant;

#[test]
fn two_processes_share_one_balance() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let url = redis.url();
    let started = Instant::now();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_weir"))
                .args([
                    "bench",
                    "--algorithm",
                    "token-bucket",
                    "--capacity",
                    "20",
                    "--rate",
                    "50/s",
                ])
                .args([
                    "--keys",
                    "1",
                    "--threads",
                    "1",
                    "--concurrency",
                    "8",
                    "--duration",
                    "2s",
                    "--store",
                    &url,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let elapsed = started.elapsed();
    drop(redis);
    let mut admitted = 0u64;
    for output in &outputs {
        assert!(output.status.success());
        let text = String::from_utf8_lossy(&output.stdout);
        let allowed = text
            .split("\"allowed\":")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap();
        admitted += allowed.parse::<u64>().unwrap();
        assert!(text.contains("\"store_errors\":0"), "{text}");
    }
    // C + d·N/P over the whole time both ran (a bound, not a timing claim).
    let bound = 20 + (elapsed.as_secs_f64() * 50.0).ceil() as u64;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 20, "at least the burst: {admitted}");
}
