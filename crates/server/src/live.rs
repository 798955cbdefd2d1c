//! What the dashboard reads while weir runs: per policy, decisions counted
//! since the configuration was loaded and the identities refused most over
//! the last minute; the store's check latencies.
//!
//! The heavy hitters are a space-saving sketch (Metwally, Agrawal and El
//! Abbadi, 2005) per ten-second slice, [`SLICES`] slices kept: fixed memory
//! whatever the number of identities. Over the last minute, with `N`
//! refusals in it, every identity refused more than `N / CAPACITY` times is
//! listed, and a listed count is within `N / CAPACITY` of the truth (each
//! entry carries its own bound as `error`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How a policy's part in a decision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Rejected,
    /// Would have allowed, but another policy of the same request refused.
    Uncharged,
    Error,
    /// A shadow policy would have refused (and admitted instead).
    ShadowLimited,
    /// An unlimited override admitted it without counting.
    Unlimited,
}

/// Counters per slice of the sketch.
pub(crate) const CAPACITY: usize = 64;
/// The slices kept: together, the last minute.
pub(crate) const SLICES: u64 = 6;
/// One slice.
pub(crate) const SLICE: Duration = Duration::from_secs(10);

/// Counters that threads add to without sharing a cache line: one padded
/// row per stripe (a thread keeps the stripe it was given), summed on read.
#[derive(Debug)]
struct Striped<const N: usize>(Box<[CachePadded<[AtomicU64; N]>]>);

/// Stripes per counter: more than the workers of most machines.
const STRIPES: usize = 16;

impl<const N: usize> Default for Striped<N> {
    fn default() -> Self {
        Self(
            (0..STRIPES)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        )
    }
}

/// This thread's stripe: threads take stripes in turn.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl<const N: usize> Striped<N> {
    fn add(&self, i: usize) {
        self.0[stripe()][i].fetch_add(1, Ordering::Relaxed);
    }

    fn sum(&self, i: usize) -> u64 {
        self.0
            .iter()
            .map(|row| row[i].load(Ordering::Relaxed))
            .sum()
    }
}

/// The counts of a policy's decisions, by [`Counted`].
const COUNTED: usize = 4;

/// What [`Live`] counts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counted {
    Allowed,
    Limited,
    Degraded,
    ShadowLimited,
}

/// One policy's live counts and heavy hitters.
#[derive(Debug)]
pub(crate) struct Live {
    counts: Striped<COUNTED>,
    /// Per stripe, a sketch per slice: a refusal locks its own thread's
    /// (no lock is shared on the refusal path); a reading merges them all.
    top: Box<[CachePadded<Mutex<Slices>>]>,
    /// Keys banned here, and when each ban ends (Unix ms): at most
    /// [`MAX_BANS`], the ended ones dropped first.
    bans: Mutex<HashMap<Box<str>, u128>>,
}

/// The most bans a policy's dashboard marks at once.
const MAX_BANS: usize = 4 * CAPACITY;

/// A sketch per ten-second slice, the last [`SLICES`] of them.
type Slices = Vec<(u64, Sketch)>;

impl Default for Live {
    fn default() -> Self {
        Self {
            counts: Striped::default(),
            top: (0..STRIPES).map(|_| CachePadded::default()).collect(),
            bans: Mutex::default(),
        }
    }
}

/// A space-saving sketch: `CAPACITY` counters, each an identity, its count
/// and how much of that count it may have inherited.
#[derive(Debug, Default)]
struct Sketch {
    /// Hashed with foldhash, not SipHash: a refusal adds to it, and a map
    /// of at most `CAPACITY` entries has no long chains to fear.
    counts: HashMap<Box<str>, (u64, u64), foldhash::fast::RandomState>,
}

impl Sketch {
    fn add(&mut self, key: &str) {
        if let Some((count, _)) = self.counts.get_mut(key) {
            *count += 1;
            return;
        }
        if self.counts.len() < CAPACITY {
            self.counts.insert(key.into(), (1, 0));
            return;
        }
        // The least counted gives its counter to the newcomer.
        let evicted = self
            .counts
            .iter()
            .min_by_key(|(_, (count, _))| *count)
            .map(|(k, &(count, _))| (k.clone(), count));
        if let Some((evicted, min)) = evicted {
            self.counts.remove(&evicted);
            self.counts.insert(key.into(), (min + 1, min));
        }
    }
}

/// The current slice's number.
fn slice_now() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    since.as_secs() / SLICE.as_secs()
}

/// One identity among the most refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Hitter {
    pub(crate) key: String,
    /// Refusals counted (at most `error` more than the truth).
    pub(crate) refused: u64,
    pub(crate) error: u64,
    /// When its ban ends (Unix ms), if a ban begun here is in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) banned_until_ms: Option<u128>,
}

impl Live {
    /// One decision for `key`.
    pub(crate) fn count(&self, outcome: Outcome, degraded: bool, key: &str) {
        let counted = match outcome {
            Outcome::Allowed => Counted::Allowed,
            Outcome::Rejected => {
                self.record(key, slice_now());
                Counted::Limited
            }
            Outcome::ShadowLimited => Counted::ShadowLimited,
            Outcome::Uncharged | Outcome::Error | Outcome::Unlimited => {
                return;
            }
        };
        self.counts.add(counted as usize);
        if degraded {
            self.counts.add(Counted::Degraded as usize);
        }
    }

    /// Decisions counted as `counted` since the configuration loaded.
    pub(crate) fn total(&self, counted: Counted) -> u64 {
        self.counts.sum(counted as usize)
    }

    /// Every count: allowed, limited, degraded, shadow-limited.
    pub(crate) fn totals(&self) -> [u64; 4] {
        [
            Counted::Allowed,
            Counted::Limited,
            Counted::Degraded,
            Counted::ShadowLimited,
        ]
        .map(|c| self.total(c))
    }

    /// A ban of `key` begun here, for `wait` ns.
    pub(crate) fn banned(&self, key: &str, wait: weir_core::Nanos) {
        let until = now_ms() + u128::from(wait.div_ceil(1_000_000));
        let mut bans = self.bans.lock().unwrap_or_else(PoisonError::into_inner);
        if bans.len() >= MAX_BANS && !bans.contains_key(key) {
            let now = now_ms();
            bans.retain(|_, until| *until > now);
            if bans.len() >= MAX_BANS {
                return;
            }
        }
        bans.insert(key.into(), until);
    }

    fn record(&self, key: &str, slice: u64) {
        let mut slices = self.top[stripe()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let at = match slices.iter().position(|(s, _)| *s == slice) {
            Some(at) => at,
            None => {
                slices.retain(|(s, _)| s + SLICES > slice);
                slices.push((slice, Sketch::default()));
                slices.len() - 1
            }
        };
        slices[at].1.add(key);
    }

    /// The `n` identities refused most over the last minute, most first,
    /// and the refusals counted in all.
    pub(crate) fn top(&self, n: usize) -> (Vec<Hitter>, u64) {
        self.top_at(n, slice_now())
    }

    fn top_at(&self, n: usize, slice: u64) -> (Vec<Hitter>, u64) {
        let stripes: Vec<_> = self
            .top
            .iter()
            .map(|stripe| stripe.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let live: Vec<&Sketch> = stripes
            .iter()
            .flat_map(|slices| slices.iter())
            .filter(|(s, _)| s + SLICES > slice)
            .map(|(_, sketch)| sketch)
            .collect();
        // A key missing from a full slice may have had up to its least
        // count there; the counts of a slice add up to its refusals.
        let floors: Vec<u64> = live
            .iter()
            .map(|sketch| match sketch.counts.len() {
                CAPACITY => sketch.counts.values().map(|c| c.0).min().unwrap_or(0),
                _ => 0,
            })
            .collect();
        let total = live
            .iter()
            .flat_map(|s| s.counts.values())
            .map(|c| c.0)
            .sum();
        let mut merged: HashMap<&str, (u64, u64)> = HashMap::new();
        for sketch in &live {
            for key in sketch.counts.keys() {
                merged.entry(key).or_default();
            }
        }
        for (key, (refused, error)) in &mut merged {
            for (sketch, floor) in live.iter().zip(&floors) {
                match sketch.counts.get(*key) {
                    Some(&(count, inherited)) => {
                        *refused += count;
                        *error += inherited;
                    }
                    None => *error += floor,
                }
            }
        }
        let mut top: Vec<Hitter> = merged
            .into_iter()
            .map(|(key, (refused, error))| Hitter {
                key: key.to_owned(),
                refused,
                error,
                banned_until_ms: None,
            })
            .collect();
        top.sort_by(|a, b| b.refused.cmp(&a.refused).then_with(|| a.key.cmp(&b.key)));
        top.truncate(n);
        let bans = self.bans.lock().unwrap_or_else(PoisonError::into_inner);
        let now = now_ms();
        for hitter in &mut top {
            hitter.banned_until_ms = bans.get(hitter.key.as_str()).copied().filter(|&u| u > now);
        }
        (top, total)
    }
}

/// Check latencies since start, in buckets four to an octave of
/// microseconds: the dashboard takes percentiles of the difference between
/// two readings.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    buckets: Striped<BUCKETS>,
}

const BUCKETS: usize = 128;

/// The bucket of `us` microseconds: `4 log2(us)`, plus the next two bits.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = 63 - u64::from(us.leading_zeros());
    let sub = (us >> (e - 2)) & 3;
    ((4 * e + sub) as usize - 4).min(BUCKETS - 1)
}

/// The largest value of bucket `i`, in microseconds.
fn upper(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let (e, sub) = ((i + 4) / 4, ((i + 4) % 4) as u64);
    ((4 + sub + 1) << (e - 2)) - 1
}

impl Latency {
    pub(crate) fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.buckets.add(bucket(us));
    }

    /// `[largest µs of the bucket, count]` for every bucket used.
    pub(crate) fn read(&self) -> Vec<[u64; 2]> {
        (0..BUCKETS)
            .filter_map(|i| {
                let n = self.buckets.sum(i);
                (n > 0).then(|| [upper(i), n])
            })
            .collect()
    }
}

/// Seconds of counts kept for the dashboard (its charts' width).
pub(crate) const HISTORY: usize = 180;

/// The dashboard's counts at one second: per policy, decisions since the
/// configuration loaded, and check latencies, as `/v1/stats` has them.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Sample {
    time_ms: u128,
    latency_us: Vec<[u64; 2]>,
    policies: Vec<PolicyCounts>,
}

/// One policy's counts, as `/v1/stats` shows them now and in its history.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PolicyCounts {
    /// In the history, shared by every sample of one configuration.
    name: std::sync::Arc<str>,
    allowed: u64,
    limited: u64,
    degraded: u64,
    shadow_limited: u64,
}

impl PolicyCounts {
    /// `name`'s [`Live::totals`].
    pub(crate) fn new(name: std::sync::Arc<str>, totals: [u64; 4]) -> Self {
        let [allowed, limited, degraded, shadow_limited] = totals;
        Self {
            name,
            allowed,
            limited,
            degraded,
            shadow_limited,
        }
    }
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// The last [`HISTORY`] samples, recorded once a second by the server's
/// housekeeping: a dashboard opened now draws the minutes before it.
/// Bounded: `HISTORY` samples of four counts per policy.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<std::collections::VecDeque<Sample>>,
}

impl History {
    /// Records each policy's [`Live::totals`] now, and the latencies.
    pub(crate) fn record<'a>(
        &self,
        policies: impl Iterator<Item = (&'a str, [u64; 4])>,
        latency_us: Vec<[u64; 2]>,
    ) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let last = samples.back().map(|s| &s.policies);
        let policies = policies
            .enumerate()
            .map(|(i, (name, totals))| {
                let name = match last.and_then(|l| l.get(i)).filter(|p| *p.name == *name) {
                    Some(p) => p.name.clone(),
                    None => std::sync::Arc::from(name),
                };
                PolicyCounts::new(name, totals)
            })
            .collect();
        if samples.len() >= HISTORY {
            samples.pop_front();
        }
        samples.push_back(Sample {
            time_ms: now_ms(),
            latency_us,
            policies,
        });
    }

    /// The samples, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboard's history keeps [`HISTORY`] seconds, the oldest
    /// dropped, and one name per configuration shared by its samples.
    #[test]
    fn the_history_is_bounded_and_shares_names() {
        let history = History::default();
        for second in 0..HISTORY as u64 + 20 {
            let policies = [("api", [second, 0, 0, 0]), ("search", [0, second, 0, 0])];
            history.record(policies.into_iter(), vec![[10, second]]);
        }
        let samples = history.samples();
        assert_eq!(samples.len(), HISTORY);
        assert_eq!(samples[0].policies[0].allowed, 20, "the oldest 20 dropped");
        let (first, last) = (&samples[0].policies[1], &samples[HISTORY - 1].policies[1]);
        assert!(std::sync::Arc::ptr_eq(&first.name, &last.name));
    }

    #[test]
    fn striped_counts_add_up_across_threads() {
        let live = std::sync::Arc::new(Live::default());
        let threads: Vec<_> = (0..20)
            .map(|_| {
                let live = live.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        live.count(Outcome::Allowed, true, "k");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(live.total(Counted::Allowed), 20_000);
        assert_eq!(live.total(Counted::Degraded), 20_000);
        assert_eq!(live.total(Counted::Limited), 0);
    }

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for us in 0..100_000u64 {
            let b = bucket(us);
            assert!(b >= last && us <= upper(b), "{us}: bucket {b}");
            assert!(b == 0 || us > upper(b - 1), "{us}: bucket {b}");
            last = b;
        }
    }

    #[test]
    fn the_heavy_hitters_are_found_within_their_bound() {
        let live = Live::default();
        // 1,000 identities refused once, and three refused often, over
        // two slices of the last minute.
        for slice in [100, 101] {
            for i in 0..500 {
                live.record(&format!("scanner-{slice}-{i}"), slice);
                if i % 5 == 0 {
                    live.record("hot", slice);
                }
                if i % 10 == 0 {
                    live.record("warm", slice);
                }
                if i % 25 == 0 {
                    live.record("mild", slice);
                }
            }
        }
        let (top, total) = live.top_at(3, 101);
        assert_eq!(total, 1000 + 200 + 100 + 40);
        let names: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(names, ["hot", "warm", "mild"]);
        let truth = [200, 100, 40];
        for (hitter, truth) in top.iter().zip(truth) {
            assert!(hitter.refused.abs_diff(truth) <= hitter.error, "{hitter:?}");
            assert!(hitter.error <= total / CAPACITY as u64, "{hitter:?}");
        }
        // A minute later they are gone.
        assert!(live.top_at(3, 101 + SLICES).0.is_empty());
    }
}
