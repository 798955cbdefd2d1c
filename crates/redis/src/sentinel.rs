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
    let mut last = StoreError::NoMaster(name.to_owned());
    for sentinel in sentinels {
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
        match asked.await {
            Ok(master) => return Ok(master),
            Err(e) => last = e,
        }
    }
    Err(last)
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
