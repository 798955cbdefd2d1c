//! `[plans.NAME]`: named sets of per-policy settings a key is put on by the
//! API (`PUT /v1/keys/{key}/plan`), and the one [`Setting`] both plans and
//! the API's per-key limits are written in.
//!
//! ```toml
//! [plans.pro]
//! policies = { monthly = { limit = 1000000 }, burst = { capacity = 200 } }
//!
//! [plans.internal]
//! policies = { monthly = { unlimited = true }, burst = { multiplier = 4 } }
//! ```

use std::collections::BTreeMap;

use toml::{Spanned, Value};
use weir_core::Policy;

use super::{PolicyConfig, Report, TableId};

/// What a plan or a per-key limit gives a key under one policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Setting {
    /// Some of the policy's own parameters replaced (name → value).
    Params(BTreeMap<String, String>),
    /// Admitted, not counted.
    Unlimited,
    /// The policy's limit times this many millionths (`multiplier = 2`:
    /// twice the limit, [`Policy::multiplied`]).
    Multiplier(u64),
}

/// The largest `multiplier`.
const MAX_MULTIPLIER: u64 = 1_000;

impl Setting {
    /// The setting written as `fields` (each value as text: a string as
    /// it is, a number or a boolean as written), checked against `base`:
    /// `unlimited = true`, or `multiplier = M` (0 < M ≤ 1000, up to six
    /// decimals), or some of `base`'s parameters. The error names the
    /// field at fault and says what would be valid.
    pub fn parse<'a>(
        fields: impl IntoIterator<Item = (&'a str, String)>,
        base: &Policy,
    ) -> Result<Self, (String, String)> {
        let setting = Self::read(fields).map_err(|(field, message)| match field.as_str() {
            "policy" => (
                field,
                format!(
                    "give some of {}'s parameters ({}), {message}",
                    base.algorithm().name(),
                    base.algorithm().params().join(", ")
                ),
            ),
            _ => (field, message),
        })?;
        setting.apply(base)?;
        Ok(setting)
    }

    /// The setting written as `fields`, not yet checked against a policy
    /// (as a record read back from a shared store).
    pub fn read<'a>(
        fields: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Result<Self, (String, String)> {
        let mut params = BTreeMap::new();
        let (mut unlimited, mut multiplier) = (false, None);
        for (name, value) in fields {
            match name {
                "unlimited" if value == "true" => unlimited = true,
                "unlimited" if value == "false" => {}
                "unlimited" => return Err((name.into(), "must be true or false".into())),
                "multiplier" => multiplier = Some(millionths(&value).ok_or_else(|| {
                    (name.to_owned(), format!("`{value}` is not a number above 0 and at most {MAX_MULTIPLIER}, with up to six decimals (e.g. 2 or 1.5)"))
                })?),
                _ => {
                    params.insert(name.to_owned(), value);
                }
            }
        }
        Ok(match (unlimited, multiplier, params.is_empty()) {
            (true, None, true) => Self::Unlimited,
            (false, Some(m), true) => Self::Multiplier(m),
            (false, None, false) => Self::Params(params),
            (false, None, true) => {
                return Err(("policy".into(), "unlimited = true, or a multiplier".into()));
            }
            _ => {
                return Err((
                    if unlimited { "unlimited" } else { "multiplier" }.into(),
                    "takes no other setting: give one of parameters, unlimited = true or a multiplier".into(),
                ));
            }
        })
    }

    /// The policy `base` becomes under this setting (an unlimited one keeps
    /// `base`: it is admitted without counting); the error names the field.
    pub fn apply(&self, base: &Policy) -> Result<Policy, (String, String)> {
        match self {
            Self::Unlimited => Ok(*base),
            Self::Multiplier(m) => base
                .multiplied(*m, 1_000_000)
                .map_err(|e| ("multiplier".into(), e.kind.to_string())),
            Self::Params(given) => {
                let written = base.to_string();
                let mut words = written.split_whitespace();
                let algorithm = words.next().unwrap_or_default();
                let mut params: BTreeMap<&str, &str> =
                    words.filter_map(|w| w.split_once('=')).collect();
                params.extend(given.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                Policy::from_params(algorithm, params).map_err(|e| (e.field, e.kind.to_string()))
            }
        }
    }

    /// One line that names the setting and nothing else: two settings are
    /// equal when their texts are (`limit=20000`, `unlimited`, `x1.5`).
    pub fn canonical(&self) -> String {
        match self {
            Self::Params(p) => p
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
            Self::Unlimited => "unlimited".into(),
            Self::Multiplier(m) => {
                let (whole, part) = (m / 1_000_000, m % 1_000_000);
                match part {
                    0 => format!("x{whole}"),
                    _ => format!("x{whole}.{}", format!("{part:06}").trim_end_matches('0')),
                }
            }
        }
    }

    /// The setting as JSON fields (what `GET /v1/limits` shows).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        match self {
            Self::Params(p) => {
                for (k, v) in p {
                    let value = v
                        .parse::<u64>()
                        .map_or_else(|_| v.clone().into(), serde_json::Value::from);
                    map.insert(k.clone(), value);
                }
            }
            Self::Unlimited => {
                map.insert("unlimited".into(), true.into());
            }
            Self::Multiplier(_) => {
                let text = self.canonical();
                let number = text[1..].parse::<serde_json::Number>().ok();
                map.insert("multiplier".into(), number.map_or(text.into(), Into::into));
            }
        }
        map
    }
}

/// `text` (a decimal above 0, at most [`MAX_MULTIPLIER`], up to six
/// decimals) in millionths.
fn millionths(text: &str) -> Option<u64> {
    let (whole, part) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && part.is_empty()
        || part.len() > 6
        || !(whole.bytes().chain(part.bytes())).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let part: u64 = format!("{part:0<6}").parse().ok()?;
    let m = whole.checked_mul(1_000_000)?.checked_add(part)?;
    (m > 0 && m <= MAX_MULTIPLIER * 1_000_000).then_some(m)
}

/// One `[plans.NAME]` table: per policy it names, what its keys get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Its name.
    pub name: String,
    /// The policies it sets, each with its setting.
    pub policies: Vec<(TableId, Setting)>,
}

pub(super) type Raw = BTreeMap<String, BTreeMap<String, Spanned<Value>>>;

/// A TOML value as the text [`Setting::parse`] reads; `None` for a table
/// or an array.
pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Integer(n) => Some(n.to_string()),
        Value::Float(x) => Some(x.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(super) fn parse(
    raw: &Raw,
    policies: &[PolicyConfig],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    report: &mut Report<'_>,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    for (name, table) in raw {
        let place = |key: &str| format!("[plans.{name}] {key}");
        if !super::valid_name(name) {
            let span = table.values().next().map_or(0..0, Spanned::span);
            report.error(
                &span,
                &format!("[plans.{name}]"),
                "a plan's name is letters, digits, `-` and `_`, at most 64",
            );
        }
        for (key, value) in table.iter().filter(|(k, _)| *k != "policies") {
            report.error(&value.span(), &place(key), "unknown key (valid: policies)");
        }
        let Some(value) = table.get("policies") else {
            let span = table.values().next().map_or(0..0, Spanned::span);
            let example = "policies = { monthly = { limit = 1000000 } }";
            report.error(
                &span,
                &place("policies"),
                format!("name what the plan sets, e.g. {example}"),
            );
            continue;
        };
        let Value::Table(set) = value.get_ref() else {
            report.error(
                &value.span(),
                &place("policies"),
                "expected a table of policy = { setting }",
            );
            continue;
        };
        let mut plan = Plan {
            name: name.clone(),
            policies: Vec::new(),
        };
        for (policy, setting) in set {
            let at = place(&format!("policies.{policy}"));
            let Some(id) = resolve(policy) else {
                report.error(
                    &value.span(),
                    &at,
                    format!("no policy `{policy}` (defined: {})", known()),
                );
                continue;
            };
            let Some(base) = policies.iter().find(|p| &p.name == policy) else {
                continue; // the policy itself has errors, reported there
            };
            let Value::Table(fields) = setting else {
                report.error(
                    &value.span(),
                    &at,
                    "expected a table, e.g. { limit = 1000 }",
                );
                continue;
            };
            let mut texts = Vec::new();
            for (field, v) in fields {
                match text(v) {
                    Some(t) => texts.push((field.as_str(), t)),
                    None => report.error(
                        &value.span(),
                        &format!("{at}.{field}"),
                        "expected a string, a number or a boolean",
                    ),
                }
            }
            match Setting::parse(texts, &base.policy) {
                Ok(setting) => plan.policies.push((id, setting)),
                Err((field, message)) => {
                    report.error(&value.span(), &format!("{at}.{field}"), message)
                }
            }
        }
        plans.push(plan);
    }
    plans
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn multipliers_are_exact_decimals() {
        assert_eq!(millionths("2"), Some(2_000_000));
        assert_eq!(millionths("1.5"), Some(1_500_000));
        assert_eq!(millionths(".25"), Some(250_000));
        assert_eq!(millionths("0.000001"), Some(1));
        for bad in ["0", "", ".", "1e3", "-1", "1.0000001", "1001", "nan"] {
            assert_eq!(millionths(bad), None, "{bad}");
        }
        assert_eq!(Setting::Multiplier(1_500_000).canonical(), "x1.5");
        assert_eq!(Setting::Multiplier(3_000_000).canonical(), "x3");
    }

    #[test]
    fn a_setting_is_checked_against_its_policy() {
        let base = Policy::parse("fixed-window limit=100 window=1h").unwrap();
        let limit = |v: &str| Setting::parse([("limit", v.to_owned())], &base);
        let doubled = limit("200").unwrap();
        assert_eq!(doubled.canonical(), "limit=200");
        assert_eq!(
            doubled.apply(&base).unwrap().to_string(),
            "fixed-window limit=200 window=1h"
        );
        assert_eq!(limit("none").unwrap_err().0, "limit");
        let twice = Setting::parse([("multiplier", "2".to_owned())], &base).unwrap();
        assert_eq!(
            twice.apply(&base).unwrap().to_string(),
            "fixed-window limit=200 window=1h"
        );
        let (field, message) = Setting::parse([("capacity", "5".to_owned())], &base).unwrap_err();
        assert_eq!(field, "capacity", "{message}");
        let both = [("unlimited", "true".to_owned()), ("limit", "3".to_owned())];
        assert_eq!(Setting::parse(both, &base).unwrap_err().0, "unlimited");
    }
}
