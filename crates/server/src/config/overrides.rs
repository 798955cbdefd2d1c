//! `[[overrides]]`: named identities with a quota of their own, or none.
//!
//! ```toml
//! [[overrides]]
//! policy = "seller-stock-read"
//! keys = ["seller-1", "seller-2"]   # identities as the client sends them
//! capacity = 100                    # any of the policy's own parameters
//!
//! [[overrides]]
//! policy = "seller-stock-read"
//! keys = ["internal-batch"]
//! unlimited = true                  # admitted, not counted, still in metrics
//! ```

use std::collections::BTreeMap;

use toml::{Spanned, Value};
use weir_core::{MAX_IDENTITY, Policy};

use super::{PolicyConfig, Report, Setting, TableId};

/// What an override gives its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quota {
    /// The policy with some parameters replaced: its own state.
    Policy(Policy),
    /// Admitted, not counted.
    Unlimited,
}

/// One `[[overrides]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The policy it overrides.
    pub policy: TableId,
    /// The identities it applies to, as clients send them.
    pub keys: Vec<String>,
    /// What they get instead.
    pub quota: Quota,
}

pub(super) type Raw = Vec<BTreeMap<String, Spanned<Value>>>;

pub(super) fn parse(
    raw: &Raw,
    policies: &[PolicyConfig],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    report: &mut Report<'_>,
) -> Vec<Override> {
    let mut overrides = Vec::new();
    let mut seen: BTreeMap<(TableId, String), usize> = BTreeMap::new();
    for (i, table) in raw.iter().enumerate() {
        let entry = Entry::new(table, i + 1);
        let Some(name) = table.get("policy").and_then(|v| v.get_ref().as_str()) else {
            report.error(
                &entry.first,
                &entry.place("policy"),
                "name the policy it overrides",
            );
            continue;
        };
        let Some(id) = resolve(name) else {
            report.error(
                &entry.span("policy"),
                &entry.place("policy"),
                format!("no policy `{name}` (defined: {})", known()),
            );
            continue;
        };
        let Some(base) = policies.iter().find(|p| p.name == name).map(|p| p.policy) else {
            continue; // the policy itself has errors, reported there
        };
        let keys = entry.keys(report);
        for key in &keys {
            if let Some(other) = seen.insert((id, key.clone()), entry.number) {
                report.error(
                    &entry.span("keys"),
                    &entry.place("keys"),
                    format!("`{key}` is already overridden for `{name}` by [[overrides]] #{other}"),
                );
            }
        }
        if let Some(quota) = entry.quota(base, report) {
            overrides.push(Override {
                policy: id,
                keys,
                quota,
            });
        }
    }
    overrides
}

/// One `[[overrides]]` table being read, and where to point its errors.
struct Entry<'a> {
    table: &'a BTreeMap<String, Spanned<Value>>,
    /// Its place among the tables, from 1.
    number: usize,
    /// The span of its first key: where an error of the whole table points.
    first: std::ops::Range<usize>,
}

impl<'a> Entry<'a> {
    fn new(table: &'a BTreeMap<String, Spanned<Value>>, number: usize) -> Self {
        let first = table
            .values()
            .map(Spanned::span)
            .min_by_key(|s| s.start)
            .unwrap_or(0..0);
        Self {
            table,
            number,
            first,
        }
    }

    fn place(&self, key: &str) -> String {
        format!("[[overrides]] #{} {key}", self.number)
    }

    /// The span of `key`, or of the table when it is absent.
    fn span(&self, key: &str) -> std::ops::Range<usize> {
        self.table
            .get(key)
            .map_or(self.first.clone(), Spanned::span)
    }

    /// The identities it lists, each of 1 to [`MAX_IDENTITY`] bytes.
    fn keys(&self, report: &mut Report<'_>) -> Vec<String> {
        let keys: Vec<String> = match self.table.get("keys").map(Spanned::get_ref) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        if keys.is_empty() {
            report.error(
                &self.span("keys"),
                &self.place("keys"),
                "list the identities, e.g. [\"seller-1\"]",
            );
        }
        for key in keys
            .iter()
            .filter(|k| k.is_empty() || k.len() > MAX_IDENTITY)
        {
            report.error(
                &self.span("keys"),
                &self.place("keys"),
                format!("`{key}` is not an identity of 1 to {MAX_IDENTITY} bytes"),
            );
        }
        keys
    }

    /// What its keys get: `unlimited`, a `multiplier`, or `base` with the
    /// parameters given replaced — read as plans and per-key limits are
    /// ([`Setting`]), each error at its field.
    fn quota(&self, base: Policy, report: &mut Report<'_>) -> Option<Quota> {
        let mut texts = Vec::new();
        for (key, value) in self.table {
            if matches!(key.as_str(), "policy" | "keys") {
                continue;
            }
            match super::plans::text(value.get_ref()) {
                Some(text) => texts.push((key.as_str(), text)),
                None => report.error(
                    &value.span(),
                    &self.place(key),
                    "expected a string or an integer",
                ),
            }
        }
        match Setting::parse(texts, &base) {
            Ok(Setting::Unlimited) => Some(Quota::Unlimited),
            Ok(setting) => match setting.apply(&base) {
                Ok(policy) => Some(Quota::Policy(policy)),
                Err((field, message)) => {
                    report.error(&self.span(&field), &self.place(&field), message);
                    None
                }
            },
            Err((field, message)) => {
                report.error(&self.span(&field), &self.place(&field), message);
                None
            }
        }
    }
}
