//! envoyproxy/ratelimit's configuration, read for weir: `weir config import
//! envoy-ratelimit` and `weir envoy-ratelimit` share this translation.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use weir_envoy_ratelimit::weir::{Options, quote as quoted, to_toml};
use weir_envoy_ratelimit::{Limits, read_dir};

/// The weir TOML (policies and descriptor rules) of the YAML files in
/// `dir`; errors name the file and the descriptor.
pub(crate) fn import(
    dir: &Path,
    merge_domains: bool,
    ignore_dotfiles: bool,
) -> anyhow::Result<String> {
    let files = read_dir(dir, ignore_dotfiles)
        .map_err(|e| anyhow!("cannot read the config directory {}: {e}", dir.display()))?;
    if files.is_empty() {
        bail!(
            "{}: no config files (one YAML file per domain)",
            dir.display()
        );
    }
    let limits = Limits::load(
        files
            .iter()
            .map(|(name, text)| (name.as_str(), text.as_str())),
        merge_domains,
    )?;
    Ok(to_toml(&limits, Options::default()))
}

/// `weir envoy-ratelimit`: configured by envoyproxy/ratelimit's environment
/// variables, nothing else.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print the weir configuration the environment and the config files
    /// make (no secrets), and exit.
    #[arg(long)]
    print_config: bool,
}

/// What envoyproxy/ratelimit's variables ask of weir.
#[derive(Debug)]
struct Settings {
    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
    dir: PathBuf,
    ignore_dotfiles: bool,
    merge_domains: bool,
    /// `[server]` and `[store]`, as TOML.
    prelude: String,
    /// `REDIS_AUTH`'s password, passed as `WEIR_REDIS_PASSWORD` would be.
    password: Option<String>,
    /// Variables of theirs that weir does not read (they tune their
    /// implementation, or weir does otherwise): named at start.
    ignored: Vec<String>,
}

/// Every variable envoyproxy/ratelimit reads (its `settings.go`): one set
/// that weir does not read is named at start, never silently dropped.
const THEIRS: [&str; 114] = [
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// The variables weir reads.
const READ: [&str; 33] = [
    "NEAR_LIMIT_RATIO",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_HOST",
    "GRPC_PORT",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "BACKEND_TYPE",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "SHADOW_MODE",
    "MERGE_DOMAIN_CONFIG",
    "USE_STATSD",
];

/// Variables that ask for what weir does not do: an error when set to
/// anything but their off value (`""` or `false`).
const UNSUPPORTED: [(&str, &str); 13] = [
    (
        "USE_DOG_STATSD",
        "statsd: weir exports Prometheus metrics (DEBUG_PORT, or PROMETHEUS_ADDR)",
    ),
    (
        "GRPC_UDS",
        "a Unix socket for gRPC: use GRPC_HOST and GRPC_PORT",
    ),
    ("GRPC_SERVER_USE_TLS", "TLS on the gRPC listener"),
    ("QUOTA_MODE", "quota mode"),
    ("RESPONSE_DYNAMIC_METADATA", "dynamic metadata in answers"),
    (
        "TRACING_ENABLED",
        "their tracing: weir's is [server.telemetry]",
    ),
    (
        "MEMCACHE_HOST_PORT",
        "memcached: weir's stores are Redis and its own",
    ),
    (
        "MEMCACHE_SRV",
        "memcached: weir's stores are Redis and its own",
    ),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "skipping only the hostname check (weir verifies the whole certificate)",
    ),
    (
        "REDIS_SENTINEL_AUTH",
        "a password for the sentinels from the environment (weir reads [store] sentinel_password_file)",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        "a statsd-to-Prometheus mapping: weir's metrics are Prometheus already",
    ),
    (
        "USE_STATSD",
        "statsd (set USE_STATSD=false: weir exports Prometheus metrics on DEBUG_PORT, or PROMETHEUS_ADDR)",
    ),
    ("DISABLE_STATS", "turning metrics off"),
];

/// A boolean variable as their settings read one (`true`, `1`, `t`,
/// `false`, `0`, `f`, any case; empty is false), `default` when unset.
fn flag(var: &dyn Fn(&str) -> Option<String>, name: &str, default: bool) -> anyhow::Result<bool> {
    match var(name).as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(default),
        Some("true" | "1" | "t") => Ok(true),
        Some("false" | "0" | "f" | "") => Ok(false),
        Some(other) => bail!("{name}=`{other}`: expected true or false"),
    }
}

fn settings(var: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Settings> {
    let get = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_owned());
    let flag = |name: &str, default: bool| flag(var, name, default);
    for (name, what) in UNSUPPORTED {
        // Anything but their off value asks for it.
        if flag(name, false).unwrap_or(true) {
            bail!("{name} asks for {what}; weir envoy-ratelimit does not support it");
        }
    }
    match get("CONFIG_TYPE", "FILE").to_ascii_uppercase().as_str() {
        "FILE" => {}
        other => bail!(
            "CONFIG_TYPE=`{other}`: weir envoy-ratelimit reads config files (FILE); xDS is not supported"
        ),
    }
    let listener = |host: &str, port: &str, default_port: &str| -> anyhow::Result<String> {
        let (h, p) = (get(host, "0.0.0.0"), get(port, default_port));
        let port: u16 = p
            .parse()
            .map_err(|_| anyhow!("{port}=`{p}`: expected a port number"))?;
        let at = match h.contains(':') {
            true => format!("[{h}]:{port}"),
            false => format!("{h}:{port}"),
        };
        at.parse::<std::net::SocketAddr>()
            .map_err(|_| anyhow!("{host}=`{h}`: expected an IP address"))?;
        Ok(at)
    };
    let listen = listener("HOST", "PORT", "8080")?;
    let grpc = listener("GRPC_HOST", "GRPC_PORT", "8081")?;
    // Their debug port serves /rlconfig and stats; weir's internal
    // listener serves /metrics (and, with USE_PROMETHEUS, PROMETHEUS_ADDR).
    let internal = match flag("USE_PROMETHEUS", false)? {
        true => {
            let addr = get("PROMETHEUS_ADDR", ":9090");
            match addr.strip_prefix(':') {
                Some(port) => format!("0.0.0.0:{port}"),
                None => addr,
            }
        }
        false => listener("DEBUG_HOST", "DEBUG_PORT", "6070")?,
    };
    let log_level = get("LOG_LEVEL", "WARN").to_ascii_lowercase();
    let log_level = match log_level.as_str() {
        "warning" => "warn".to_owned(),
        "fatal" | "panic" => "error".to_owned(),
        _ => log_level,
    };
    let json = match get("LOG_FORMAT", "text").to_ascii_lowercase().as_str() {
        "json" => true,
        "text" => false,
        other => bail!("LOG_FORMAT=`{other}`: expected text or json"),
    };
    let mut server = vec![
        format!("listen = {}", quoted(&listen)),
        format!("grpc = {}", quoted(&grpc)),
        format!("internal = {}", quoted(&internal)),
        format!("log_level = {}", quoted(&log_level)),
        format!(
            "log_format = {}",
            quoted(if json { "json" } else { "text" })
        ),
        "envoy_json = true".to_owned(),
    ];
    // weir_near_limit_total, their near_limit stat.
    let near = get("NEAR_LIMIT_RATIO", "0.8");
    match near.parse::<f64>() {
        Ok(r) if r > 0.0 && r < 1.0 => server.push(format!("near_limit_ratio = {r}")),
        _ => bail!("NEAR_LIMIT_RATIO=`{near}`: expected a number above 0 and below 1, e.g. 0.8"),
    }
    // Their response headers, when asked for, beside weir's own fields.
    if flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
        let names = [
            get("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            get("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            get("LIMIT_RESET_HEADER", "RateLimit-Reset"),
        ];
        let names: Vec<String> = names.iter().map(|n| quoted(n)).collect();
        server.push("headers = \"both\"".to_owned());
        server.push(format!("envoy_header_names = [{}]", names.join(", ")));
    }
    // SHADOW_MODE: every limit decided and reported, the overall code OK.
    if flag("SHADOW_MODE", false)? {
        server.push("shadow = true".to_owned());
    }
    let (store, password) = store(var, &get)?;
    let prelude = format!(
        "[server]\n{}\n\n[store]\n{}\n",
        server.join("\n"),
        store.join("\n")
    );
    let root = PathBuf::from(get("RUNTIME_ROOT", "/srv/runtime_data/current"));
    let dir = root
        .join(get("RUNTIME_SUBDIRECTORY", ""))
        .join(get("RUNTIME_APPDIRECTORY", "config"));
    // RUNTIME_WATCH_ROOT: weir reads the directory again every second
    // either way, through the root's symlink.
    flag("RUNTIME_WATCH_ROOT", true)?;
    let ignored = THEIRS
        .iter()
        .filter(|name| !READ.contains(name) && var(name).is_some())
        .map(|name| (*name).to_owned())
        .collect();
    Ok(Settings {
        dir,
        ignore_dotfiles: flag("RUNTIME_IGNOREDOTFILES", false)?,
        merge_domains: flag("MERGE_DOMAIN_CONFIG", false)?,
        prelude,
        password,
        ignored,
    })
}

/// `[store]`'s lines, and the password (`REDIS_AUTH`).
fn store(
    var: &dyn Fn(&str) -> Option<String>,
    get: &dyn Fn(&str, &str) -> String,
) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let backend = get("BACKEND_TYPE", "redis").to_ascii_lowercase();
    match backend.as_str() {
        "redis" => {}
        // weir's own: the in-process store, for one replica or a try.
        "memory" => return Ok((vec!["url = \"memory\"".to_owned()], None)),
        other => bail!(
            "BACKEND_TYPE=`{other}`: weir envoy-ratelimit keeps its counters in Redis (redis) or in process (memory); memcache is not supported"
        ),
    }
    let tls = flag(var, "REDIS_TLS", false)?;
    let url = get("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
    let scheme = if tls { "rediss" } else { "redis" };
    let kind = get("REDIS_TYPE", "SINGLE").to_ascii_uppercase();
    let socket = get("REDIS_SOCKET_TYPE", "unix").to_ascii_lowercase();
    let url = match (kind.as_str(), socket.as_str()) {
        ("SINGLE", "tcp") => format!("{scheme}://{url}"),
        ("SINGLE", "unix") => format!("redis+unix://{url}"),
        ("CLUSTER", "tcp") => format!("redis-cluster://{url}"),
        ("SENTINEL", "tcp") => {
            let (master, sentinels) = url.split_once(',').ok_or_else(|| {
                anyhow!("REDIS_URL=`{url}`: with REDIS_TYPE=SENTINEL, give MASTER,HOST:PORT[,HOST:PORT…]")
            })?;
            format!("redis-sentinel://{sentinels}/{master}")
        }
        ("SINGLE" | "CLUSTER" | "SENTINEL", _) => bail!(
            "REDIS_SOCKET_TYPE=`{socket}` with REDIS_TYPE=`{kind}`: expected tcp (or unix, for SINGLE)"
        ),
        _ => bail!("REDIS_TYPE=`{kind}`: expected SINGLE, SENTINEL or CLUSTER"),
    };
    let mut lines = vec![format!("url = {}", quoted(&url))];
    if tls {
        lines.push("tls = true".to_owned());
    }
    for (name, key) in [
        ("REDIS_TLS_CACERT", "tls_ca"),
        ("REDIS_TLS_CLIENT_CERT", "tls_cert"),
        ("REDIS_TLS_CLIENT_KEY", "tls_key"),
    ] {
        if let Some(path) = var(name).filter(|p| !p.is_empty()) {
            lines.push(format!("{key} = {}", quoted(&path)));
        }
    }
    let password = match var("REDIS_AUTH").filter(|a| !a.is_empty()) {
        Some(auth) => match auth.split_once(':') {
            Some((user, secret)) => {
                lines.push(format!("username = {}", quoted(user)));
                Some(secret.to_owned())
            }
            None => Some(auth),
        },
        None => None,
    };
    Ok((lines, password))
}

/// What `weir envoy-ratelimit` serves while its config directory holds no
/// file: no descriptor is limited, as envoyproxy/ratelimit starts; weir
/// needs a policy, which no rule names.
const NO_FILES_YET: &str = "
# No config files yet: every descriptor is answered OK until some appear.
# (weir needs a policy; no rule names this one.)
[policies.no-config-files-yet]
algorithm = \"fixed-window\"
limit = 1
window = \"1s\"
";

impl Settings {
    /// The configuration served: the prelude, then the config files' limits.
    fn config(&self) -> anyhow::Result<String> {
        let empty = read_dir(&self.dir, self.ignore_dotfiles).is_ok_and(|f| f.is_empty());
        if empty {
            return Ok(format!("{}{NO_FILES_YET}", self.prelude));
        }
        let limits = import(&self.dir, self.merge_domains, self.ignore_dotfiles)?;
        Ok(format!("{}{limits}", self.prelude))
    }
}

/// A fingerprint of the files under `dir` — each path, size and time of
/// change, through symlinks — or `None` when it cannot be listed.
fn listing(dir: &Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    fn walk(dir: &Path, hasher: &mut std::hash::DefaultHasher) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(std::fs::DirEntry::path);
        for entry in entries {
            let path = entry.path();
            let meta = std::fs::metadata(&path)?;
            path.hash(hasher);
            meta.len().hash(hasher);
            meta.modified().ok().hash(hasher);
            if meta.is_dir() {
                walk(&path, hasher)?;
            }
        }
        Ok(())
    }
    let mut hasher = std::hash::DefaultHasher::new();
    std::fs::canonicalize(dir).ok()?.hash(&mut hasher);
    walk(dir, &mut hasher).ok()?;
    Some(hasher.finish())
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let var = |name: &str| std::env::var(name).ok();
    let settings = settings(&var)?;
    if args.print_config {
        // As it is served, but for a password inside REDIS_URL.
        for line in settings.config()?.lines() {
            match line.strip_prefix("url = ") {
                Some(url) => println!("url = {}", weir_redis::redacted(url)),
                None => println!("{line}"),
            }
        }
        return Ok(());
    }
    // The files' errors before anything starts, as theirs.
    settings.config()?;
    let env = weir_server::config::Env {
        redis_password: settings.password.clone(),
        ..weir_server::config::Env::from_process()
    };
    let name = settings.dir.display().to_string();
    let ignored = settings.ignored.clone();
    // Read every second: the files are read again only when their
    // listing (paths, sizes, times, through the root's symlink) changed.
    let last: std::sync::Mutex<Option<(u64, String)>> = std::sync::Mutex::default();
    let generate = move || {
        let seen = listing(&settings.dir);
        let mut last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, text)) = last.as_ref().filter(|(l, _)| Some(*l) == seen) {
            return Ok((name.clone(), text.clone()));
        }
        let text = settings.config().map_err(|e| format!("{e:#}"))?;
        if let Some(seen) = seen {
            *last = Some((seen, text.clone()));
        }
        Ok((name.clone(), text))
    };
    let source = weir_server::reload::Source {
        env,
        generated: Some(weir_server::reload::Generator(std::sync::Arc::new(
            generate,
        ))),
        ..weir_server::reload::Source::default()
    };
    crate::serve::run_source(source, &ignored)
}
