//! How a policy shows itself to clients, made once per policy: its
//! `RateLimit-Policy` item and limit (and its local fallback's, for
//! degraded answers), and the body of the `429` it refuses with.

use axum::body::Bytes;
use http::HeaderValue;
use weir_core::{Decision, Policy};
use weir_tower::{Part, quota, rate_limit_policy};

/// What a policy answers with: its `RateLimit-Policy` item and limit.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    pub(crate) field: HeaderValue,
    pub(crate) limit: u64,
}

impl Fields {
    fn new(name: &str, policy: &Policy) -> Self {
        Self {
            field: rate_limit_policy(name, policy),
            limit: quota(policy).0,
        }
    }
}

/// A policy's answers, made once.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub(crate) fields: Fields,
    /// The fields of the local fallback's policy, for degraded answers.
    local_fields: Fields,
    /// The body of the gateway's `429` when this policy refuses.
    pub(crate) refused: Bytes,
}

impl Shown {
    /// The answers of policy `name`, and of `local`, its fallback.
    pub(crate) fn new(name: &str, policy: &Policy, local: &Policy) -> Self {
        Self {
            refused: weir_tower::error_body("RATE_LIMITED", name).into(),
            fields: Fields::new(name, policy),
            local_fields: Fields::new(name, local),
        }
    }

    /// Its part in an answer, under `name`; a degraded decision reports
    /// the local fallback's limit, the one that was applied.
    pub(crate) fn part<'a>(
        &'a self,
        name: &'a str,
        decision: Decision,
        degraded: bool,
    ) -> Part<'a> {
        let fields = match degraded {
            true => &self.local_fields,
            false => &self.fields,
        };
        Part {
            name,
            field: &fields.field,
            limit: fields.limit,
            decision,
        }
    }

    /// The limit reported with a decision.
    pub(crate) fn limit(&self, degraded: bool) -> u64 {
        match degraded {
            true => self.local_fields.limit,
            false => self.fields.limit,
        }
    }
}
