//! `weir explain POLICY KEY`: asks a running weir why a key is limited
//! (`GET /v1/explain`, with the admin token) and prints its answer.

use crate::healthcheck::{admin, escape};

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
    let mut query = format!("policy={}&key={}", escape(&args.policy), escape(&args.key));
    if let Some(source) = &args.source {
        query.push_str(&format!("&source={}", escape(source)));
    }
    admin(&args.url, "GET", &format!("/v1/explain?{query}"), "")
}
