//! The deployment files under `deploy/`, checked by the real tools:
//! tools/test.sh installs them; where one is missing a test fails under
//! CI=true and says SKIPPED, and why, elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::serve::{Server, request_at};
use weir_testkit::free_port;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// What a finished command printed, standard output then error.
fn said(out: &std::process::Output) -> String {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    text(&out.stdout) + &text(&out.stderr)
}

/// Runs `command`, which must succeed; its standard output.
fn run(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?}: {}", said(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// Whether `program` runs; when it does not, `test` fails under CI=true
/// and says SKIPPED elsewhere ([`weir_testkit::missing`]).
fn installed(program: &str, test: &str) -> bool {
    let found = Command::new(program).arg("--version").output();
    let ok = found.is_ok_and(|o| o.status.success());
    if !ok {
        weir_testkit::missing(test, &format!("no `{program}` on PATH"));
    }
    ok
}

/// How many metrics `text` reads (words `weir_…`), each asserted to be one
/// weir exports (in its catalog, `weir_server::metrics::CATALOG`).
fn metrics_read(text: &str) -> usize {
    let metrics: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("weir_"))
        .map(|w| w.trim_end_matches("_bucket"))
        .collect();
    for metric in &metrics {
        let base = ["_sum", "_count"]
            .iter()
            .find_map(|s| metric.strip_suffix(s))
            .unwrap_or(metric);
        assert!(
            weir_server::metrics::CATALOG
                .iter()
                .any(|m| m.name == *metric || m.name == base),
            "{metric} is not a metric of weir (crates/server/src/metrics.rs)"
        );
    }
    metrics.len()
}

#[test]
fn the_alert_rules_pass_promtool_and_name_metrics_weir_exports() {
    let dir = root().join("deploy/prometheus");
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    assert!(metrics_read(&rules) >= 6);
    if !installed("promtool", "the_alert_rules_pass_promtool") {
        return;
    }
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        run(Command::new("promtool").args(args).current_dir(&dir));
    }
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
    let toml = configmap_toml();
    let password = crate::serve::temp("k8s-redis-password", "change-me\n");
    let toml = toml.replace(
        "/run/secrets/weir/redis-password",
        password.to_str().unwrap(),
    );
    run(crate::serve::weir()
        .args(["config", "check"])
        .arg(crate::serve::temp("k8s-weir.toml", &toml)));
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
    // `kubectl apply -k` applies what `kubectl apply -f` does.
    let mut manifests: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    manifests.sort();
    let mut listed: Vec<String> = read("Kustomization")
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(str::to_owned)
        .collect();
    listed.sort();
    assert_eq!(listed, manifests, "Kustomization's resources");
    // Envoy reaches every pod through the headless Service; the config's
    // Redis is the one redis.yaml runs.
    let services = read("service.yaml");
    assert!(services.contains("name: weir-grpc\n") && services.contains("clusterIP: None"));
    let snippet = std::fs::read_to_string(root().join("deploy/envoy/weir-cluster.snippet.yaml"));
    assert!(
        snippet
            .unwrap()
            .contains("address: weir-grpc.default.svc.cluster.local")
    );
    assert!(read("redis.yaml").contains("kind: Service\nmetadata:\n  name: redis\n"));
    assert!(toml.contains("redis://redis:6379") || toml.contains(password.to_str().unwrap()));
    if !installed("kubernetes-validate", "the_kubernetes_manifests_validate") {
        return;
    }
    // `kubectl apply -f deploy/kubernetes/` reads every .yaml, .yml and
    // .json file there: each must be a manifest (the Prometheus Operator's
    // PodMonitor, a custom resource, sits in a directory of its own).
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json")) {
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

/// The weir.toml the ConfigMap holds.
fn configmap_toml() -> String {
    let configmap =
        std::fs::read_to_string(root().join("deploy/kubernetes/configmap.yaml")).unwrap();
    configmap
        .split_once("weir.toml: |\n")
        .unwrap()
        .1
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect()
}

/// Whether this process may run a program in an empty root (`unshare
/// --root`, which needs root); when not, as [`installed`].
fn can_chroot(test: &str) -> bool {
    let id = Command::new("id").arg("-u").output();
    if !id.is_ok_and(|o| o.stdout == b"0\n") {
        weir_testkit::missing(
            test,
            "running a program in an empty root (unshare --root) needs root",
        );
        return false;
    }
    installed("unshare", test)
}

/// `program` of `dir`, run with `dir` as its whole filesystem, as the
/// unprivileged user and group 65532 (distroless's `nonroot`).
fn in_root(dir: &Path, program: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .arg(format!("--root={}", dir.display()))
        .args(["--setuid", "65532", "--setgid", "65532", program]);
    command
}

/// The user a process runs as (`/proc/PID/status`).
fn uid(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    line.split_whitespace().next().unwrap().to_owned()
}

/// A new empty directory.
fn empty_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-deploy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The release binary, linked statically by tools/static.sh: built once
/// (tools/test.sh builds it before the tests, so here it is fresh).
fn static_weir() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = root().join("target/static");
        run(Command::new(root().join("tools/static.sh"))
            .arg("--target-dir")
            .arg(&target));
        target.join("x86_64-unknown-linux-gnu/release/weir")
    })
}

/// The answer's status to one request.
fn status(addr: &str, method: &str, path: &str, body: &str) -> u16 {
    request_at(addr, method, path, "", body)[9..12]
        .parse()
        .unwrap()
}

/// Polls `GET path` at `addr` until it answers 200 (at most 10 s).
fn answers_ok(addr: &str, path: &str) {
    for _ in 0..200 {
        let listening = std::net::TcpStream::connect(addr).is_ok();
        if listening && status(addr, "GET", path, "") == 200 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("GET {path} at {addr} never answered 200");
}

/// The release binary needs nothing of the system it runs on: alone in an
/// empty root with its config, as an unprivileged user, it decides.
#[test]
fn the_static_binary_serves_alone_in_an_empty_root_as_an_unprivileged_user() {
    if !can_chroot("the_static_binary_serves_alone_in_an_empty_root") {
        return;
    }
    let dir = empty_dir("static");
    std::fs::copy(static_weir(), dir.join("weir")).unwrap();
    let config = "[policies.api]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/m\"\n";
    std::fs::write(dir.join("weir.toml"), config).unwrap();
    let server = Server::spawn(in_root(&dir, "/weir"), &["--config", "/weir.toml"]);
    assert_eq!(uid(server.child.id()), "65532");
    let check = r#"{"policy":"api","key":"me"}"#;
    let (status, body) = server.request("POST", "/v1/check", check);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""allowed":true"#), "{body}");
    let (_, body) = server.request("POST", "/v1/check", check);
    assert!(body.contains(r#""allowed":false"#), "{body}");
}

/// The runtime image: built by podman from the repository's Dockerfile with
/// the host's static binary (`--build-arg binary=context`), and its
/// filesystem exported into a directory.
struct Image {
    /// `podman image inspect`'s `Config`.
    config: serde_json::Value,
    /// The image's `Healthcheck.Test`.
    health: Vec<String>,
    /// Its filesystem.
    root: PathBuf,
}

/// Runs `podman ARGS`; its standard output.
fn podman(args: &[&str]) -> String {
    run(Command::new("podman").args(args))
}

impl Image {
    /// Builds the Dockerfile in `context` with `args` (`--build-arg=…`),
    /// exports the image's filesystem into the directory `name`, and
    /// removes the image.
    fn build(context: &Path, args: &[&str], name: &str) -> Self {
        let tag = format!("localhost/weir-test-{name}:{}", std::process::id());
        let dockerfile = format!("--file={}", root().join("Dockerfile").display());
        let mut build = vec!["build", "--format=docker", &dockerfile];
        let tagged = format!("--tag={tag}");
        build.extend(
            args.iter()
                .copied()
                .chain([tagged.as_str(), context.to_str().unwrap()]),
        );
        podman(&build);
        let inspect: serde_json::Value =
            serde_json::from_str(&podman(&["image", "inspect", &tag])).unwrap();
        let health = inspect[0]["Healthcheck"]["Test"].as_array().cloned();
        let health = health.unwrap_or_else(|| panic!("no health check in {inspect}"));
        let container = podman(&["create", &tag]).trim().to_owned();
        let root = empty_dir(name);
        let mut export = Command::new("podman")
            .args(["export", &container])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let untar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&root)
            .stdin(export.stdout.take().unwrap())
            .status()
            .unwrap();
        assert!(untar.success() && export.wait().unwrap().success());
        podman(&["rm", &container]);
        podman(&["rmi", &tag]);
        Image {
            config: inspect[0]["Config"].clone(),
            health: health
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect(),
            root,
        }
    }

    /// Serves the image's default config (as [`serve_in`]) and checks a
    /// request.
    fn serve(&self) -> (Server, String) {
        let (server, internal) = serve_in(&self.root);
        let check = r#"{"policy":"api","key":"me"}"#;
        assert_eq!(status(&internal, "POST", "/v1/check", check), 200);
        (server, internal)
    }
}

/// Serves `/etc/weir/weir.toml` of the filesystem `root` as user 65532,
/// its listeners moved to free loopback ports (it shares the host's
/// network); and the internal listener's address.
fn serve_in(root: &Path) -> (Server, String) {
    let internal = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let config = "/etc/weir/weir.toml";
    let args = ["--config", config, "--internal", &internal, "--grpc", &grpc];
    let server = Server::spawn(in_root(root, "/weir"), &args);
    assert_eq!(uid(server.child.id()), "65532");
    (server, internal)
}

/// The image built from the host's static binary, once; None without
/// podman or root ([`installed`]).
fn image(test: &str) -> Option<&'static Image> {
    static BUILT: OnceLock<Image> = OnceLock::new();
    if !can_chroot(test) || !installed("podman", test) {
        return None;
    }
    Some(BUILT.get_or_init(|| {
        let context = empty_dir("image-context");
        std::fs::copy(static_weir(), context.join("weir")).unwrap();
        let config = root().join("deploy/container/weir.toml");
        std::fs::copy(config, context.join("weir.toml")).unwrap();
        Image::build(&context, &["--build-arg=binary=context"], "image")
    }))
}

/// The Dockerfile's whole build — weir compiled in the Rust builder. It needs
/// the network (the builder's base image is pulled) and a release build
/// inside the image, so it runs when asked: `cargo test -p weir --test
/// integration -- --ignored the_dockerfile_builds` (the other image tests
/// build the same Dockerfile from the host's static binary, every run).
#[test]
#[ignore = "pulls the Rust builder image from the network; run with --ignored"]
fn the_dockerfile_builds_weir_from_source_where_its_builder_can_be_pulled() {
    let test = "the_dockerfile_builds_weir_from_source";
    if !can_chroot(test) || !installed("podman", test) {
        return;
    }
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let builder = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM ")?.strip_suffix(" AS source"))
        .unwrap();
    let pulled = Command::new("podman")
        .args(["pull", builder])
        .output()
        .unwrap();
    if !pulled.status.success() {
        let why = String::from_utf8_lossy(&pulled.stderr);
        let why = why.lines().last().unwrap_or_default();
        panic!("{test}: the builder's base image {builder} cannot be pulled here: {why}");
    }
    let image = Image::build(root(), &[], "image-from-source");
    let (_server, internal) = image.serve();
    run(in_root(&image.root, "/weir").args(["healthcheck", &format!("http://{internal}/readyz")]));
}

/// The files under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match path.is_dir() {
            true => found.extend(files(&path).into_iter().map(|f| format!("{name}/{f}"))),
            false => found.push(name),
        }
    }
    found.sort();
    found
}

/// The image holds weir, its config and nothing else; runs it as a
/// non-root user with its own command; and its health check, which needs
/// no shell, passes while weir is ready and fails once it is gone.
#[test]
fn the_image_runs_weir_as_nonroot_with_a_health_check_that_needs_no_shell() {
    let Some(image) = image("the_image_runs_weir_as_nonroot") else {
        return;
    };
    let config = &image.config;
    assert_eq!(config["User"], "65532:65532");
    for port in ["8080/tcp", "8081/tcp", "9090/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{config}");
    }
    assert_eq!(config["Entrypoint"], serde_json::json!(["/weir"]));
    let command: Vec<&str> = config["Cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(command, ["serve", "--config", "/etc/weir/weir.toml"]);
    let mut empty = files(&image.root);
    empty.retain(|f| !f.starts_with("etc/weir/") && f != "weir");
    assert_eq!(empty, Vec::<String>::new(), "only weir and its config");
    let (server, internal) = image.serve();
    // The health check as the image declares it, on the moved port.
    let [kind, program, verb, url] = &image.health[..] else {
        panic!("{:?}", image.health);
    };
    assert_eq!([kind, program, verb], ["CMD", "/weir", "healthcheck"]);
    let url = url.replace("127.0.0.1:9090", &internal);
    let health = || {
        in_root(&image.root, program)
            .args([verb, &url])
            .output()
            .unwrap()
    };
    let ready = health();
    assert!(ready.status.success(), "{}", said(&ready));
    drop(server);
    let gone = health();
    assert_eq!(gone.status.code(), Some(1), "{}", said(&gone));
    assert!(said(&gone).contains(&url), "{}", said(&gone));
}

/// The Deployment as a kubelet would run it, in the image: the ConfigMap's
/// config at /etc/weir, the Secret's password at its mount (readable by the
/// pod's fsGroup), as user 65532, against a Redis that requires that
/// password. Both probes answer and the decisions land in that Redis.
#[test]
fn the_deployment_runs_in_the_image_against_a_redis_that_requires_a_password() {
    let Some(image) = image("the_deployment_runs_in_the_image") else {
        return;
    };
    let dir = root().join("deploy/kubernetes");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let deployment = read("deployment.yaml");
    for expected in [
        r#"args: ["serve", "--config", "/etc/weir/weir.toml"]"#,
        "mountPath: /etc/weir,",
        "mountPath: /run/secrets/weir,",
        "httpGet: { path: /healthz, port: http }",
        "httpGet: { path: /readyz, port: internal }",
        "runAsUser: 65532",
        "fsGroup: 65532",
        "defaultMode: 0440",
    ] {
        assert!(deployment.contains(expected), "{expected}");
    }
    let secret = read("secret.yaml");
    let password = secret.split("redis-password: ").nth(1).unwrap().trim();
    let redis = weir_testkit::RedisServer::start(&[]);
    redis.cli(&["CONFIG", "SET", "requirepass", password]);
    let pod = empty_dir("deployment");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(image.root.join("."))
        .arg(&pod)
        .status()
        .unwrap();
    assert!(copied.success());
    let toml = configmap_toml();
    assert!(toml.contains("url = \"redis://redis:6379\""), "{toml}");
    let toml = toml.replace("redis://redis:6379", &redis.url());
    std::fs::write(pod.join("etc/weir/weir.toml"), toml).unwrap();
    let secrets = pod.join("run/secrets/weir");
    std::fs::create_dir_all(&secrets).unwrap();
    let file = secrets.join("redis-password");
    std::fs::write(&file, password).unwrap();
    std::os::unix::fs::chown(&file, Some(0), Some(65532)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440)).unwrap();
    let (server, internal) = serve_in(&pod);
    answers_ok(&server.addr, "/healthz");
    answers_ok(&internal, "/readyz");
    let check = r#"{"policy":"api","key":"pod"}"#;
    let answer = request_at(&internal, "POST", "/v1/check", "", check);
    assert!(answer.contains(r#""allowed":true"#), "{answer}");
    let keys = redis.cli(&["--no-auth-warning", "-a", password, "--scan"]);
    assert!(keys.contains("pod"), "no key in Redis: {keys}");
}

/// A YAML file as JSON, read by PyYAML; None without it ([`installed`]).
fn yaml(path: &Path, test: &str) -> Option<serde_json::Value> {
    let script = "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output();
    match out {
        Ok(out) if out.status.success() => Some(serde_json::from_slice(&out.stdout).unwrap()),
        _ => {
            let why = format!("no python3 with PyYAML to read {}", path.display());
            weir_testkit::missing(test, &why);
            None
        }
    }
}

/// The compose file starts the docs/envoy example: Redis, weir built from
/// the Dockerfile, a sample upstream and Envoy on one compose network (no
/// host networking), each with its file here — docs/envoy's own but for the
/// addresses, which name the services — that passes `weir config check` and
/// Envoy's `--mode validate`; the addresses they use of each other agree,
/// and what is published reaches a listener on every interface.
#[test]
fn the_compose_file_runs_the_envoy_example_with_configs_that_check() {
    let test = "the_compose_file_runs_the_envoy_example";
    let dir = root().join("deploy/compose");
    let Some(compose) = yaml(&dir.join("compose.yaml"), test) else {
        return;
    };
    let services = compose["services"].as_object().unwrap();
    let names: Vec<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(names, ["envoy", "redis", "upstream", "weir"]);
    for (name, service) in services {
        assert!(
            service.get("network_mode").is_none(),
            "{name}: on the compose network"
        );
    }
    let mount = |service: &str, inside: &str| -> PathBuf {
        let volumes = services[service]["volumes"].as_array().unwrap();
        let volume = volumes
            .iter()
            .filter_map(|v| v.as_str())
            .find(|v| v.split(':').nth(1) == Some(inside))
            .unwrap_or_else(|| panic!("{service} mounts nothing at {inside}"));
        let host = dir.join(volume.split(':').next().unwrap());
        assert!(host.is_file(), "{}", host.display());
        host
    };
    // Each file is docs/envoy's, its addresses those of the network.
    let docs = |file: &str| std::fs::read_to_string(root().join("docs/envoy").join(file)).unwrap();
    let body = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // weir: the image of the repository's Dockerfile, its config here.
    let build = services["weir"]["build"].as_str().unwrap();
    assert!(dir.join(build).join("Dockerfile").is_file());
    let command = &services["weir"]["command"];
    assert_eq!(command[2], "/etc/weir/weir.toml");
    let config = mount("weir", "/etc/weir/weir.toml");
    run(crate::serve::weir().args(["config", "check"]).arg(&config));
    let toml = std::fs::read_to_string(&config).unwrap();
    let expected = body(&docs("weir.toml"))
        .replace(
            "listen = \"127.0.0.1:8080\"  ",
            "listen = \"0.0.0.0:8080\"    ",
        )
        .replace("grpc = \"127.0.0.1:8081\"  ", "grpc = \"0.0.0.0:8081\"    ")
        .replace("redis://127.0.0.1:6379", "redis://redis:6379");
    assert_eq!(
        body(&toml),
        expected,
        "weir.toml is docs/envoy/weir.toml but for addresses"
    );
    // Its health check asks a listener of that config (inside the container).
    let health = services["weir"]["healthcheck"]["test"].as_array().unwrap();
    let url = health[3].as_str().unwrap();
    let port = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap();
    assert!(
        toml.contains(&format!("listen = \"0.0.0.0:{port}\"")),
        "{url} is not a listener of {toml}"
    );
    // Redis where weir's store is; the upstream and weir where Envoy's
    // clusters are.
    let redis = services["redis"]["command"].to_string();
    assert!(toml.contains("url = \"redis://redis:6379\"") && redis.contains("\"6379\""));
    let envoy_yaml = mount("envoy", "/etc/envoy/envoy.yaml");
    let envoy = std::fs::read_to_string(&envoy_yaml).unwrap();
    let expected = body(&docs("envoy.yaml"))
        .replace(
            "address: 127.0.0.1, port_value: 10000",
            "address: 0.0.0.0, port_value: 10000",
        )
        .replace(
            "address: 127.0.0.1, port_value: 9000",
            "address: upstream, port_value: 9000",
        )
        .replace(
            "address: 127.0.0.1, port_value: 8081",
            "address: weir, port_value: 8081",
        )
        .replace("type: STATIC", "type: STRICT_DNS");
    assert_eq!(
        body(&envoy),
        expected,
        "envoy.yaml is docs/envoy/envoy.yaml but for addresses"
    );
    let upstream = services["upstream"]["command"].to_string();
    assert!(upstream.contains("-listen=:9000"));
    let published = |service: &str| services[service]["ports"].to_string();
    assert!(published("envoy").contains("10000:10000"));
    assert!(published("weir").contains("127.0.0.1:8080:8080"));
    // The Envoy the tests validate with.
    let image = services["envoy"]["image"].as_str().unwrap();
    assert!(image.ends_with(":v1.40-latest"), "{image}");
    if !installed("envoy", test) {
        return;
    }
    run(Command::new("envoy")
        .args(["--mode", "validate", "-c"])
        .arg(&envoy_yaml));
}

/// A real Prometheus scraping `target` every second (its data in a
/// temporary directory), killed when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: &str) -> Self {
        let dir = empty_dir("prometheus");
        let config = format!(
            "global: {{ scrape_interval: 1s }}\nscrape_configs:\n- job_name: weir\n  static_configs: [{{ targets: [\"{target}\"] }}]\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let prometheus = Self { child, addr, dir };
        answers_ok(&prometheus.addr, "/-/ready");
        prometheus
    }

    /// The samples `expr` evaluates to now.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", expr)
            .finish();
        let answer = request_at(&self.addr, "GET", &format!("/api/v1/query?{query}"), "", "");
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(json["status"], "success", "{expr}: {answer}");
        json["data"]["result"].as_array().unwrap().clone()
    }

    /// Waits (at most 20 s) until `expr` has samples.
    fn wait_for(&self, expr: &str) {
        for _ in 0..200 {
            if !self.query(expr).is_empty() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("Prometheus never had {expr}");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every query of the Grafana dashboard, as Grafana would send it
/// (`$instance` all, `$__rate_interval` one minute).
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("deploy/grafana/weir.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    fn targets(panels: &serde_json::Value, into: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            let exprs = panel["targets"].as_array().into_iter().flatten();
            into.extend(exprs.map(|t| t["expr"].as_str().unwrap().to_owned()));
            targets(&panel["panels"], into);
        }
    }
    let mut queries = Vec::new();
    targets(&dashboard["panels"], &mut queries);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            let metric = query.strip_prefix("label_values(").unwrap();
            queries.push(metric.split(',').next().unwrap().to_owned());
        }
    }
    queries
        .iter()
        .map(|q| {
            q.replace("$instance", ".*")
                .replace("$__rate_interval", "1m")
        })
        .collect()
}

/// A real Prometheus scrapes a real `weir serve` — on a Redis Cluster, with
/// a gateway route to an LLM that reports usage, one to an upstream that is
/// down, a connection cap, a failed and a good reload, then a master
/// killed — and every panel of the dashboard has data.
#[test]
fn every_dashboard_query_has_data_from_prometheus_scraping_weir() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    assert!(metrics_read(&queries.join("\n")) >= 20);
    if !installed("prometheus", "every_dashboard_query_has_data") {
        return;
    }
    let mut cluster = weir_testkit::Cluster::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(weir_testkit::Llm::start());
    let config = |burst: u32| {
        format!(
            r#"
[server]
header_timeout = "1s"
max_connections_per_ip = 4

[store]
url = "{}"
timeout = "100ms"

[policies.api]
algorithm = "gcra"
burst = {burst}
rate = "1/m"
on_store_error = "local"

[policies.tokens]
algorithm = "token-bucket"
capacity = 100000
rate = "1000/s"

[policies.inflight]
algorithm = "concurrency"
limit = 4
lease = "1m"

[[routes]]
match = "POST /v1/chat"
identity = "header:x-tenant"
policies = ["tokens", "inflight"]
upstream = "http://{}"
usage = "json:/usage/total_tokens"

[[routes]]
match = "GET /down"
identity = "header:x-tenant"
policies = ["api"]
upstream = "http://127.0.0.1:1"
"#,
            cluster.url(),
            llm.addr
        )
    };
    let path = crate::serve::temp("dashboard.toml", &config(2));
    let internal = format!("127.0.0.1:{}", free_port());
    let server = Server::start(&["--config", path.to_str().unwrap(), "--internal", &internal]);
    let prometheus = Prometheus::start(&internal);
    prometheus.wait_for("weir_build_info");
    let check = |key: &str| {
        let body = format!(r#"{{"policy":"api","key":"{key}"}}"#);
        status(&internal, "POST", "/v1/check", &body)
    };
    for _ in 0..5 {
        check("one");
    }
    let tenant = "X-Tenant: acme\r\n";
    for _ in 0..5 {
        let answer = request_at(&server.addr, "POST", "/v1/chat", tenant, r#"{"usage":40}"#);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        request_at(&server.addr, "GET", "/down", tenant, "");
    }
    // Past the cap, then timed out in the middle of their heads.
    let idle: Vec<_> = (0..6)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
            let _ = std::io::Write::write_all(&mut stream, b"GET /down HTTP/1.1\r\n");
            stream
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(idle);
    std::fs::write(&path, "[policies.api]\nalgorithm = \"gcra\"\n").unwrap();
    server.wait_for_log("reload rejected");
    std::fs::write(&path, config(3)).unwrap();
    server.wait_for_log("configuration reloaded");
    // One master gone: its slots' keys decided in process.
    cluster.nodes[0].kill();
    for key in 0..50 {
        check(&format!("key-{key}"));
    }
    prometheus.wait_for("weir_fallback_decisions_total");
    prometheus.wait_for("weir_store_node_up == 0");
    prometheus.wait_for("weir_connections_timed_out_total");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let empty: Vec<&String> = queries
        .iter()
        .filter(|q| prometheus.query(q).is_empty())
        .collect();
    assert!(empty.is_empty(), "no data for {empty:#?}");
}

/// `weir healthcheck` against what it cannot ask: a URL of another scheme
/// is bad input (exit 2, saying what it asks); nobody listening is a failed
/// check (exit 1, saying why).
#[test]
fn healthcheck_says_why_it_fails() {
    let ftp = crate::serve::weir()
        .args(["healthcheck", "ftp://127.0.0.1:9090/readyz"])
        .output()
        .unwrap();
    assert_eq!(ftp.status.code(), Some(2), "{}", said(&ftp));
    assert!(said(&ftp).contains("https://"), "{}", said(&ftp));
    let url = format!("http://127.0.0.1:{}/readyz", free_port());
    let down = crate::serve::weir()
        .args(["healthcheck", &url, "--timeout", "1"])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(1), "{}", said(&down));
    assert!(said(&down).contains(&url), "{}", said(&down));
    // --timeout takes a duration as well as seconds; anything else is named.
    let quick = crate::serve::weir()
        .args(["healthcheck", &url, "--timeout", "300ms"])
        .output()
        .unwrap();
    assert_eq!(quick.status.code(), Some(1), "{}", said(&quick));
    let wrong = crate::serve::weir()
        .args(["healthcheck", &url, "--timeout", "soon"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(2), "{}", said(&wrong));
    assert!(said(&wrong).contains("--timeout"), "{}", said(&wrong));
}
