//! The deployment files under `deploy/`, checked by the real tools where
//! they are installed (a test says SKIPPED, and why, where one is not).

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// What a finished command printed, standard output then error.
fn said(out: &std::process::Output) -> String {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    text(&out.stdout) + &text(&out.stderr)
}

/// Whether `program` runs; says SKIPPED for `test` when it does not.
fn installed(program: &str, test: &str) -> bool {
    let found = Command::new(program).arg("--version").output();
    let ok = found.is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED {test}: no `{program}` on PATH (tools/test.sh installs it)");
    }
    ok
}

#[test]
fn the_alert_rules_pass_promtool_and_name_metrics_weir_exports() {
    let dir = root().join("deploy/prometheus");
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    // Every metric an alert reads is one weir exports (named in its source).
    let source: String = [
        "crates/server/src",
        "crates/redis/src",
        "crates/limiter/src",
    ]
    .iter()
    .flat_map(|d| std::fs::read_dir(root().join(d)).unwrap())
    .map(|e| e.unwrap().path())
    .filter(|p| p.extension().is_some_and(|e| e == "rs"))
    .map(|p| std::fs::read_to_string(p).unwrap())
    .collect();
    let metrics: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("weir_"))
        .collect();
    assert!(metrics.len() >= 6, "{metrics:?}");
    for metric in metrics {
        assert!(
            source.contains(&format!("\"{metric}\"")),
            "{metric} is not a metric of weir"
        );
    }
    if !installed("promtool", "the_alert_rules_pass_promtool") {
        return;
    }
    let check = Command::new("promtool")
        .args(["check", "rules", "alerts.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", said(&check));
    let test = Command::new("promtool")
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(test.status.success(), "{}", said(&test));
}

/// The systemd unit verifies without a warning (its `ExecStart` pointed at
/// the binary under test), and its sandboxing scores better than "medium".
#[test]
fn the_systemd_unit_verifies_and_is_sandboxed() {
    if !installed(
        "systemd-analyze",
        "the_systemd_unit_verifies_and_is_sandboxed",
    ) {
        return;
    }
    let unit = std::fs::read_to_string(root().join("deploy/systemd/weir.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/weir serve --config /etc/weir/weir.toml"));
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    let dir = std::env::temp_dir().join(format!("weir-systemd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("weir.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/weir", env!("CARGO_BIN_EXE_weir")),
    )
    .unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let said = said(&verify);
    assert!(verify.status.success() && said.trim().is_empty(), "{said}");
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&security.stdout);
    let score: f64 = said
        .split("Overall exposure level for weir.service: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in {said}"));
    assert!(score < 7.0, "exposure {score}: {said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every Kubernetes manifest validates against the Kubernetes schemas
/// (strict: no unknown field), the Deployment's grace period is above the
/// config's shutdown_timeout, and the ConfigMap's weir.toml passes `weir
/// config check` with the Secret's password file in place.
#[test]
fn the_kubernetes_manifests_validate_and_their_config_checks() {
    let dir = root().join("deploy/kubernetes");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    // The config, as the ConfigMap holds it.
    let configmap = read("configmap.yaml");
    let toml: String = configmap
        .split_once("weir.toml: |\n")
        .unwrap()
        .1
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let password = crate::serve::temp("k8s-redis-password", "change-me\n");
    let toml = toml.replace(
        "/etc/weir/secrets/redis-password",
        password.to_str().unwrap(),
    );
    let checked = crate::serve::weir()
        .args(["config", "check"])
        .arg(crate::serve::temp("k8s-weir.toml", &toml))
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", said(&checked));
    // Requests in flight finish before the kubelet kills the pod.
    let grace: u64 = read("deployment.yaml")
        .split("terminationGracePeriodSeconds: ")
        .nth(1)
        .and_then(|s| s.lines().next()?.trim().parse().ok())
        .unwrap();
    let shutdown: u64 = toml
        .split("shutdown_timeout = \"")
        .nth(1)
        .and_then(|s| s.split("s\"").next()?.parse().ok())
        .unwrap();
    assert!(
        grace > shutdown,
        "grace {grace} s, shutdown_timeout {shutdown} s"
    );
    if !installed("kubernetes-validate", "the_kubernetes_manifests_validate") {
        return;
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // A custom resource (no schema) and an Envoy snippet.
        if !name.ends_with(".yaml") || name == "podmonitor.yaml" || name.ends_with(".snippet.yaml")
        {
            continue;
        }
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(&path)
            .output()
            .unwrap();
        let said = said(&out);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{name}: {said}"
        );
    }
}
