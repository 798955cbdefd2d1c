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
    /// `redis://…`, `rediss://…`, `valkey://…`, `valkeys://…` or
    /// `redis-cluster://…`.
    Redis(String),
}

/// Shown with any password inside the URL replaced (`***`).
impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) => f.write_str(&weir_redis::redacted(url)),
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
    /// The most leases the in-process store's concurrency policies hold at
    /// once (each at most `weir_limiter::LEASE_BYTES`).
    pub max_leases: usize,
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
    /// TLS and credentials beside the URL: `tls`, `tls_ca`, `tls_cert` and
    /// `tls_key`, `tls_insecure_skip_verify`, `username`, and the password
    /// from `password_file` or `WEIR_REDIS_PASSWORD` (files read at each
    /// load, so a reload picks up a rotated one).
    pub access: weir_redis::Access,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Raw {
    url: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_keys: Option<Spanned<u64>>,
    max_leases: Option<Spanned<u64>>,
    fallback_share: Option<Spanned<Value>>,
    replica_acks: Option<Spanned<u64>>,
    refusal_cache: Option<bool>,
    tls: Option<Spanned<bool>>,
    tls_ca: Option<Spanned<String>>,
    tls_cert: Option<Spanned<String>>,
    tls_key: Option<Spanned<String>>,
    tls_insecure_skip_verify: Option<Spanned<bool>>,
    username: Option<Spanned<String>>,
    password_file: Option<Spanned<String>>,
    sentinel_username: Option<Spanned<String>>,
    sentinel_password_file: Option<Spanned<String>>,
}

pub(super) fn parse(raw: Raw, env: &super::Env, report: &mut Report<'_>) -> StoreConfig {
    let url = match &raw.url {
        None => StoreUrl::Memory,
        Some(url) if url.get_ref() == "memory" => StoreUrl::Memory,
        Some(url) => {
            let text = url.get_ref();
            let redis = [
                "redis://",
                "rediss://",
                "valkey://",
                "valkeys://",
                "redis-cluster://",
                "redis-sentinel://",
            ]
            .iter()
            .any(|scheme| text.starts_with(scheme));
            if !redis {
                report.error(
                    &url.span(),
                    "[store] url",
                    format!(
                        "`{}` is not a store (valid: \"memory\", \"redis://HOST:PORT\", \"rediss://HOST:PORT\" (TLS), \"redis-cluster://HOST:PORT,HOST:PORT\", \"redis-sentinel://HOST:PORT,HOST:PORT/MASTER\"; valkey:// and valkeys:// alike)",
                        weir_redis::redacted(text)
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
        weir_redis::DEFAULT_TIMEOUT,
        "[store] timeout",
        report,
    );
    let max_keys = raw
        .max_keys
        .as_ref()
        .map_or(weir_limiter::DEFAULT_MAX_KEYS, |m| {
            usize::try_from(*m.get_ref()).unwrap_or(usize::MAX).max(1)
        });
    let max_leases = raw
        .max_leases
        .as_ref()
        .map_or(weir_limiter::DEFAULT_MAX_LEASES, |m| {
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
    let access = access(&raw, env, url != StoreUrl::Memory, report);
    // TLS settings without TLS: silently unused, and a connection in clear
    // to a Redis that expects TLS fails only at run time.
    if let StoreUrl::Redis(text) = &url {
        let secure = ["rediss://", "valkeys://"]
            .iter()
            .any(|s| text.starts_with(s));
        let given = [
            ("tls_ca", raw.tls_ca.as_ref().map(Spanned::span)),
            ("tls_cert", raw.tls_cert.as_ref().map(Spanned::span)),
            ("tls_key", raw.tls_key.as_ref().map(Spanned::span)),
            (
                "tls_insecure_skip_verify",
                raw.tls_insecure_skip_verify.as_ref().map(Spanned::span),
            ),
        ];
        if !secure && !access.tls {
            for (key, span) in given {
                if let Some(span) = span {
                    let message = "is for TLS to Redis, and the url asks for none: write rediss:// (valkeys://), or set tls = true (a cluster or a sentinel URL)";
                    report.error(&span, &format!("[store] {key}"), message);
                }
            }
        }
    }
    StoreConfig {
        url,
        timeout,
        max_keys,
        max_leases,
        fallback_share,
        replica_acks,
        refusal_cache: raw.refusal_cache.unwrap_or(true),
        access,
    }
}

/// TLS and credentials for a Redis store; with the in-process store, any
/// of them is an error (it would be silently ignored).
fn access(raw: &Raw, env: &super::Env, redis: bool, report: &mut Report<'_>) -> weir_redis::Access {
    // A PEM file, read now (and at every reload).
    let mut pem = |key: &str, path: &Option<Spanned<String>>| {
        let path = path.as_ref()?;
        match std::fs::read(path.get_ref()) {
            Ok(bytes) if bytes.windows(10).any(|w| w == b"-----BEGIN") => Some(bytes),
            Ok(_) => {
                let message = format!("`{}` is not a PEM file (-----BEGIN …)", path.get_ref());
                report.error(&path.span(), &format!("[store] {key}"), message);
                None
            }
            Err(e) => {
                let message = format!("cannot read `{}`: {e}", path.get_ref());
                report.error(&path.span(), &format!("[store] {key}"), message);
                None
            }
        }
    };
    let tls_ca = pem("tls_ca", &raw.tls_ca);
    let tls_client = match (pem("tls_cert", &raw.tls_cert), pem("tls_key", &raw.tls_key)) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            let span = raw
                .tls_cert
                .as_ref()
                .or(raw.tls_key.as_ref())
                .map_or(0..0, Spanned::span);
            let message = "a client certificate needs both tls_cert and tls_key (PEM files)";
            report.error(&span, "[store] tls_cert", message);
            None
        }
    };
    // A password file's first line: a trailing newline is not the password's.
    let mut secret = |key: &str, path: &Option<Spanned<String>>| {
        let path = path.as_ref()?;
        match std::fs::read_to_string(path.get_ref()) {
            Ok(text) => Some(text.lines().next().unwrap_or_default().to_owned()),
            Err(e) => {
                let message = format!("cannot read `{}`: {e}", path.get_ref());
                report.error(&path.span(), &format!("[store] {key}"), message);
                None
            }
        }
    };
    let password = secret("password_file", &raw.password_file).or(env.redis_password.clone());
    let sentinel_password = secret("sentinel_password_file", &raw.sentinel_password_file);
    let access = weir_redis::Access {
        tls: raw.tls.as_ref().is_some_and(|t| *t.get_ref()),
        tls_ca,
        tls_client,
        tls_insecure_skip_verify: raw
            .tls_insecure_skip_verify
            .as_ref()
            .is_some_and(|t| *t.get_ref()),
        username: raw.username.as_ref().map(|u| u.get_ref().clone()),
        password: password.filter(|p| !p.is_empty()),
        sentinel_username: raw.sentinel_username.as_ref().map(|u| u.get_ref().clone()),
        // An empty file: the sentinels take no password (kept as "").
        sentinel_password,
    };
    if !redis {
        let given = [
            ("tls", raw.tls.as_ref().map(Spanned::span)),
            ("tls_ca", raw.tls_ca.as_ref().map(Spanned::span)),
            ("tls_cert", raw.tls_cert.as_ref().map(Spanned::span)),
            ("tls_key", raw.tls_key.as_ref().map(Spanned::span)),
            (
                "tls_insecure_skip_verify",
                raw.tls_insecure_skip_verify.as_ref().map(Spanned::span),
            ),
            ("username", raw.username.as_ref().map(Spanned::span)),
            (
                "password_file",
                raw.password_file.as_ref().map(Spanned::span),
            ),
            (
                "sentinel_username",
                raw.sentinel_username.as_ref().map(Spanned::span),
            ),
            (
                "sentinel_password_file",
                raw.sentinel_password_file.as_ref().map(Spanned::span),
            ),
        ];
        for (key, span) in given {
            if let Some(span) = span {
                let message =
                    "applies to a Redis store only: set url = \"redis://…\" (or rediss://)";
                report.error(&span, &format!("[store] {key}"), message);
            }
        }
    }
    access
}
