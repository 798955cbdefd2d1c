//! The abuse example (`docs/abuse/`) as the README runs it: its login
//! service (`login.py`, Python's standard library) behind `weir serve` on
//! the example's config — only the service's port changed to a free one.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_testkit::free_port;

use crate::serve::{Server, temp};

const CONFIG: &str = include_str!("../../../docs/abuse/weir.toml");
const LOGIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/abuse/login.py");
const TOKEN: &str = "change-me-to-a-long-secret";

/// The login service, stopped when dropped.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_login_example_bans_and_unbans_as_the_readme_says() {
    let port = free_port();
    let Ok(child) = Command::new("python3")
        .args([LOGIN, &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        weir_testkit::missing("the_login_example", "no `python3` on PATH");
        return;
    };
    let _service = Service(child);
    let config = CONFIG.replace("127.0.0.1:9000", &format!("127.0.0.1:{port}"));
    let path = temp("abuse.toml", &config);
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command.env("WEIR_ADMIN_TOKEN", TOKEN);
    let server = Server::spawn(command, &["--config", path.to_str().unwrap()]);
    let login = |password: &str| {
        let headers = format!("x-account: ann\r\nx-password: {password}\r\n");
        server.request_full("POST", "/login", &headers, "")
    };
    // The service may take a moment to listen.
    let started = Instant::now();
    while !login("hunter2").starts_with("HTTP/1.1 200") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the login service never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let statuses: Vec<String> = (0..7).map(|_| login("guess")[9..12].to_owned()).collect();
    assert_eq!(statuses, ["401", "401", "401", "401", "401", "429", "429"]);
    let banned = login("hunter2");
    assert!(
        banned.to_ascii_lowercase().contains("retry-after: 900"),
        "{banned}"
    );
    let (_, probe) = server.request(
        "POST",
        "/v1/check",
        r#"{"policy":"login-ip","key":"127.0.0.1","source":"peer","probe":true}"#,
    );
    assert!(probe.contains(r#""banned":true"#), "{probe}");
    let auth = format!("authorization: Bearer {TOKEN}\r\n");
    for path in [
        "/v1/bans/login-account/ann?source=header:x-account",
        "/v1/bans/login-ip/127.0.0.1?source=peer",
    ] {
        let (status, body) = server.request_with("DELETE", path, &auth, "");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""lifted":true"#), "{body}");
    }
    assert!(login("hunter2").starts_with("HTTP/1.1 200"));
    let denied = server.request_with("POST", "/login", "x-forwarded-for: 198.51.100.7\r\n", "");
    assert_eq!(denied.0, 403, "{}", denied.1);
}
