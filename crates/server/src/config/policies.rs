//! `[policies.NAME]`: an algorithm with its parameters, and what the policy
//! does when the shared store fails or loses its state.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::Deserialize;
use toml::{Spanned, Value};
use weir_core::{Penalty, Policy};

use super::Report;

/// A policy's place in [`Config::policies`](super::Config::policies) and in
/// the policy table built from it (whose entries also count overrides and
/// Envoy's ad-hoc limits): routes and descriptor rules hold these, so
/// nothing on the request path looks a policy up by name. Not the
/// limiter's `PolicyId`, an index into the limiter's own policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId(pub usize);

/// One `[policies.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Its name.
    pub name: String,
    /// The algorithm and its parameters.
    pub policy: Policy,
    /// `on_store_error`; unset means `local` over HTTP and `UNAVAILABLE`
    /// over gRPC (so that Envoy's `failure_mode_deny` decides).
    pub on_store_error: Option<OnStoreError>,
    /// `on_state_loss`.
    pub on_state_loss: OnStateLoss,
    /// `max_keys`: the most in-process keys this policy may hold (within
    /// `[store] max_keys`); none: only the store's bound.
    pub max_keys: Option<usize>,
    /// `shadow = true` (or `[server] shadow = true`): decided and charged as
    /// if enforced, but never refusing a request.
    pub shadow: bool,
    /// `penalty = { ban, factor, max, memory }` (docs/SPEC.md's bans): a
    /// refusal shuts the key out for `ban`, longer each time.
    pub penalty: Option<Penalty>,
    /// `exempt`: client networks this policy does not limit (on the
    /// gateway and forward-auth, whose clients have addresses).
    pub exempt: crate::addresses::AddressList,
    /// `grants = { ttl = "2s" }` (docs/SPEC.md's fleet grants): a token
    /// bucket that hands data-plane clients local buckets of their own.
    pub grants: Option<weir_core::algo::grants::Fleet>,
}

/// `on_store_error` and `on_state_loss`: the store boundary's rules, named
/// as the configuration names them.
pub use weir_core::store::{OnLoss as OnStateLoss, OnStoreError};

#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub(super) struct Raw(pub(super) BTreeMap<String, BTreeMap<String, Spanned<Value>>>);

fn rule<T: FromStr<Err = String>>(
    value: &Spanned<Value>,
    place: &str,
    report: &mut Report<'_>,
) -> Option<T> {
    let parsed = match value.get_ref() {
        Value::String(s) => s.parse(),
        other => Err(format!("expected a string, found {}", other.type_str())),
    };
    parsed
        .map_err(|e| report.error(&value.span(), place, e))
        .ok()
}

/// Values that parse as a count, a rate or a duration: what stands in for
/// a bad parameter while the others are checked.
const STAND_INS: [&str; 3] = ["1", "1/s", "1s"];

fn build(algorithm: &str, params: &[(String, String)]) -> Result<Policy, weir_core::PolicyError> {
    Policy::from_params(
        algorithm,
        params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
}

/// `exempt = ["10.0.0.0/8", …]`.
fn parse_exempt(
    value: &Spanned<Value>,
    at: &str,
    report: &mut Report<'_>,
) -> crate::addresses::AddressList {
    let texts: Option<Vec<String>> = match value.get_ref() {
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    };
    let Some(texts) = texts else {
        report.error(
            &value.span(),
            at,
            "expected a list of networks such as [\"10.0.0.0/8\", \"2001:db8::/32\"]",
        );
        return crate::addresses::AddressList::default();
    };
    let spanned = Spanned::new(value.span(), texts);
    super::server::address_list(Some(&spanned), at, report)
}

/// `grants = { ttl = "2s" }`: the ttl, in ns.
fn parse_ttl(value: &Spanned<Value>, at: &str, report: &mut Report<'_>) -> Option<u64> {
    let example = "expected a table such as { ttl = \"2s\" }: how long a grant lives";
    let ttl = match value.get_ref() {
        Value::Table(t) if t.len() == 1 => t.get("ttl").and_then(Value::as_str),
        _ => None,
    };
    let Some(ttl) = ttl else {
        report.error(&value.span(), at, example);
        return None;
    };
    let ttl = weir_core::units::parse_duration(ttl)
        .map_err(|e| {
            report.error(
                &value.span(),
                &format!("{at}.ttl"),
                format!("{e} (a duration such as 2s)"),
            )
        })
        .ok()?;
    if ttl < 2_000_000_000 {
        let message = "at least 2s: an assignment's time to live goes out in whole seconds, less a margin for the network (Envoy reads only its seconds)";
        report.error(&value.span(), &format!("{at}.ttl"), message);
        return None;
    }
    Some(ttl)
}

/// The grants of `policy` with `ttl`: a token bucket (or GCRA) whose
/// capacity holds one grant's booking.
fn fleet(
    policy: &Policy,
    ttl: u64,
    span: &std::ops::Range<usize>,
    at: &str,
    report: &mut Report<'_>,
) -> Option<weir_core::algo::grants::Fleet> {
    let (Policy::TokenBucket(bucket) | Policy::Gcra(bucket)) = policy else {
        let message = format!(
            "grants are local token buckets: the policy must be a token-bucket or gcra, not {}",
            policy.algorithm().name()
        );
        report.error(span, at, message);
        return None;
    };
    weir_core::algo::grants::Fleet::new(*bucket, ttl)
        .map_err(|e| report.error(span, at, e.to_string()))
        .ok()
}

/// `penalty = { ban = "15m", factor = 4, max = "1d", memory = "1d" }`;
/// errors name the field (`penalty.max`) and say what is valid.
fn parse_penalty(value: &Spanned<Value>, at: &str, report: &mut Report<'_>) -> Option<Penalty> {
    let Value::Table(table) = value.get_ref() else {
        report.error(
            &value.span(),
            at,
            "expected a table such as { ban = \"15m\", factor = 4, max = \"1d\", memory = \"1d\" }",
        );
        return None;
    };
    let mut params = Vec::new();
    for (field, v) in table {
        match v {
            Value::String(s) => params.push((field.as_str(), s.clone())),
            Value::Integer(i) => params.push((field.as_str(), i.to_string())),
            other => {
                let message = format!(
                    "expected a string or an integer, found {}",
                    other.type_str()
                );
                report.error(&value.span(), &format!("{at}.{field}"), message);
                return None;
            }
        }
    }
    Penalty::from_params(params.iter().map(|(k, v)| (*k, v.as_str())))
        .map_err(|e| {
            report.error(
                &value.span(),
                &format!("{at}.{}", e.field),
                e.kind.to_string(),
            )
        })
        .ok()
}

pub(super) fn parse(raw: &Raw, report: &mut Report<'_>) -> Vec<PolicyConfig> {
    let mut policies = Vec::new();
    for (name, table) in &raw.0 {
        let place = format!("[policies.{name}]");
        let first = table
            .values()
            .map(Spanned::span)
            .min_by_key(|s| s.start)
            .unwrap_or(0..0);
        if !super::valid_name(name) {
            report.error(
                &first,
                &place,
                "a policy name is letters, digits, `-` and `_`",
            );
        }
        let mut params = Vec::new();
        let (mut on_store_error, mut on_state_loss) = (None, OnStateLoss::Full);
        let mut max_keys = None;
        let mut shadow = false;
        let mut penalty = None;
        let mut exempt = crate::addresses::AddressList::default();
        let mut grants = None;
        for (key, value) in table {
            let at = format!("{place} {key}");
            match key.as_str() {
                "on_store_error" => on_store_error = rule(value, &at, report),
                "on_state_loss" => on_state_loss = rule(value, &at, report).unwrap_or_default(),
                "shadow" => match value.get_ref() {
                    Value::Boolean(b) => shadow = *b,
                    _ => report.error(&value.span(), &at, "must be true or false"),
                },
                "penalty" => penalty = parse_penalty(value, &at, report),
                "exempt" => exempt = parse_exempt(value, &at, report),
                "grants" => grants = parse_ttl(value, &at, report),
                "max_keys" => match value.get_ref() {
                    Value::Integer(n) if *n > 0 => max_keys = usize::try_from(*n).ok(),
                    _ => report.error(&value.span(), &at, "must be a number of keys, at least 1"),
                },
                server if super::keys::server().contains(&server) => report.error(
                    &value.span(),
                    &at,
                    format!("belongs in [server], not in a policy: `[server] {server} = …`"),
                ),
                _ => match value.get_ref() {
                    Value::String(s) => params.push((key.clone(), s.clone())),
                    Value::Integer(i) => params.push((key.clone(), i.to_string())),
                    other => report.error(
                        &value.span(),
                        &at,
                        format!(
                            "expected a string or an integer, found {}",
                            other.type_str()
                        ),
                    ),
                },
            }
        }
        let Some(algorithm) = params.iter().position(|(k, _)| k == "algorithm") else {
            let names = weir_core::Algorithm::names();
            report.error(&first, &place, format!("has no `algorithm` ({names})"));
            continue;
        };
        let (_, algorithm) = params.remove(algorithm);
        // Every bad parameter, not just the first: each one reported is
        // replaced by a stand-in that parses (or dropped, when the algorithm
        // does not take it) and the rest tried again.
        let mut reported: Vec<String> = Vec::new();
        loop {
            let built = build(&algorithm, &params);
            let e = match built {
                Ok(policy) if reported.is_empty() => {
                    let span = table.get("grants").map_or(first.clone(), Spanned::span);
                    let grants = grants.and_then(|ttl| {
                        fleet(&policy, ttl, &span, &format!("{place} grants"), report)
                    });
                    policies.push(PolicyConfig {
                        name: name.clone(),
                        policy,
                        on_store_error,
                        on_state_loss,
                        max_keys,
                        shadow,
                        penalty,
                        exempt: exempt.clone(),
                        grants,
                    });
                    break;
                }
                Ok(_) => break,
                Err(e) if reported.contains(&e.field) => break,
                Err(e) => e,
            };
            let span = table.get(&e.field).map_or(first.clone(), Spanned::span);
            report.error(&span, &format!("{place} {}", e.field), e.kind.to_string());
            params.retain(|(k, _)| *k != e.field);
            if !matches!(
                e.kind,
                weir_core::policy::PolicyErrorKind::NotAParameter { .. }
            ) {
                let fits = |stand_in: &str| {
                    let mut tried = params.clone();
                    tried.push((e.field.clone(), stand_in.to_owned()));
                    build(&algorithm, &tried).map_or_else(|again| again.field != e.field, |_| true)
                };
                match STAND_INS.into_iter().find(|s| fits(s)) {
                    Some(stand_in) => params.push((e.field.clone(), stand_in.to_owned())),
                    None => break,
                }
            }
            reported.push(e.field);
        }
    }
    policies
}
