//! `[[quota_buckets]]`: which policy and key a Rate Limit Quota Service
//! bucket (an Envoy `BucketId`, a map of names to values) is granted from,
//! in the style of the descriptor rules. The first rule whose `match`
//! entries the bucket holds, with its `key` entry present, decides.
//!
//! ```toml
//! [[quota_buckets]]
//! match = { name = "api" }   # entries the BucketId must hold (optional)
//! key = "tenant"             # the entry whose value is the identity
//! policy = "api"             # a token-bucket policy with grants = { ttl }
//! abandon_after = "1m"       # a bucket not reported this long is abandoned
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{PolicyConfig, Report, TableId};

/// One `[[quota_buckets]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRule {
    /// Entries the bucket must hold, with these values.
    pub matches: Vec<(String, String)>,
    /// The entry whose value is the identity.
    pub key: String,
    /// The policy its grants are booked in.
    pub policy: TableId,
    /// A bucket not reported this long is told to abandon its assignment.
    pub abandon_after: Duration,
}

#[derive(Debug, Deserialize)]
pub(super) struct Raw {
    policy: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    #[serde(rename = "match", default)]
    matches: BTreeMap<String, String>,
    abandon_after: Option<Spanned<String>>,
}

pub(super) fn parse(
    raw: &[Raw],
    policies: &[PolicyConfig],
    resolve: &dyn Fn(&str) -> Option<TableId>,
    report: &mut Report<'_>,
) -> Vec<BucketRule> {
    let mut rules = Vec::new();
    for (i, rule) in raw.iter().enumerate() {
        let place = |key: &str| format!("[[quota_buckets]] #{} {key}", i + 1);
        let (Some(policy), Some(key)) = (&rule.policy, &rule.key) else {
            report.error(&(0..0), &place("policy"), "give `policy` (a policy with grants) and `key` (the BucketId entry that names the identity)");
            continue;
        };
        let Some(id) = resolve(policy.get_ref()) else {
            report.error(
                &policy.span(),
                &place("policy"),
                format!("no policy `{}`", policy.get_ref()),
            );
            continue;
        };
        let granted = policies
            .iter()
            .any(|p| p.name == *policy.get_ref() && p.grants.is_some());
        if !granted && policies.iter().any(|p| p.name == *policy.get_ref()) {
            let message = format!(
                "policy `{}` hands out no grants: give it grants = {{ ttl = \"2s\" }}",
                policy.get_ref()
            );
            report.error(&policy.span(), &place("policy"), message);
            continue;
        }
        let abandon_after = super::duration(
            rule.abandon_after.as_ref(),
            Duration::from_secs(60),
            &place("abandon_after"),
            report,
        );
        rules.push(BucketRule {
            matches: rule.matches.clone().into_iter().collect(),
            key: key.get_ref().clone(),
            policy: id,
            abandon_after,
        });
    }
    rules
}

/// The rule and identity of a bucket: the first rule it matches.
pub fn find<'a>(
    rules: &'a [BucketRule],
    bucket: &'a std::collections::HashMap<String, String>,
) -> Option<(&'a BucketRule, &'a str)> {
    rules.iter().find_map(|rule| {
        let matched = (rule.matches.iter()).all(|(k, v)| bucket.get(k) == Some(v));
        let key = bucket.get(&rule.key).filter(|k| !k.is_empty())?;
        matched.then_some((rule, key.as_str()))
    })
}
