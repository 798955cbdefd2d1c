//! What a response holds while it lives: its concurrency policies' leases.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
#[cfg(feature = "redis")]
use weir_core::{Policy, algo::LeaseId};
use weir_limiter::{Clock, LeaseGuard};

/// Leases held until dropped (in process: their guards; on Redis, a
/// release sent when dropped).
pub(crate) struct Held(#[allow(dead_code)] Box<dyn Any + Send + Sync>);

impl Held {
    pub(crate) fn memory<C: Clock + Send + Sync + 'static>(
        guards: Vec<LeaseGuard<C>>,
    ) -> Option<Self> {
        (!guards.is_empty()).then(|| Self(Box::new(guards)))
    }

    #[cfg(feature = "redis")]
    pub(crate) fn redis(
        store: &weir_redis::RedisStore,
        key: &str,
        leases: Vec<(String, Policy, LeaseId)>,
    ) -> Option<Self> {
        (!leases.is_empty()).then(|| {
            Self(Box::new(OnRedis {
                store: store.clone(),
                key: key.to_owned(),
                leases,
            }))
        })
    }
}

/// Leases taken on Redis: released when dropped (or, if no runtime is
/// left to send the release, when they expire).
#[cfg(feature = "redis")]
struct OnRedis {
    store: weir_redis::RedisStore,
    key: String,
    leases: Vec<(String, Policy, LeaseId)>,
}

#[cfg(feature = "redis")]
impl Drop for OnRedis {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key) = (self.store.clone(), std::mem::take(&mut self.key));
        let leases = std::mem::take(&mut self.leases);
        runtime.spawn(async move {
            for (name, policy, lease) in leases {
                let op = weir_redis::LeaseOp::Release(lease);
                let _ = store.on_lease(&name, &policy, &key, op, None).await;
            }
        });
    }
}

pin_project_lite::pin_project! {
    /// A response body holding its request's leases (a concurrency
    /// policy's) until it ends or is dropped; any other body as it is.
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        held: Option<Held>,
    }
}

impl<B> LeaseBody<B> {
    pub(crate) fn new(inner: B, held: Option<Held>) -> Self {
        Self { inner, held }
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
        Self::new(B::from(text), None)
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
