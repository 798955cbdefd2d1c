//! One policy's keys: a sharded map from key to state.
//!
//! A check takes its shard's read lock (shared, so checks of unrelated keys
//! and of one hot key run in parallel) and then either
//!
//! - the **one-word path**: token bucket, GCRA and leaky bucket keep their
//!   state as GCRA's theoretical arrival time `tat = seen·n + level` (in
//!   `1/n` ns) in one `AtomicU64`, updated by compare-and-swap, the clock read
//!   after the state so no committed state is ever newer than `now`. A second
//!   atomic keeps `seen` for times that may go backwards (explicit times, a
//!   fake clock); with a monotonic clock it is not needed and not written.
//!   Used when the rate's reduced numerator `n` is at most 2 (`2/s`, `100/s`,
//!   `120/m` all have `n = 1`), so `tat` fits 64 bits until 2262.
//! - the **locked path**: every other state sits behind its own mutex.
//!
//! Keys up to 24 bytes are stored inline (no pointer to chase on lookup). A
//! new key takes the shard's write lock once. Idle keys (SPEC.md's idle rule:
//! back to fully available) are swept from a shard when it grows past twice
//! its size after the last sweep and past its largest size so far (taking
//! keys idle for a second or more, so a working set that is checked every
//! few hundred milliseconds is not removed and re-inserted over and over),
//! and from every shard, taking every idle key, when the key budget runs out.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use compact_str::CompactString;
use weir_core::algo::{LeakyBucket, LevelState, TokenBucket};
use weir_core::{CostError, Decision, Nanos, Policy, State};

type Map = HashMap<CompactString, Slot, foldhash::fast::RandomState>;

/// A shard sweeps itself when it reaches this many keys, then at twice the
/// number it kept.
const FIRST_SWEEP: usize = 64;

/// Sweeps as a shard grows remove keys that have been idle for at least this
/// long, so that a key checked every few hundred milliseconds is not removed
/// and re-inserted each time; sweeps for room (budget spent) take every idle
/// key.
pub(crate) const GROWTH_SWEEP_GRACE: Nanos = 1_000_000_000;

/// The limit on keys across every policy of a limiter.
#[derive(Debug)]
pub(crate) struct Budget {
    max: usize,
    used: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
        }
    }

    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.max).then_some(used + 1)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// The key budget is spent: no new key can be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

#[derive(Debug)]
enum Slot {
    Word {
        tat: AtomicU64,
        seen: AtomicU64,
    },
    /// Boxed, so that a map entry stays small (and the map dense) for the
    /// one-word algorithms.
    Locked(Box<Mutex<State>>),
}

/// The algorithms whose state is one draining level.
#[derive(Debug, Clone, Copy)]
enum Leveled {
    Bucket(TokenBucket),
    Shaper(LeakyBucket),
}

impl Leveled {
    fn check(self, state: LevelState, now: Nanos, cost: u64) -> (Decision, LevelState) {
        match self {
            Self::Bucket(b) => b.check(state, now, cost),
            Self::Shaper(l) => l.check(state, now, cost),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct ShardMap {
    map: Map,
    sweep_at: usize,
}

#[derive(Debug)]
pub(crate) struct Store {
    policy: Policy,
    /// `(algorithm, n)` when the one-word path applies.
    word: Option<(Leveled, u64)>,
    shards: Box<[RwLock<ShardMap>]>,
    pick: foldhash::fast::RandomState,
}

fn read(lock: &RwLock<ShardMap>) -> RwLockReadGuard<'_, ShardMap> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write(lock: &RwLock<ShardMap>) -> RwLockWriteGuard<'_, ShardMap> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl Store {
    pub(crate) fn new(policy: Policy, shards: usize) -> Self {
        let leveled = match policy {
            Policy::TokenBucket(b) | Policy::Gcra(b) => {
                Some((Leveled::Bucket(b), b.rate().tokens()))
            }
            Policy::LeakyBucket(l) => Some((Leveled::Shaper(l), l.rate().tokens())),
            _ => None,
        };
        Self {
            policy,
            word: leveled.filter(|&(_, n)| n <= 2),
            shards: (0..shards.next_power_of_two())
                .map(|_| RwLock::default())
                .collect(),
            pick: foldhash::fast::RandomState::default(),
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn shard_of(&self, key: &str) -> usize {
        (self.pick.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    pub(crate) fn shard(&self, index: usize) -> &RwLock<ShardMap> {
        &self.shards[index]
    }

    /// Checks `key`, creating it if it is new. `now` is read after the
    /// key's state is loaded (and under its lock), so concurrent checks with
    /// a monotonic clock are evaluated in the order they commit.
    pub(crate) fn check(
        &self,
        key: &str,
        cost: u64,
        now: &impl Fn() -> Nanos,
        record_seen: bool,
        budget: &Budget,
    ) -> Result<Result<Decision, CostError>, Full> {
        let shard = self.shard(self.shard_of(key));
        if let Some(slot) = read(shard).map.get(key) {
            return Ok(self.decide(slot, cost, now, record_seen));
        }
        let mut guard = write(shard);
        self.insert(&mut guard, key, now(), budget)?;
        let slot = guard.map.get(key).ok_or(Full)?;
        Ok(self.decide(slot, cost, now, record_seen))
    }

    /// Makes sure `key` exists in a write-locked shard.
    pub(crate) fn insert(
        &self,
        shard: &mut ShardMap,
        key: &str,
        now: Nanos,
        budget: &Budget,
    ) -> Result<(), Full> {
        if shard.map.contains_key(key) {
            return Ok(());
        }
        if shard.map.len() >= shard.sweep_at.max(FIRST_SWEEP) {
            let size = shard.map.len();
            let removed = self.sweep_map(&mut shard.map, now.saturating_sub(GROWTH_SWEEP_GRACE));
            budget.give_back(removed);
            shard.sweep_at = (2 * shard.map.len()).max(size + 1);
        }
        if !budget.take() {
            return Err(Full);
        }
        let slot = match self.word {
            Some(_) => Slot::Word {
                tat: AtomicU64::new(0),
                seen: AtomicU64::new(0),
            },
            None => Slot::Locked(Box::new(Mutex::new(self.policy.new_state()))),
        };
        shard.map.insert(key.into(), slot);
        Ok(())
    }

    fn decide(
        &self,
        slot: &Slot,
        cost: u64,
        now: &impl Fn() -> Nanos,
        record_seen: bool,
    ) -> Result<Decision, CostError> {
        match (slot, self.word) {
            (Slot::Word { tat, seen }, Some((algorithm, n))) => loop {
                let current = tat.load(Ordering::Acquire);
                let last = seen.load(Ordering::Acquire);
                let (decision, next) = algorithm.check(level(current, last, n), now(), cost);
                let new = tat_of(next, n);
                if new == current
                    || tat
                        .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    if record_seen && next.seen > last {
                        seen.fetch_max(next.seen, Ordering::AcqRel);
                    }
                    return Ok(decision);
                }
                std::hint::spin_loop();
            },
            (Slot::Locked(state), _) => {
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                self.policy.check(&mut state, now(), cost)
            }
            // A word slot exists only when `word` is set.
            (Slot::Word { .. }, None) => {
                self.policy.check(&mut self.policy.new_state(), now(), cost)
            }
        }
    }

    /// The state of `key` in a locked shard, as the core's `State`.
    fn state_of(&self, shard: &ShardMap, key: &str) -> State {
        match (shard.map.get(key), self.word) {
            (Some(Slot::Word { tat, seen }), Some((_, n))) => State::Level(level(
                tat.load(Ordering::Acquire),
                seen.load(Ordering::Acquire),
                n,
            )),
            (Some(Slot::Locked(state)), _) => {
                state.lock().unwrap_or_else(PoisonError::into_inner).clone()
            }
            _ => self.policy.new_state(),
        }
    }

    /// The decision a check would make on a write-locked shard, changing nothing.
    pub(crate) fn peek_locked(
        &self,
        shard: &ShardMap,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        match (shard.map.get(key), self.word) {
            (Some(Slot::Locked(state)), _) => self.policy.peek(
                &state.lock().unwrap_or_else(PoisonError::into_inner),
                now,
                cost,
            ),
            _ => self.policy.peek(&self.state_of(shard, key), now, cost),
        }
    }

    /// Charges `key` in a write-locked shard where it exists.
    pub(crate) fn check_locked(
        &self,
        shard: &ShardMap,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        match shard.map.get(key) {
            Some(slot) => self.decide(slot, cost, &|| now, true),
            None => self.policy.check(&mut self.policy.new_state(), now, cost),
        }
    }

    fn is_idle(&self, slot: &Slot, now: Nanos) -> bool {
        match (slot, self.word) {
            // `tat >= seen·n` always, so this also says `seen <= now`.
            (Slot::Word { tat, .. }, Some((_, n))) => {
                tat.load(Ordering::Acquire) <= now.saturating_mul(n)
            }
            (Slot::Locked(state), _) => {
                let state = state.lock().unwrap_or_else(PoisonError::into_inner);
                state.seen() <= now && self.policy.is_idle(&state, now)
            }
            (Slot::Word { .. }, None) => true,
        }
    }

    /// Removes the keys that are idle at `now` and have seen nothing later.
    fn sweep_map(&self, map: &mut Map, now: Nanos) -> usize {
        let before = map.len();
        map.retain(|_, slot| !self.is_idle(slot, now));
        before - map.len()
    }

    /// Sweeps every shard; returns how many keys were removed.
    pub(crate) fn sweep(&self, now: Nanos, budget: &Budget) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut guard = write(shard);
            let n = self.sweep_map(&mut guard.map, now);
            guard.sweep_at = 2 * guard.map.len();
            removed += n;
        }
        budget.give_back(removed);
        removed
    }

    /// Keys stored now.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).map.len()).sum()
    }
}

fn level(tat: u64, seen: Nanos, n: u64) -> LevelState {
    LevelState {
        seen,
        level: tat.saturating_sub(seen.saturating_mul(n)),
    }
}

fn tat_of(state: LevelState, n: u64) -> u64 {
    state.seen.saturating_mul(n).saturating_add(state.level)
}
