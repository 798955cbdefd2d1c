//! `weir serve` and `weir config`: load and validate the config, bind, run
//! until SIGTERM or SIGINT, reload on SIGHUP.

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use weir_server::AppState;
use weir_server::config::{Config, EXAMPLE};
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

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print an example config.
    Example,
    /// Validate a config file: every error with its line, table and key.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

/// Reads and validates a config (the example without a path); errors name
/// the file, line, table and key. `weir simulate --policies` reads its
/// `[policies.NAME]` tables the same way.
pub(crate) fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    source(path)
        .load()
        .map(|(config, _)| config)
        .map_err(|e| anyhow!("{e}"))
}

/// Where the config comes from: the file, and `WEIR_ADMIN_TOKEN`.
fn source(path: Option<&PathBuf>) -> Source {
    Source {
        path: path.cloned(),
        admin_token_env: std::env::var("WEIR_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
        ..Source::default()
    }
}

pub(crate) fn config(command: &ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Example => {
            print!("{EXAMPLE}");
            Ok(())
        }
        ConfigCommand::Check { file } => {
            let config = load(Some(file))?;
            let grpc = config
                .server
                .grpc
                .map_or(String::new(), |g| format!(", gRPC on {g}"));
            let count = |n: usize, one: &str, many: &str| match n {
                1 => format!("1 {one}"),
                n => format!("{n} {many}"),
            };
            println!(
                "{}: ok ({}, {}, {}, store {}, listening on {}{grpc})",
                file.display(),
                count(config.policies.len(), "policy", "policies"),
                count(config.routes.len(), "route", "routes"),
                count(
                    config.descriptors.len(),
                    "descriptor rule",
                    "descriptor rules"
                ),
                config.store.url,
                config.server.listen
            );
            Ok(())
        }
    }
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let source = Source {
        listen: args.listen,
        grpc: args.grpc,
        internal: args.internal,
        ..source(args.config.as_ref())
    };
    // The file's errors, each with its line, before anything starts.
    let (config, _) = source.load().map_err(|e| anyhow!("{e}"))?;
    logging(config.server.json_logs, &config.server.log_level)?;
    weir_server::serve::raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(telemetry) = &config.server.telemetry {
        runtime
            .block_on(async { weir_server::telemetry::install(telemetry) })
            .map_err(|e| anyhow!("{e}"))?;
    }
    let served = runtime.block_on(serve(source, !args.no_watch));
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

async fn serve(source: Source, watch: bool) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let path = source.path.clone();
    let state = AppState::from_source(source).map_err(|e| anyhow!("{e}"))?;
    let config = &state.current().config;
    let listen = config.server.listen;
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let bind = |at: Option<std::net::SocketAddr>, what: &'static str| async move {
        match at {
            Some(at) => tokio::net::TcpListener::bind(at)
                .await
                .map(Some)
                .with_context(|| format!("cannot listen on {at} ({what})")),
            None => Ok(None),
        }
    };
    let grpc = match config.server.grpc {
        Some(at) => Some(
            std::net::TcpListener::bind(at)
                .with_context(|| format!("cannot listen on {at} (gRPC)"))?,
        ),
        None => None,
    };
    let internal = bind(config.server.internal, "internal").await?;
    // What listens where: a plain line each for people (and scripts), or
    // — JSON logs are JSON only — one log object each.
    let json = config.server.json_logs;
    let file = path
        .as_ref()
        .map_or("example".into(), |p| p.display().to_string());
    let announce = |what: &str, url: String| match json {
        true => tracing::info!(target: "weir::listening", %url, config = %file, "{what}"),
        false => eprintln!("{what} on {url}"),
    };
    announce("weir listening", format!("http://{addr}"));
    if let Some(grpc) = &grpc {
        announce(
            "weir rate limit service (gRPC)",
            grpc.local_addr()?.to_string(),
        );
    }
    if let Some(internal) = &internal {
        let at = internal.local_addr()?;
        announce(
            "weir internal (decision API, admin, metrics)",
            format!("http://{at}"),
        );
    }

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("shutting down: finishing requests in flight");
        let _ = stop.send(true);
    });
    let shutdown = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    // The main listener and the gRPC one each from a runtime per core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let grpc = grpc.map(|listener| {
        let (state, stopped) = (state.clone(), stopped.clone());
        tokio::spawn(weir_server::run_grpc_per_core(
            listener, threads, state, stopped,
        ))
    });
    let internal = internal.map(|listener| {
        let (state, stopped) = (state.clone(), stopped.clone());
        tokio::spawn(weir_server::run_internal(
            listener,
            state,
            shutdown(stopped),
        ))
    });
    // Reloads: the file watcher (unless --no-watch) and SIGHUP, one way.
    let _watcher = match watch {
        true => weir_server::reload::watch(state.clone()).map_err(|e| anyhow!("{e}"))?,
        false => None,
    };
    let reloader = {
        let state = state.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                if path.is_none() {
                    tracing::warn!("SIGHUP: no --config file to reload; still serving the example");
                    continue;
                }
                let state = state.clone();
                let _ = tokio::task::spawn_blocking(move || state.reload_from_source()).await;
            }
        })
    };
    let served = weir_server::run_per_core(listener, threads, state, stopped).await;
    reloader.abort();
    if let Err(e) = served {
        bail!("server failed: {e}");
    }
    if let Some(grpc) = grpc {
        match grpc.await {
            Ok(Err(e)) => bail!("gRPC server failed: {e}"),
            Err(e) => bail!("gRPC server failed: {e}"),
            Ok(Ok(())) => {}
        }
    }
    if let Some(internal) = internal {
        match internal.await {
            Ok(Err(e)) => bail!("internal server failed: {e}"),
            Err(e) => bail!("internal server failed: {e}"),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}
