//! `weir serve`'s configuration: TOML, parsed once into typed structs and
//! validated before anything is served. Each concept parses and validates its
//! own table (`server`, `store`, `policies`, `routes`, `descriptors`); every
//! problem in a file is reported in one run, each with its line, table and
//! key, and unknown keys with the nearest valid one.

mod buckets;
mod descriptors;
mod jwt;
mod keys;
mod overrides;
mod plans;
mod policies;
mod routes;
mod server;
mod store;

use std::fmt;
use std::ops::Range;

use serde::Deserialize;

pub use buckets::{BucketRule, find as find_bucket};
pub use descriptors::{DescriptorRule, DescriptorTree, NO_RELEASE};
pub use jwt::{Jwt, Refused as TokenRefused};
pub use overrides::{Override, Quota};
pub use plans::{Plan, Setting};
pub use policies::{OnStateLoss, OnStoreError, PolicyConfig, TableId};
pub use routes::{Cost, Identity, Route, Segment, Usage};
pub use server::{ConnectionLimits, RespAuth, ServerConfig, Telemetry, TlsFiles};
pub use store::{StoreConfig, StoreUrl};

/// The example served when `weir serve` is given no config, and printed by
/// `weir config example`.
pub const EXAMPLE: &str = include_str!("example.toml");

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[server]`: listeners and the admin token.
    pub server: ServerConfig,
    /// `[store]`: where state lives.
    pub store: StoreConfig,
    /// `[policies.NAME]`, in name order; a [`TableId`] is an index here.
    pub policies: Vec<PolicyConfig>,
    /// `[[routes]]`, in file order (the first match wins).
    pub routes: Vec<Route>,
    /// `[[descriptors]]`, in file order.
    pub descriptors: Vec<DescriptorRule>,
    /// The same rules as a tree per domain, as Envoy descriptors are
    /// matched: a node holds its rule's index in `descriptors`.
    pub descriptor_tree: DescriptorTree,
    /// `[[overrides]]`: identities with a quota of their own.
    pub overrides: Vec<Override>,
    /// `[plans.NAME]`: per-policy settings a key is put on by the API.
    pub plans: Vec<Plan>,
    /// `[[quota_buckets]]`: which policy and key an RLQS bucket is granted from.
    pub quota_buckets: Vec<BucketRule>,
    /// `[jwt]`: how `jwt:CLAIM` identities are verified.
    pub jwt: Option<jwt::Jwt>,
}

impl Config {
    /// The policy called `name`.
    pub fn policy_id(&self, name: &str) -> Option<TableId> {
        self.policies
            .iter()
            .position(|p| p.name == name)
            .map(TableId)
    }
}

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line; 0 for a problem outside the file (an environment
    /// variable).
    pub line: usize,
    /// Where: `[server] listen`, `[[routes]] #2 policies`, …
    pub place: String,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.place, self.message),
            line => write!(f, "line {line}: {}: {}", self.place, self.message),
        }
    }
}

/// Every problem found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The text being parsed and the problems found so far.
pub(crate) struct Report<'a> {
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl Report<'_> {
    /// The 1-based line of a byte offset.
    pub(crate) fn line(&self, span: &Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text[..end].matches('\n').count() + 1
    }

    /// Records a problem outside the file (line 0).
    pub(crate) fn error_outside(&mut self, place: &str, message: impl Into<String>) {
        self.errors.push(ConfigError {
            line: 0,
            place: place.to_owned(),
            message: message.into(),
        });
    }

    /// Records a problem at `span`.
    pub(crate) fn error(&mut self, span: &Range<usize>, place: &str, message: impl Into<String>) {
        let line = self.line(span);
        self.errors.push(ConfigError {
            line,
            place: place.to_owned(),
            message: message.into(),
        });
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    #[serde(default)]
    server: server::Raw,
    #[serde(default)]
    store: store::Raw,
    #[serde(default)]
    policies: policies::Raw,
    #[serde(default)]
    routes: Vec<routes::Raw>,
    #[serde(default)]
    descriptors: Vec<descriptors::Raw>,
    #[serde(default)]
    overrides: overrides::Raw,
    #[serde(default)]
    plans: plans::Raw,
    #[serde(default)]
    quota_buckets: Vec<buckets::Raw>,
    telemetry: Option<server::RawTelemetry>,
    jwt: Option<jwt::Raw>,
}

/// Secrets the environment gives beside the file, so that the file need not
/// hold them.
#[derive(Clone, Default)]
pub struct Env {
    /// `WEIR_ADMIN_TOKEN`, which stands in for an absent `admin_token`.
    pub admin_token: Option<String>,
    /// `WEIR_REDIS_PASSWORD`, which stands in for an absent
    /// `[store] password_file`.
    pub redis_password: Option<String>,
    /// `WEIR_RESP_PASSWORD`, which stands in for an absent `[server]
    /// resp_password_file`.
    pub resp_password: Option<String>,
}

impl Env {
    /// `WEIR_ADMIN_TOKEN` and `WEIR_REDIS_PASSWORD`, where set and not empty.
    pub fn from_process() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self {
            admin_token: var("WEIR_ADMIN_TOKEN"),
            redis_password: var("WEIR_REDIS_PASSWORD"),
            resp_password: var("WEIR_RESP_PASSWORD"),
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |v: &Option<String>| v.as_ref().map(|_| "<set>");
        f.debug_struct("Env")
            .field("admin_token", &set(&self.admin_token))
            .field("redis_password", &set(&self.redis_password))
            .field("resp_password", &set(&self.resp_password))
            .finish()
    }
}

/// Parses and validates `text`, with the secrets of `env` standing in for
/// those the file does not give.
/// The file read into its tables, every value of the wrong type reported
/// (with its table and key, and what to write instead): a value that does
/// not read is reported, blanked out, and the file read again, so that one
/// error does not hide the next. `None` when the file cannot be read past
/// an error (one that is not a key's value).
fn typed(text: &str, report: &mut Report<'_>) -> Option<Raw> {
    let mut text = text.to_owned();
    for _ in 0..64 {
        let e = match toml::from_str::<Raw>(&text) {
            Ok(raw) => return Some(raw),
            Err(e) => e,
        };
        let span = e.span().unwrap_or(0..0);
        let before = text.get(..span.start).unwrap_or_default();
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let line = &text[start..end];
        let message = e.message().trim().to_owned();
        let Some((key, value)) = line
            .split_once('=')
            .filter(|_| !line.trim_start().starts_with('['))
        else {
            report.error(&span, "file", message);
            return None;
        };
        // The table the key is in: the last header above it.
        let table = text[..start]
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('['))
            .map(|h| h.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
        let key = key.trim();
        // A duration or a rate written as a bare number: how to write it.
        let number = value.trim().parse::<f64>().is_ok() && message.contains("expected a string");
        let duration = ["timeout", "deadline", "window", "lease", "wait"]
            .iter()
            .any(|end| key.trim().ends_with(end));
        let hint = match (number, duration, key.trim()) {
            (true, true, key) => format!(" (a duration: write {key} = \"{}s\")", value.trim()),
            (true, _, "rate") => format!(" (a rate: write rate = \"{}/s\")", value.trim()),
            _ => String::new(),
        };
        let place = match table {
            Some(table) => format!("[{table}] {key}"),
            None => key.to_owned(),
        };
        report.error(&span, &place, format!("{message}{hint}"));
        // Blanked out, the line's bytes kept: later spans stay where they
        // were. A value over several lines cannot be: the errors so far.
        let blank = " ".repeat(end - start);
        text.replace_range(start..end, &blank);
        if toml::de::DeTable::parse(&text).is_err() {
            return None;
        }
    }
    None
}

pub fn parse(text: &str, env: &Env) -> Result<Config, ConfigErrors> {
    let mut report = Report {
        text,
        errors: Vec::new(),
    };
    let syntax = |report: &mut Report<'_>, e: toml::de::Error| {
        let span = e.span().unwrap_or(0..0);
        report.error(&span, "file", e.message().trim());
        ConfigErrors(std::mem::take(&mut report.errors))
    };
    let table = toml::de::DeTable::parse(text).map_err(|e| syntax(&mut report, e))?;
    keys::check(&table, &mut report);
    let raw =
        typed(text, &mut report).ok_or_else(|| ConfigErrors(std::mem::take(&mut report.errors)))?;
    let mut server = server::parse(raw.server, env, &mut report);
    server.telemetry = raw
        .telemetry
        .and_then(|t| server::telemetry(t, &mut report));
    let store = store::parse(raw.store, env, &mut report);
    let mut policies = policies::parse(&raw.policies, &mut report);
    if server.shadow {
        policies.iter_mut().for_each(|p| p.shadow = true);
    }
    let names = &raw.policies.0;
    let resolve = |name: &str| names.keys().position(|n| n == name).map(TableId);
    let known = || {
        names
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let leased = |name: &str| {
        (policies.iter())
            .any(|p| p.name == name && matches!(p.policy, weir_core::Policy::Concurrency(_)))
    };
    let leased_id = |id: TableId| names.keys().nth(id.0).is_some_and(|n| leased(n));
    let routes = routes::parse(&raw.routes, &resolve, &known, &leased_id, &mut report);
    let (descriptors, descriptor_tree) =
        descriptors::parse(&raw.descriptors, &resolve, &known, &leased, &mut report);
    let overrides = overrides::parse(&raw.overrides, &policies, &resolve, &known, &mut report);
    let plans = plans::parse(&raw.plans, &policies, &resolve, &known, &mut report);
    let quota_buckets = buckets::parse(&raw.quota_buckets, &policies, &resolve, &mut report);
    if let (StoreUrl::Redis(_), Some(p)) =
        (&store.url, policies.iter().find(|p| p.grants.is_some()))
    {
        report.error_outside(
            &format!("[policies.{}] grants", p.name),
            "fleet grants are booked in process in this version: serve them from a weir on the in-process store (no [store] url)",
        );
    }
    // Per-request checks beside grants are decided by the core (`Fleet::check`)
    // but not served yet: a granted policy is the RLQS's alone.
    let granted = |id: &TableId| policies.get(id.0).is_some_and(|p| p.grants.is_some());
    let checked = (routes.iter().flat_map(|r| &r.policies))
        .chain(descriptors.iter().filter_map(|d| d.policy.as_ref()))
        .find(|id| granted(id));
    if let Some(id) = checked {
        report.error_outside(
            &format!("[policies.{}] grants", policies[id.0].name),
            "a policy with grants is served to Rate Limit Quota Service clients only in this version: routes and descriptor rules check another policy",
        );
    }
    let jwt = raw.jwt.and_then(|j| jwt::parse(j, &mut report));
    let wants_jwt = routes.iter().any(|r| {
        std::iter::once(&r.identity)
            .chain(r.fallbacks.iter().map(|(i, _)| i))
            .chain(r.keyed.iter().flatten().map(|(i, _)| i))
            .any(|i| matches!(i, Identity::Jwt(_)))
    });
    if wants_jwt && jwt.is_none() && !report.errors.iter().any(|e| e.place.starts_with("[jwt]")) {
        report.error(
            &(text.len()..text.len()),
            "[jwt]",
            "a route's identity is a jwt: claim: say how tokens are verified ([jwt] secret_file, public_key or jwks_file)",
        );
    }
    // On a Redis Cluster one request's checks share one identity (one hash
    // slot, one atomic script): a route whose policies count other keys
    // could never be decided.
    let cluster = matches!(&store.url, StoreUrl::Redis(url) if url.starts_with("redis-cluster://"));
    if let Some(i) = routes
        .iter()
        .position(|r| r.keyed.iter().any(Option::is_some))
    {
        if cluster {
            report.error(
                &(text.len()..text.len()),
                &format!("[[routes]] #{} policies", i + 1),
                "on a Redis Cluster a request's policies count one identity (one hash slot): a policy with an identity of its own needs a single Redis (or Sentinel)",
            );
        }
    }
    if names.is_empty() {
        report.error(
            &(text.len()..text.len()),
            "[policies]",
            "define at least one policy ([policies.NAME] with an algorithm)",
        );
    }
    if !report.errors.is_empty() {
        report.errors.sort_by_key(|e| e.line);
        return Err(ConfigErrors(report.errors));
    }
    Ok(Config {
        server,
        store,
        policies,
        routes,
        descriptors,
        descriptor_tree,
        overrides,
        plans,
        quota_buckets,
        jwt,
    })
}

/// Letters, digits, `-` and `_`, at most 64.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A duration such as `50ms`; what is wrong otherwise.
pub(crate) fn duration(
    value: Option<&toml::Spanned<String>>,
    default: std::time::Duration,
    place: &str,
    report: &mut Report<'_>,
) -> std::time::Duration {
    let Some(value) = value else {
        return default;
    };
    match weir_core::units::parse_duration(value.get_ref()) {
        Ok(ns) => std::time::Duration::from_nanos(ns),
        Err(e) => {
            report.error(
                &value.span(),
                place,
                format!("`{}` is not valid: {e}", value.get_ref()),
            );
            default
        }
    }
}

#[cfg(test)]
mod tests;
