//! One policy's keys: a sharded map from key to state.
//!
//! A check takes its shard's read lock — a `ShardedLock`, whose readers
//! each lock a copy of their own, so a check writes no cache line that
//! another thread's check reads or writes, and checks of unrelated keys and
//! of one hot key run in parallel — and then either
//!
//! - the **one-word path**: token bucket, GCRA and leaky bucket keep their
//!   state as GCRA's theoretical arrival time `tat = seen·n + level` (in
//!   `1/n` ns) in one `AtomicU64`, updated by compare-and-swap, beside the
//!   latest time any check of the key has read. A check's time is the
//!   later of its own reading and that one — SPEC.md's clamp, exact whatever
//!   the clock (a fake one set back, or time-stamp counters read on two
//!   cores, which can disagree by a microsecond). A map entry is then 40
//!   bytes: the key inline and the two words. Used when the rate's reduced
//!   numerator `n` is at most 2 (`2/s`, `100/s`, `120/m` all have `n = 1`),
//!   so `tat` fits 64 bits until 2262.
//! - the **locked path**: every other state sits behind its own mutex
//!   (`parking_lot`'s, which spins before it parks: two threads on one hot
//!   key of a window policy decide 1.4–1.7× faster than with std's).
//!
//! Keys up to 24 bytes are stored inline (no pointer to chase on lookup). A
//! new key takes the shard's write lock once. Idle keys (SPEC.md's idle rule:
//! back to fully available) are swept from a shard when it grows past twice
//! its size after the last sweep and past its largest size so far (taking
//! keys idle for a second or more, so a working set that is checked every
//! few hundred milliseconds is not removed and re-inserted over and over),
//! and from every shard, taking every idle key, when the key budget runs out.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use compact_str::CompactString;
use hashbrown::HashTable;
use parking_lot::Mutex;
use weir_core::algo::{LeakyBucket, LevelState, TokenBucket};
use weir_core::{CostError, Decision, Nanos, Policy, State};

/// A shard sweeps itself when it reaches this many keys, then at twice the
/// number it kept.
const FIRST_SWEEP: usize = 64;

/// Sweeps as a shard grows remove keys that have been idle for at least this
/// long; sweeps for room (budget spent) take every idle key.
const GROWTH_SWEEP_GRACE: Nanos = 1_000_000_000;

/// A limit on keys: one policy's, within the limiter's across every policy
/// (its `parent`), so that a flood on one policy cannot take every key.
#[derive(Debug)]
pub(crate) struct Budget {
    max: usize,
    used: AtomicUsize,
    parent: Option<Arc<Budget>>,
}

impl Budget {
    pub(crate) fn new(max: usize, parent: Option<Arc<Budget>>) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
            parent,
        }
    }

    fn take(&self) -> bool {
        let mine = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.max).then_some(used + 1)
            })
            .is_ok();
        if mine && self.parent.as_ref().is_some_and(|p| !p.take()) {
            self.used.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        mine
    }

    /// Counts `n` keys already stored (kept across a rebuild).
    pub(crate) fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.add(n);
        }
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.give_back(n);
        }
    }

    /// The limit this budget or its parent has reached, if either has.
    pub(crate) fn spent(&self) -> Option<usize> {
        if self.used() >= self.max {
            return Some(self.max);
        }
        self.parent.as_ref().and_then(|p| p.spent())
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// What a call does to a key: decide a request, or charge usage after the
/// fact (SPEC.md's report: always charged, possibly into debt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Check,
    Report,
}

/// The key budget is spent: no new key can be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// The algorithms whose state is one draining level.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Leveled {
    Bucket(TokenBucket),
    Shaper(LeakyBucket),
}

/// What a store knows besides its keys.
#[derive(Debug)]
pub(crate) struct Rules {
    policy: Policy,
    /// The level algorithm and its rate's reduced numerator, on the word path.
    word: Option<(Leveled, u64)>,
    /// The hasher of keys, for shards and buckets alike.
    pick: Pick,
}

/// A key's state in the map.
pub(crate) trait Slot: Sized {
    fn new(rules: &Rules) -> Self;
    fn decide(
        &self,
        rules: &Rules,
        cost: u64,
        now: Nanos,
        op: Op,
    ) -> Result<Decision, CostError>;
    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError>;
    /// Idle at `now`, and nothing later seen.
    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool;
    /// `(remaining, reset)` at `now` with no request.
    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos);
}

/// The one-word state: `tat`, and the latest time a check of the key read
/// (a check's time is never earlier: SPEC.md's clamp).
#[derive(Debug, Default)]
pub(crate) struct Word {
    tat: AtomicU64,
    seen: AtomicU64,
}

impl Word {
    /// The level at `now` (at least the latest time seen), and that time.
    fn level(&self, rules: &Rules, now: Nanos) -> (u64, Nanos) {
        let n = rules.word.map_or(1, |(_, n)| n);
        let tat = self.tat.load(Ordering::Acquire);
        let now = now.max(self.seen.load(Ordering::Acquire));
        (tat.saturating_sub(now.saturating_mul(n)), now)
    }
}

impl Slot for Word {
    fn new(_: &Rules) -> Self {
        Self::default()
    }

    #[inline(always)]
    fn decide(
        &self,
        rules: &Rules,
        cost: u64,
        now: Nanos,
        op: Op,
    ) -> Result<Decision, CostError> {
        let Some((algorithm, n)) = rules.word else {
            return rules
                .policy
                .check(&mut rules.policy.new_state(), now, cost);
        };
        loop {
            let current = self.tat.load(Ordering::Acquire);
            // Read after `tat`: at least the time of the state loaded.
            let seen = self.seen.load(Ordering::Acquire);
            let now = now.max(seen);
            let state = LevelState {
                seen: now,
                level: current.saturating_sub(now.saturating_mul(n)),
            };
            let (decision, next) = match (op, algorithm) {
                (Op::Report, _) => {
                    let mut after = State::Level(state);
                    let decision = rules.policy.report(&mut after, now, cost)?;
                    match after {
                        State::Level(next) => (decision, next),
                        _ => (decision, state),
                    }
                }
                (Op::Check, Leveled::Bucket(b)) => b.check(state, now, cost),
                (Op::Check, Leveled::Shaper(l)) => l.check(state, now, cost),
            };
            // Every check moves the key's latest time (SPEC.md), before an
            // admission commits its state: whoever loads that state then
            // loads a time at least as late.
            if now > seen {
                self.seen.fetch_max(now, Ordering::AcqRel);
            }
            // A rejection changes nothing else (its level is positive, so
            // `tat` is the same).
            if !decision.allowed {
                return Ok(decision);
            }
            let new = next.seen.saturating_mul(n).saturating_add(next.level);
            if self
                .tat
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(decision);
            }
            std::hint::spin_loop();
        }
    }

    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError> {
        let (level, now) = self.level(rules, now);
        rules
            .policy
            .peek(&State::Level(LevelState { seen: now, level }), now, cost)
    }

    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool {
        let n = rules.word.map_or(1, |(_, n)| n);
        self.seen.load(Ordering::Acquire) <= now
            && self.tat.load(Ordering::Acquire) <= now.saturating_mul(n)
    }

    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos) {
        let (level, now) = self.level(rules, now);
        rules
            .policy
            .status(&State::Level(LevelState { seen: now, level }), now)
    }
}

impl Slot for Mutex<State> {
    fn new(rules: &Rules) -> Self {
        Self::new(rules.policy.new_state())
    }

    #[inline(always)]
    fn decide(
        &self,
        rules: &Rules,
        cost: u64,
        now: Nanos,
        op: Op,
    ) -> Result<Decision, CostError> {
        match op {
            Op::Check => rules.policy.check(&mut self.lock(), now, cost),
            Op::Report => rules.policy.report(&mut self.lock(), now, cost),
        }
    }

    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError> {
        rules.policy.peek(&self.lock(), now, cost)
    }

    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool {
        let state = self.lock();
        state.seen() <= now && rules.policy.is_idle(&state, now)
    }

    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos) {
        rules.policy.status(&self.lock(), now)
    }
}

/// One shard: keys and their slots, and when to sweep next. The key's hash
/// is computed once per check and picks both the shard and the bucket.
#[derive(Debug)]
pub(crate) struct ShardMap<S> {
    table: HashTable<(CompactString, S)>,
    sweep_at: usize,
}

impl<S> Default for ShardMap<S> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            sweep_at: FIRST_SWEEP,
        }
    }
}

/// A key and its hash under the store's hasher.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hashed<'a> {
    key: &'a str,
    hash: u64,
}

impl<S: Slot> ShardMap<S> {
    fn get(&self, key: Hashed<'_>) -> Option<&S> {
        self.table
            .find(key.hash, |(k, _)| k == key.key)
            .map(|(_, slot)| slot)
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn sweep(&mut self, rules: &Rules, now: Nanos) -> usize {
        let before = self.table.len();
        self.table.retain(|(_, slot)| !slot.is_idle(rules, now));
        self.sweep_at = (2 * self.table.len()).max(before + 1).max(FIRST_SWEEP);
        before - self.table.len()
    }

    /// Makes sure `key` exists.
    fn insert(
        &mut self,
        rules: &Rules,
        key: Hashed<'_>,
        now: Nanos,
        budget: &Budget,
    ) -> Result<(), Full> {
        if self.get(key).is_some() {
            return Ok(());
        }
        if self.table.len() >= self.sweep_at {
            budget.give_back(self.sweep(rules, now.saturating_sub(GROWTH_SWEEP_GRACE)));
        }
        if !budget.take() {
            return Err(Full);
        }
        let entry = (CompactString::from(key.key), S::new(rules));
        self.table
            .insert_unique(key.hash, entry, |(k, _)| rules.pick.hash_one(k.as_str()));
        Ok(())
    }

    fn peek(
        &self,
        rules: &Rules,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        match self.get(key) {
            Some(slot) => slot.peek(rules, cost, now),
            None => rules.policy.peek(&rules.policy.new_state(), now, cost),
        }
    }

    fn status(&self, rules: &Rules, key: Hashed<'_>, now: Nanos) -> (u64, Nanos) {
        match self.get(key) {
            Some(slot) => slot.status(rules, now),
            None => rules.policy.status(&rules.policy.new_state(), now),
        }
    }

    fn charge(
        &self,
        rules: &Rules,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        match self.get(key) {
            Some(slot) => slot.decide(rules, cost, now, Op::Check),
            None => rules.policy.check(&mut rules.policy.new_state(), now, cost),
        }
    }
}

type Pick = foldhash::fast::RandomState;

fn read<S>(lock: &ShardedLock<ShardMap<S>>) -> ShardedLockReadGuard<'_, ShardMap<S>> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<S>(lock: &ShardedLock<ShardMap<S>>) -> ShardedLockWriteGuard<'_, ShardMap<S>> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Shards<S> {
    shards: Box<[ShardedLock<ShardMap<S>>]>,
}

impl<S: Slot> Shards<S> {
    fn new(count: usize) -> Self {
        Self {
            shards: (0..count).map(|_| ShardedLock::default()).collect(),
        }
    }

    #[inline(always)]
    fn check(
        &self,
        rules: &Rules,
        index: usize,
        key: Hashed<'_>,
        (cost, op): (u64, Op),
        now: Nanos,
        budget: &Budget,
    ) -> Result<Result<Decision, CostError>, Full> {
        let shard = &self.shards[index];
        if let Some(slot) = read(shard).get(key) {
            return Ok(slot.decide(rules, cost, now, op));
        }
        let mut guard = write(shard);
        guard.insert(rules, key, now, budget)?;
        let slot = guard.get(key).ok_or(Full)?;
        Ok(slot.decide(rules, cost, now, op))
    }

    fn sweep(&self, rules: &Rules, now: Nanos) -> usize {
        self.shards
            .iter()
            .map(|shard| write(shard).sweep(rules, now))
            .sum()
    }

    fn peek(
        &self,
        rules: &Rules,
        index: usize,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        read(&self.shards[index]).peek(rules, key, cost, now)
    }

    fn remove(&self, index: usize, key: Hashed<'_>) -> bool {
        let mut shard = write(&self.shards[index]);
        match shard.table.find_entry(key.hash, |(k, _)| k == key.key) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|shard| read(shard).len()).sum()
    }

    fn contains(&self, index: usize, key: Hashed<'_>) -> bool {
        read(&self.shards[index])
            .table
            .find(key.hash, |(k, _)| k == key.key)
            .is_some()
    }
}

/// Runs `$body` with `$s` bound to the shards (or the locked shard) of
/// whichever slot kind `$value` holds: both kinds share every method.
macro_rules! each_kind {
    ($value:expr, $kind:ident, $s:ident => $body:expr) => {
        match $value {
            $kind::Word($s) => $body,
            $kind::Locked($s) => $body,
        }
    };
}

#[derive(Debug)]
enum Table {
    Word(Shards<Word>),
    Locked(Shards<Mutex<State>>),
}

/// A write-locked shard, for checks over several policies.
#[derive(Debug)]
pub(crate) enum Guard<'a> {
    Word(ShardedLockWriteGuard<'a, ShardMap<Word>>),
    Locked(ShardedLockWriteGuard<'a, ShardMap<Mutex<State>>>),
}

#[derive(Debug)]
pub(crate) struct Store {
    rules: Rules,
    table: Table,
    mask: usize,
}

impl Store {
    pub(crate) fn new(policy: Policy, shards: usize) -> Self {
        let leveled = match policy {
            Policy::TokenBucket(b) | Policy::Gcra(b) => {
                Some((Leveled::Bucket(b), b.rate().tokens()))
            }
            Policy::LeakyBucket(l) => Some((Leveled::Shaper(l), l.rate().tokens())),
            Policy::FixedWindow(_) | Policy::SlidingLog(_) | Policy::SlidingCounter(_) => None,
        };
        let word = leveled.filter(|&(_, n)| n <= 2);
        let count = shards.max(1).next_power_of_two();
        let table = match word {
            Some(_) => Table::Word(Shards::new(count)),
            None => Table::Locked(Shards::new(count)),
        };
        Self {
            rules: Rules {
                policy,
                word,
                pick: Pick::default(),
            },
            table,
            mask: count - 1,
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.rules.policy
    }

    /// Hashes `key` once, for its shard and its bucket.
    #[inline]
    pub(crate) fn hashed<'a>(&self, key: &'a str) -> Hashed<'a> {
        Hashed {
            key,
            hash: self.rules.pick.hash_one(key),
        }
    }

    /// The shard of a key: bits the tables' own bucket index and tag do not
    /// use (they take the low bits and the top seven).
    pub(crate) fn shard_of(&self, key: Hashed<'_>) -> usize {
        (key.hash >> 32) as usize & self.mask
    }

    /// Checks `key` at `now`, creating it if it is new. Callers read the
    /// clock before the lookup, so that its latency overlaps the hashing and
    /// the probe: the decision is at the later of `now` and the key's latest
    /// time, as for any check, so a check that waited for a key's lock behind
    /// a later one is decided at that later time.
    #[inline(always)]
    pub(crate) fn check(
        &self,
        key: &str,
        cost: u64,
        now: Nanos,
        budget: &Budget,
        op: Op,
    ) -> Result<Result<Decision, CostError>, Full> {
        let key = self.hashed(key);
        let index = self.shard_of(key);
        each_kind!(&self.table, Table, shards => {
            shards.check(&self.rules, index, key, (cost, op), now, budget)
        })
    }

    pub(crate) fn lock(&self, index: usize) -> Guard<'_> {
        match &self.table {
            Table::Word(shards) => Guard::Word(write(&shards.shards[index])),
            Table::Locked(shards) => Guard::Locked(write(&shards.shards[index])),
        }
    }

    /// The decision a check would make, changing nothing.
    pub(crate) fn peek_locked(
        &self,
        guard: &Guard<'_>,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        each_kind!(guard, Guard, g => g.peek(&self.rules, key, cost, now))
    }

    pub(crate) fn insert_locked(
        &self,
        guard: &mut Guard<'_>,
        key: Hashed<'_>,
        now: Nanos,
        budget: &Budget,
    ) -> Result<(), Full> {
        each_kind!(guard, Guard, g => g.insert(&self.rules, key, now, budget))
    }

    pub(crate) fn check_locked(
        &self,
        guard: &Guard<'_>,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        each_kind!(guard, Guard, g => g.charge(&self.rules, key, cost, now))
    }

    /// `(remaining, reset)` of `key` at `now` with no request.
    pub(crate) fn status_locked(
        &self,
        guard: &Guard<'_>,
        key: Hashed<'_>,
        now: Nanos,
    ) -> (u64, Nanos) {
        each_kind!(guard, Guard, g => g.status(&self.rules, key, now))
    }

    /// Removes every key idle at `now`; returns how many, and gives their
    /// budget back.
    pub(crate) fn sweep(&self, now: Nanos, budget: &Budget) -> usize {
        let removed = each_kind!(&self.table, Table, shards => shards.sweep(&self.rules, now));
        budget.give_back(removed);
        removed
    }

    /// The decision a check would make now, changing nothing.
    pub(crate) fn peek(&self, key: &str, cost: u64, now: Nanos) -> Result<Decision, CostError> {
        let key = self.hashed(key);
        let index = self.shard_of(key);
        each_kind!(&self.table, Table, shards => shards.peek(&self.rules, index, key, cost, now))
    }

    /// Forgets `key` (it starts fresh); whether it was stored.
    pub(crate) fn remove(&self, key: &str, budget: &Budget) -> bool {
        let key = self.hashed(key);
        let index = self.shard_of(key);
        let removed = each_kind!(&self.table, Table, shards => shards.remove(index, key));
        if removed {
            budget.give_back(1);
        }
        removed
    }

    /// Whether `key` is stored.
    pub(crate) fn contains(&self, key: &str) -> bool {
        let key = self.hashed(key);
        let index = self.shard_of(key);
        each_kind!(&self.table, Table, shards => shards.contains(index, key))
    }

    /// Keys stored now.
    pub(crate) fn len(&self) -> usize {
        each_kind!(&self.table, Table, shards => shards.len())
    }
}
