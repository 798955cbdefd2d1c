//! `weir serve`: load and validate the config, bind, run until SIGTERM or
//! SIGINT, reload on SIGHUP.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use weir_server::AppState;
use weir_server::reload::Source;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The config file (TOML); without it, the example from `weir config example`.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen here instead of the config's `[server] listen`.
    #[arg(long, value_name = "ADDR", value_parser = address)]
    listen: Option<std::net::SocketAddr>,
    /// Serve the Envoy rate limit service (gRPC) here, instead of the
    /// config's `[server] grpc`.
    #[arg(long, value_name = "ADDR", value_parser = address)]
    grpc: Option<std::net::SocketAddr>,
    /// Serve the decision API, admin endpoints and metrics here (and only
    /// gateway routes and /healthz on --listen), instead of the config's
    /// `[server] internal`.
    #[arg(long, value_name = "ADDR", value_parser = address)]
    internal: Option<std::net::SocketAddr>,
    /// Answer the Redis protocol (CL.THROTTLE, WEIR.CHECK, …) here,
    /// instead of the config's `[server] resp`.
    #[arg(long, value_name = "ADDR", value_parser = address)]
    resp: Option<std::net::SocketAddr>,
    /// Do not watch the config file; reload it only on SIGHUP or `POST
    /// /v1/admin/reload`.
    #[arg(long)]
    no_watch: bool,
}

/// An address to listen on: `IP:PORT`, or `localhost:PORT` (loopback).
fn address(text: &str) -> Result<std::net::SocketAddr, String> {
    let localhost = || {
        let port = text.strip_prefix("localhost:")?.parse::<u16>().ok()?;
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    };
    text.parse().ok().or_else(localhost).ok_or_else(|| {
        format!(
            "`{text}` is not an address to listen on: an IP address and a port, such as 127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080 (all interfaces) or localhost:8080"
        )
    })
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let source = Source {
        listen: args.listen,
        grpc: args.grpc,
        internal: args.internal,
        resp: args.resp,
        ..Source::file(args.config.clone())
    };
    serve_source(source, Reload::Watch(!args.no_watch), &[])
}

/// `weir envoy-ratelimit`: `source` made from another's files, read again
/// every second; `ignored` names the variables that only tuned theirs.
pub(crate) fn run_source(source: Source, ignored: &[String]) -> anyhow::Result<()> {
    serve_source(
        source,
        Reload::Poll(std::time::Duration::from_secs(1)),
        ignored,
    )
}

/// How a served configuration is read again.
#[derive(Debug, Clone, Copy)]
enum Reload {
    /// On the file's changes (when true) and SIGHUP.
    Watch(bool),
    /// Every so often (a generated configuration), and on SIGHUP.
    Poll(std::time::Duration),
}

fn serve_source(source: Source, reload: Reload, ignored: &[String]) -> anyhow::Result<()> {
    // The file's errors, each with its line, before anything starts.
    let (config, _) = source.load().map_err(|e| anyhow!("{e}"))?;
    logging(config.server.json_logs, &config.server.log_level)?;
    weir_server::serve::raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Before anything connects in the background or listens.
    runtime.block_on(credentials_accepted(&config.store))?;
    if let Some(telemetry) = &config.server.telemetry {
        runtime
            .block_on(async { weir_server::telemetry::install(telemetry) })
            .map_err(|e| anyhow!("{e}"))?;
    }
    let served = runtime.block_on(serve(source, reload, ignored));
    // The last spans, sent before the runtime stops.
    runtime.block_on(async { tokio::task::spawn_blocking(weir_server::telemetry::flush).await })?;
    served
}

/// Logs to stderr: text for people (colored on a terminal), or one JSON
/// object per line for log pipelines (`[server] log_format = "json"`), from
/// `[server] log_level` up — or as `RUST_LOG` says, when it is set.
fn logging(json: bool, level: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives)
            .map_err(|e| anyhow!("RUST_LOG=`{directives}`: {e} (e.g. RUST_LOG=debug, or RUST_LOG=weir_server=debug,info)"))?,
        _ => EnvFilter::new(level),
    };
    // Where weir listens, and the access log once asked for, whatever the
    // level.
    let filter = ["weir::listening=info", "weir::access=info"]
        .into_iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, EnvFilter::add_directive);
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    match json {
        true => logs.json().with_current_span(false).init(),
        false => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    Ok(())
}

/// At start, a Redis store that refuses the credentials stops weir: a
/// wrong password is a configuration error, not an outage to ride out on
/// the local fallback (an instance that served on it would turn ready and
/// enforce a share of each limit). A Redis that cannot be reached is an
/// outage: weir starts, and each policy's `on_store_error` decides until it
/// is back.
async fn credentials_accepted(store: &weir_server::config::StoreConfig) -> anyhow::Result<()> {
    let weir_server::config::StoreUrl::Redis(url) = &store.url else {
        return Ok(());
    };
    let connect = weir_redis::RedisStore::connect_with(url, &store.access);
    match tokio::time::timeout(std::time::Duration::from_secs(3), connect).await {
        Ok(Err(e @ weir_redis::StoreError::Credentials { .. })) => Err(anyhow!("{e}")),
        _ => Ok(()),
    }
}

async fn serve(source: Source, reload: Reload, ignored: &[String]) -> anyhow::Result<()> {
    let path = source.path.clone();
    let reloadable = path.is_some() || source.generated.is_some();
    let state = AppState::from_source(source).map_err(|e| anyhow!("{e}"))?;
    let config = &state.current().config;
    let listeners = Listeners::bind(&config.server)?;
    let file = path
        .as_ref()
        .map_or("example".into(), |p| p.display().to_string());
    listeners.announce(&config.server, &file)?;
    if !ignored.is_empty() {
        tracing::warn!(variables = %ignored.join(", "), "weir does not read these: they tune envoyproxy/ratelimit's own implementation, or weir does otherwise (docs/MIGRATING.md)");
    }
    let stopped = stop_on_signals()?;
    // The main listener and the gRPC one each from a runtime per core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let grpc = listeners.grpc.map(|listener| {
        let (state, stopped) = (state.clone(), stopped.clone());
        tokio::spawn(weir_server::run_grpc_per_core(
            listener, threads, state, stopped,
        ))
    });
    let internal = listeners.internal.map(|listener| {
        let (state, mut stopped) = (state.clone(), stopped.clone());
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        tokio::spawn(weir_server::run_internal(listener, state, shutdown))
    });
    let resp = listeners.resp.map(|listener| {
        let (state, mut stopped) = (state.clone(), stopped.clone());
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        tokio::spawn(weir_server::run_resp(listener, state, shutdown))
    });
    // Reloads: the file watcher (unless --no-watch) and SIGHUP, one way.
    let _watcher = match reload {
        Reload::Watch(true) => match state.config_file().map(Path::to_path_buf) {
            Some(path) => {
                let state = state.clone();
                let reload = move || {
                    let _ = state.reload_from_source();
                };
                Some(weir_server::reload::watch(path, reload).map_err(|e| anyhow!("{e}"))?)
            }
            None => None,
        },
        Reload::Watch(false) => None,
        Reload::Poll(every) => {
            let state = state.clone();
            Some(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let state = state.clone();
                    let _ = tokio::task::spawn_blocking(move || state.reload_from_source()).await;
                }
            }))
        }
    };
    let reloader = reload_on_hangup(state.clone(), reloadable)?;
    let served = weir_server::run_per_core(listeners.main, threads, state, stopped).await;
    reloader.abort();
    served.map_err(|e| anyhow!("server failed: {e}"))?;
    joined(grpc, "gRPC").await?;
    joined(internal, "internal").await?;
    joined(resp, "Redis protocol").await
}

/// The listeners `[server]` (or the flags) asks for, bound before anything
/// is served, so that a taken port stops weir at once.
struct Listeners {
    main: std::net::TcpListener,
    grpc: Option<std::net::TcpListener>,
    internal: Option<tokio::net::TcpListener>,
    resp: Option<tokio::net::TcpListener>,
}

impl Listeners {
    fn bind(server: &weir_server::config::ServerConfig) -> anyhow::Result<Self> {
        let bind = |at: std::net::SocketAddr, what: &str| {
            std::net::TcpListener::bind(at).with_context(|| format!("cannot listen on {at}{what}"))
        };
        let main = bind(server.listen, "")?;
        let grpc = server.grpc.map(|at| bind(at, " (gRPC)")).transpose()?;
        let tokio = |at: Option<std::net::SocketAddr>, what: &str| -> anyhow::Result<_> {
            let Some(at) = at else { return Ok(None) };
            let listener = bind(at, what)?;
            listener.set_nonblocking(true)?;
            Ok(Some(tokio::net::TcpListener::from_std(listener)?))
        };
        Ok(Self {
            main,
            grpc,
            internal: tokio(server.internal, " (internal)")?,
            resp: tokio(server.resp, " (Redis protocol)")?,
        })
    }

    /// What listens where: a plain line each for people (and scripts), or
    /// — JSON logs are JSON only — one log object each.
    fn announce(
        &self,
        server: &weir_server::config::ServerConfig,
        file: &str,
    ) -> anyhow::Result<()> {
        let json = server.json_logs;
        let announce = |what: &str, url: String| match json {
            true => tracing::info!(target: "weir::listening", %url, config = %file, "{what}"),
            false => eprintln!("{what} on {url}"),
        };
        // The scheme a client uses: https on a listener with TLS.
        let scheme = |tls: bool| if tls { "https" } else { "http" };
        let main = self.main.local_addr()?;
        announce(
            "weir listening",
            format!("{}://{main}", scheme(server.tls.is_some())),
        );
        if let Some(grpc) = &self.grpc {
            let at = grpc.local_addr()?;
            let tls = if server.grpc_tls.is_some() {
                " (TLS)"
            } else {
                ""
            };
            announce("weir rate limit service (gRPC)", format!("{at}{tls}"));
        }
        if let Some(internal) = &self.internal {
            let at = internal.local_addr()?;
            announce(
                "weir internal (decision API, admin, metrics)",
                format!("{}://{at}", scheme(server.internal_tls.is_some())),
            );
        }
        if let Some(resp) = &self.resp {
            let at = resp.local_addr()?;
            let scheme = if server.resp_tls.is_some() {
                "rediss"
            } else {
                "redis"
            };
            announce("weir Redis protocol", format!("{scheme}://{at}"));
        }
        Ok(())
    }
}

/// A receiver that turns true on SIGTERM or SIGINT: every listener then
/// finishes the requests in flight and stops.
fn stop_on_signals() -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("shutting down: finishing requests in flight");
        let _ = stop.send(true);
    });
    Ok(stopped)
}

/// Reloads the config file on each SIGHUP (without a file, says so).
fn reload_on_hangup(
    state: std::sync::Arc<AppState>,
    has_file: bool,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if !has_file {
                tracing::warn!("SIGHUP: no --config file to reload; still serving the example");
                continue;
            }
            let state = state.clone();
            let _ = tokio::task::spawn_blocking(move || state.reload_from_source()).await;
        }
    }))
}

/// Waits for a listener's task, if it runs: its failure is weir's.
async fn joined(
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    what: &str,
) -> anyhow::Result<()> {
    let Some(task) = task else {
        return Ok(());
    };
    match task.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => bail!("{what} server failed: {e}"),
        Err(e) => bail!("{what} server failed: {e}"),
    }
}
