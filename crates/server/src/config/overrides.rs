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

use super::{PolicyConfig, PolicyId, Report};

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
    pub policy: PolicyId,
    /// The identities it applies to, as clients send them.
    pub keys: Vec<String>,
    /// What they get instead.
    pub quota: Quota,
}

pub(super) type Raw = Vec<BTreeMap<String, Spanned<Value>>>;

pub(super) fn parse(
    raw: &Raw,
    policies: &[PolicyConfig],
    resolve: &dyn Fn(&str) -> Option<PolicyId>,
    known: &dyn Fn() -> String,
    report: &mut Report<'_>,
) -> Vec<Override> {
    let mut overrides = Vec::new();
    let mut seen: BTreeMap<(PolicyId, String), usize> = BTreeMap::new();
    for (i, table) in raw.iter().enumerate() {
        let place = |key: &str| format!("[[overrides]] #{} {key}", i + 1);
        let first = table
            .values()
            .map(Spanned::span)
            .min_by_key(|s| s.start)
            .unwrap_or(0..0);
        let text = |key: &str| match table.get(key).map(Spanned::get_ref) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Integer(n)) => Some(n.to_string()),
            _ => None,
        };
        let Some(name) = table.get("policy").and_then(|v| v.get_ref().as_str()) else {
            report.error(&first, &place("policy"), "name the policy it overrides");
            continue;
        };
        let Some(id) = resolve(name) else {
            let span = table.get("policy").map_or(first.clone(), Spanned::span);
            report.error(
                &span,
                &place("policy"),
                format!("no policy `{name}` (defined: {})", known()),
            );
            continue;
        };
        let Some(base) = policies.iter().find(|p| p.name == name).map(|p| p.policy) else {
            continue; // the policy itself has errors, reported there
        };
        let keys_span = table.get("keys").map_or(first.clone(), Spanned::span);
        let keys: Vec<String> = match table.get("keys").map(Spanned::get_ref) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        if keys.is_empty() {
            report.error(
                &keys_span,
                &place("keys"),
                "list the identities, e.g. [\"seller-1\"]",
            );
        }
        for key in &keys {
            if key.is_empty() || key.len() > MAX_IDENTITY {
                report.error(
                    &keys_span,
                    &place("keys"),
                    format!("`{key}` is not an identity of 1 to {MAX_IDENTITY} bytes"),
                );
            }
            if let Some(other) = seen.insert((id, key.clone()), i + 1) {
                report.error(
                    &keys_span,
                    &place("keys"),
                    format!("`{key}` is already overridden for `{name}` by [[overrides]] #{other}"),
                );
            }
        }
        let unlimited = match table.get("unlimited").map(|v| (v, v.get_ref())) {
            None => false,
            Some((_, Value::Boolean(b))) => *b,
            Some((v, _)) => {
                report.error(&v.span(), &place("unlimited"), "must be true or false");
                false
            }
        };
        // The base policy's parameters, with those given here replaced.
        let written = base.to_string();
        let mut words = written.split_whitespace();
        let algorithm = words.next().unwrap_or_default().to_owned();
        let mut params: BTreeMap<String, String> = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let mut given = false;
        for key in table.keys() {
            if matches!(key.as_str(), "policy" | "keys" | "unlimited") {
                continue;
            }
            match text(key) {
                Some(value) => {
                    given = true;
                    params.insert(key.clone(), value);
                }
                None => report.error(
                    &table[key].span(),
                    &place(key),
                    "expected a string or an integer",
                ),
            }
        }
        let quota = match (unlimited, given) {
            (true, true) => {
                report.error(
                    &first,
                    &place("unlimited"),
                    "an unlimited override takes no parameters",
                );
                continue;
            }
            (true, false) => Quota::Unlimited,
            (false, false) => {
                report.error(
                    &first,
                    &place("policy"),
                    format!("give some of {algorithm}'s parameters, or unlimited = true"),
                );
                continue;
            }
            (false, true) => {
                match Policy::from_params(
                    &algorithm,
                    params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                ) {
                    Ok(policy) => Quota::Policy(policy),
                    Err(e) => {
                        let span = table.get(&e.field).map_or(first.clone(), Spanned::span);
                        report.error(&span, &place(&e.field), e.kind.to_string());
                        continue;
                    }
                }
            }
        };
        overrides.push(Override {
            policy: id,
            keys,
            quota,
        });
    }
    overrides
}
