//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService`
//! over gRPC, deciding with the same store, policies and metrics as HTTP.
//!
//! A descriptor is matched against the `[[descriptors]]` rules of its
//! request's domain as envoyproxy/ratelimit matches its tree: entry by
//! entry, the entry's value first, then wildcard values in file order, then
//! the key's default; the rule of the node its **last** entry reaches
//! decides it. The key is built from the domain and every entry (escaped,
//! so that no two descriptors share a key unless equal; a `share_threshold`
//! wildcard stands for every value it matches). A descriptor no rule
//! matches, an unlimited rule's and one of an unknown domain are unlimited
//! (`OK`, no limit). A matched rule whose `name` another matched rule
//! `replaces` is not checked. All matched descriptors of one request are
//! decided all-or-nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};
use weir_core::check::escape;
use weir_core::{Decision, MAX_IDENTITY, NANOS_PER_SEC, Nanos, Policy};
use weir_tower::{Limited, Part, fields_in};

use crate::backend::{Check, InlineVec, Undecided};
use crate::config::{Config, DescriptorRule, TableId};
use crate::engine::Ask;
use crate::state::{AppState, Shared};
use weir_envoy_ratelimit::Found;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    state: Arc<AppState>,
}

impl RateLimiter {
    /// The generated service over `state`, as `run_grpc` serves it.
    pub fn service(state: Arc<AppState>) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(Self { state })
            .max_decoding_message_size(crate::answer::MAX_GRPC_MESSAGE)
    }
}

/// One request descriptor, translated: `None` when no rule matches.
pub type Translated = Vec<Option<(Target, String, u64)>>;

/// What decides a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The matched rule's policy.
    Rule(TableId),
    /// The matched rule's policy, the descriptor being usage reported after
    /// the fact (`report = true`).
    Report(TableId),
    /// A `refuse = true` rule: over the limit, whatever is counted; its
    /// current limit is 0 per this unit.
    Refuse(weir_envoy_ratelimit::Unit),
    /// An `unlimited = true` rule: `OK`, nothing counted, and (as
    /// envoyproxy/ratelimit answers) `limit_remaining` 4294967295.
    Unlimited,
    /// The descriptor's own `limit` (`RateLimitOverride`): the matched
    /// rule's algorithm with its quota replaced, or — no rule matching — a
    /// fixed window of `requests_per_unit` per `unit`.
    Limit {
        /// The rule that matched, if one did.
        rule: Option<TableId>,
        /// Requests per unit.
        requests_per_unit: u32,
        /// `envoy.type.v3.RateLimitUnit`.
        unit: i32,
    },
}

/// The most descriptors one request may carry (`INVALID_ARGUMENT` above):
/// Envoy's rate limit actions make a handful per request, and every
/// descriptor is a check the request's answer waits on.
pub const MAX_DESCRIPTORS: usize = 64;

/// Translates a request into (policy, key, cost) per descriptor, or the
/// `INVALID_ARGUMENT` message. Pure: no store, no clock. A descriptor's
/// identity — its domain, keys and values as Envoy sent them — is at most
/// [`MAX_IDENTITY`] bytes, the bound of every face.
pub fn translate(config: &Config, request: &RateLimitRequest) -> Result<Translated, String> {
    translate_named(config, request).map(|(translated, _)| translated)
}

/// [`translate`], and per descriptor the `name` of the rule that matched it
/// (its `current_limit.name`, as envoyproxy/ratelimit answers the YAML's).
fn translate_named<'c>(
    config: &'c Config,
    request: &RateLimitRequest,
) -> Result<(Translated, Vec<Option<&'c str>>), String> {
    if request.domain.is_empty() {
        return Err("`domain` is empty".into());
    }
    if request.descriptors.is_empty() {
        return Err("the request has no descriptors".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!(
            "the request has {} descriptors, above the limit of {MAX_DESCRIPTORS}",
            request.descriptors.len()
        ));
    }
    let request_cost = u64::from(request.hits_addend).max(1);
    let mut out = Vec::with_capacity(request.descriptors.len());
    // Per descriptor, its rule's `name`; and every name a matched rule
    // `replaces`.
    let mut names: Vec<Option<&str>> = Vec::with_capacity(request.descriptors.len());
    let mut replaced: Vec<&str> = Vec::new();
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(format!("descriptor #{} has no entries", i + 1));
        }
        let cost = descriptor.hits_addend.map_or(request_cost, |h| h.value);
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let (rule, shared) = match config.descriptor_tree.find(&request.domain, &entries) {
            Found::Limit { limit, shared } => (config.descriptors.get(*limit), shared),
            Found::None => (None, Vec::new()),
            // As envoyproxy/ratelimit: a domain it does not know has no
            // limits, not even one the descriptor names itself.
            Found::UnknownDomain => {
                names.push(None);
                out.push(None);
                continue;
            }
        };
        // A descriptor's own limit bypasses the rules: it neither replaces
        // nor is replaced.
        let own = descriptor.limit.is_some();
        names.push(rule.filter(|_| !own).and_then(|r| r.name.as_deref()));
        if !own {
            replaced.extend(
                rule.iter()
                    .flat_map(|r| r.replaces.iter().map(String::as_str)),
            );
        }
        let target = match (rule, &descriptor.limit) {
            (rule, Some(limit)) => Target::Limit {
                rule: rule.and_then(|r| r.policy),
                requests_per_unit: limit.requests_per_unit,
                unit: limit.unit,
            },
            (
                Some(DescriptorRule {
                    policy: Some(policy),
                    report: true,
                    ..
                }),
                None,
            ) => Target::Report(*policy),
            (
                Some(DescriptorRule {
                    policy: Some(policy),
                    ..
                }),
                None,
            ) => Target::Rule(*policy),
            (
                Some(DescriptorRule {
                    refuse: true,
                    refuse_unit,
                    ..
                }),
                None,
            ) => Target::Refuse(*refuse_unit),
            // Matched, and exempt: answered as no rule is.
            (Some(DescriptorRule { no_limit: true, .. }), None) => {
                out.push(None);
                continue;
            }
            (Some(_), None) => Target::Unlimited,
            // No rule.
            (None, None) => {
                out.push(None);
                continue;
            }
        };
        let sent: usize = request.domain.len()
            + descriptor
                .entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 2)
                .sum::<usize>();
        if sent > MAX_IDENTITY {
            return Err(format!(
                "descriptor #{}: its domain and entries are {sent} bytes, above the limit of {MAX_IDENTITY}",
                i + 1
            ));
        }
        // Room for the key unescaped: one allocation, as a rule.
        let mut key = String::with_capacity(sent + 16);
        key.push_str("envoy:");
        escape(&mut key, &request.domain);
        let keyed = rule.and_then(|r| r.key_entries.as_ref());
        let in_key = |k: &str| keyed.is_none_or(|keys| keys.iter().any(|e| e == k));
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if !in_key(&entry.key) {
                continue;
            }
            key.push(':');
            escape(&mut key, &entry.key);
            // A shared wildcard stands for every value it matches.
            match shared.get(j).copied().flatten() {
                Some(pattern) => {
                    key.push('~');
                    escape(&mut key, pattern);
                }
                None => {
                    key.push('=');
                    escape(&mut key, &entry.value);
                }
            }
        }
        out.push(Some((target, key, cost)));
    }
    // A rule another matched rule replaces is not checked.
    if !replaced.is_empty() {
        for (slot, name) in out.iter_mut().zip(&names) {
            if name.is_some_and(|n| replaced.contains(&n)) {
                *slot = None;
            }
        }
    }
    Ok((out, names))
}

/// A policy's sustained limit as Envoy shows it: requests per unit — a
/// window's own unit when it is one (120 per minute), else the smallest
/// unit (second, minute, hour, day) where it is a whole number; otherwise
/// per day, rounded down.
pub fn per_unit(policy: &Policy) -> (u32, Unit) {
    let (count, period) = policy.sustained();
    let units = [
        (Unit::Second, NANOS_PER_SEC),
        (Unit::Minute, 60 * NANOS_PER_SEC),
        (Unit::Hour, 3_600 * NANOS_PER_SEC),
        (Unit::Day, 86_400 * NANOS_PER_SEC),
    ];
    let per = |unit: Nanos| u128::from(count) * u128::from(unit);
    let exact = units.iter().find(|(_, unit)| *unit == period).or_else(|| {
        units
            .iter()
            .find(|(_, unit)| per(*unit) % u128::from(period) == 0)
    });
    let (unit, length) = exact.copied().unwrap_or(units[3]);
    let n = per(length) / u128::from(period);
    (u32::try_from(n).unwrap_or(u32::MAX), unit)
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

fn duration(ns: Nanos) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ns / NANOS_PER_SEC).unwrap_or(i64::MAX),
        nanos: i32::try_from(ns % NANOS_PER_SEC).unwrap_or(0),
    }
}

/// A unit of `envoy.type.v3.RateLimitUnit` in nanoseconds (a month is 30
/// days, a year 365, as envoyproxy/ratelimit counts them), and its name.
fn unit_length(unit: i32) -> Option<(Nanos, &'static str)> {
    let day = 86_400 * NANOS_PER_SEC;
    match Unit::try_from(unit).ok()? {
        Unit::Second => Some((NANOS_PER_SEC, "second")),
        Unit::Minute => Some((60 * NANOS_PER_SEC, "minute")),
        Unit::Hour => Some((3_600 * NANOS_PER_SEC, "hour")),
        Unit::Day => Some((day, "day")),
        Unit::Week => Some((7 * day, "week")),
        Unit::Month => Some((30 * day, "month")),
        Unit::Year => Some((365 * day, "year")),
        Unit::Unknown => None,
    }
}

pub use crate::config::NO_RELEASE;

/// `base`'s algorithm with its quota replaced by `count` per `period`
/// ([`Policy::with_quota`]); without a base, a fixed window.
pub fn with_limit(base: Option<Policy>, count: u64, period: Nanos) -> Result<Policy, String> {
    match base.map(|base| base.with_quota(count, period)) {
        None => Policy::fixed_window(count, period).map_err(|e| e.to_string()),
        Some(Some(policy)) => policy.map_err(|e| e.to_string()),
        Some(None) => Err(NO_RELEASE.to_owned()),
    }
}

/// The table entry that decides `target`: a rule's policy, or the entry of
/// a descriptor's own limit (its state keyed by that limit too).
fn resolve(shared: &Shared, target: Target) -> Result<TableId, Status> {
    let (rule, requests_per_unit, unit) = match target {
        Target::Rule(id) | Target::Report(id) => return Ok(id),
        // Answered before any policy is resolved (see `refused`).
        Target::Refuse(_) | Target::Unlimited => {
            return Err(Status::internal(
                "a refusing or unlimited rule has no policy",
            ));
        }
        Target::Limit {
            rule,
            requests_per_unit,
            unit,
        } => (rule, requests_per_unit, unit),
    };
    let (period, unit_name) = unit_length(unit).ok_or_else(|| {
        Status::invalid_argument(format!("the descriptor's limit has no known unit ({unit})"))
    })?;
    let base = rule.map(|r| shared.table.get(r));
    let policy = with_limit(base.map(|b| b.policy), u64::from(requests_per_unit), period)
        .map_err(|e| Status::invalid_argument(format!("the descriptor's limit: {e}")))?;
    let name = base.map_or("envoy-limit", |b| b.name.as_str());
    let stored_as = format!("{name}@limit-{requests_per_unit}-per-{unit_name}");
    shared
        .table
        .ad_hoc(&stored_as, name, policy, rule)
        .ok_or_else(|| Status::resource_exhausted(AD_HOC_FULL))
}

/// What a request is told when every slot for descriptor limits holds one
/// named within the last minute.
const AD_HOC_FULL: &str = "too many distinct descriptor limits named within the last minute";

/// [`answer`] from the configuration served now; when its table holds its
/// most of the limits requests name, room is made (those unused for a
/// minute let go) and the request is answered again.
pub(crate) async fn answer_now(
    state: &AppState,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let shared = state.current();
    let answered = match answer(&shared, request).await {
        Err(s) if s.message() == AD_HOC_FULL && state.make_room(&shared) => {
            answer(&state.current(), request).await
        }
        answered => answered,
    };
    // At debug level (their LOG_LEVEL=debug), a line per request: its
    // domain, how many descriptors, and the answer — never the entries'
    // values, which are clients' identities.
    if tracing::enabled!(tracing::Level::DEBUG) {
        let domain = request.domain.as_str();
        let descriptors = request.descriptors.len();
        match &answered {
            Ok(r) => {
                let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
                let statuses: Vec<&str> = r.statuses.iter().map(|s| code(s.code)).collect();
                tracing::debug!(
                    domain,
                    descriptors,
                    overall = code(r.overall_code),
                    ?statuses,
                    "rate limit request"
                );
            }
            Err(status) => {
                tracing::debug!(
                    domain,
                    descriptors,
                    error = status.message(),
                    "rate limit request refused"
                );
            }
        }
    }
    answered
}

/// The gRPC status of a request the backend could not decide. A store
/// failure with no rule is `UNAVAILABLE`, so that Envoy's
/// `failure_mode_deny` decides.
fn status(refusal: Undecided) -> Status {
    match refusal {
        Undecided::Invalid(e) => Status::invalid_argument(e.to_string()),
        Undecided::Unsupported(m) => Status::invalid_argument(m),
        Undecided::Full { max } => Status::resource_exhausted(format!(
            "the limiter holds its maximum of {max} keys; new keys are refused"
        )),
        Undecided::Unavailable { .. } => Status::unavailable(
            "the store is unavailable and no on_store_error rule decides for it",
        ),
        Undecided::NewKeys(_) => Status::resource_exhausted("no new keys for this client now"),
    }
}

/// Descriptors that name the same (policy, key) — two rate limit actions
/// producing the same entries — are one check of their summed cost, and
/// report the same status: the checks, and each descriptor's check.
fn merge_same_checks<'a>(
    translated: &[Option<(TableId, &'a str, u64)>],
) -> (Vec<Check<'a>>, Vec<Option<usize>>) {
    let mut checks: Vec<Check<'a>> = Vec::with_capacity(translated.len());
    let mut index: HashMap<(TableId, &str), usize> = HashMap::with_capacity(translated.len());
    let slot = translated
        .iter()
        .map(|t| {
            t.map(|(policy, key, cost)| {
                *index
                    .entry((policy, key))
                    .and_modify(|&mut i| checks[i].cost = checks[i].cost.saturating_add(cost))
                    .or_insert_with(|| {
                        checks.push(Check { policy, key, cost });
                        checks.len() - 1
                    })
            })
        })
        .collect();
    (checks, slot)
}

/// One descriptor's status: its code, and the policy's limit and standing.
fn descriptor_status(code: Code, name: &str, policy: &Policy, d: &Decision) -> DescriptorStatus {
    let (requests_per_unit, unit) = per_unit(policy);
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit,
            unit: unit.into(),
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(d.reset)),
        ..DescriptorStatus::default()
    }
}

/// The store failed and a policy fails closed: every limited descriptor is
/// over its limit, with a body that says why.
fn store_unavailable(
    mut response: RateLimitResponse,
    translated: &[Option<(TableId, &str, u64)>],
) -> RateLimitResponse {
    response.overall_code = Code::OverLimit.into();
    for (status, t) in response.statuses.iter_mut().zip(translated) {
        if t.is_some() {
            status.code = Code::OverLimit.into();
        }
    }
    response.response_headers_to_add = vec![
        header("retry-after", "1".into()),
        header("content-type", "application/json".into()),
    ];
    response.raw_body = r#"{"error":"STORE_UNAVAILABLE"}"#.as_bytes().to_vec();
    response
}

/// Decides `request` (errors as gRPC statuses).
pub(crate) async fn answer(
    shared: &Shared,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let (translated, names) =
        translate_named(&shared.config, request).map_err(Status::invalid_argument)?;
    if translated
        .iter()
        .flatten()
        .any(|(t, _, _)| matches!(t, Target::Refuse(_)))
    {
        return Ok(refused(&translated));
    }
    let reporting: Vec<bool> = translated
        .iter()
        .map(|t| matches!(t, Some((Target::Report(_), _, _))))
        .collect();
    let statuses = translated
        .iter()
        .map(|t| DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: match t {
                Some((Target::Unlimited, _, _)) => u32::MAX,
                _ => 0,
            },
            ..DescriptorStatus::default()
        })
        .collect();
    let mut translated: Vec<Option<(TableId, &str, u64)>> = translated
        .iter()
        .map(|t| {
            t.as_ref()
                .filter(|(target, _, _)| *target != Target::Unlimited)
                .map(|(target, key, cost)| Ok((resolve(shared, *target)?, key.as_str(), *cost)))
                .transpose()
        })
        .collect::<Result<_, Status>>()?;
    let mut response = RateLimitResponse {
        overall_code: Code::Ok.into(),
        statuses,
        ..RateLimitResponse::default()
    };
    report(shared, &mut translated, &reporting, &mut response).await?;
    let (checks, slot) = merge_same_checks(&translated);
    if checks.is_empty() {
        return Ok(response);
    }
    // Envoy cannot hold a request: a shaper admits only what it would
    // release at once.
    let decided = shared
        .decide(Ask {
            checks: &checks,
            client: None,
            max_delay: 0,
            on_store_error: None,
            probe: false,
        })
        .await;
    match decided {
        Ok(verdict) => Ok(answered(shared, response, &checks, &slot, &names, &verdict)),
        Err(Undecided::Unavailable { denied: true }) => {
            Ok(store_unavailable(response, &translated))
        }
        Err(refusal) => Err(status(refusal)),
    }
}

/// A request with a descriptor of a `refuse = true` rule: over the limit,
/// and nothing charged (as for any refusal of several descriptors).
fn refused(translated: &Translated) -> RateLimitResponse {
    let statuses = translated
        .iter()
        .map(|t| {
            let refuse = match t {
                Some((Target::Refuse(unit), _, _)) => Some(*unit),
                _ => None,
            };
            let unlimited = matches!(t, Some((Target::Unlimited, _, _)));
            DescriptorStatus {
                code: if refuse.is_some() {
                    Code::OverLimit
                } else {
                    Code::Ok
                }
                .into(),
                limit_remaining: if unlimited { u32::MAX } else { 0 },
                current_limit: refuse.map(|unit| RateLimit {
                    name: "refuse".into(),
                    requests_per_unit: 0,
                    unit: proto_unit(unit).into(),
                }),
                ..DescriptorStatus::default()
            }
        })
        .collect();
    RateLimitResponse {
        overall_code: Code::OverLimit.into(),
        statuses,
        ..RateLimitResponse::default()
    }
}

/// Usage reported after the fact: always charged and answered OK, apart
/// from the checks of the same request (taken out of `translated`).
async fn report(
    shared: &Shared,
    translated: &mut [Option<(TableId, &str, u64)>],
    reporting: &[bool],
    response: &mut RateLimitResponse,
) -> Result<(), Status> {
    let mut reports: Vec<(usize, Check<'_>)> = Vec::new();
    for (i, t) in translated.iter_mut().enumerate() {
        if reporting[i] {
            if let Some((policy, key, cost)) = t.take() {
                reports.push((i, Check { policy, key, cost }));
            }
        }
    }
    if reports.is_empty() {
        return Ok(());
    }
    let checks: Vec<Check<'_>> = reports.iter().map(|(_, c)| *c).collect();
    let reported = shared.report(&checks, None).await.map_err(status)?;
    for ((i, check), d) in reports.iter().zip(&reported) {
        let entry = shared.table.get(check.policy);
        response.statuses[*i] = descriptor_status(Code::Ok, &entry.name, &entry.policy, d);
    }
    Ok(())
}

/// The response to decided checks: each descriptor's status (`slot`: the
/// check that answers it), and the `RateLimit` fields — or, refused, the
/// 429's headers and body for Envoy to send.
fn answered(
    shared: &Shared,
    mut response: RateLimitResponse,
    checks: &[Check<'_>],
    slot: &[Option<usize>],
    names: &[Option<&str>],
    verdict: &crate::backend::Verdict,
) -> RateLimitResponse {
    let ids: Vec<TableId> = checks.iter().map(|c| c.policy).collect();
    let decided: Vec<Part<'_>> = ids
        .iter()
        .zip(verdict.decisions())
        .map(|(id, d)| {
            let entry = shared.table.get(*id);
            entry.shown.part(&entry.name, d, verdict.degraded)
        })
        .collect();
    // `[server] shadow` (their SHADOW_MODE): the answer as enforced —
    // each descriptor's status and the fields — but for its overall code,
    // OK. A policy's own `shadow` (their `shadow_mode`) answers OK.
    let global_shadow = shared.config.server.shadow;
    let parts: InlineVec<Part<'_>> = match global_shadow {
        true => decided.iter().copied().collect(),
        false => verdict.visible(&shared.table, &ids),
    };
    for ((status, s), rule_name) in response.statuses.iter_mut().zip(slot).zip(names) {
        let Some(i) = *s else { continue };
        let (part, check) = (&decided[i], &checks[i]);
        let code = match verdict.refuses(i) || (global_shadow && verdict.shadow_limited(i)) {
            true => Code::OverLimit,
            false => Code::Ok,
        };
        let policy = &shared.table.get(check.policy).policy;
        let name = rule_name.unwrap_or(part.name);
        *status = descriptor_status(code, name, policy, &part.decision);
    }
    // `[server] envoy_header_names`: the X-RateLimit fields under other
    // names (envoyproxy/ratelimit's LIMIT_*_HEADER).
    let renamed = &shared.config.server.envoy_header_names;
    let to_envoy = |(name, value): (http::HeaderName, http::HeaderValue)| {
        let name = match (name.as_str(), renamed) {
            ("x-ratelimit-limit", Some([limit, _, _])) => limit.as_str(),
            ("x-ratelimit-remaining", Some([_, remaining, _])) => remaining.as_str(),
            ("x-ratelimit-reset", Some([_, _, reset])) => reset.as_str(),
            (name, _) => name,
        };
        header(name, value.to_str().unwrap_or_default().to_owned())
    };
    response.response_headers_to_add = match verdict.refusing() {
        None => fields_in(shared.config.server.headers, &parts)
            .into_iter()
            .map(to_envoy)
            .collect(),
        Some(first) => {
            response.overall_code = Code::OverLimit.into();
            let limited = Limited {
                policy: decided[first].name,
                retry_after: verdict.retry_after(),
                parts: &parts,
                style: shared.config.server.headers,
            };
            response.raw_body = limited.body().into_bytes();
            limited.headers().into_iter().map(to_envoy).collect()
        }
    };
    response
}

/// `GET /rlconfig`: the descriptor rules as envoyproxy/ratelimit's debug
/// port prints its loaded limits, one line each: the rule's path, then its
/// limit (a fixed window of a whole unit as theirs, any other policy as
/// weir writes it).
pub(crate) async fn rlconfig(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
) -> String {
    let shared = state.current();
    let config = &shared.config;
    let mut out = String::new();
    // A node without a limit is not one of theirs to print.
    for rule in config.descriptors.iter().filter(|r| !r.no_limit) {
        let path: Vec<String> = rule
            .entries
            .iter()
            .map(|(k, v)| v.as_ref().map_or_else(|| k.clone(), |v| format!("{k}_{v}")))
            .collect();
        let limit = match rule.policy.map(|id| &config.policies[id.0]) {
            None if rule.refuse => format!(
                "unit={} requests_per_unit=0, shadow_mode: false",
                proto_unit(rule.refuse_unit).as_str_name()
            ),
            None => "unlimited".to_owned(),
            Some(p) => {
                let unit = match p.policy {
                    Policy::FixedWindow(w) => unit_of(w.window()).map(|u| (w.limit(), u)),
                    _ => None,
                };
                match unit {
                    Some((n, unit)) => format!(
                        "unit={} requests_per_unit={n}, shadow_mode: {}",
                        unit.as_str_name(),
                        p.shadow
                    ),
                    None => format!("{}, shadow_mode: {}", p.policy, p.shadow),
                }
            }
        };
        out.push_str(&format!("{}.{}: {limit}\n", rule.domain, path.join(".")));
    }
    out
}

/// The unit whose window is `window`, as envoyproxy/ratelimit counts them.
/// A unit of envoyproxy/ratelimit's files as the protocol names it.
fn proto_unit(unit: weir_envoy_ratelimit::Unit) -> Unit {
    use weir_envoy_ratelimit::Unit as U;
    match unit {
        U::Second => Unit::Second,
        U::Minute => Unit::Minute,
        U::Hour => Unit::Hour,
        U::Day => Unit::Day,
        U::Week => Unit::Week,
        U::Month => Unit::Month,
        U::Year => Unit::Year,
    }
}

fn unit_of(window: Nanos) -> Option<Unit> {
    let day = 86_400 * NANOS_PER_SEC;
    [
        (NANOS_PER_SEC, Unit::Second),
        (60 * NANOS_PER_SEC, Unit::Minute),
        (3_600 * NANOS_PER_SEC, Unit::Hour),
        (day, Unit::Day),
        (7 * day, Unit::Week),
        (30 * day, Unit::Month),
        (365 * day, Unit::Year),
    ]
    .into_iter()
    .find(|(w, _)| *w == window)
    .map(|(_, u)| u)
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let answered = answer_now(&self.state, request.get_ref()).await;
        let code = match &answered {
            Ok(r) if r.overall_code == i32::from(Code::OverLimit) => "over_limit",
            Ok(_) => "ok",
            Err(s) if s.code() == tonic::Code::Unavailable => "unavailable",
            Err(_) => "invalid_argument",
        };
        crate::metrics::Meters::grpc(code, started);
        answered.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use proptest::prelude::*;

    const CONFIG: &str = "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate = \"7/1500ms\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"seller\", \"endpoint=stock-read\"]\npolicy = \"a\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"ip\"]\npolicy = \"a\"\n";

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn rules_match_exact_entries_and_keys_never_collide() {
        let config = crate::config::parse(CONFIG, &Default::default()).unwrap();
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![
                descriptor(&[("seller", "7"), ("endpoint", "stock-read")]),
                descriptor(&[("seller", "7"), ("endpoint", "other")]),
                descriptor(&[("seller", "7")]),
                descriptor(&[("ip", "a:b=c")]),
                descriptor(&[("ip", "a%3Ab%3Dc")]),
            ],
            hits_addend: 0,
        };
        let t = translate(&config, &request).unwrap();
        assert_eq!(
            t[0].as_ref().unwrap().1,
            "envoy:d:seller=7:endpoint=stock-read"
        );
        assert_eq!(t[0].as_ref().unwrap().0, Target::Rule(TableId(0)));
        assert!(t[1].is_none() && t[2].is_none());
        assert_ne!(t[3].as_ref().unwrap().1, t[4].as_ref().unwrap().1);
        let unknown = RateLimitRequest {
            domain: "x".into(),
            ..request
        };
        // As envoyproxy/ratelimit: an unknown domain has no limits.
        let t = translate(&config, &unknown).unwrap();
        assert!(t.iter().all(Option::is_none), "{t:?}");
    }

    /// The slots for limits requests name are a least-recently-used cache:
    /// once all are taken, a new limit makes room by letting go of those
    /// unused for a while, keeping the recent ones with their keys; when
    /// all were used lately, the request is refused for that while only.
    #[tokio::test]
    async fn descriptor_limits_make_room_for_new_ones() {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
        let config = crate::config::parse(CONFIG, &Default::default()).unwrap();
        let state = AppState::new(Shared::new(config, None).unwrap());
        let ask = |n: u32| {
            let mut limited = descriptor(&[("ip", "1.2.3.4")]);
            limited.limit = Some(RateLimitOverride {
                requests_per_unit: n,
                unit: Unit::Hour.into(),
            });
            RateLimitRequest {
                domain: "d".into(),
                descriptors: vec![limited],
                hits_addend: 0,
            }
        };
        let remaining = |answered: Result<RateLimitResponse, Status>| {
            answered.unwrap().statuses[0].limit_remaining
        };
        for n in 1..=crate::table::AD_HOC as u32 {
            answer_now(&state, &ask(1000 + n)).await.unwrap();
        }
        // Every slot was used within the minute: refused, none let go.
        let full = answer_now(&state, &ask(5000)).await.unwrap_err();
        assert_eq!(full.code(), tonic::Code::ResourceExhausted);
        assert_eq!(full.message(), AD_HOC_FULL);
        // A while later one limit is named again (and charged): it stays,
        // with its key, when room is made; the others give way.
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        assert_eq!(remaining(answer_now(&state, &ask(1001)).await), 999);
        let seen = state.current();
        assert!(state.make_room_within(&seen, std::time::Duration::from_millis(50)));
        assert!(!Arc::ptr_eq(&seen, &state.current()), "a new table serves");
        assert_eq!(remaining(answer_now(&state, &ask(5000)).await), 5000 - 1);
        assert_eq!(
            remaining(answer_now(&state, &ask(1001)).await),
            998,
            "a recent limit keeps its keys"
        );
        assert_eq!(
            remaining(answer_now(&state, &ask(1002)).await),
            1002 - 1,
            "a let-go limit starts afresh"
        );
    }

    #[test]
    fn limits_per_unit() {
        let p = |s: &str| per_unit(&Policy::parse(s).unwrap());
        assert_eq!(p("token-bucket capacity=5 rate=2/s"), (2, Unit::Second));
        assert_eq!(
            p("token-bucket capacity=5 rate=7/1500ms"),
            (280, Unit::Minute)
        );
        assert_eq!(p("fixed-window limit=120 window=1m"), (120, Unit::Minute));
        assert_eq!(p("sliding-log limit=3 window=7s"), (37028, Unit::Day));
        assert_eq!(p("gcra burst=1 rate=1/7h"), (3, Unit::Day));
    }

    proptest! {
        /// Random requests: never a panic; every refusal says why.
        #[test]
        fn translation_never_panics(
            domain in "[a-z]{0,2}",
            descriptors in prop::collection::vec(
                (prop::collection::vec(("(seller|endpoint|ip|[ -~]{0,3})", "[ -~\\u{0}-\\u{ff}]{0,300}"), 0..4),
                 prop::option::of(0u64..5)),
                0..4),
            hits in 0u32..4,
        ) {
            let config = crate::config::parse(CONFIG, &Default::default()).unwrap();
            let request = RateLimitRequest {
                domain,
                descriptors: descriptors
                    .iter()
                    .map(|(entries, hits)| RateLimitDescriptor {
                        entries: entries.iter().map(|(k, v)| Entry { key: k.clone(), value: v.clone() }).collect(),
                        hits_addend: hits.map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                        ..RateLimitDescriptor::default()
                    })
                    .collect(),
                hits_addend: hits,
            };
            match translate(&config, &request) {
                Ok(t) => {
                    prop_assert_eq!(t.len(), request.descriptors.len());
                    for (policy, key, _) in t.iter().flatten() {
                        prop_assert_eq!(*policy, Target::Rule(TableId(0)));
                        prop_assert!(key.len() <= crate::backend::MAX_KEY);
                    }
                }
                Err(message) => prop_assert!(!message.is_empty()),
            }
        }
    }
}
