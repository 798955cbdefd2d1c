//! Integration tests of the `weir` binary, run as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod crawler;
mod redis;
mod serve;
mod simulate;

/// A `redis-server` of the test's own on a free loopback port; stopped on drop.
pub(crate) struct Redis {
    child: std::process::Child,
    pub(crate) url: String,
}

impl Redis {
    pub(crate) fn start() -> Self {
        use std::process::{Command, Stdio};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        let redis = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        redis
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
