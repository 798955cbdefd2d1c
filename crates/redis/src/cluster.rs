//! What a Redis Cluster is made of, for failure per shard: the hash slot of
//! an identity's keys, and the masters with the slots each one serves.

use std::time::Duration;

use redis::Value;

use crate::StoreError;

/// The hash slots of a cluster.
pub const SLOTS: u16 = 16_384;

/// The hash slot of every key of `identity` (every policy of one identity
/// shares it: the escaped identity is the keys' hash tag).
pub fn slot(identity: &str) -> u16 {
    let mut tag = String::with_capacity(identity.len());
    weir_core::check::escape(&mut tag, identity);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
}

/// One master and the slot ranges it serves (inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// `host:port`.
    pub addr: String,
    /// Its slot ranges.
    pub slots: Vec<(u16, u16)>,
}

/// A connection to the one node at `addr` (`host:port`), within `timeout`,
/// with `access`'s TLS and credentials.
async fn node(
    addr: &str,
    timeout: Duration,
    access: &crate::Access,
) -> Result<redis::aio::MultiplexedConnection, StoreError> {
    let info = redis::IntoConnectionInfo::into_connection_info(format!("redis://{addr}").as_str())?;
    let client = access.client(&info)?;
    tokio::time::timeout(timeout, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(StoreError::Redis)
}

/// Whether the node at `addr` answers `PING` within `timeout`.
pub async fn ping(addr: &str, timeout: Duration, access: &crate::Access) -> bool {
    let Ok(mut connection) = node(addr, timeout, access).await else {
        return false;
    };
    let cmd = redis::cmd("PING");
    let ping = cmd.query_async::<String>(&mut connection);
    matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_)))
}

/// The masters, as the first of `addrs` to answer `CLUSTER SLOTS` within
/// `timeout` sees them.
pub async fn masters(
    addrs: &[String],
    timeout: Duration,
    access: &crate::Access,
) -> Result<Vec<Master>, StoreError> {
    let mut last = StoreError::Reply;
    for addr in addrs {
        let asked = async {
            let mut connection = node(addr, timeout, access).await?;
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            let call = cmd.query_async::<Value>(&mut connection);
            let reply = tokio::time::timeout(timeout, call)
                .await
                .map_err(|_| StoreError::Timeout(timeout))??;
            parse(&reply, addr).ok_or(StoreError::Reply)
        };
        match asked.await {
            Ok(masters) => return Ok(masters),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id…], replicas…]…]`. A
/// node that gives an empty host is the one asked (`asked`).
fn parse(reply: &Value, asked: &str) -> Option<Vec<Master>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut masters: Vec<Master> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let int = |v: &Value| match v {
            Value::Int(n) => u16::try_from(*n).ok(),
            _ => None,
        };
        let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
        let Value::Array(node) = fields.get(2)? else {
            return None;
        };
        let host = match node.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let port = match node.get(1)? {
            Value::Int(p) => *p,
            _ => return None,
        };
        let addr = match host.as_str() {
            "" | "?" => asked.to_owned(),
            _ => format!("{host}:{port}"),
        };
        match masters.iter_mut().find(|m| m.addr == addr) {
            Some(master) => master.slots.push((start, end)),
            None => masters.push(Master {
                addr,
                slots: vec![(start, end)],
            }),
        }
    }
    masters.sort_by(|a, b| a.addr.cmp(&b.addr));
    Some(masters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_redis() {
        // From the Redis Cluster specification's examples.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("bar"), 5_061);
        // The escaped identity is the tag: `a b` is tagged `a%20b`.
        assert_eq!(
            slot("a b"),
            crc16::State::<crc16::XMODEM>::calculate(b"a%20b") % SLOTS
        );
    }
}
