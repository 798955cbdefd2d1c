//! Unknown keys, found before the tables are read: every one is reported
//! (not just the first), with its line, table and the nearest valid key.

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Report;

const TOP: &[&str] = &[
    "server",
    "store",
    "policies",
    "routes",
    "descriptors",
    "overrides",
    "telemetry",
];
const TELEMETRY: &[&str] = &["otlp_endpoint", "include_identity"];
pub(super) const SERVER: &[&str] = &[
    "listen",
    "internal",
    "grpc",
    "admin_token",
    "header_timeout",
    "idle_timeout",
    "body_timeout",
    "body_deadline",
    "shutdown_timeout",
    "max_connections",
    "max_connections_per_ip",
    "trusted_proxies",
    "new_keys_per_ip",
    "shadow",
    "headers",
    "near_limit_ratio",
    "log_format",
    "log_level",
    "access_log",
    "access_log_identity",
];
const STORE: &[&str] = &[
    "url",
    "timeout",
    "max_keys",
    "fallback_share",
    "replica_acks",
];
const ROUTE: &[&str] = &[
    "match",
    "identity",
    "policies",
    "upstream",
    "max_wait",
    "timeout",
    "max_body",
    "identity_case",
    "usage",
    "cost",
    "min_cost",
];
const DESCRIPTOR: &[&str] = &["domain", "entries", "policy", "report", "key_entries"];

/// Reports every key of `table` that is not one of the known ones. A
/// policy's own parameters are checked by the policy (they depend on its
/// algorithm).
pub(super) fn check(table: &Spanned<DeTable<'_>>, report: &mut Report<'_>) {
    unknown(table.get_ref(), TOP, "top level", report);
    for (key, value) in table.get_ref() {
        let (known, place): (&[&str], &str) = match key.get_ref().as_ref() {
            "server" => (SERVER, "[server]"),
            "store" => (STORE, "[store]"),
            "telemetry" => (TELEMETRY, "[telemetry]"),
            "routes" => (ROUTE, "[[routes]]"),
            "descriptors" => (DESCRIPTOR, "[[descriptors]]"),
            _ => continue,
        };
        match value.get_ref() {
            DeValue::Table(table) => unknown(table, known, place, report),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let DeValue::Table(table) = item.get_ref() {
                        unknown(table, known, &format!("{place} #{}", i + 1), report);
                    }
                }
            }
            _ => {}
        }
    }
}

fn unknown(table: &DeTable<'_>, known: &[&str], place: &str, report: &mut Report<'_>) {
    for key in table.keys() {
        let name: &str = key.get_ref().as_ref();
        if known.contains(&name) {
            continue;
        }
        let nearest = known
            .iter()
            .map(|k| (strsim::damerau_levenshtein(name, k), *k))
            .filter(|(distance, k)| *distance <= 2.max(k.len() / 3))
            .min();
        let hint = match nearest {
            Some((_, k)) => format!("did you mean `{k}`?"),
            None => format!("valid: {}", known.join(", ")),
        };
        report.error(
            &key.span(),
            &format!("{place} {name}"),
            format!("unknown key ({hint})"),
        );
    }
}
