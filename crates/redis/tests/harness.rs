//! Starts `redis-server` processes on free loopback ports.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) struct RedisServer {
    child: Child,
    pub(crate) port: u16,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

impl RedisServer {
    pub(crate) fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("weir-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        // From here on, dropping `server` stops the process.
        let server = Self { child, port, dir };
        for _ in 0..200 {
            if ping(port) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on {port} did not answer");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters, slots spread by `redis-cli --cluster create`.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<RedisServer>,
}

impl Cluster {
    pub(crate) fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli is installed");
        assert!(created.success());
        for _ in 0..200 {
            let info = Command::new("redis-cli")
                .args(["-p", &nodes[0].port.to_string(), "cluster", "info"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                std::thread::sleep(Duration::from_millis(200));
                return Self { nodes };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not come up");
    }

    pub(crate) fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }
}
