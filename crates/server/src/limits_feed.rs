//! On Redis, every weir follows the limits managed by API: it loads the
//! shared records once the store is up, then reads their change log every
//! [`POLL`] — so a change made through any weir decides here within
//! `POLL` plus a store round trip. A weir that missed changes (the log
//! trimmed past them while the store was away) loads the records again;
//! a new store URL (a reload) is loaded afresh.

use std::sync::Arc;
use std::time::Duration;

use weir_redis::RedisStore;

use crate::breaker::Remote;
use crate::limits::{Change, Limits};

/// How often the change log is read.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// The most changes read at once.
const BATCH: usize = 1_000;

/// What [`follow`] asks of the server each time: its registry and its
/// shared store (none in process); `None` once the server is gone.
pub(crate) type Source = dyn Fn() -> Option<(Arc<Limits>, Option<Arc<Remote>>)> + Send;

/// Follows the shared records until the server is gone.
pub(crate) async fn follow(source: Box<Source>) {
    // The change log's id the registry is up to, and of which store.
    let mut at: Option<(usize, String)> = None;
    loop {
        let Some((limits, remote)) = source() else {
            return;
        };
        let Some(remote) = remote else {
            at = None;
            tokio::time::sleep(POLL).await;
            continue;
        };
        let which = Arc::as_ptr(&remote) as usize;
        if let Some(store) = remote.available() {
            at = match at.filter(|(w, _)| *w == which) {
                None => load(&store, &limits).await.map(|head| (which, head)),
                Some((_, after)) => catch_up(&store, &limits, after).await.map(|id| (which, id)),
            };
        }
        drop((limits, remote));
        tokio::time::sleep(POLL).await;
    }
}

/// Loads every shared record into `limits` (replacing what it held); the
/// change log's id to follow from.
async fn load(store: &RedisStore, limits: &Limits) -> Option<String> {
    let loaded = async {
        let head = store.limits_head().await?;
        let (mut cursor, mut changes) = (0, Vec::new());
        loop {
            let (next, page) = store.limits_page(cursor).await?;
            changes.extend(page.iter().filter_map(|(f, v)| Change::from_stored(f, v)));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok::<_, weir_redis::StoreError>((head, changes))
    };
    match loaded.await {
        Ok((head, changes)) => {
            let fresh = Limits::default();
            for change in &changes {
                let _ = fresh.apply(change);
            }
            limits.replace_with(fresh);
            metrics::gauge!(crate::metrics::LIMITS).set(limits.len() as f64);
            tracing::info!(
                keys = limits.len(),
                "limits managed by API loaded from the store"
            );
            Some(head)
        }
        Err(e) => {
            tracing::warn!(error = %e, "limits managed by API could not be loaded from the store; trying again");
            None
        }
    }
}

/// Applies the changes made after `after`; the id it is up to then, or
/// `None` when changes were missed (the records are loaded again).
async fn catch_up(store: &RedisStore, limits: &Limits, mut after: String) -> Option<String> {
    loop {
        match store.limits_changes(&after, BATCH).await {
            Ok((_, false)) => return None,
            Ok((changes, true)) => {
                let done = changes.len() < BATCH;
                for change in changes {
                    if let Some(read) = Change::from_stored(&change.field, &change.value) {
                        let _ = limits.apply(&read);
                    }
                    after = change.id;
                }
                if done {
                    metrics::gauge!(crate::metrics::LIMITS).set(limits.len() as f64);
                    return Some(after);
                }
            }
            // Kept where it was: read again at the next poll.
            Err(_) => return Some(after),
        }
    }
}
