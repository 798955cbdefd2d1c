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
    /// `report = true`: its descriptors are usage reported after the fact
    /// (always `OK`, charged with `hits_addend`), e.g. the call Envoy makes
    /// when a stream is done (`apply_on_stream_done`).
    pub report: bool,
    /// `key_entries`: the entries the key is built from (none: all), so that
    /// a report rule charges the key of the admission rule.
    pub key_entries: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    domain: Spanned<String>,
    entries: Spanned<Vec<String>>,
    policy: Spanned<String>,
    report: Option<bool>,
    key_entries: Option<Spanned<Vec<String>>>,
}

pub(super) fn parse(
    raw: &[Raw],
    resolve: &dyn Fn(&str) -> Option<PolicyId>,
    known: &dyn Fn() -> String,
    leased: &dyn Fn(&str) -> bool,
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
        if let Some(keys) = &rule.key_entries {
            for key in keys.get_ref() {
                if !entries.iter().any(|(k, _)| k == key) {
                    report.error(
                        &keys.span(),
                        &place("key_entries"),
                        format!("`{key}` is not one of the rule's entries"),
                    );
                }
            }
        }
        if leased(rule.policy.get_ref()) {
            report.error(
                &rule.policy.span(),
                &place("policy"),
                format!(
                    "`{}` is a concurrency policy: {}; use it in a gateway route, the decision API or the tower layer",
                    rule.policy.get_ref(),
                    crate::envoy::NO_RELEASE
                ),
            );
            continue;
        }
        match resolve(rule.policy.get_ref()) {
            Some(policy) => rules.push(DescriptorRule {
                domain: rule.domain.get_ref().clone(),
                entries,
                policy,
                report: rule.report.unwrap_or(false),
                key_entries: rule.key_entries.as_ref().map(|k| k.get_ref().clone()),
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
