//! `[server]`: where weir listens, and the admin token.

use std::net::SocketAddr;

use serde::Deserialize;
use toml::Spanned;

use super::Report;

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The decision API, gateway routes, metrics and health.
    pub listen: SocketAddr,
    /// The Envoy rate limit service; none: off.
    pub grpc: Option<SocketAddr>,
    /// The bearer token of the admin endpoints; none turns them off.
    pub admin_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Raw {
    listen: Option<Spanned<String>>,
    admin_token: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
}

/// The shortest admin token accepted.
const MIN_TOKEN: usize = 16;

fn address(
    value: &Spanned<String>,
    place: &str,
    example: &str,
    report: &mut Report<'_>,
) -> Option<SocketAddr> {
    value
        .get_ref()
        .parse()
        .map_err(|_| {
            report.error(
                &value.span(),
                place,
                format!("`{}` is not an address such as {example}", value.get_ref()),
            );
        })
        .ok()
}

pub(super) fn parse(raw: Raw, token_env: Option<String>, report: &mut Report<'_>) -> ServerConfig {
    let listen = raw
        .listen
        .as_ref()
        .and_then(|l| address(l, "[server] listen", "127.0.0.1:8080", report))
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)));
    let grpc = raw
        .grpc
        .as_ref()
        .and_then(|g| address(g, "[server] grpc", "127.0.0.1:8081", report));
    let admin_token = match raw.admin_token {
        Some(token) => {
            if token.get_ref().len() < MIN_TOKEN {
                report.error(
                    &token.span(),
                    "[server] admin_token",
                    format!("must be at least {MIN_TOKEN} characters"),
                );
            }
            Some(token.into_inner())
        }
        None => {
            if token_env.as_ref().is_some_and(|t| t.len() < MIN_TOKEN) {
                report.error(
                    &(0..0),
                    "[server] admin_token (from WEIR_ADMIN_TOKEN)",
                    format!("must be at least {MIN_TOKEN} characters"),
                );
            }
            token_env
        }
    };
    ServerConfig {
        listen,
        grpc,
        admin_token,
    }
}
