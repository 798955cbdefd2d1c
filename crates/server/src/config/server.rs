//! `[server]`: where weir listens, the admin token, and the bounds that
//! keep a listener on the internet up (docs/SECURITY.md).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use super::Report;
use crate::addresses::AddressList;

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The gateway routes and `/healthz`; without `internal`, also the
    /// decision API, metrics and admin endpoints.
    pub listen: SocketAddr,
    /// Where the decision API, `/metrics`, `/v1/policies`, the admin
    /// endpoints and `/readyz` are served instead of `listen`.
    pub internal: Option<SocketAddr>,
    /// The Envoy rate limit service; none: off.
    pub grpc: Option<SocketAddr>,
    /// The Redis protocol (`CL.THROTTLE`, `WEIR.CHECK`, …); none: off.
    pub resp: Option<SocketAddr>,
    /// `resp_user` (`default` unless set) and the password the Redis
    /// protocol's clients `AUTH` with (`resp_password_file`, or
    /// `WEIR_RESP_PASSWORD`); none: no `AUTH` needed.
    pub resp_auth: Option<RespAuth>,
    /// `envoy_json = true`: the main listener answers `POST /json`, the
    /// Envoy service's call as JSON (as envoyproxy/ratelimit's HTTP port
    /// does). Read at start.
    pub envoy_json: bool,
    /// `envoy_header_names = [LIMIT, REMAINING, RESET]`: the Envoy face's
    /// X-RateLimit fields under these names (envoyproxy/ratelimit's
    /// `LIMIT_LIMIT_HEADER` and the like).
    pub envoy_header_names: Option<[String; 3]>,
    /// The bearer token of the admin endpoints; none turns them off.
    pub admin_token: Option<String>,
    /// `[server.admin_tokens]`: more admin tokens, each with the name the
    /// audit log gives its changes (`admin_token` is named `admin`).
    pub admin_tokens: Vec<(String, String)>,
    /// The bounds of every connection.
    pub limits: ConnectionLimits,
    /// Proxies whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// `allow`: client networks exempt from every limit.
    pub allow: AddressList,
    /// `deny`: client networks refused `403` before anything is decided.
    pub deny: AddressList,
    /// New keys a client address may create per second; none: no cap.
    pub new_keys_per_ip: Option<u32>,
    /// Every policy in shadow mode.
    pub shadow: bool,
    /// Which rate-limit header fields answers carry.
    pub headers: weir_tower::HeaderStyle,
    /// An admitted decision leaving less than `1 - near_limit_ratio` of the
    /// limit counts as `near_limit` too (parts per million); none: off.
    pub near_limit_ratio: Option<u64>,
    /// `log_format = "json"`: one JSON object per log line, for log
    /// pipelines; `"text"` (the default) for people. Read at start only.
    pub json_logs: bool,
    /// `log_level`: the least severe level logged (`RUST_LOG`, when set,
    /// takes its place). Read at start only.
    pub log_level: String,
    /// `access_log = true`: one line per gateway request (route, status,
    /// outcome, policy, latency).
    pub access_log: bool,
    /// `access_log_identity = true`: the access log names the identity too
    /// (off: identities are the clients', kept out of logs).
    pub access_log_identity: bool,
    /// `[telemetry]`: OpenTelemetry spans over OTLP; none: off.
    pub telemetry: Option<Telemetry>,
    /// `[server.tls]`: TLS on `listen`; none: plaintext. The paths are read
    /// at start; the files again whenever they change.
    pub tls: Option<TlsFiles>,
    /// `[server.internal_tls]`: TLS on `internal`.
    pub internal_tls: Option<TlsFiles>,
    /// `[server.grpc_tls]`: TLS on `grpc`.
    pub grpc_tls: Option<TlsFiles>,
    /// `[server.resp_tls]`: TLS on `resp`.
    pub resp_tls: Option<TlsFiles>,
}

/// Who may use the Redis protocol listener: one user and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct RespAuth {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for RespAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespAuth")
            .field("user", &self.user)
            .field("password", &"(set)")
            .finish()
    }
}

/// `[telemetry]`: where spans go, and whether they may name identities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    /// An OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`.
    pub otlp_endpoint: String,
    /// Whether a span carries the identity (off: identities are the
    /// clients', kept out of traces).
    pub include_identity: bool,
}

/// How long and how many: the bounds of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From the first byte of a request head to its end.
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in flight and no bytes.
    pub idle_timeout: Duration,
    /// The longest wait for the next piece of a request body.
    pub body_timeout: Duration,
    /// A decision API or playground body, first byte to last (gateway
    /// bodies: the route's `timeout`).
    pub body_deadline: Duration,
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections from one client address.
    pub max_connections_per_ip: usize,
    /// After SIGTERM, how long requests in flight may take to finish.
    pub shutdown_timeout: Duration,
    /// `ipv6_prefix`: the leading bits of an IPv6 address that name one
    /// client for every per-address bound (connections, new keys, failed
    /// admin attempts): a host that rotates its addresses inside its /64
    /// is one client — and one `peer` identity. 128 counts every address
    /// apart.
    pub ipv6_prefix: u8,
    /// `ipv4_prefix`: the same for IPv4 (default 32: every address apart).
    pub ipv4_prefix: u8,
}

/// The default of `[server] ipv6_prefix`: a /64, the network one host (or
/// one customer's LAN) is given.
pub(crate) const IPV6_PREFIX: u8 = 64;

impl ConnectionLimits {
    /// The client `ip` counts as for the per-address bounds: an IPv4
    /// address whole (and an IPv4-mapped IPv6 one as IPv4), an IPv6
    /// address as its network of `ipv6_prefix` bits.
    pub fn client(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let bits = u32::from(self.ipv6_prefix.min(128));
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                IpAddr::V6((v6.to_bits() & mask).into())
            }
            IpAddr::V4(v4) => {
                let bits = u32::from(self.ipv4_prefix.min(32));
                let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
                IpAddr::V4((v4.to_bits() & mask).into())
            }
        }
    }

    /// The `peer` identity of a client at `ip`: its address when its
    /// prefix is the whole address (`192.0.2.7`), else its network
    /// (`2001:db8:1:2::/64`), so that the addresses a client rotates
    /// through inside it are one key.
    pub fn peer_key(&self, ip: IpAddr) -> String {
        weir_tower::network_key(ip, self.ipv4_prefix, self.ipv6_prefix)
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            body_deadline: Duration::from_secs(10),
            max_connections: 10_000,
            max_connections_per_ip: 256,
            shutdown_timeout: Duration::from_secs(30),
            ipv6_prefix: IPV6_PREFIX,
            ipv4_prefix: 32,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Raw {
    listen: Option<Spanned<String>>,
    internal: Option<Spanned<String>>,
    admin_token: Option<Spanned<String>>,
    admin_tokens: Option<BTreeMap<String, Spanned<String>>>,
    grpc: Option<Spanned<String>>,
    resp: Option<Spanned<String>>,
    resp_user: Option<Spanned<String>>,
    resp_password_file: Option<Spanned<String>>,
    envoy_json: Option<bool>,
    envoy_header_names: Option<Spanned<Vec<String>>>,
    header_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    body_timeout: Option<Spanned<String>>,
    body_deadline: Option<Spanned<String>>,
    shutdown_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<u64>>,
    max_connections_per_ip: Option<Spanned<u64>>,
    ipv6_prefix: Option<Spanned<u64>>,
    ipv4_prefix: Option<Spanned<u64>>,
    allow: Option<Spanned<Vec<String>>>,
    deny: Option<Spanned<Vec<String>>>,
    trusted_proxies: Option<Spanned<Vec<String>>>,
    new_keys_per_ip: Option<Spanned<u64>>,
    shadow: Option<Spanned<bool>>,
    headers: Option<Spanned<String>>,
    near_limit_ratio: Option<Spanned<toml::Value>>,
    log_format: Option<Spanned<String>>,
    log_level: Option<Spanned<String>>,
    access_log: Option<Spanned<bool>>,
    access_log_identity: Option<Spanned<bool>>,
    tls: Option<Spanned<RawTls>>,
    internal_tls: Option<Spanned<RawTls>>,
    grpc_tls: Option<Spanned<RawTls>>,
    resp_tls: Option<Spanned<RawTls>>,
}

/// `[server.tls]` (and `internal_tls`, `grpc_tls`) as written.
#[derive(Debug, Deserialize)]
pub(super) struct RawTls {
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    client_ca: Option<Spanned<String>>,
}

/// The TLS tables of `[server]`.
pub(super) const TLS_TABLES: [&str; 4] = ["tls", "internal_tls", "grpc_tls", "resp_tls"];

/// `[server.tls]` (and `internal_tls`, `grpc_tls`): PEM files, read by
/// the listener (`tls.rs`, which also loads them once when the
/// configuration is read, so that a pair that does not load is an error
/// naming its line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Roots of the client certificates to require (mTLS); none: no client
    /// certificate asked for.
    pub client_ca: Option<PathBuf>,
    /// Its table: `tls`, `internal_tls` or `grpc_tls`.
    pub table: &'static str,
    /// The line of `cert` in the configuration file.
    pub line: usize,
}

/// A listener's TLS files; `serves` is whether the listener it is for is
/// configured.
fn tls(
    raw: Option<&Spanned<RawTls>>,
    table: &'static str,
    serves: bool,
    report: &mut Report<'_>,
) -> Option<TlsFiles> {
    let raw = raw?;
    let place = format!("[server.{table}]");
    let (Some(cert), Some(key)) = (&raw.get_ref().cert, &raw.get_ref().key) else {
        report.error(&raw.span(), &place, "needs cert and key (PEM files)");
        return None;
    };
    if !serves {
        let listener = table.strip_suffix("_tls").unwrap_or("listen");
        let message = format!("there is no [server] {listener} listener for it");
        report.error(&raw.span(), &place, message);
        return None;
    }
    Some(TlsFiles {
        cert: cert.get_ref().into(),
        key: key.get_ref().into(),
        client_ca: raw.get_ref().client_ca.as_ref().map(|c| c.get_ref().into()),
        table,
        line: report.line(&cert.span()),
    })
}

/// `[telemetry]` as written.
#[derive(Debug, Deserialize)]
pub(super) struct RawTelemetry {
    otlp_endpoint: Spanned<String>,
    include_identity: Option<Spanned<bool>>,
}

pub(super) fn telemetry(raw: RawTelemetry, report: &mut Report<'_>) -> Option<Telemetry> {
    let endpoint = raw.otlp_endpoint.get_ref();
    match endpoint.parse::<http::Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some() =>
        {
            Some(Telemetry {
                otlp_endpoint: endpoint.clone(),
                include_identity: raw.include_identity.is_some_and(|i| *i.get_ref()),
            })
        }
        _ => {
            report.error(
                &raw.otlp_endpoint.span(),
                "[telemetry] otlp_endpoint",
                format!(
                    "`{endpoint}` is not an OTLP/gRPC endpoint such as \"http://127.0.0.1:4317\""
                ),
            );
            None
        }
    }
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

pub(super) fn parse(raw: Raw, env: &super::Env, report: &mut Report<'_>) -> ServerConfig {
    let token_env = env.admin_token.clone();
    let listen = raw
        .listen
        .as_ref()
        .and_then(|l| address(l, "[server] listen", "127.0.0.1:8080", report))
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)));
    let grpc = raw
        .grpc
        .as_ref()
        .and_then(|g| address(g, "[server] grpc", "127.0.0.1:8081", report));
    let internal = raw
        .internal
        .as_ref()
        .and_then(|g| address(g, "[server] internal", "127.0.0.1:9090", report));
    let limits = limits(&raw, report);
    let trusted_proxies = trusted_proxies(&raw, report);
    let headers = match &raw.headers {
        None => weir_tower::HeaderStyle::default(),
        Some(h) => h.get_ref().parse().unwrap_or_else(|e: String| {
            report.error(&h.span(), "[server] headers", e);
            weir_tower::HeaderStyle::default()
        }),
    };
    let near_limit_ratio = near_limit_ratio(&raw, report);
    let new_keys_per_ip = raw
        .new_keys_per_ip
        .as_ref()
        .map(|v| u32::try_from(*v.get_ref()).unwrap_or(u32::MAX).max(1));
    let admin_token = admin_token(raw.admin_token.clone(), token_env, report);
    let (json_logs, log_level) = logs(&raw, report);
    let tls_of = |raw: &Option<Spanned<RawTls>>, table, serves, report: &mut Report<'_>| {
        tls(raw.as_ref(), table, serves, report)
    };
    let internal_tls = tls_of(
        &raw.internal_tls,
        "internal_tls",
        internal.is_some(),
        report,
    );
    let grpc_tls = tls_of(&raw.grpc_tls, "grpc_tls", grpc.is_some(), report);
    let resp = raw
        .resp
        .as_ref()
        .and_then(|r| address(r, "[server] resp", "127.0.0.1:6380", report));
    let resp_tls = tls_of(&raw.resp_tls, "resp_tls", resp.is_some(), report);
    let resp_auth = resp_auth(&raw, env.resp_password.clone(), report);
    let tls = tls_of(&raw.tls, "tls", true, report);
    ServerConfig {
        tls,
        internal_tls,
        grpc_tls,
        resp,
        resp_tls,
        resp_auth,
        json_logs,
        log_level,
        access_log: raw.access_log.is_some_and(|a| *a.get_ref()),
        access_log_identity: raw.access_log_identity.is_some_and(|a| *a.get_ref()),
        telemetry: None,
        listen,
        internal,
        grpc,
        envoy_json: raw.envoy_json.unwrap_or(false),
        envoy_header_names: header_names(raw.envoy_header_names.as_ref(), report),
        admin_token,
        admin_tokens: admin_tokens(raw.admin_tokens.as_ref(), report),
        limits,
        trusted_proxies,
        allow: address_list(raw.allow.as_ref(), "[server] allow", report),
        deny: address_list(raw.deny.as_ref(), "[server] deny", report),
        new_keys_per_ip,
        shadow: raw.shadow.is_some_and(|s| *s.get_ref()),
        headers,
        near_limit_ratio,
    }
}

/// The bounds of every connection: timeouts above 0, counts at least 1.
fn limits(raw: &Raw, report: &mut Report<'_>) -> ConnectionLimits {
    let defaults = ConnectionLimits::default();
    let duration =
        |value: &Option<Spanned<String>>, default, key: &str, report: &mut Report<'_>| {
            let d = super::duration(value.as_ref(), default, &format!("[server] {key}"), report);
            if d.is_zero() {
                if let Some(v) = value {
                    report.error(&v.span(), &format!("[server] {key}"), "must be above 0");
                }
            }
            d
        };
    let count =
        |value: &Option<Spanned<u64>>, default: usize, key: &str, report: &mut Report<'_>| {
            match value {
                None => default,
                Some(v) if *v.get_ref() == 0 => {
                    report.error(&v.span(), &format!("[server] {key}"), "must be at least 1");
                    default
                }
                Some(v) => usize::try_from(*v.get_ref()).unwrap_or(usize::MAX),
            }
        };
    ConnectionLimits {
        header_timeout: duration(
            &raw.header_timeout,
            defaults.header_timeout,
            "header_timeout",
            report,
        ),
        idle_timeout: duration(
            &raw.idle_timeout,
            defaults.idle_timeout,
            "idle_timeout",
            report,
        ),
        body_timeout: duration(
            &raw.body_timeout,
            defaults.body_timeout,
            "body_timeout",
            report,
        ),
        body_deadline: duration(
            &raw.body_deadline,
            defaults.body_deadline,
            "body_deadline",
            report,
        ),
        shutdown_timeout: duration(
            &raw.shutdown_timeout,
            defaults.shutdown_timeout,
            "shutdown_timeout",
            report,
        ),
        max_connections: count(
            &raw.max_connections,
            defaults.max_connections,
            "max_connections",
            report,
        ),
        max_connections_per_ip: count(
            &raw.max_connections_per_ip,
            defaults.max_connections_per_ip,
            "max_connections_per_ip",
            report,
        ),
        ipv6_prefix: match &raw.ipv6_prefix {
            None => defaults.ipv6_prefix,
            Some(v) => match u8::try_from(*v.get_ref()) {
                Ok(bits @ 1..=128) => bits,
                _ => {
                    report.error(
                        &v.span(),
                        "[server] ipv6_prefix",
                        format!("{} is not a prefix length from 1 to 128 (the default, {IPV6_PREFIX}, counts a /64 as one client; 128 counts every address)", v.get_ref()),
                    );
                    defaults.ipv6_prefix
                }
            },
        },
        ipv4_prefix: match &raw.ipv4_prefix {
            None => defaults.ipv4_prefix,
            Some(v) => match u8::try_from(*v.get_ref()) {
                Ok(bits @ 1..=32) => bits,
                _ => {
                    report.error(
                        &v.span(),
                        "[server] ipv4_prefix",
                        format!("{} is not a prefix length from 1 to 32 (the default, 32, counts every address apart)", v.get_ref()),
                    );
                    defaults.ipv4_prefix
                }
            },
        },
    }
}

/// A list of addresses and networks (`allow`, `deny`, `exempt`), each
/// error naming the entry and `place`.
pub(super) fn address_list(
    list: Option<&Spanned<Vec<String>>>,
    place: &str,
    report: &mut Report<'_>,
) -> AddressList {
    let Some(list) = list else {
        return AddressList::default();
    };
    let networks: Vec<IpNet> = list
        .get_ref()
        .iter()
        .filter_map(|text| {
            AddressList::parse_network(text)
                .map_err(|e| report.error(&list.span(), place, e))
                .ok()
        })
        .collect();
    AddressList::new(&networks)
}

/// `trusted_proxies`: addresses or networks.
fn trusted_proxies(raw: &Raw, report: &mut Report<'_>) -> Vec<IpNet> {
    let mut trusted_proxies = Vec::new();
    if let Some(list) = &raw.trusted_proxies {
        for text in list.get_ref() {
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => trusted_proxies.push(net),
                Err(_) => report.error(
                    &list.span(),
                    "[server] trusted_proxies",
                    format!("`{text}` is not an address or a network such as \"10.0.0.0/8\""),
                ),
            }
        }
    }
    trusted_proxies
}

/// `near_limit_ratio`, in parts per million.
fn near_limit_ratio(raw: &Raw, report: &mut Report<'_>) -> Option<u64> {
    raw.near_limit_ratio.as_ref().and_then(|v| {
        let ratio = match v.get_ref() {
            toml::Value::Float(f) => Some(*f),
            toml::Value::Integer(i) => Some(*i as f64),
            _ => None,
        };
        match ratio {
            // Parts per million: configuration, never a decision.
            Some(r) if r > 0.0 && r < 1.0 => Some((r * 1e6).round() as u64),
            _ => {
                report.error(
                    &v.span(),
                    "[server] near_limit_ratio",
                    "must be a number above 0 and below 1, e.g. 0.8",
                );
                None
            }
        }
    })
}

/// `[server.admin_tokens]`: name → token, each name a word, each token
/// checked as `admin_token` is.
fn admin_tokens(
    raw: Option<&BTreeMap<String, Spanned<String>>>,
    report: &mut Report<'_>,
) -> Vec<(String, String)> {
    let mut tokens = Vec::new();
    for (name, token) in raw.into_iter().flatten() {
        let place = format!("[server.admin_tokens] {name}");
        if !super::valid_name(name) || name == "admin" {
            let message = "a name of letters, digits, `-` and `_` (at most 64), other than `admin` (the name of admin_token)";
            report.error(&token.span(), &place, message);
        }
        if let Err(e) = check_token(token.get_ref()) {
            report.error(&token.span(), &place, e);
        }
        if tokens.iter().any(|(_, t)| t == token.get_ref()) {
            report.error(
                &token.span(),
                &place,
                "the same token as another name: give each its own",
            );
        }
        tokens.push((name.clone(), token.get_ref().clone()));
    }
    tokens
}

/// `admin_token`, else `WEIR_ADMIN_TOKEN`: checked either way.
fn admin_token(
    token: Option<Spanned<String>>,
    token_env: Option<String>,
    report: &mut Report<'_>,
) -> Option<String> {
    match token {
        Some(token) => {
            if let Err(e) = check_token(token.get_ref()) {
                report.error(&token.span(), "[server] admin_token", e);
            }
            Some(token.into_inner())
        }
        None => {
            if let Some(Err(e)) = token_env.as_deref().map(check_token) {
                report.error_outside("WEIR_ADMIN_TOKEN (the [server] admin_token)", e);
            }
            token_env
        }
    }
}

/// `resp_user` and the password from `resp_password_file` (its first
/// line) or `WEIR_RESP_PASSWORD`.
fn resp_auth(raw: &Raw, env: Option<String>, report: &mut Report<'_>) -> Option<RespAuth> {
    let password = match &raw.resp_password_file {
        Some(path) => match std::fs::read_to_string(path.get_ref()) {
            Ok(text) => Some(text.lines().next().unwrap_or_default().to_owned()),
            Err(e) => {
                let message = format!("cannot read `{}`: {e}", path.get_ref());
                report.error(&path.span(), "[server] resp_password_file", message);
                None
            }
        },
        None => env,
    };
    let user = raw.resp_user.as_ref();
    match (password, user) {
        (Some(password), user) if !password.is_empty() => Some(RespAuth {
            user: user.map_or_else(|| "default".to_owned(), |u| u.get_ref().clone()),
            password,
        }),
        (_, Some(user)) => {
            let message = "needs a password: resp_password_file, or WEIR_RESP_PASSWORD";
            report.error(&user.span(), "[server] resp_user", message);
            None
        }
        _ => None,
    }
}

/// `log_format` (JSON or text) and `log_level`.
fn logs(raw: &Raw, report: &mut Report<'_>) -> (bool, String) {
    let json_logs = match raw.log_format.as_ref().map(|f| (f, f.get_ref().as_str())) {
        None | Some((_, "text")) => false,
        Some((_, "json")) => true,
        Some((f, other)) => {
            report.error(
                &f.span(),
                "[server] log_format",
                format!("`{other}` is not a log format (valid: \"text\", \"json\")"),
            );
            false
        }
    };
    let log_level = match &raw.log_level {
        None => "info".to_owned(),
        Some(level) if LOG_LEVELS.contains(&level.get_ref().as_str()) => level.get_ref().clone(),
        Some(level) => {
            report.error(
                &level.span(),
                "[server] log_level",
                format!(
                    "`{}` is not a log level (valid: {})",
                    level.get_ref(),
                    LOG_LEVELS.map(|l| format!("\"{l}\"")).join(", ")
                ),
            );
            "info".to_owned()
        }
    };
    (json_logs, log_level)
}

/// The levels `log_level` takes, most severe first.
const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// An admin token long enough and not one repeated character.
fn check_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN {
        return Err(format!("must be at least {MIN_TOKEN} characters"));
    }
    let mut chars = token.chars();
    let first = chars.next();
    if chars.all(|c| Some(c) == first) {
        return Err(
            "is one character repeated: use a random token (e.g. `openssl rand -hex 24`)".into(),
        );
    }
    Ok(())
}

/// `envoy_header_names`: three valid header names.
fn header_names(
    raw: Option<&Spanned<Vec<String>>>,
    report: &mut Report<'_>,
) -> Option<[String; 3]> {
    let raw = raw?;
    let names = raw.get_ref();
    let valid = names
        .iter()
        .all(|n| http::HeaderName::try_from(n.as_str()).is_ok());
    match <[String; 3]>::try_from(names.clone()) {
        Ok(three) if valid => Some(three),
        _ => {
            report.error(
                &raw.span(),
                "[server] envoy_header_names",
                "give three header names: the limit's, the remaining's and the reset's, e.g. [\"RateLimit-Limit\", \"RateLimit-Remaining\", \"RateLimit-Reset\"]",
            );
            None
        }
    }
}
