//! `redis-server` processes of the test's own, stopped on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Stops the test with one line when `program` is not installed.
pub fn require(program: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    if !found {
        panic!(
            "`{program}` is not installed: run `tools/test.sh` (installs it), or `apt-get install redis-server redis-tools`"
        );
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free and
/// valid too, as `redis-server --cluster-enabled yes` needs.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port <= u16::MAX - 10_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
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

/// A `redis-server` on a free loopback port, with no persistence and the
/// `DEBUG` command enabled.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    /// Its port.
    pub port: u16,
    extra: Vec<String>,
    dir: PathBuf,
    /// Over TLS only (no plaintext port).
    tls: bool,
    /// What `redis-cli` needs to reach it (over TLS: the CA and a client
    /// certificate).
    cli_args: Vec<String>,
}

impl RedisServer {
    /// Starts one, with `extra` arguments, and waits until it answers.
    pub fn start(extra: &[&str]) -> Self {
        Self::launch(extra.iter().map(|s| (*s).to_owned()).collect(), false)
    }

    /// Starts one that speaks TLS only, with `certs`' server certificate,
    /// requiring clients to show a certificate of its CA, with `extra`
    /// arguments (`--requirepass`, `--user`…).
    pub fn start_tls(certs: &crate::Certs, extra: &[&str]) -> Self {
        let path = |f: &str| certs.path(f).display().to_string();
        let mut args: Vec<String> = [
            ("--tls-cert-file", path("server.pem")),
            ("--tls-key-file", path("server-key.pem")),
            ("--tls-ca-cert-file", path("ca.pem")),
            ("--tls-auth-clients", "yes".to_owned()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut server = Self::launch(args, true);
        server.cli_args = vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            path("ca.pem"),
            "--cert".to_owned(),
            path("client.pem"),
            "--key".to_owned(),
            path("client-key.pem"),
        ];
        server
    }

    fn launch(extra: Vec<String>, tls: bool) -> Self {
        require("redis-server");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("weir-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            child: Command::new("true").spawn().unwrap(),
            port,
            extra,
            dir,
            tls,
            cli_args: Vec::new(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let ports = match self.tls {
            true => vec!["--port", "0", "--tls-port", &port],
            false => vec!["--port", &port],
        };
        self.child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        for _ in 0..400 {
            // Over TLS, listening is enough: the handshake is the test's.
            let up = match self.tls {
                true => TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
                false => ping(self.port),
            };
            if up {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not answer", self.port);
    }

    /// `redis://127.0.0.1:PORT` (`rediss://localhost:PORT` over TLS).
    pub fn url(&self) -> String {
        match self.tls {
            true => format!("rediss://localhost:{}", self.port),
            false => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the signal `name` (`STOP`, `CONT`, …) to the server.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} {}", self.pid());
    }

    /// Kills the server; its data is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts an empty server on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli -p PORT ARGS…`; its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        require("redis-cli");
        let out = Command::new("redis-cli")
            .args(&self.cli_args)
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped (SIGSTOP) server must be continued to die promptly.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How every cluster node runs.
const CLUSTER_NODE: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "1000",
    // Replicas in sync at once, not after 5 s.
    "--repl-diskless-sync-delay",
    "0",
    // A master down stops only its own slots, not the cluster
    // (docs/RELIABILITY.md).
    "--cluster-require-full-coverage",
    "no",
];

/// `redis-cli --cluster ARGS…`: whether it succeeded, and what it said.
fn try_cluster_cli(args: &[&str]) -> (bool, String) {
    let done = Command::new("redis-cli")
        .arg("--cluster")
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&done.stdout).into_owned();
    (done.status.success() && !said.contains("[ERR]"), said)
}

/// `redis-cli --cluster ARGS…`, which must succeed — tried again while the
/// nodes still converge (a few seconds at most).
fn cluster_cli(args: &[&str]) {
    let mut said = String::new();
    for _ in 0..30 {
        let (ok, out) = try_cluster_cli(args);
        if ok {
            return;
        }
        said = out;
        std::thread::sleep(Duration::from_millis(200));
        // A move cut short leaves its slot open: close it first.
        if let Some(node) = args.get(1).filter(|_| said.contains("open")) {
            try_cluster_cli(&["fix", node, "--cluster-yes"]);
        }
    }
    panic!("redis-cli --cluster {args:?}: {said}");
}

/// A Redis Cluster of three masters, slots spread by `redis-cli --cluster
/// create`.
#[derive(Debug)]
pub struct Cluster {
    /// The masters.
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Starts the three nodes, creates the cluster and waits until it is ok.
    pub fn start() -> Self {
        Self::with_replicas(3, 0)
    }

    /// `masters` masters with `replicas` replicas each (`nodes` holds them
    /// all, as `redis-cli --cluster create` paired them).
    pub fn with_replicas(masters: usize, replicas: usize) -> Self {
        let nodes = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start(CLUSTER_NODE))
            .collect();
        Self::create(nodes, replicas)
    }

    /// Three masters, each started with `extra` arguments too.
    pub fn start_with(extra: &[&str]) -> Self {
        let node: Vec<&str> = CLUSTER_NODE.iter().chain(extra).copied().collect();
        let nodes = (0..3).map(|_| RedisServer::start(&node)).collect();
        Self::create(nodes, 0)
    }

    /// Three masters speaking TLS only, among themselves too (`certs`'
    /// server certificate, clients' certificates required).
    pub fn start_tls(certs: &crate::Certs) -> Self {
        let node: Vec<&str> = CLUSTER_NODE
            .iter()
            .copied()
            .chain(["--tls-cluster", "yes"])
            .collect();
        let nodes = (0..3)
            .map(|_| RedisServer::start_tls(certs, &node))
            .collect();
        Self::create(nodes, 0)
    }

    fn create(nodes: Vec<RedisServer>, replicas: usize) -> Self {
        require("redis-cli");
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(&nodes[0].cli_args)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create {addrs:?}");
        for _ in 0..200 {
            // Up, and every replica in sync with its master.
            let ok = nodes.iter().all(|n| {
                let synced = n.cli(&["info", "replication"]);
                n.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && (synced.contains("role:master") || synced.contains("master_link_status:up"))
            });
            if ok {
                std::thread::sleep(Duration::from_millis(200));
                return Self { nodes };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not come up");
    }

    /// The masters and their slot ranges, as the node `asker` sees them
    /// (`CLUSTER NODES`; failed masters left out): indexes in `nodes`.
    pub fn masters(&self, asker: usize) -> Vec<(usize, Vec<(u16, u16)>)> {
        let nodes = self.nodes[asker].cli(&["cluster", "nodes"]);
        let mut masters = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse::<u16>().ok());
            let Some(index) = self.nodes.iter().position(|n| Some(n.port) == port) else {
                continue;
            };
            let ranges = fields[8..]
                .iter()
                .filter_map(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            masters.push((index, ranges));
        }
        masters
    }

    /// A replica of the master `master`, as the node `asker` sees it.
    pub fn replica_of(&self, master: usize, asker: usize) -> Option<usize> {
        let nodes = self.nodes[asker].cli(&["cluster", "nodes"]);
        let index = |addr: &str| {
            let port = addr.split(['@', ':']).nth(1)?.parse::<u16>().ok()?;
            self.nodes.iter().position(|n| n.port == port)
        };
        let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
        let id = lines
            .iter()
            .find(|f| f.len() > 3 && index(f[1]) == Some(master))?[0];
        lines
            .iter()
            .find(|f| f.len() > 3 && f[2].contains("slave") && f[3] == id)
            .and_then(|f| index(f[1]))
    }

    /// The master serving `slot`, as the node `asker` sees it.
    pub fn master_of(&self, slot: u16, asker: usize) -> Option<usize> {
        self.masters(asker)
            .into_iter()
            .find(|(_, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|(index, _)| index)
    }

    /// Adds an empty master; its index in `nodes`.
    pub fn add_master(&mut self) -> usize {
        let node = RedisServer::start(CLUSTER_NODE);
        let (new, known) = (
            format!("127.0.0.1:{}", node.port),
            format!("127.0.0.1:{}", self.nodes[0].port),
        );
        cluster_cli(&["add-node", &new, &known]);
        self.nodes.push(node);
        let index = self.nodes.len() - 1;
        for _ in 0..200 {
            if self.masters(0).iter().any(|(i, _)| *i == index) || self.knows(index) {
                return index;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the new master never joined");
    }

    fn knows(&self, index: usize) -> bool {
        let port = self.nodes[index].port.to_string();
        self.nodes[0]
            .cli(&["cluster", "nodes"])
            .contains(&format!(":{port}@"))
    }

    /// Moves slots until every master (empty ones too) has its share.
    pub fn rebalance(&self) {
        let known = format!("127.0.0.1:{}", self.nodes[0].port);
        cluster_cli(&[
            "rebalance",
            &known,
            "--cluster-use-empty-masters",
            "--cluster-yes",
        ]);
    }

    /// Moves every slot off the master `index`, then takes it out of the
    /// cluster (asking the node `asker`).
    pub fn remove_master(&self, index: usize, asker: usize) {
        let id = self.nodes[index].cli(&["cluster", "myid"]);
        let id = id.trim();
        let known = format!("127.0.0.1:{}", self.nodes[asker].port);
        cluster_cli(&[
            "rebalance",
            &known,
            "--cluster-weight",
            &format!("{id}=0"),
            "--cluster-yes",
        ]);
        cluster_cli(&["del-node", &known, id]);
    }

    /// `redis-cluster://HOST:PORT,HOST:PORT,HOST:PORT`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_ports_leave_room_for_the_bus() {
        for _ in 0..200 {
            assert!(super::free_port() <= 55_535);
        }
    }
}

/// A Sentinel group: a master, one replica, and three sentinels watching
/// them as [`Sentinels::NAME`] (quorum 2, the master deemed down after
/// 500 ms).
#[derive(Debug)]
pub struct Sentinels {
    /// The master, then the replica.
    pub nodes: Vec<RedisServer>,
    sentinels: Vec<Child>,
    /// The sentinels' ports.
    pub ports: Vec<u16>,
    dir: PathBuf,
}

impl Sentinels {
    /// The name the sentinels know the master by.
    pub const NAME: &'static str = "weir";

    /// Starts them, and waits until the sentinels know the replica and one
    /// another (a failover can happen from then on).
    pub fn start() -> Self {
        require("redis-sentinel");
        let master = RedisServer::start(&[]);
        let port = master.port.to_string();
        let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
        let dir =
            std::env::temp_dir().join(format!("weir-sentinels-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let sentinels = ports
            .iter()
            .map(|p| {
                let conf = dir.join(format!("sentinel-{p}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "port {p}\nbind 127.0.0.1\ndir {}\nsentinel monitor {name} 127.0.0.1 {port} 2\nsentinel down-after-milliseconds {name} 500\nsentinel failover-timeout {name} 3000\n",
                        dir.display(),
                        name = Self::NAME,
                    ),
                )
                .unwrap();
                Command::new("redis-sentinel")
                    .arg(&conf)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-sentinel starts")
            })
            .collect();
        let group = Self {
            nodes: vec![master, replica],
            sentinels,
            ports,
            dir,
        };
        let ready = || {
            group.ports.iter().all(|p| {
                let ask = |what: &str| group.sentinel(*p, &["SENTINEL", what, Self::NAME]);
                ask("replicas").contains("127.0.0.1")
                    && ask("sentinels").matches("127.0.0.1").count() >= 2
            })
        };
        for _ in 0..300 {
            if ready() {
                return group;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the sentinels did not find the replica and one another within 30 s");
    }

    /// `redis-cli -p PORT ARGS…` to a sentinel.
    pub fn sentinel(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The master's port as the first sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        let said = self.sentinel(
            self.ports[0],
            &["SENTINEL", "get-master-addr-by-name", Self::NAME],
        );
        said.lines().nth(1)?.trim().parse().ok()
    }

    /// `redis-sentinel://127.0.0.1:P,…/weir`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-sentinel://{}/{}", hosts.join(","), Self::NAME)
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
