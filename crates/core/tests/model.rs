//! A naive, exact model of docs/SPEC.md, written independently of the crate:
//! rational numbers (`Ratio<i128>`) exactly as the formulas read, the rate as
//! written (not reduced), and the sliding counter's `retry_after` found by
//! search instead of by formula.

use std::collections::HashMap;

use num_rational::Ratio;

pub(crate) type Q = Ratio<i128>;

fn int(v: i128) -> Q {
    Q::from_integer(v)
}

fn ceil(q: Q) -> i128 {
    q.ceil().to_integer()
}

fn floor(q: Q) -> i128 {
    q.floor().to_integer()
}

/// Parameters of a policy, as plain numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spec {
    TokenBucket { capacity: i128, n: i128, p: i128 },
    FixedWindow { limit: i128, window: i128 },
    SlidingLog { limit: i128, window: i128 },
    SlidingCounter { limit: i128, window: i128 },
    LeakyBucket { n: i128, p: i128, queue: i128 },
}

/// The model's decision, in the crate's field order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub allowed: bool,
    pub remaining: i128,
    pub retry_after: i128,
    pub reset: i128,
    pub delay: i128,
}

#[derive(Debug, Clone)]
enum KeyState {
    Bucket { tokens: Q, updated_at: i128 },
    Window { index: i128, count: i128 },
    Log(Vec<(i128, i128)>),
    Counter { index: i128, cur: i128, prev: i128 },
    Shaper { next: Option<Q> },
}

#[derive(Debug, Clone)]
pub(crate) struct Model {
    spec: Spec,
    keys: HashMap<String, (i128, KeyState)>,
}

impl Model {
    pub(crate) fn new(spec: Spec) -> Self {
        Self {
            spec,
            keys: HashMap::new(),
        }
    }

    fn fresh(&self, t: i128) -> KeyState {
        match self.spec {
            Spec::TokenBucket { capacity, .. } => KeyState::Bucket {
                tokens: int(capacity),
                updated_at: t,
            },
            Spec::FixedWindow { .. } => KeyState::Window {
                index: -1,
                count: 0,
            },
            Spec::SlidingLog { .. } => KeyState::Log(Vec::new()),
            Spec::SlidingCounter { .. } => KeyState::Counter {
                index: -10,
                cur: 0,
                prev: 0,
            },
            Spec::LeakyBucket { .. } => KeyState::Shaper { next: None },
        }
    }

    pub(crate) fn check(&mut self, key: &str, now: i128, cost: i128) -> (i128, Verdict) {
        let (last_seen, mut state) = match self.keys.get(key) {
            Some((seen, s)) => (*seen, s.clone()),
            None => (now, self.fresh(now)),
        };
        let t = now.max(last_seen);
        let verdict = decide(self.spec, &mut state, t, cost);
        self.keys.insert(key.to_owned(), (t, state));
        (t, saturated(verdict))
    }

    /// Usage reported after the fact: charged whatever the standing, then
    /// answered as a check of cost 0 would be, with the wait until a check
    /// of cost 1 would be allowed — found by search.
    pub(crate) fn report(&mut self, key: &str, now: i128, cost: i128) -> (i128, Verdict) {
        let (last_seen, mut state) = match self.keys.get(key) {
            Some((seen, s)) => (*seen, s.clone()),
            None => (now, self.fresh(now)),
        };
        let t = now.max(last_seen);
        charge(self.spec, &mut state, t, cost);
        let standing = decide(self.spec, &mut state.clone(), t, 0);
        let allowed_after = |d: i128| decide(self.spec, &mut state.clone(), t + d, 1).allowed;
        let (mut lo, mut hi) = (0, 1i128 << 64);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if allowed_after(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        self.keys.insert(key.to_owned(), (t, state));
        let verdict = Verdict {
            allowed: true,
            retry_after: lo,
            delay: 0,
            ..standing
        };
        (t, saturated(verdict))
    }
}

/// `floor(q · g)`, without the overflow of multiplying `q`'s numerator
/// (a 2^32-token bucket's tokens over a 366-day period, times another).
fn floor_times(q: Q, g: i128) -> i128 {
    let (a, b) = (*q.numer(), *q.denom());
    a.div_euclid(b) * g + (a.rem_euclid(b) * g).div_euclid(b)
}

impl Model {
    /// The policy's parameters change to `spec` (docs/SPEC.md, "Changed
    /// parameters"), read straight from the spec: a bucket keeps its tokens
    /// rounded down to the new rate's grain (1/p token, the rate reduced to
    /// n/p), between the new capacity and the deepest debt a report leaves;
    /// a shaper its backlog rounded up to the grain (1/n ns), as deep at
    /// most; windows and counters their counts when the window is the same
    /// length; a log its entries; anything else starts over.
    pub(crate) fn change(&mut self, spec: Spec) {
        fn gcd(a: i128, b: i128) -> i128 {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let old = self.spec;
        self.keys = std::mem::take(&mut self.keys)
            .into_iter()
            .filter_map(|(key, (seen, state))| {
                let state = match (old, spec, state) {
                    (
                        Spec::TokenBucket { .. },
                        Spec::TokenBucket { capacity, n, p },
                        KeyState::Bucket { tokens, .. },
                    ) => {
                        let grain = p / gcd(n, p);
                        let tokens = Q::new(floor_times(tokens, grain), grain);
                        let tokens = tokens
                            .min(int(capacity))
                            .max(int(capacity - ceiling(capacity)));
                        KeyState::Bucket {
                            tokens,
                            updated_at: seen,
                        }
                    }
                    (
                        Spec::LeakyBucket { .. },
                        Spec::LeakyBucket { n, p, queue },
                        KeyState::Shaper { next },
                    ) => {
                        let grain = n / gcd(n, p);
                        let next = next.map(|next| {
                            let backlog = (next - int(seen)).max(int(0));
                            let backlog = Q::new(-floor_times(-backlog, grain), grain);
                            int(seen) + backlog.min(int(ceiling(queue)) * Q::new(p, n))
                        });
                        KeyState::Shaper { next }
                    }
                    (
                        Spec::FixedWindow { window: a, .. },
                        Spec::FixedWindow { window: b, .. },
                        s @ KeyState::Window { .. },
                    )
                    | (
                        Spec::SlidingCounter { window: a, .. },
                        Spec::SlidingCounter { window: b, .. },
                        s @ KeyState::Counter { .. },
                    ) if a == b => s,
                    (Spec::SlidingLog { .. }, Spec::SlidingLog { .. }, s @ KeyState::Log(_)) => s,
                    _ => return None,
                };
                Some((key, (seen, state)))
            })
            .collect();
        self.spec = spec;
    }
}

/// A wait beyond `i64::MAX` ns (292 years) is reported as that.
fn saturated(v: Verdict) -> Verdict {
    let wait = |d: i128| d.min(i128::from(i64::MAX));
    Verdict {
        retry_after: wait(v.retry_after),
        reset: wait(v.reset),
        delay: wait(v.delay),
        ..v
    }
}

/// docs/SPEC.md's ceiling: the largest report is 1,000 times the capacity
/// (limit, queue), but at most 2^50, and no sum of reports leaves a key
/// deeper in debt than one.
fn ceiling(size: i128) -> i128 {
    (1_000 * size).min(1 << 50)
}

/// A report's charge: the state an admitted check of `cost` would leave,
/// without the admission condition, within the ceiling on debt.
fn charge(spec: Spec, state: &mut KeyState, t: i128, cost: i128) {
    match (spec, state) {
        (Spec::TokenBucket { capacity, n, p }, KeyState::Bucket { tokens, updated_at }) => {
            let avail = (*tokens + int(t - *updated_at) * Q::new(n, p)).min(int(capacity));
            *tokens = (avail - int(cost)).max(int(capacity - ceiling(capacity)));
            *updated_at = t;
        }
        (Spec::FixedWindow { limit, window }, KeyState::Window { index, count }) => {
            let i = t.div_euclid(window);
            if i != *index {
                *index = i;
                *count = 0;
            }
            *count = (*count + cost).min(ceiling(limit));
        }
        (Spec::SlidingLog { limit, window }, KeyState::Log(log)) => {
            log.retain(|&(a, _)| a > t - window);
            let live: i128 = log.iter().map(|&(_, c)| c).sum();
            let cost = cost.min(ceiling(limit) - live);
            if cost > 0 {
                log.push((t, cost));
            }
        }
        (Spec::SlidingCounter { limit, window }, KeyState::Counter { index, cur, prev }) => {
            let i = t.div_euclid(window);
            if i == *index + 1 {
                *prev = *cur;
                *cur = 0;
            } else if i != *index {
                *prev = 0;
                *cur = 0;
            }
            *index = i;
            *cur = (*cur + cost).min(ceiling(limit));
        }
        (Spec::LeakyBucket { n, p, queue }, KeyState::Shaper { next }) => {
            let start = next.map_or(int(t), |next| next.max(int(t)));
            let slot = Q::new(p, n);
            *next = Some((start + int(cost) * slot).min(int(t) + int(ceiling(queue)) * slot));
        }
        (spec, _) => panic!("state does not match {spec:?}"),
    }
}

fn decide(spec: Spec, state: &mut KeyState, t: i128, cost: i128) -> Verdict {
    match (spec, state) {
        (Spec::TokenBucket { capacity, n, p }, KeyState::Bucket { tokens, updated_at }) => {
            let c = int(capacity);
            let avail = (*tokens + int(t - *updated_at) * Q::new(n, p)).min(c);
            let allowed = avail >= int(cost);
            *tokens = if allowed { avail - int(cost) } else { avail };
            *updated_at = t;
            Verdict {
                allowed,
                remaining: floor(*tokens).max(0),
                retry_after: if allowed {
                    0
                } else {
                    ceil((int(cost) - avail) * Q::new(p, n))
                },
                reset: ceil((c - *tokens) * Q::new(p, n)),
                delay: 0,
            }
        }
        (Spec::FixedWindow { limit, window }, KeyState::Window { index, count }) => {
            let i = t.div_euclid(window);
            if i != *index {
                *index = i;
                *count = 0;
            }
            let allowed = *count + cost <= limit;
            if allowed {
                *count += cost;
            }
            let end = (i + 1) * window - t;
            Verdict {
                allowed,
                remaining: (limit - *count).max(0),
                retry_after: if allowed { 0 } else { end },
                reset: if *count > 0 { end } else { 0 },
                delay: 0,
            }
        }
        (Spec::SlidingLog { limit, window }, KeyState::Log(log)) => {
            log.retain(|&(a, _)| a > t - window);
            let count: i128 = log.iter().map(|(_, c)| c).sum();
            let allowed = count + cost <= limit;
            let mut retry_after = 0;
            if allowed {
                log.push((t, cost));
            } else {
                let mut cumulative = 0;
                for &(a, c) in log.iter() {
                    cumulative += c;
                    if cumulative >= count + cost - limit {
                        retry_after = a + window - t;
                        break;
                    }
                }
            }
            let count: i128 = log.iter().map(|(_, c)| c).sum();
            Verdict {
                allowed,
                remaining: (limit - count).max(0),
                retry_after,
                reset: log.last().map_or(0, |&(a, _)| a + window - t),
                delay: 0,
            }
        }
        (Spec::SlidingCounter { limit, window }, KeyState::Counter { index, cur, prev }) => {
            let i = t.div_euclid(window);
            if i == *index + 1 {
                *prev = *cur;
                *cur = 0;
            } else if i != *index {
                *prev = 0;
                *cur = 0;
            }
            *index = i;
            let estimate = |at: i128, cur: i128, prev: i128| -> Q {
                // The estimate at a later time `at`, with no admissions after t.
                match at.div_euclid(window) - i {
                    0 => int(cur) + int(prev) * Q::new(window - (at - i * window), window),
                    1 => int(cur) * Q::new(window - (at - (i + 1) * window), window),
                    _ => int(0),
                }
            };
            let allowed = estimate(t, *cur, *prev) + int(cost) <= int(limit);
            if allowed {
                *cur += cost;
            }
            let retry_after = if allowed {
                0
            } else {
                // Earliest whole nanosecond at which the request fits.
                let (mut lo, mut hi) = (0, 2 * window);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if estimate(t + mid, *cur, *prev) + int(cost) <= int(limit) {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                lo
            };
            Verdict {
                allowed,
                remaining: floor(int(limit) - estimate(t, *cur, *prev)).max(0),
                retry_after,
                reset: if *cur > 0 {
                    (i + 2) * window - t
                } else if *prev > 0 {
                    (i + 1) * window - t
                } else {
                    0
                },
                delay: 0,
            }
        }
        (Spec::LeakyBucket { n, p, queue }, KeyState::Shaper { next }) => {
            let slot = Q::new(p, n);
            let start = next.map_or(int(t), |next| next.max(int(t)));
            let wait = start - int(t);
            let allowed = wait <= int(queue) * slot;
            if allowed {
                *next = Some(start + int(cost) * slot);
            }
            let ahead = next.map_or(int(0), |next| (next - int(t)).max(int(0)));
            Verdict {
                allowed,
                remaining: floor(int(queue + 1) - ahead / slot).max(0),
                retry_after: if allowed {
                    0
                } else {
                    ceil(wait - int(queue) * slot)
                },
                reset: ceil(ahead),
                delay: if allowed { ceil(wait) } else { 0 },
            }
        }
        (spec, _) => panic!("state does not match {spec:?}"),
    }
}
