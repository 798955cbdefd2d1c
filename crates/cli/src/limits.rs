//! `weir limits set|get|list|delete|plan`: limits managed by API, through
//! a running weir's admin API (`/v1/limits`, `/v1/keys/{key}/plan`) with
//! the admin token of `WEIR_ADMIN_TOKEN`. Each prints weir's answer.

use anyhow::{Context, bail};
use serde_json::{Map, Value};

use crate::healthcheck::{admin, escape};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
    /// weir's API listener (its internal one, if split).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Sets a key's own limit under a policy: some of the policy's
    /// parameters (`limit=20000`, `capacity=200 rate=50/s`), or
    /// `unlimited=true`, or `multiplier=2`.
    Set {
        /// The policy, as configured.
        policy: String,
        /// The identity, as clients send it.
        key: String,
        /// `NAME=VALUE`: the setting.
        #[arg(required = true, value_name = "NAME=VALUE")]
        setting: Vec<String>,
        #[command(flatten)]
        meta: Meta,
    },
    /// Shows a key's own limit under a policy.
    Get {
        /// The policy.
        policy: String,
        /// The identity.
        key: String,
    },
    /// Lists the limits and plans set, in key order, a page at a time.
    List {
        /// Only this policy's limits.
        #[arg(long)]
        policy: Option<String>,
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// The page after this key (the last page's `next`).
        #[arg(long)]
        after: Option<String>,
        /// At most this many (up to 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only plans.
        #[arg(long)]
        plans: bool,
    },
    /// Removes a key's own limit under a policy: the policy (or its plan,
    /// or the file's override) decides it again.
    Delete {
        /// The policy.
        policy: String,
        /// The identity.
        key: String,
    },
    /// Shows a key's plan, puts it on one (`PLAN`), or takes it off
    /// (`--remove`).
    Plan {
        /// The identity.
        key: String,
        /// The plan, as configured (`[plans.NAME]`).
        plan: Option<String>,
        /// Takes the key off its plan.
        #[arg(long, conflicts_with = "plan")]
        remove: bool,
        #[command(flatten)]
        meta: Meta,
    },
}

/// When a setting ends, and why it was made.
#[derive(Debug, clap::Args)]
struct Meta {
    /// It ends at this time (RFC 3339, `2026-12-31T23:59:59Z`).
    #[arg(long, value_name = "TIME", conflicts_with = "for_")]
    expires_at: Option<String>,
    /// It ends this long from now (`7d`, `12h`).
    #[arg(long = "for", id = "for_", value_name = "DURATION")]
    for_: Option<String>,
    /// Why: kept with it and logged.
    #[arg(long)]
    reason: Option<String>,
}

impl Meta {
    fn add_to(&self, body: &mut Map<String, Value>) -> anyhow::Result<()> {
        let expires_at = match (&self.expires_at, &self.for_) {
            (Some(at), _) => Some(at.clone()),
            (None, Some(span)) => {
                let ns = weir_core::units::parse_duration(span).map_err(|e| {
                    anyhow::anyhow!("--for {span}: {e} (a duration such as 7d or 12h)")
                })?;
                let at = jiff::Timestamp::now()
                    .checked_add(jiff::SignedDuration::from_nanos(i64::try_from(ns)?))
                    .context("--for: too far ahead")?;
                Some(at.to_string())
            }
            (None, None) => None,
        };
        if let Some(at) = expires_at {
            body.insert("expires_at".into(), at.into());
        }
        if let Some(reason) = &self.reason {
            body.insert("reason".into(), reason.as_str().into());
        }
        Ok(())
    }
}

/// `text` as JSON: a whole number or a boolean as such, anything else as
/// a string.
fn value(text: &str) -> Value {
    match text {
        "true" => true.into(),
        "false" => false.into(),
        _ => text.parse::<u64>().map_or_else(|_| text.into(), Into::into),
    }
}

/// Makes the request; prints weir's answer; fails (exit 1) with weir's
/// error.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let limit = |policy: &str, key: &str| format!("/v1/limits/{}/{}", escape(policy), escape(key));
    let (method, path, body) = match &args.command {
        Command::Set {
            policy,
            key,
            setting,
            meta,
        } => {
            let mut body = Map::new();
            for pair in setting {
                let Some((name, text)) = pair.split_once('=') else {
                    bail!(
                        "`{pair}`: write a setting as NAME=VALUE (limit=20000, multiplier=2, unlimited=true)"
                    );
                };
                body.insert(name.trim().to_owned(), value(text.trim()));
            }
            meta.add_to(&mut body)?;
            ("PUT", limit(policy, key), Value::Object(body).to_string())
        }
        Command::Get { policy, key } => ("GET", limit(policy, key), String::new()),
        Command::Delete { policy, key } => ("DELETE", limit(policy, key), String::new()),
        Command::List {
            policy,
            prefix,
            after,
            limit,
            plans,
        } => {
            let mut query = format!("prefix={}&limit={limit}&plans={plans}", escape(prefix));
            if let Some(policy) = policy {
                query.push_str(&format!("&policy={}", escape(policy)));
            }
            if let Some(after) = after {
                query.push_str(&format!("&after={}", escape(after)));
            }
            ("GET", format!("/v1/limits?{query}"), String::new())
        }
        Command::Plan {
            key,
            plan,
            remove,
            meta,
        } => {
            let path = format!("/v1/keys/{}/plan", escape(key));
            match (plan, remove) {
                (_, true) => ("DELETE", path, String::new()),
                (None, false) => ("GET", path, String::new()),
                (Some(plan), false) => {
                    let mut body = Map::new();
                    body.insert("plan".into(), plan.as_str().into());
                    meta.add_to(&mut body)?;
                    ("PUT", path, Value::Object(body).to_string())
                }
            }
        }
    };
    admin(&args.url, method, &path, &body)
}
