//! `[[descriptors]]`: Envoy descriptor rules — a domain and the entries a
//! descriptor must have, mapped to a policy.

use serde::Deserialize;
use toml::Spanned;

use super::{PolicyId, Report};

/// Maps an Envoy descriptor to a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// The request's domain.
    pub domain: String,
    /// The descriptor's entries, in order: a key, and the one value it must
    /// have (none: any value).
    pub entries: Vec<(String, Option<String>)>,
    /// The policy that decides it.
    pub policy: PolicyId,
}

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    domain: Spanned<String>,
    entries: Spanned<Vec<String>>,
    policy: Spanned<String>,
}

pub(super) fn parse(
    raw: &[Raw],
    resolve: &dyn Fn(&str) -> Option<PolicyId>,
    known: &dyn Fn() -> String,
    report: &mut Report<'_>,
) -> Vec<DescriptorRule> {
    let mut rules = Vec::new();
    for (i, rule) in raw.iter().enumerate() {
        let place = |key: &str| format!("[[descriptors]] #{} {key}", i + 1);
        let mut entries = Vec::new();
        for entry in rule.entries.get_ref() {
            let (key, value) = match entry.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (entry.as_str(), None),
            };
            if key.is_empty() || value.as_deref() == Some("") {
                report.error(
                    &rule.entries.span(),
                    &place("entries"),
                    format!(
                        "`{entry}` is not an entry (valid: \"key\" for any value, \"key=value\")"
                    ),
                );
            }
            entries.push((key.to_owned(), value));
        }
        if entries.is_empty() {
            report.error(
                &rule.entries.span(),
                &place("entries"),
                "name at least one entry, e.g. [\"seller\"]",
            );
        }
        if rule.domain.get_ref().is_empty() {
            report.error(&rule.domain.span(), &place("domain"), "must not be empty");
        }
        match resolve(rule.policy.get_ref()) {
            Some(policy) => rules.push(DescriptorRule {
                domain: rule.domain.get_ref().clone(),
                entries,
                policy,
            }),
            None => report.error(
                &rule.policy.span(),
                &place("policy"),
                format!(
                    "no policy `{}` (defined: {})",
                    rule.policy.get_ref(),
                    known()
                ),
            ),
        }
    }
    rules
}
