//! Polite retries: when to try a request again after a `429` or `503`.
//!
//! Pure decision logic: the caller passes the response's status and headers,
//! how many attempts were made, how long it has been trying, the wall-clock
//! time (for an HTTP-date `Retry-After`) and a random source, so that tests
//! run on a fake clock with a seeded generator.
//!
//! - The server's stated wait comes first: `Retry-After` (delta-seconds or an
//!   HTTP-date) and the IETF `RateLimit` field's `t` for an item with `r=0`;
//!   the next attempt is never earlier than the longest of them, plus a jitter
//!   of up to half of it (capped at `base`) so that clients told the same
//!   time do not return together.
//! - Otherwise, exponential backoff with full jitter: a uniform wait in
//!   `[0, min(cap, base · 2^(attempt-1))]`.
//! - Never more than `max_attempts` attempts, and never a wait that would end
//!   past the overall `deadline`.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

/// How persistent to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 5).
    pub max_attempts: u32,
    /// The first backoff bound (default 500 ms).
    pub base: Duration,
    /// The largest backoff bound (default 30 s).
    pub cap: Duration,
    /// The whole budget, from the first attempt (default: none).
    pub deadline: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
            deadline: None,
        }
    }
}

/// What to do after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The response is final (not a 429 or 503).
    Done,
    /// Try again after this long.
    Retry(Duration),
    /// Stop: attempts used up, or the wait would pass the deadline.
    GiveUp(GiveUp),
}

/// Why retrying stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// `max_attempts` attempts were made.
    Attempts,
    /// The next attempt (after `wait`) would be past the deadline.
    Deadline {
        /// The wait that did not fit.
        wait: Duration,
    },
}

/// Whether the status asks the caller to come back later.
pub fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
}

/// Decides what follows a response with `status` and `headers`, after
/// `attempts` attempts (≥ 1) and `elapsed` since the first.
pub fn next_attempt(
    policy: &RetryPolicy,
    attempts: u32,
    status: StatusCode,
    headers: &HeaderMap,
    elapsed: Duration,
    now: SystemTime,
    rng: &mut fastrand::Rng,
) -> Next {
    if !is_retryable(status) {
        return Next::Done;
    }
    backoff(policy, attempts, elapsed, server_wait(headers, now), rng)
}

/// What to do after an attempt that got no response at all (the connection
/// failed, or no answer came in time): the same backoff as a `503` that
/// states no wait.
pub fn after_failure(
    policy: &RetryPolicy,
    attempts: u32,
    elapsed: Duration,
    rng: &mut fastrand::Rng,
) -> Next {
    backoff(policy, attempts, elapsed, None, rng)
}

fn backoff(
    policy: &RetryPolicy,
    attempts: u32,
    elapsed: Duration,
    stated: Option<Duration>,
    rng: &mut fastrand::Rng,
) -> Next {
    if attempts >= policy.max_attempts {
        return Next::GiveUp(GiveUp::Attempts);
    }
    let wait = match stated {
        Some(stated) => stated + jitter(rng, (stated / 2).min(policy.base)),
        None => {
            let doublings = attempts.saturating_sub(1).min(32);
            let bound = policy.base.saturating_mul(1 << doublings).min(policy.cap);
            jitter(rng, bound)
        }
    };
    match policy.deadline {
        Some(deadline) if elapsed + wait > deadline => Next::GiveUp(GiveUp::Deadline { wait }),
        _ => Next::Retry(wait),
    }
}

/// A uniform duration in `[0, bound]`, to the nanosecond.
fn jitter(rng: &mut fastrand::Rng, bound: Duration) -> Duration {
    let bound = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=bound))
}

/// The longest wait the server stated, if any.
pub fn server_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let retry_after = headers
        .get_all(http::header::RETRY_AFTER)
        .iter()
        .filter_map(|v| {
            let text = v.to_str().ok()?.trim();
            if let Ok(seconds) = text.parse::<u64>() {
                return Some(Duration::from_secs(seconds));
            }
            let date = httpdate::parse_http_date(text).ok()?;
            Some(date.duration_since(now).unwrap_or(Duration::ZERO))
        });
    let rate_limit = headers
        .get_all("ratelimit")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|item| {
            let param = |name: &str| {
                item.split(';').skip(1).find_map(|p| {
                    let (key, value) = p.trim().split_once('=')?;
                    (key == name)
                        .then(|| value.trim().parse::<u64>().ok())
                        .flatten()
                })
            };
            (param("r") == Some(0))
                .then(|| param("t").map(Duration::from_secs))
                .flatten()
        });
    retry_after.chain(rate_limit).max()
}

/// A quota a server announced in `RateLimit-Policy`: `q` units per `w` seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The policy's name.
    pub name: String,
    /// Units per window.
    pub quota: u64,
    /// The window.
    pub window: Duration,
}

/// The quotas of every `RateLimit-Policy` item, to pace by before being told.
pub fn quotas(headers: &HeaderMap) -> Vec<Quota> {
    headers
        .get_all("ratelimit-policy")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|item| {
            let mut parts = item.split(';');
            let name = parts.next()?.trim().trim_matches('"').to_owned();
            let (mut quota, mut window) = (None, None);
            for p in parts {
                match p.trim().split_once('=') {
                    Some(("q", v)) => quota = v.trim().parse().ok(),
                    Some(("w", v)) => window = v.trim().parse().ok().map(Duration::from_secs),
                    _ => {}
                }
            }
            Some(Quota {
                name,
                quota: quota?,
                window: window?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    const T0: Duration = Duration::from_secs(1_780_000_000);

    fn decide(attempts: u32, status: u16, h: &HeaderMap, elapsed: Duration, seed: u64) -> Next {
        let policy = RetryPolicy {
            deadline: Some(Duration::from_secs(60)),
            ..RetryPolicy::default()
        };
        let status = StatusCode::from_u16(status).unwrap();
        next_attempt(
            &policy,
            attempts,
            status,
            h,
            elapsed,
            SystemTime::UNIX_EPOCH + T0,
            &mut fastrand::Rng::with_seed(seed),
        )
    }

    #[test]
    fn final_responses_are_done() {
        for status in [200, 404, 500, 502] {
            assert_eq!(
                decide(1, status, &HeaderMap::new(), Duration::ZERO, 1),
                Next::Done
            );
        }
    }

    #[test]
    fn never_before_the_server_says() {
        let date = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(7));
        for (h, stated) in [
            (headers(&[("retry-after", "3")]), 3),
            (headers(&[("retry-after", &date)]), 7),
            (headers(&[("ratelimit", "\"api\";r=0;t=4")]), 4),
            (
                headers(&[
                    ("ratelimit", "\"a\";r=5;t=9, \"b\";r=0;t=2"),
                    ("retry-after", "1"),
                ]),
                2,
            ),
        ] {
            for seed in 0..200 {
                let Next::Retry(wait) = decide(1, 429, &h, Duration::ZERO, seed) else {
                    panic!()
                };
                let stated = Duration::from_secs(stated);
                assert!(
                    wait >= stated && wait <= stated + Duration::from_millis(500),
                    "{wait:?}"
                );
            }
        }
        // A date in the past means now.
        let past = headers(&[(
            "retry-after",
            &httpdate::fmt_http_date(SystemTime::UNIX_EPOCH),
        )]);
        assert_eq!(
            server_wait(&past, SystemTime::UNIX_EPOCH + T0),
            Some(Duration::ZERO)
        );
        assert_eq!(
            server_wait(&headers(&[("retry-after", "soon")]), SystemTime::UNIX_EPOCH),
            None
        );
    }

    #[test]
    fn backoff_is_full_jitter_under_a_growing_cap() {
        for attempts in 1..=4u32 {
            let bound = Duration::from_millis(500) * (1 << (attempts - 1));
            let waits: Vec<Duration> = (0..500)
                .map(
                    |seed| match decide(attempts, 503, &HeaderMap::new(), Duration::ZERO, seed) {
                        Next::Retry(wait) => wait,
                        other => panic!("{other:?}"),
                    },
                )
                .collect();
            assert!(waits.iter().all(|w| *w <= bound));
            assert!(
                waits.iter().any(|w| *w < bound / 4) && waits.iter().any(|w| *w > bound * 3 / 4),
                "spread"
            );
        }
        // Same seed, same wait: reproducible.
        assert_eq!(
            decide(2, 503, &HeaderMap::new(), Duration::ZERO, 9),
            decide(2, 503, &HeaderMap::new(), Duration::ZERO, 9)
        );
    }

    #[test]
    fn attempts_and_deadline_bound_the_retries() {
        assert_eq!(
            decide(5, 429, &HeaderMap::new(), Duration::ZERO, 1),
            Next::GiveUp(GiveUp::Attempts)
        );
        let h = headers(&[("retry-after", "30")]);
        assert!(matches!(
            decide(1, 429, &h, Duration::from_secs(40), 1),
            Next::GiveUp(GiveUp::Deadline { .. })
        ));
    }

    #[test]
    fn reads_quotas() {
        let h = headers(&[("ratelimit-policy", "\"api\";q=10;w=5, \"burst\";q=2;w=1")]);
        let q = quotas(&h);
        assert_eq!(q.len(), 2);
        assert_eq!(
            (q[0].name.as_str(), q[0].quota, q[0].window),
            ("api", 10, Duration::from_secs(5))
        );
    }

    #[test]
    fn a_failed_connection_backs_off_like_an_unexplained_503() {
        let policy = RetryPolicy::default();
        for attempts in 1..5 {
            for seed in 0..50 {
                let failed = after_failure(
                    &policy,
                    attempts,
                    Duration::ZERO,
                    &mut fastrand::Rng::with_seed(seed),
                );
                let unavailable = next_attempt(
                    &policy,
                    attempts,
                    StatusCode::SERVICE_UNAVAILABLE,
                    &HeaderMap::new(),
                    Duration::ZERO,
                    SystemTime::UNIX_EPOCH + T0,
                    &mut fastrand::Rng::with_seed(seed),
                );
                assert_eq!(failed, unavailable);
            }
        }
        let last = after_failure(&policy, 5, Duration::ZERO, &mut fastrand::Rng::new());
        assert_eq!(last, Next::GiveUp(GiveUp::Attempts));
    }
}
