//! Per-key limits set through the API, shared by every weir on one Redis:
//! one hash of records (field → record, both opaque text to this crate)
//! and a stream of its changes, written together by one script so that a
//! change is in both or neither. Each weir loads the hash once and then
//! follows the stream from where its load began. Both keys share a hash
//! tag (one slot of a cluster) and a prefix no decision key has (`rl:`).

use crate::{RedisStore, StoreError};

/// The hash of records.
pub const RECORDS: &str = "weir:v1:{limits}";
/// The stream of changes (trimmed to about [`LOG_LENGTH`] entries).
pub const LOG: &str = "weir:v1:{limits}:log";
/// About how many changes the stream keeps: a weir that falls further
/// behind (its poll failing while more changes were made) loads the
/// hash again.
pub const LOG_LENGTH: u32 = 100_000;

/// Sets (or, with an empty value, deletes) a field and logs the change;
/// the field's value before it (empty: none).
const WRITE: &str = "local before = redis.call('HGET', KEYS[1], ARGV[1]) or '' \
    if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) \
    else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'f', ARGV[1], 'v', ARGV[2]) \
    return before";

/// One change of the stream: its id, the field, and its new value (empty:
/// deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The stream entry's id (`ms-seq`).
    pub id: String,
    /// The field changed.
    pub field: String,
    /// Its value now; empty when it was deleted.
    pub value: String,
}

impl RedisStore {
    /// Sets `field` to `value` (`None`: deletes it) and logs the change,
    /// atomically; the value it had.
    pub async fn limits_write(
        &self,
        field: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let before: String = self
            .query(
                redis::cmd("EVAL")
                    .arg(WRITE)
                    .arg(2)
                    .arg(RECORDS)
                    .arg(LOG)
                    .arg(field)
                    .arg(value.unwrap_or_default())
                    .arg(LOG_LENGTH),
            )
            .await?;
        Ok(Some(before).filter(|b| !b.is_empty()))
    }

    /// The id of the newest change (`0-0`: none yet): where to follow the
    /// stream from after loading the hash.
    pub async fn limits_head(&self) -> Result<String, StoreError> {
        let newest: redis::streams::StreamRangeReply = self
            .query(
                redis::cmd("XREVRANGE")
                    .arg(LOG)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1),
            )
            .await?;
        Ok(newest
            .ids
            .first()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone()))
    }

    /// One page of the hash from `cursor` (`0` starts; the next cursor is
    /// `0` at the end).
    pub async fn limits_page(
        &self,
        cursor: u64,
    ) -> Result<(u64, Vec<(String, String)>), StoreError> {
        self.query(
            redis::cmd("HSCAN")
                .arg(RECORDS)
                .arg(cursor)
                .arg("COUNT")
                .arg(1000),
        )
        .await
    }

    /// Up to `count` changes after `after`, oldest first, and whether
    /// `after` is still in the stream (`false`: changes were trimmed
    /// unseen, so the hash must be loaded again).
    pub async fn limits_changes(
        &self,
        after: &str,
        count: usize,
    ) -> Result<(Vec<Change>, bool), StoreError> {
        let reply: redis::streams::StreamRangeReply = self
            .query(
                redis::cmd("XRANGE")
                    .arg(LOG)
                    .arg(format!("({after}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(count),
            )
            .await?;
        let changes: Vec<Change> = reply
            .ids
            .into_iter()
            .map(|e| {
                let text = |name: &str| e.get::<String>(name).unwrap_or_default();
                Change {
                    field: text("f"),
                    value: text("v"),
                    id: e.id,
                }
            })
            .collect();
        let kept = changes.is_empty() || after == "0-0" || {
            let oldest: redis::streams::StreamRangeReply = self
                .query(
                    redis::cmd("XRANGE")
                        .arg(LOG)
                        .arg("-")
                        .arg("+")
                        .arg("COUNT")
                        .arg(1),
                )
                .await?;
            oldest.ids.first().is_none_or(|e| !newer(&e.id, after))
        };
        Ok((changes, kept))
    }
}

/// Whether the stream id `a` is after `b`.
fn newer(a: &str, b: &str) -> bool {
    let parse = |id: &str| {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a) > parse(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_ids_compare_as_numbers() {
        assert!(super::newer("10-0", "9-5"));
        assert!(super::newer("9-10", "9-9"));
        assert!(!super::newer("9-9", "9-9"));
    }
}
