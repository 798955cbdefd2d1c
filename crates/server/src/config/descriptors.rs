//! `[[descriptors]]`: Envoy descriptor rules — a domain and the entries a
//! descriptor must have, mapped to a policy (or to no limit). The rules of
//! a domain form a tree matched as envoyproxy/ratelimit matches its files
//! (`weir-envoy-ratelimit`): at each entry its value first, then wildcard
//! values in file order, then the key's default; a rule applies only to
//! descriptors whose last entry reaches its node.

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;
use weir_envoy_ratelimit::Tree;

use super::{Report, TableId};

/// Maps an Envoy descriptor to a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// The request's domain.
    pub domain: String,
    /// The descriptor's entries, in order: a key, and the value it must
    /// have (`*` in it: any run of characters; none: any value).
    pub entries: Vec<(String, Option<String>)>,
    /// The policy that decides it; `None` for `unlimited = true` (matched,
    /// never limited) and `refuse = true` (always over the limit).
    pub policy: Option<TableId>,
    /// `refuse = true`: every descriptor it matches is over the limit
    /// (envoyproxy/ratelimit's `requests_per_unit: 0`).
    pub refuse: bool,
    /// `no_limit = true`: matched, and no limit applies — not even a
    /// default or wildcard rule beside it (envoyproxy/ratelimit's node
    /// without a `rate_limit`, their way to exempt a value). Unlike
    /// `unlimited`, answered as no rule is (`limit_remaining` 0).
    pub no_limit: bool,
    /// `unit` of a `refuse = true` rule: what its descriptors' current
    /// limit answers (`requests_per_unit` 0 per this unit; second unless
    /// given), as envoyproxy/ratelimit's `requests_per_unit: 0` does.
    pub refuse_unit: weir_envoy_ratelimit::Unit,
    /// `report = true`: its descriptors are usage reported after the fact
    /// (always `OK`, charged with `hits_addend`), e.g. the call Envoy makes
    /// when a stream is done (`apply_on_stream_done`).
    pub report: bool,
    /// `key_entries`: the entries the key is built from (none: all), so that
    /// a report rule charges the key of the admission rule.
    pub key_entries: Option<Vec<String>>,
    /// `name`: what `replaces` calls it.
    pub name: Option<String>,
    /// `replaces`: the rules (by `name`) this one stands for when both
    /// match descriptors of one request.
    pub replaces: Vec<String>,
    /// `share_threshold = true`: every value a wildcard entry matches
    /// counts as one (one key for all).
    pub share_threshold: bool,
}

/// The rules of every domain as a tree: each node holds a rule's index.
pub type DescriptorTree = Arc<Tree<usize>>;

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    domain: Spanned<String>,
    entries: Spanned<Vec<String>>,
    policy: Option<Spanned<String>>,
    unlimited: Option<Spanned<bool>>,
    refuse: Option<Spanned<bool>>,
    no_limit: Option<Spanned<bool>>,
    unit: Option<Spanned<String>>,
    report: Option<bool>,
    key_entries: Option<Spanned<Vec<String>>>,
    name: Option<Spanned<String>>,
    replaces: Option<Spanned<Vec<String>>>,
    share_threshold: Option<bool>,
}

pub(super) fn parse(
    raw: &[Raw],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    leased: &dyn Fn(&str) -> bool,
    report: &mut Report<'_>,
) -> (Vec<DescriptorRule>, DescriptorTree) {
    let mut rules = Vec::new();
    let mut tree = Tree::default();
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
                        "`{entry}` is not an entry (valid: \"key\" for any value, \"key=value\", \"key=prefix*\")"
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
        fn set(flag: &Option<Spanned<bool>>) -> Option<&Spanned<bool>> {
            flag.as_ref().filter(|f| *f.get_ref())
        }
        let (unlimited, refuse, no_limit) =
            (set(&rule.unlimited), set(&rule.refuse), set(&rule.no_limit));
        let flags: Vec<(&str, &Spanned<bool>)> = [
            ("unlimited", unlimited),
            ("refuse", refuse),
            ("no_limit", no_limit),
        ]
        .into_iter()
        .filter_map(|(key, flag)| flag.map(|f| (key, f)))
        .collect();
        let policy = match (&rule.policy, flags.as_slice()) {
            (Some(policy), []) => match policy_of(policy, resolve, known, leased) {
                Ok(id) => Some(id),
                Err(message) => {
                    report.error(&policy.span(), &place("policy"), message);
                    continue;
                }
            },
            (None, [_]) => None,
            (_, [(key, flag), ..]) => {
                let message =
                    "give one of policy, unlimited = true, refuse = true and no_limit = true";
                report.error(&flag.span(), &place(key), message);
                continue;
            }
            (None, []) => {
                let message = format!(
                    "name the policy that decides it (defined: {}), or set unlimited = true, refuse = true or no_limit = true",
                    known()
                );
                report.error(&rule.entries.span(), &place("policy"), message);
                continue;
            }
        };
        let refuse_unit = match &rule.unit {
            None => weir_envoy_ratelimit::Unit::Second,
            Some(unit) => match (
                refuse.is_some(),
                weir_envoy_ratelimit::Unit::parse(unit.get_ref()),
            ) {
                (true, Some(parsed)) => parsed,
                (true, None) => {
                    let message = format!(
                        "`{}` is not a unit (valid: second, minute, hour, day, week, month, year)",
                        unit.get_ref()
                    );
                    report.error(&unit.span(), &place("unit"), message);
                    continue;
                }
                (false, _) => {
                    report.error(&unit.span(), &place("unit"), "is what a refuse = true rule answers as its unit; other rules take theirs from their policy");
                    continue;
                }
            },
        };
        let is_report = rule.report.unwrap_or(false);
        if let (true, Some((_, flag))) = (is_report, flags.first()) {
            let message =
                "a report rule charges a policy: it cannot be unlimited, refuse or no_limit";
            report.error(&flag.span(), &place("report"), message);
            continue;
        }
        let name = rule.name.as_ref().map(|n| n.get_ref().clone());
        let replaces = rule
            .replaces
            .as_ref()
            .map_or_else(Vec::new, |r| r.get_ref().clone());
        if let Some(r) = &rule.replaces {
            if replaces.iter().any(String::is_empty) {
                report.error(
                    &r.span(),
                    &place("replaces"),
                    "should not have an empty entry",
                );
            }
            if name.as_ref().is_some_and(|n| replaces.contains(n)) {
                report.error(
                    &r.span(),
                    &place("replaces"),
                    "should not name the rule itself",
                );
            }
        }
        let share_threshold = rule.share_threshold.unwrap_or(false);
        let wild = entries
            .iter()
            .any(|(_, v)| v.as_ref().is_some_and(|v| v.contains('*')));
        if share_threshold && !wild {
            report.error(
                &rule.entries.span(),
                &place("share_threshold"),
                "applies to wildcard values: give an entry such as \"path=/api/*\"",
            );
        }
        let path: Vec<(&str, Option<&str>)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        let domain = rule.domain.get_ref();
        if let Err(e) = tree.insert(domain, &path, rules.len(), share_threshold) {
            report.error(
                &rule.entries.span(),
                &place("entries"),
                format!("{e}: another rule of this domain has the same entries"),
            );
            continue;
        }
        rules.push(DescriptorRule {
            domain: domain.clone(),
            entries,
            policy,
            refuse: refuse.is_some(),
            no_limit: no_limit.is_some(),
            refuse_unit,
            report: is_report,
            key_entries: rule.key_entries.as_ref().map(|k| k.get_ref().clone()),
            name,
            replaces,
            share_threshold,
        });
    }
    (rules, Arc::new(tree))
}

/// Why a concurrency policy cannot serve Envoy.
pub const NO_RELEASE: &str = "a concurrency policy cannot serve Envoy: Envoy's rate limit protocol has no release, so every lease would be held until it expires";

/// The policy a rule names, or why it cannot decide descriptors.
fn policy_of(
    policy: &Spanned<String>,
    resolve: &dyn Fn(&str) -> Option<TableId>,
    known: &dyn Fn() -> String,
    leased: &dyn Fn(&str) -> bool,
) -> Result<TableId, String> {
    let name = policy.get_ref();
    if leased(name) {
        return Err(format!(
            "`{name}` is a concurrency policy: {}; use it in a gateway route, the decision API or the tower layer",
            NO_RELEASE
        ));
    }
    resolve(name).ok_or_else(|| format!("no policy `{name}` (defined: {})", known()))
}
