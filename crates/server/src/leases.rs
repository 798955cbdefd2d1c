//! The leases the gateway holds for a request it forwards: from admission
//! until the answer's body has ended, the client has gone away or the
//! upstream has failed — whichever comes first — renewed at half the lease
//! while a long answer is still streaming.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};
use weir_core::Policy;
use weir_core::algo::LeaseId;
use weir_redis::LeaseOp;

use crate::backend::{Check, Few, Verdict};
use crate::config::TableId;
use crate::state::Shared;

/// Leases taken by one admission, released when dropped.
pub(crate) struct Held {
    shared: Arc<Shared>,
    key: String,
    leases: Few<(TableId, LeaseId)>,
    /// Taken by the in-process fallback (the shared store was down).
    local: bool,
    renewing: tokio::task::JoinHandle<()>,
}

impl Held {
    /// The leases `verdict` took for the checks of `ids` on `key`, held and
    /// renewed until dropped (booked by the pipeline, released here); `None`
    /// when it took none.
    pub(crate) fn take(
        shared: &Arc<Shared>,
        key: &str,
        ids: &[TableId],
        verdict: &Verdict,
    ) -> Option<Self> {
        let leases: Few<(TableId, LeaseId)> = ids
            .iter()
            .zip(verdict.decisions())
            .filter_map(|(&id, d)| Some((id, d.lease?)))
            .collect();
        // Renewed at half the shortest lease: a renewal late by less than
        // that still finds its lease live.
        let every = leases
            .iter()
            .filter_map(|&(id, _)| match shared.table.get(id).policy {
                Policy::Concurrency(c) => Some(c.lease() / 2),
                _ => None,
            })
            .min()?
            .max(1_000_000);
        let local = verdict.degraded;
        let renewing = tokio::spawn(renew(
            shared.clone(),
            key.to_owned(),
            leases.clone(),
            local,
            Duration::from_nanos(every),
        ));
        Some(Self {
            shared: shared.clone(),
            key: key.to_owned(),
            leases,
            local,
            renewing,
        })
    }
}

/// Renews `leases` every `every` until aborted.
async fn renew(
    shared: Arc<Shared>,
    key: String,
    leases: Few<(TableId, LeaseId)>,
    local: bool,
    every: Duration,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tick.tick().await;
        for &(policy, lease) in &leases {
            let check = lease_check(policy, &key);
            let renewed = (shared.backend)
                .on_lease(&shared.table, &check, LeaseOp::Renew(lease), local)
                .await;
            let entry = shared.table.get(policy);
            match renewed {
                Ok(d) if d.allowed => entry.lease_taken(lease),
                Ok(_) => {
                    tracing::warn!(policy = %entry.name, "a lease held for a streaming answer expired before its renewal");
                }
                Err(_) => {
                    tracing::warn!(policy = %entry.name, "a lease could not be renewed: the store did not answer");
                }
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewing.abort();
        let (shared, key) = (self.shared.clone(), std::mem::take(&mut self.key));
        let (leases, local) = (std::mem::take(&mut self.leases), self.local);
        // In process: released before the next request can be decided.
        if local || shared.backend.remote().is_none() {
            for &(policy, lease) in &leases {
                let check = lease_check(policy, &key);
                let released =
                    shared
                        .backend
                        .on_local_lease(&shared.table, &check, LeaseOp::Release(lease));
                count_release(&shared, policy, lease, released.ok());
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the runtime is going: the leases expire by themselves
        };
        runtime.spawn(async move {
            for (policy, lease) in leases {
                let check = lease_check(policy, &key);
                let released = (shared.backend)
                    .on_lease(&shared.table, &check, LeaseOp::Release(lease), false)
                    .await;
                count_release(&shared, policy, lease, released.ok());
            }
        });
    }
}

/// A release's or a renewal's check: the lease's policy and key.
fn lease_check(policy: TableId, key: &str) -> Check<'_> {
    Check {
        policy,
        key,
        cost: 0,
    }
}

/// Counts a release the store answered (`None`: it did not).
fn count_release(
    shared: &Shared,
    policy: TableId,
    lease: LeaseId,
    released: Option<weir_core::Decision>,
) {
    let entry = shared.table.get(policy);
    match released {
        Some(d) => entry.lease_released(lease, d.allowed),
        None => {
            tracing::warn!(policy = %entry.name, "a lease could not be released: the store did not answer; it expires by itself")
        }
    }
}

/// An answer's body that holds its request's leases until it ends (or is
/// dropped: the client went away).
pub(crate) struct Leased {
    body: Body,
    held: Option<Held>,
}

impl Leased {
    pub(crate) fn new(body: Body, held: Held) -> Self {
        Self {
            body,
            held: Some(held),
        }
    }
}

impl hyper::body::Body for Leased {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = polled {
            // Ended (or failed): the work is done.
            self.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
