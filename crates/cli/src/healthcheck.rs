//! `weir healthcheck URL`: the container's health check, with no shell or
//! curl in the image. Exits 0 when the URL answers 2xx within the timeout,
//! 1 otherwise (saying why on standard error).

use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The URL to ask, over plain HTTP: /healthz (the process answers) or
    /// /readyz (its configuration is loaded and it decides: 2xx even while
    /// a shared store is down, since each policy's on_store_error decides
    /// then; the answer's "store_up" says which), e.g.
    /// http://127.0.0.1:9090/readyz.
    #[arg(value_name = "URL")]
    url: hyper::Uri,
    /// How long to wait for the answer: a duration (2s, 500ms), or a bare
    /// number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = timeout)]
    timeout: Duration,
}

/// `--timeout`: `2s`, `500ms`, `1m`, or seconds as a bare number.
fn timeout(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.trim().parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    weir_core::units::parse_duration(text)
        .map(Duration::from_nanos)
        .map_err(|e| format!("{e} (a duration such as 2s or 500ms)"))
}

/// Whether the URL answered 2xx (false, exit status 1, says why on
/// standard error); `Err` is a URL it cannot ask (exit status 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<bool> {
    if args.url.scheme_str() != Some("http") {
        bail!(
            "`{}`: weir healthcheck speaks plain HTTP (http://HOST:PORT/PATH); point it at a listener without TLS, such as the internal listener",
            args.url
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the health check")?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let status = runtime
        .block_on(async { tokio::time::timeout(args.timeout, client.get(args.url.clone())).await });
    match status {
        Err(_) => eprintln!("{}: no answer within {:?}", args.url, args.timeout),
        Ok(Err(e)) => eprintln!("{}: {e}", args.url),
        Ok(Ok(answer)) if answer.status().is_success() => return Ok(true),
        Ok(Ok(answer)) => eprintln!("{}: {}", args.url, answer.status()),
    }
    Ok(false)
}
