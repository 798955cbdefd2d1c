//! How weir reaches a Redis beyond its URL: TLS (rustls, no OpenSSL) and
//! credentials; and the URL as it may be shown, its password replaced.

use std::fmt;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, TlsCertificates};

/// TLS and credentials for a Redis store, beside its URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// TLS to every node, with the URL's scheme `redis://` (or
    /// `redis-cluster://`); `rediss://` and `valkeys://` ask for it themselves.
    pub tls: bool,
    /// PEM roots to trust instead of the system's.
    pub tls_ca: Option<Vec<u8>>,
    /// A client certificate and its private key (PEM), for a Redis that
    /// asks for one.
    pub tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// Accept any server certificate, unverified: only for the managed
    /// Redis that give no verifiable one.
    pub tls_insecure_skip_verify: bool,
    /// The ACL user (Redis 6+); `default` when only a password is given.
    pub username: Option<String>,
    /// The password, which replaces one inside the URL.
    pub password: Option<String>,
    /// The sentinels' user, where it is not the master's.
    pub sentinel_username: Option<String>,
    /// The sentinels' password, where it is not the master's; empty: the
    /// sentinels take none (where the master has one).
    pub sentinel_password: Option<String>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(|_| "<pem>"))
            .field("tls_client", &self.tls_client.as_ref().map(|_| "<pem>"))
            .field("tls_insecure_skip_verify", &self.tls_insecure_skip_verify)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// `url` as it may be shown (logs, `weir config check`, `/readyz`, the
/// dashboard): every node's password replaced by `***`, and so a
/// `password=`/`pass=` query parameter's value. A malformed URL too (a
/// scheme without `://`, none at all): whatever precedes an `@` after the
/// last `/` is credentials.
pub fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let nodes: Vec<String> = rest
        .split(',')
        .map(|node| {
            let node = match node.rfind('@') {
                Some(at) => {
                    let start = node[..at].rfind('/').map_or(0, |slash| slash + 1);
                    match node[start..at].split_once(':') {
                        Some((user, _)) => {
                            format!("{}{user}:***{}", &node[..start], &node[at..])
                        }
                        None => node.to_owned(),
                    }
                }
                None => node.to_owned(),
            };
            match node.split_once('?') {
                Some((path, query)) => {
                    let query: Vec<String> = query
                        .split('&')
                        .map(|pair| match pair.split_once('=') {
                            Some((k, _)) if k == "password" || k == "pass" => format!("{k}=***"),
                            _ => pair.to_owned(),
                        })
                        .collect();
                    format!("{path}?{}", query.join("&"))
                }
                None => node,
            }
        })
        .collect();
    format!("{scheme}{}", nodes.join(","))
}

/// What a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `redis://`, `rediss://`, `valkey://`, `valkeys://`: one node.
    Single,
    /// `redis-cluster://h:p,h:p`: a cluster seeded by these nodes.
    Cluster,
    /// `redis-sentinel://h:p,h:p/MASTER`: these sentinels, and the name of
    /// the master they watch.
    Sentinel(String),
}

/// What a URL names, and its nodes (a cluster's seeds, or the sentinels).
pub(crate) fn nodes(url: &str) -> RedisResult<(Kind, Vec<ConnectionInfo>)> {
    let several = |nodes: &str| {
        nodes
            .split(',')
            .map(|n| format!("redis://{n}").as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()
    };
    if let Some(nodes) = url.strip_prefix("redis-cluster://") {
        return Ok((Kind::Cluster, several(nodes)?));
    }
    if let Some(rest) = url.strip_prefix("redis-sentinel://") {
        let (nodes, name) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty() || name.contains('/') {
            let message = "a sentinel URL ends with the master's name: redis-sentinel://HOST:PORT,HOST:PORT/NAME";
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                message,
            )));
        }
        return Ok((Kind::Sentinel(name.to_owned()), several(nodes)?));
    }
    Ok((Kind::Single, vec![url.into_connection_info()?]))
}

impl Access {
    /// The access to the sentinels without credentials: for sentinels
    /// that take none, where the master's were tried on them.
    pub(crate) fn without_credentials(&self) -> Self {
        Self {
            username: None,
            password: None,
            ..self.clone()
        }
    }

    /// The access to the sentinels: the same TLS, their own credentials
    /// where given.
    pub(crate) fn to_sentinels(&self) -> Self {
        let password = match self.sentinel_password.as_deref() {
            Some("") => None,
            Some(password) => Some(password.to_owned()),
            None => self.password.clone(),
        };
        Self {
            username: self.sentinel_username.clone().or(self.username.clone()),
            password,
            ..self.clone()
        }
    }

    /// Whether a node is reached over TLS.
    pub(crate) fn tls_for(&self, node: &ConnectionInfo) -> bool {
        self.tls || matches!(node.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// `node` with this access's TLS and credentials applied.
    pub(crate) fn apply(&self, node: ConnectionInfo) -> ConnectionInfo {
        let tls = self.tls_for(&node);
        let addr = match node.addr().clone() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } if tls => {
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: self.tls_insecure_skip_verify,
                    tls_params: None,
                }
            }
            other => other,
        };
        let mut settings = node.redis_settings().clone();
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        node.set_addr(addr).set_redis_settings(settings)
    }

    /// The roots and client certificate to connect with.
    pub(crate) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self
                .tls_client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.tls_ca.clone(),
        }
    }

    /// A client of one node.
    pub(crate) fn client(&self, node: &ConnectionInfo) -> RedisResult<redis::Client> {
        let node = self.apply(node.clone());
        if matches!(node.addr(), ConnectionAddr::TcpTls { .. }) {
            install_crypto();
            redis::Client::build_with_tls(node, self.certificates())
        } else {
            redis::Client::open(node)
        }
    }

    /// A client of a cluster seeded by `nodes`.
    pub(crate) fn cluster(
        &self,
        nodes: &[ConnectionInfo],
    ) -> RedisResult<redis::cluster::ClusterClient> {
        let tls = nodes.iter().any(|n| self.tls_for(n));
        let nodes = nodes.iter().map(|n| self.apply(n.clone()));
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes);
        if let Some(username) = &self.username {
            builder = builder.username(username);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        if tls {
            install_crypto();
            let mode = match self.tls_insecure_skip_verify {
                true => redis::TlsMode::Insecure,
                false => redis::TlsMode::Secure,
            };
            builder = builder.tls(mode).certs(self.certificates());
        }
        builder.build()
    }
}

/// rustls's process-wide crypto provider, installed once: `ring`, which
/// builds with no C toolchain beyond a compiler (its key exchange is not
/// post-quantum, hence rustls's deprecation note).
#[allow(deprecated)]
fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redacted("rediss://weir:s3cret@cache.example:6380/0"),
            "rediss://weir:***@cache.example:6380/0"
        );
        assert_eq!(
            redacted("redis://:s3cret@127.0.0.1:6379"),
            "redis://:***@127.0.0.1:6379"
        );
        assert_eq!(
            redacted("redis-cluster://u:p1@a:1,u:p2@b:2,c:3"),
            "redis-cluster://u:***@a:1,u:***@b:2,c:3"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        // Malformed, as a user may write it: still no password shown.
        for url in [
            "redis//weir:s3cret@cache:6379",
            "weir:s3cret@cache:6379",
            "redis:/weir:s3cret@cache:6379/0",
            "redis+unix:///run/redis.sock?db=0&password=s3cret",
            "redis-sentinel://:s3cret@a:1,u:s3cret@b:2/mymaster",
        ] {
            let shown = redacted(url);
            assert!(!shown.contains("s3cret"), "{url} → {shown}");
            assert!(shown.contains("***"), "{url} → {shown}");
        }
        let access = Access {
            password: Some("s3cret".into()),
            ..Access::default()
        };
        assert!(!format!("{access:?}").contains("s3cret"));
    }
}
