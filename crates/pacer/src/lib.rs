//! weir for callers: the other side of a rate limit.
//!
//! - [`Pacer`]: waits until a request may go to its destination, on docs/SPEC.md's
//!   leaky-bucket shaper per destination and, at the same time, across all
//!   destinations (a slot on every policy or on none).
//! - [`retry`]: when to try again after a `429` or `503` — never before the
//!   server's stated time, otherwise exponential backoff with full jitter.
//! - [`send_with_retry`]: both decisions around any tower `Service` that
//!   speaks `http` (hyper's client, a tower stack, an axum router in tests).
//!
//! ```
//! use weir_core::Policy;
//! use weir_pacer::Pacer;
//!
//! # tokio_test(async {
//! let pacer = Pacer::builder()
//!     .per_destination(Policy::parse("leaky-bucket rate=2/s queue=100")?)?
//!     .global(Policy::parse("leaky-bucket rate=50/s queue=1000")?)?
//!     .build();
//! let slot = pacer.acquire("example.org", 1, None).await?;
//! assert_eq!(slot.wait, std::time::Duration::ZERO);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! # fn tokio_test<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
//! # }
//! ```

mod pacer;
pub mod retry;

use std::time::{Duration, SystemTime};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

pub use pacer::{PaceError, Pacer, PacerBuilder, Slot};
pub use retry::{GiveUp, Next, RetryPolicy};

/// The outcome of [`send_with_retry`].
#[derive(Debug)]
pub struct Sent<T> {
    /// The last response (a 429 or 503 when retrying stopped early).
    pub response: T,
    /// Attempts made.
    pub attempts: u32,
    /// Set when retrying stopped before a final response.
    pub gave_up: Option<GiveUp>,
}

/// Why [`send_with_retry`] has no response at all.
#[derive(Debug, thiserror::Error)]
pub enum SendError<E> {
    /// The service failed (connection refused, reset, …): not a server asking
    /// to wait, so not retried.
    #[error("the request failed: {0}")]
    Transport(E),
    /// The first attempt could not be paced (queue full, or past the deadline).
    #[error(transparent)]
    Paced(PaceError),
}

/// Sends the request `make` builds, again as [`retry`] decides, each attempt
/// paced by `pacer` for `destination` when one is given. Nothing is sent once
/// the policy's deadline has passed or would pass before the attempt.
pub async fn send_with_retry<S, B, ResB>(
    service: &mut S,
    mut make: impl FnMut() -> Request<B>,
    policy: &RetryPolicy,
    pacing: Option<(&Pacer, &str)>,
    rng: &mut fastrand::Rng,
) -> Result<Sent<Response<ResB>>, SendError<S::Error>>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    let started = Instant::now();
    let deadline = policy.deadline.map(|d| started + d);
    let mut last: Option<Response<ResB>> = None;
    let mut attempts = 0;
    loop {
        if let Some((pacer, destination)) = pacing {
            if let Err(e) = pacer.acquire(destination, 1, deadline).await {
                return match last {
                    None => Err(SendError::Paced(e)),
                    Some(response) => {
                        let wait = match e {
                            PaceError::Deadline { wait } => wait,
                            _ => Duration::ZERO,
                        };
                        Ok(Sent {
                            response,
                            attempts,
                            gave_up: Some(GiveUp::Deadline { wait }),
                        })
                    }
                };
            }
        }
        attempts += 1;
        let response = service_call(service, make())
            .await
            .map_err(SendError::Transport)?;
        let elapsed = started.elapsed();
        let now = SystemTime::now();
        match retry::next_attempt(
            policy,
            attempts,
            response.status(),
            response.headers(),
            elapsed,
            now,
            rng,
        ) {
            Next::Done => {
                return Ok(Sent {
                    response,
                    attempts,
                    gave_up: None,
                });
            }
            Next::GiveUp(why) => {
                return Ok(Sent {
                    response,
                    attempts,
                    gave_up: Some(why),
                });
            }
            Next::Retry(wait) => {
                last = Some(response);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn service_call<S: Service<R>, R>(
    service: &mut S,
    request: R,
) -> Result<S::Response, S::Error> {
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(request).await
}
