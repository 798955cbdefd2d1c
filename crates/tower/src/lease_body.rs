//! What a response holds while it lives: its concurrency policies' leases,
//! released through the store that granted them when it ends — one type
//! for this layer and for `weir serve`.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use weir_core::Policy;
use weir_core::algo::LeaseId;
use weir_core::store::{LeaseOp, Store};

/// The leases one admission took (a concurrency policy's), held until
/// dropped, then released through the store that granted them; renewed
/// meanwhile at half the shortest lease when asked to. An in-process
/// store's release is made before the drop returns (its future is ready at
/// once); another's is sent by a task.
pub struct Held<S: Store + Clone + 'static> {
    store: S,
    key: String,
    /// Each lease's policy (stored name, parameters) and identity.
    leases: Vec<(String, Policy, LeaseId)>,
    renewing: Option<tokio::task::JoinHandle<()>>,
}

impl<S: Store + Clone + 'static> std::fmt::Debug for Held<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("key", &self.key)
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone + 'static> Held<S> {
    /// Holds `leases` of `key` taken on `store`; with `renew`, renews them
    /// until dropped (within a tokio runtime). `None` when there are none.
    pub fn new(
        store: S,
        key: &str,
        leases: Vec<(String, Policy, LeaseId)>,
        renew: bool,
    ) -> Option<Self> {
        if leases.is_empty() {
            return None;
        }
        // Renewed at half the shortest lease: a renewal late by less than
        // that still finds its lease live.
        let every = (leases.iter())
            .filter_map(|(_, p, _)| match p {
                Policy::Concurrency(c) => Some(c.lease() / 2),
                _ => None,
            })
            .min()
            .map(|every| Duration::from_nanos(every.max(1_000_000)));
        let renewing = match (renew, every, tokio::runtime::Handle::try_current()) {
            (true, Some(every), Ok(runtime)) => Some(runtime.spawn(renewed(
                store.clone(),
                key.to_owned(),
                leases.clone(),
                every,
            ))),
            _ => None,
        };
        Some(Self {
            store,
            key: key.to_owned(),
            leases,
            renewing,
        })
    }
}

/// Renews `leases` every `every`, until aborted.
async fn renewed<S: Store>(
    store: S,
    key: String,
    leases: Vec<(String, Policy, LeaseId)>,
    every: Duration,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tick.tick().await;
        // A renewal that fails leaves the lease to expire: the store's own
        // rule, never a reason to end the response.
        each(&store, &key, &leases, LeaseOp::Renew).await;
    }
}

/// `op` on each of `leases` of `key`, through `store`; what it answers is
/// the store's to book.
async fn each<S: Store>(
    store: &S,
    key: &str,
    leases: &[(String, Policy, LeaseId)],
    op: fn(LeaseId) -> LeaseOp,
) {
    for (name, policy, lease) in leases {
        let check = weir_core::Check {
            name,
            policy,
            key,
            cost: 0,
        };
        let _ = store.on_lease(check, op(*lease)).await;
    }
}

impl<S: Store + Clone + 'static> Drop for Held<S> {
    fn drop(&mut self) {
        if let Some(renewing) = self.renewing.take() {
            renewing.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the runtime is going: the leases expire by themselves
        };
        let (store, key) = (self.store.clone(), std::mem::take(&mut self.key));
        let leases = std::mem::take(&mut self.leases);
        let mut release =
            Box::pin(async move { each(&store, &key, &leases, LeaseOp::Release).await });
        // In process, released before the next request can be decided.
        let _entered = runtime.enter();
        let mut cx = Context::from_waker(Waker::noop());
        if release.as_mut().poll(&mut cx).is_pending() {
            runtime.spawn(release);
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body holding its request's leases (a concurrency
    /// policy's) until it ends or is dropped; any other body as it is.
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        held: Option<Box<dyn Any + Send + Sync>>,
    }
}

impl<B> LeaseBody<B> {
    /// `inner`, holding `held` (a [`Held`], or whatever else must live as
    /// long as the body) until it ends or is dropped.
    pub fn holding(inner: B, held: Option<impl Any + Send + Sync>) -> Self {
        Self {
            inner,
            held: held.map(|h| Box::new(h) as Box<dyn Any + Send + Sync>),
        }
    }

    /// The body inside.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// Whether it still holds leases.
    pub fn holds_leases(&self) -> bool {
        self.held.is_some()
    }
}

impl<B: From<String>> From<String> for LeaseBody<B> {
    fn from(text: String) -> Self {
        Self {
            inner: B::from(text),
            held: None,
        }
    }
}

impl<B: Body> Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = polled {
            // Ended, or failed: the work is over.
            *this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("inner", &self.inner)
            .field("holds_leases", &self.held.is_some())
            .finish()
    }
}
