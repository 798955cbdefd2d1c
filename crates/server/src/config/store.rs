//! `[store]`: in process, or a shared Redis, and how long to wait on it.

use std::time::Duration;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::Report;

/// Where state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// In process (the default).
    Memory,
    /// `redis://…`, `rediss://…` or `redis-cluster://…`.
    Redis(String),
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) => f.write_str(url),
        }
    }
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Where state lives.
    pub url: StoreUrl,
    /// The longest any request waits on the store.
    pub timeout: Duration,
    /// The key budget of the in-process store (and of the local fallback).
    pub max_keys: usize,
    /// The local fallback's share of each limit, in parts per million.
    pub fallback_share: u64,
    /// `replica_acks = N`: an admission is answered once N replicas hold
    /// it (`WAIT`), else decided as a store error; 0 (the default): not
    /// waited for.
    pub replica_acks: u32,
    /// `refusal_cache = false`: every check goes to Redis, even one Redis
    /// has promised to refuse (default true: see `weir-redis`'s refusal
    /// cache).
    pub refusal_cache: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Raw {
    url: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_keys: Option<Spanned<u64>>,
    fallback_share: Option<Spanned<Value>>,
    replica_acks: Option<Spanned<u64>>,
    refusal_cache: Option<bool>,
}

pub(super) fn parse(raw: Raw, report: &mut Report<'_>) -> StoreConfig {
    let url = match &raw.url {
        None => StoreUrl::Memory,
        Some(url) if url.get_ref() == "memory" => StoreUrl::Memory,
        Some(url) => {
            let text = url.get_ref();
            let redis = ["redis://", "rediss://", "redis-cluster://"]
                .iter()
                .any(|scheme| text.starts_with(scheme));
            if !redis {
                report.error(
                    &url.span(),
                    "[store] url",
                    format!(
                        "`{text}` is not a store (valid: \"memory\", \"redis://HOST:PORT\", \"redis-cluster://HOST:PORT,HOST:PORT\")"
                    ),
                );
            } else if let Err(e) = weir_redis::check_url(text) {
                report.error(&url.span(), "[store] url", format!("not a Redis URL: {e}"));
            }
            StoreUrl::Redis(text.clone())
        }
    };
    let fallback_share = match &raw.fallback_share {
        None => 1_000_000,
        Some(v) => {
            let share = match v.get_ref() {
                Value::Float(f) => Some(*f),
                Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match share {
                // Parts per million: configuration, never a decision.
                Some(f) if f > 0.0 && f <= 1.0 => ((f * 1e6).round() as u64).max(1),
                _ => {
                    report.error(
                        &v.span(),
                        "[store] fallback_share",
                        "must be a number above 0 and at most 1, e.g. 0.25 for four instances",
                    );
                    1_000_000
                }
            }
        }
    };
    let timeout = super::duration(
        raw.timeout.as_ref(),
        Duration::from_millis(50),
        "[store] timeout",
        report,
    );
    let max_keys = raw.max_keys.map_or(weir_limiter::DEFAULT_MAX_KEYS, |m| {
        usize::try_from(*m.get_ref()).unwrap_or(usize::MAX).max(1)
    });
    let replica_acks = match &raw.replica_acks {
        None => 0,
        Some(n) => match u32::try_from(*n.get_ref()) {
            Ok(n) if n <= 16 && (n == 0 || url != StoreUrl::Memory) => n,
            _ => {
                report.error(
                    &n.span(),
                    "[store] replica_acks",
                    "must be 0 to 16 replicas, with a Redis url",
                );
                0
            }
        },
    };
    StoreConfig {
        url,
        timeout,
        max_keys,
        fallback_share,
        replica_acks,
        refusal_cache: raw.refusal_cache.unwrap_or(true),
    }
}
