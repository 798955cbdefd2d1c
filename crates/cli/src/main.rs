//! The `weir` binary: parse the command line, run the subcommand, and turn
//! errors into a message and an exit status (2 for bad input).

mod bench;
mod config;
mod envoy_ratelimit;
mod explain;
mod healthcheck;
mod limitador;
mod limits;
mod policy_flags;
mod serve;
mod simulate;
mod store_flag;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc rather than the system allocator: a proxied request allocates
/// and frees many small buffers across two connections, where glibc's
/// malloc took a large share of the gateway's user time
/// (docs/BENCHMARKS.md).
/// Its v2 line (the crate's `v2` feature): v3's aligned entry point, which
/// every Rust allocation goes through, over-allocates any block above
/// 1 KiB that is not a power of two (hyper's and h2's buffers), where v2
/// takes the plain path: fewer instructions per gateway request
/// (`bench/instructions.sh`) and Envoy call (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// weir: an exact rate limiter.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace through a policy and print every decision, or compare
    /// several policies on one trace (--compare) and plot them (--plot).
    Simulate(Box<simulate::Args>),
    /// Run a closed-loop load on a store — in process, or Redis with
    /// --store — and print one JSON object: decisions per second, latency
    /// percentiles, peak memory.
    Bench(Box<bench::Args>),
    /// Serve the decision API and the gateway (the embedded example policies
    /// without --config).
    Serve(serve::Args),
    /// Print an example config, or check one.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Serve as envoyproxy/ratelimit does, configured by its environment
    /// variables and its config files (RUNTIME_ROOT): a drop-in for its
    /// image.
    EnvoyRatelimit(envoy_ratelimit::Args),
    /// Ask a URL of weir and exit 0 if it answers 2xx (the container's
    /// health check: no shell or curl needed).
    Healthcheck(healthcheck::Args),
    /// Ask a running weir why a key is limited: the routes, override,
    /// parameters and penalty in force, and the key's standing (in debt,
    /// banned, its reset). Reads the admin token from WEIR_ADMIN_TOKEN.
    Explain(explain::Args),
    /// Set, read, list and remove limits managed by API on a running weir:
    /// a key's own limit under a policy (another limit, unlimited, a
    /// multiplier; until a time), and its plan. Reads the admin token from
    /// WEIR_ADMIN_TOKEN.
    Limits(limits::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(*args),
        Command::Bench(args) => bench::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Config(command) => config::config(&command),
        Command::EnvoyRatelimit(args) => envoy_ratelimit::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Limits(args) => limits::run(&args),
        Command::Healthcheck(args) => match healthcheck::run(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `weir simulate … | head` closes the pipe early; that is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
