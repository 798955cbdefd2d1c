//! The dashboard in a real browser: `weir serve` as a process, headless
//! Chromium driven through ChromeDriver (Debian's `chromium` and
//! `chromium-driver`, which tools/test.sh installs).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use weir_testkit::free_port;

use crate::serve::{Server, temp};

const TOKEN: &str = "dashboard-test-token";

const CONFIG: &str = r#"
[server]
admin_token = "dashboard-test-token"

[policies.api]
algorithm = "token-bucket"
capacity = 10
rate = "1/m"

[policies.search]
algorithm = "sliding-log"
limit = 100
window = "1m"
shadow = true
"#;

struct Driver(Child);

impl Drop for Driver {
    /// Stops ChromeDriver and the Chromium it started (its process group),
    /// also when the test failed before closing the session.
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

/// ChromeDriver on a free port and a headless Chromium session, or `None`
/// when either is missing (the test skipped, saying why; failed under
/// CI=true).
async fn browser() -> Option<(Driver, Client)> {
    let found = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !found("chromedriver") || !found("chromium") {
        weir_testkit::missing(
            "the dashboard test",
            "no chromium or chromedriver (apt-get install chromium chromium-driver)",
        );
        return None;
    }
    let port = free_port();
    let driver = Driver(
        Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let profile = std::env::temp_dir().join(format!("weir-chromium-{}", std::process::id()));
    let capabilities = serde_json::json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1400,1500",
                format!("--user-data-dir={}", profile.display()),
            ]
        }
    });
    let capabilities = capabilities.as_object().unwrap().clone();
    let started = Instant::now();
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(capabilities.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => return Some((driver, client)),
            Err(e) if started.elapsed() > Duration::from_secs(20) => {
                panic!("ChromeDriver did not start a session: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits until `probe` gives `Some`, for at most 15 s.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited 15 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The text of the first element `css` finds, if any.
async fn text(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// `n` checks of `key` against `api` (and the shadow `search`).
fn checks(server: &Server, key: &str, n: usize) {
    let body = format!(
        r#"{{"checks":[{{"policy":"api","key":"{key}"}},{{"policy":"search","key":"{key}"}}]}}"#
    );
    for _ in 0..n {
        server.request("POST", "/v1/check", &body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_policies_who_is_limited_and_resets_keys() {
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let config = temp("dashboard.toml", CONFIG);
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    // A burst: `hot` refused 20 times, `warm` 5, `calm` never.
    checks(&server, "hot", 30);
    checks(&server, "warm", 15);
    checks(&server, "calm", 3);
    // The server keeps each second's counts: a dashboard opened later
    // draws the seconds before it.
    std::thread::sleep(Duration::from_millis(2_500));
    let (_, stats) = server.request("GET", "/v1/stats?history=1", "");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let history = stats["history"].as_array().unwrap();
    assert!(history.len() >= 2, "{stats}");
    assert_eq!(
        history.last().unwrap()["policies"][0]["name"],
        "api",
        "{stats}"
    );
    assert!(
        history.last().unwrap()["policies"][0]["allowed"]
            .as_u64()
            .unwrap()
            >= 10,
        "{stats}"
    );

    client
        .goto(&format!("http://{}/ui", server.addr))
        .await
        .unwrap();
    let drawn = until("the api chart", || async {
        let chart = client
            .find(Locator::Css(".chart[data-policy='api']"))
            .await
            .ok()?;
        chart.attr("data-points").await.ok().flatten()
    })
    .await;
    assert!(
        drawn.parse::<usize>().unwrap() >= 3,
        "the chart starts with the server's history: {drawn} points"
    );
    // The configured policies, with their parameters and mode.
    let api = until("the policy table", || {
        text(&client, "#policy-rows tr[data-policy='api']")
    })
    .await;
    assert!(
        api.contains("token-bucket capacity=10 rate=1/m") && api.contains("enforced"),
        "{api}"
    );
    let search = text(&client, "#policy-rows tr[data-policy='search']")
        .await
        .unwrap();
    assert!(search.contains("shadow"), "{search}");

    // Without the token, no identity is shown.
    let note = until("the admin note", || async {
        text(&client, "#admin-note").await.filter(|t| !t.is_empty())
    })
    .await;
    assert!(note.contains("admin token"), "{note}");
    let page = client.source().await.unwrap();
    assert!(
        !page.contains("api:hot"),
        "an identity shown without the token"
    );

    // With it, the hottest identity tops its policy's list.
    let field = client.find(Locator::Id("token")).await.unwrap();
    field.send_keys(TOKEN).await.unwrap();
    click(&client, "#token-save").await;
    let first = until("the top keys", || async {
        let row = client
            .find(Locator::Css("#top div[data-policy='api'] tr.hitter"))
            .await
            .ok()?;
        row.text().await.ok()
    })
    .await;
    assert!(
        first.starts_with("api:hot") && first.contains("20"),
        "{first}"
    );
    let rows = client
        .find_all(Locator::Css("#top div[data-policy='api'] tr.hitter"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "hot and warm, not calm");

    // The counts move as decisions are made.
    let limited = |client: &Client| {
        let client = client.clone();
        async move {
            let chart = client
                .find(Locator::Css(".chart[data-policy='api']"))
                .await
                .ok()?;
            chart.attr("data-limited").await.ok()??.parse::<u64>().ok()
        }
    };
    let before = until("the api chart", || limited(&client)).await;
    checks(&server, "hot", 4);
    until("the limited count to move", || async {
        limited(&client).await.filter(|&n| n >= before + 4)
    })
    .await;

    // Inspect the hot key from its row, then reset it: admitted again.
    click(&client, "#top div[data-policy='api'] tr.hitter button").await;
    let inspected = until("the inspector", || async {
        text(&client, "#inspect-result")
            .await
            .filter(|t| t.contains("refused"))
    })
    .await;
    assert!(inspected.contains("stored"), "{inspected}");
    click(&client, "#reset").await;
    until("the reset", || async {
        text(&client, "#inspect-result")
            .await
            .filter(|t| t.starts_with("reset"))
    })
    .await;
    let (status, body) = server.request("POST", "/v1/check", r#"{"policy":"api","key":"hot"}"#);
    assert_eq!(status, 200);
    assert!(body.contains("\"allowed\":true"), "{body}");

    // The playground plots a generated trace for three policies.
    click(&client, "#gen-burst").await;
    click(&client, "#pg-plot").await;
    let summary = until("the playground's summary", || async {
        let rows = client.find_all(Locator::Css("#pg-summary tr")).await.ok()?;
        (rows.len() == 4).then_some(())
    })
    .await;
    let () = summary;
    let drawn = until("the plot", || async {
        let width = client
            .execute(
                "return document.getElementById('pg-img').naturalWidth",
                vec![],
            )
            .await
            .ok()?;
        width.as_u64().filter(|&w| w > 0)
    })
    .await;
    assert_eq!(drawn, 1400);
    // The picture in the README.
    client
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .unwrap();
    let png = client.screenshot().await.unwrap();
    let shot = std::env::temp_dir().join("weir-dashboard.png");
    std::fs::write(&shot, &png).unwrap();
    if std::env::var_os("WEIR_UPDATE_SCREENSHOT").is_some() {
        let docs = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/images/dashboard.png"
        );
        std::fs::write(docs, &png).unwrap();
    }
    // An invalid policy is explained, not drawn.
    client
        .execute(
            "document.getElementById('pg-policies').value = 'token-bucket capacity=0 rate=1/s'",
            vec![],
        )
        .await
        .unwrap();
    click(&client, "#pg-plot").await;
    let error = until("the playground's error", || async {
        text(&client, "#pg-error").await.filter(|t| !t.is_empty())
    })
    .await;
    assert!(error.contains("policy 1"), "{error}");

    client.close().await.unwrap();
}
