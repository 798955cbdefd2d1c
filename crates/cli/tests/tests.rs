//! Integration tests of the `weir` binary, run as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod crawler;
mod faults;
mod redis;
mod serve;
mod simulate;

/// A `redis-server` of the test's own on a free loopback port; stopped on drop.
pub(crate) struct Redis {
    child: std::process::Child,
    port: u16,
    pub(crate) url: String,
}

impl Redis {
    pub(crate) fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self {
            child: Self::spawn(port),
            port,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }

    fn spawn(port: u16) -> std::process::Child {
        use std::process::{Command, Stdio};
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        child
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server.
    pub(crate) fn signal(&self, name: &str) {
        signal(self.pid(), name);
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server; its data is gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts an empty server on the same port.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.child = Self::spawn(self.port);
    }

    /// Runs `redis-cli ARGS…` against the server; its output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed (.ci/run installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.signal_quietly();
        self.kill();
    }
}

impl Redis {
    fn signal_quietly(&self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
    }
}

/// Sends the signal `name` (`STOP`, `CONT`, …) to `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
