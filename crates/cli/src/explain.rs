//! `weir explain POLICY KEY`: asks a running weir why a key is limited
//! (`GET /v1/explain`, with the admin token) and prints its answer.

use std::time::Duration;

use anyhow::{Context, bail};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The policy, as configured.
    #[arg(value_name = "POLICY")]
    policy: String,
    /// The identity as a client sends it (or a stored key, `peer:203.0.113.7`).
    #[arg(value_name = "KEY")]
    key: String,
    /// Where the identity comes from, as a route names it (`peer`,
    /// `header:x-api-key`, …; default: the decision API's keys).
    #[arg(long, value_name = "SOURCE")]
    source: Option<String>,
    /// weir's API listener (its internal one, if split).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    url: String,
}

/// Prints the explanation; fails (exit 1) with weir's error when it has none.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let token = std::env::var("WEIR_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .context("WEIR_ADMIN_TOKEN: set it to weir's admin token (`[server] admin_token`)")?;
    let escape = |text: &str| {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut query = format!("policy={}&key={}", escape(&args.policy), escape(&args.key));
    if let Some(source) = &args.source {
        query.push_str(&format!("&source={}", escape(source)));
    }
    let url: hyper::Uri = format!("{}/v1/explain?{query}", args.url.trim_end_matches('/'))
        .parse()
        .with_context(|| {
            format!(
                "--url `{}` is not a URL such as http://127.0.0.1:8080",
                args.url
            )
        })?;
    let (status, body) = crate::healthcheck::get(&url, Some(&token), Duration::from_secs(5))?;
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        bail!("{url}: {status}: {text}");
    }
    let pretty = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    println!("{}", pretty.unwrap_or_else(|| text.into_owned()));
    Ok(())
}
