//! Redis Sentinel: where the master is, as the first sentinel to answer
//! says.

use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::{Access, StoreError};

/// The master `name`'s address as the first of `sentinels` to answer within
/// `timeout` names it, as a node to connect to: the URL's credentials (those
/// of the sentinels' entries) with `access`'s applied over them later.
pub(crate) async fn master(
    sentinels: &[ConnectionInfo],
    name: &str,
    access: &Access,
    timeout: Duration,
) -> Result<ConnectionInfo, StoreError> {
    let to_sentinels = access.to_sentinels();
    // The master's credentials, when the sentinels were given none of
    // their own, may be refused by sentinels that take none (the common
    // layout): then they are asked without.
    let bare = access
        .sentinel_password
        .is_none()
        .then(|| to_sentinels.without_credentials());
    let mut last = StoreError::NoMaster(name.to_owned());
    for sentinel in sentinels {
        let mut found = ask(sentinel, name, &to_sentinels, timeout).await;
        if let (Err(StoreError::Redis(e)), Some(bare)) = (&found, &bare)
            && e.kind() == redis::ErrorKind::AuthenticationFailed
            && let Ok(master) = ask(sentinel, name, bare, timeout).await
        {
            found = Ok(master);
        }
        match found {
            Ok(master) => return Ok(master),
            Err(e @ StoreError::NoMaster(_)) => last = e,
            Err(e) => {
                last = StoreError::Sentinel {
                    sentinel: address(sentinel),
                    error: e.to_string(),
                }
            }
        }
    }
    Err(last)
}

/// The master `name`'s address as `sentinel` names it.
async fn ask(
    sentinel: &ConnectionInfo,
    name: &str,
    to_sentinels: &Access,
    timeout: Duration,
) -> Result<ConnectionInfo, StoreError> {
    {
        let asked = async {
            let client = to_sentinels.client(sentinel)?;
            let connect = client.get_multiplexed_async_connection();
            let mut connection = tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| StoreError::Timeout(timeout))??;
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("get-master-addr-by-name").arg(name);
            let reply: Option<(String, u16)> =
                tokio::time::timeout(timeout, cmd.query_async(&mut connection))
                    .await
                    .map_err(|_| StoreError::Timeout(timeout))??;
            let (host, port) = reply.ok_or_else(|| StoreError::NoMaster(name.to_owned()))?;
            let master = format!("redis://{host}:{port}")
                .as_str()
                .into_connection_info()?;
            Ok::<_, StoreError>(master.set_redis_settings(sentinel.redis_settings().clone()))
        };
        asked.await
    }
}

/// `host:port` of a node.
pub(crate) fn address(node: &ConnectionInfo) -> String {
    match node.addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}
