//! `weir serve --resp`: the Redis protocol asked by real clients —
//! `redis-cli`, and redis-py running the README's example
//! (`docs/resp/example.py`) as written.

use std::process::Command;

use weir_testkit::free_port;

use crate::serve::Server;

/// Waits until `port` takes connections.
fn up(port: u16) {
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the RESP listener did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn redis_cli_and_redis_py_ask_weir() {
    let port = free_port();
    let _weir = Server::start(&["--resp", &format!("127.0.0.1:{port}")]);
    up(port);
    let cli = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "CL.THROTTLE",
            "cli-user",
            "15",
            "30",
            "60",
            "1",
        ])
        .output()
        .expect("redis-cli runs (tools/test.sh installs it)");
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "0\n16\n15\n-1\n2\n");
    let found = Command::new("python3")
        .args(["-c", "import redis"])
        .status();
    if !found.is_ok_and(|s| s.success()) {
        weir_testkit::missing(
            "resp-redis-py",
            "no redis-py for python3 (pip install redis)",
        );
        return;
    }
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/resp/example.py");
    let py = Command::new("python3")
        .args([example, &port.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&py.stdout);
    let stderr = String::from_utf8_lossy(&py.stderr);
    // user123's first request (redis-cli asked for another key); the
    // built-in example's api policy admits 10 at once of the 12 asked.
    assert_eq!(
        stdout, "CL.THROTTLE 0 16 15 -1 2\nWEIR.CHECK 0 0 True\n",
        "{stderr}"
    );
    assert!(stderr.is_empty(), "{stderr}");
}
