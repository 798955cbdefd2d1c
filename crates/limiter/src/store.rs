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
//!   later of its own reading and that one — docs/SPEC.md's clamp, exact whatever
//!   the clock (a fake one set back, or time-stamp counters read on two
//!   cores, which can disagree by a microsecond). A map entry is then 40
//!   bytes: the key inline and the two words. Used when the rate's reduced
//!   numerator `n` is at most 2 (`2/s`, `100/s`, `120/m` all have `n = 1`),
//!   so `tat` fits 64 bits until 2262. A fixed window's state fits the
//!   same way, as `index << bits | count`, when its index until 2262 and its
//!   limit + 1 fit 64 bits together (`limit` up to 524,286 for `1ms`
//!   windows, 67 million for `100ms`): a count past the limit is kept as
//!   `limit + 1`, which decides alike.
//! - the **wide path**: a sliding counter's window index and two counts in
//!   one `AtomicU128` (`cmpxchg16b`, detected at run time), beside the same
//!   `seen` word and by the same loop, when they fit 128 bits until 2262
//!   (`limit² × window` below about 2^63: `1000` per `1h`, `10000` per
//!   `1s`). A count is kept up to `limit × window + 1`: every count past
//!   `limit × window` decides alike. A map entry is then 64 bytes.
//! - the **locked path**: every other state sits behind its own mutex
//!   (`parking_lot`'s, which spins before it parks: two threads on one hot
//!   key of a window policy decide 1.4–1.7× faster than with std's).
//!
//! Keys up to 24 bytes are stored inline (no pointer to chase on lookup). A
//! new key takes the shard's write lock once. Idle keys (docs/SPEC.md's idle rule:
//! back to fully available) are swept from a shard when it grows past twice
//! its size after the last sweep and past its largest size so far (taking
//! keys idle for a second or more, so a working set that is checked every
//! few hundred milliseconds is not removed and re-inserted over and over),
//! and from every shard, taking every idle key, when the key budget runs out.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use portable_atomic::AtomicU128;

use compact_str::CompactString;
use hashbrown::HashTable;
use parking_lot::Mutex;
use weir_core::algo::LeaseId;
use weir_core::algo::{
    FixedWindow, FixedWindowState, LeakyBucket, LevelState, SlidingCounter, SlidingCounterState,
    TokenBucket,
};
use weir_core::penalty::{self, Ban, Penalty};
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

/// What a call does to a key: decide a request, charge usage after the
/// fact (docs/SPEC.md's report: always charged, possibly into debt), or
/// release or renew a concurrency policy's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Check,
    /// docs/SPEC.md's probe: answered as a check, charging nothing.
    Probe,
    Report,
    Release(LeaseId),
    Renew(LeaseId),
}

/// A new lease's identity ([`weir_core::algo::new_lease_id`]), for a
/// concurrency policy's check.
fn new_lease(policy: &Policy) -> LeaseId {
    match policy {
        Policy::Concurrency(_) => weir_core::algo::new_lease_id(),
        _ => 0,
    }
}

/// Decides `op` on a state that is not packed.
fn decide_state(
    policy: &Policy,
    state: &mut State,
    cost: u64,
    now: Nanos,
    op: Op,
) -> Result<Decision, CostError> {
    match op {
        Op::Check => policy.acquire(state, now, cost, new_lease(policy)),
        Op::Probe => policy.probe(state, now, cost),
        Op::Report => policy.report(state, now, cost),
        Op::Release(lease) => policy.release(state, now, lease),
        Op::Renew(lease) => policy.renew(state, now, lease),
    }
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

/// How a state fits one word.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Packing {
    /// `tat = seen·n + level`, `n` the rate's reduced numerator.
    Level(Leveled, u64),
    /// `index << bits | count`, the count whole up to the deepest a report
    /// takes it (the core's own cap): every count past the limit decides
    /// alike under these parameters, but a reload that raises the limit
    /// carries the count itself.
    Window(FixedWindow, u32),
}

impl Packing {
    /// The packing of `policy`, if its states fit one word for every time
    /// up to `u64::MAX` ns.
    fn of(policy: &Policy) -> Option<Self> {
        // A level is at most the largest report and cost, times `p`.
        let deepest = u128::from(policy.max_report()) + u128::from(policy.max_cost().0);
        let level = |leveled, rate: weir_core::Rate| {
            let fits = deepest * u128::from(rate.period()) <= 1 << 53;
            (rate.tokens() <= 2 && fits).then_some(Self::Level(leveled, rate.tokens()))
        };
        match *policy {
            Policy::TokenBucket(b) | Policy::Gcra(b) => level(Leveled::Bucket(b), b.rate()),
            Policy::LeakyBucket(l) => level(Leveled::Shaper(l), l.rate()),
            // A calendar's window is named by its start, not a small index.
            Policy::FixedWindow(w) if w.calendar().is_some() => None,
            Policy::FixedWindow(w) => {
                let bits = u64::BITS - index_bits(w.window());
                let cap = window_cap(w);
                (bits > 0 && bits < 64 && cap < 1 << bits).then_some(Self::Window(w, bits))
            }
            Policy::SlidingLog(_) | Policy::SlidingCounter(_) | Policy::Concurrency(_) => None,
        }
    }
}

/// The bits a window's index takes until `u64::MAX` ns.
fn index_bits(window: Nanos) -> u32 {
    u64::BITS - (u64::MAX / window).leading_zeros()
}

/// Decides a check of a packed key at the later of `$now` and the key's
/// latest time `$t`, with `$transition` (from the word `$word` and `$t` to
/// a decision and the word after it), and commits an admission by
/// compare-and-swap, trying again if another check changed the word first.
///
/// A macro, so that each algorithm's transition is compiled into a loop of
/// its own, with nothing of the other algorithms live in it: one loop
/// around a dispatch on the algorithm kept every algorithm's constants
/// live across the compare-and-swap, and a hot key's check measured slower
/// (`docs/BENCHMARKS.md`).
macro_rules! commit {
    ($slot:expr, $now:expr, |$word:ident, $t:ident| $transition:expr) => {{
        let slot = $slot;
        loop {
            let $word = slot.word.get();
            // Read after the word: at least the time of the state loaded.
            let seen = slot.seen.load(Ordering::Acquire);
            let $t = $now.max(seen);
            let (decision, new) = $transition;
            // Every check moves the key's latest time (docs/SPEC.md), before an
            // admission commits its state: whoever loads that state then
            // loads a time at least as late.
            if $t > seen {
                slot.seen.fetch_max($t, Ordering::AcqRel);
            }
            // A rejection changes nothing else (a level stays positive; a
            // window's count is kept, and a count of 0 admits any cost).
            if !decision.allowed || slot.word.replace($word, new) {
                break decision;
            }
            std::hint::spin_loop();
        }
    }};
}

/// A state packed in one atomic integer.
pub(crate) trait Pack: Copy {
    type Int: Copy;
    /// The state a word holds, at `now` (no earlier than the key's latest
    /// time).
    fn unpack(self, word: Self::Int, now: Nanos) -> State;
    fn pack(self, state: &State) -> Self::Int;
    /// Decides a check of `cost` on `slot` (see [`commit!`]).
    fn check<A: AtomicInt<Packing = Self>>(
        self,
        slot: &PackedSlot<A>,
        now: Nanos,
        cost: u64,
    ) -> Decision;
}

impl Pack for Packing {
    type Int = u64;

    fn unpack(self, word: u64, now: Nanos) -> State {
        match self {
            Self::Level(_, n) => State::Level(level_of(word, now, n)),
            Self::Window(_, bits) => State::FixedWindow(window_of(word, now, bits)),
        }
    }

    fn pack(self, state: &State) -> u64 {
        match (self, state) {
            (Self::Level(_, n), State::Level(s)) => level_word(*s, n),
            (Self::Window(w, bits), State::FixedWindow(s)) => window_word(*s, w, bits),
            // `unpack` gives no other kind.
            _ => 0,
        }
    }

    #[inline(always)]
    fn check<A: AtomicInt<Packing = Self>>(
        self,
        slot: &PackedSlot<A>,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        match self {
            Self::Level(Leveled::Bucket(b), n) => commit!(slot, now, |word, t| {
                let (decision, next) = b.check(level_of(word, t, n), t, cost);
                (decision, level_word(next, n))
            }),
            Self::Level(Leveled::Shaper(l), n) => commit!(slot, now, |word, t| {
                let (decision, next) = l.check(level_of(word, t, n), t, cost);
                (decision, level_word(next, n))
            }),
            Self::Window(w, bits) => commit!(slot, now, |word, t| {
                let (decision, next) = w.check(window_of(word, t, bits), t, cost);
                (decision, window_word(next, w, bits))
            }),
        }
    }
}

#[inline(always)]
fn level_of(word: u64, now: Nanos, n: u64) -> LevelState {
    LevelState {
        seen: now,
        level: u128::from(word.saturating_sub(now.saturating_mul(n))),
    }
}

#[inline(always)]
fn level_word(state: LevelState, n: u64) -> u64 {
    // The level fits 2^53 (`Packing::of`).
    let level = u64::try_from(state.level).unwrap_or(u64::MAX);
    state.seen.saturating_mul(n).saturating_add(level)
}

#[inline(always)]
fn window_of(word: u64, now: Nanos, bits: u32) -> FixedWindowState {
    FixedWindowState {
        seen: now,
        index: word >> bits,
        count: word & ((1 << bits) - 1),
    }
}

#[inline(always)]
fn window_word(state: FixedWindowState, window: FixedWindow, bits: u32) -> u64 {
    state.index << bits | state.count.min(window_cap(window))
}

/// The largest count a window's key holds: the deepest a report takes it.
fn window_cap(window: FixedWindow) -> u64 {
    Policy::FixedWindow(window)
        .max_report()
        .max(window.limit().saturating_add(1))
}

/// A sliding counter in 128 bits: `index << 2·bits | current << bits |
/// previous`, each count capped at `limit·window + 1`. Every count past
/// `limit·window` decides alike: weighted by at least 1 ns of the window it
/// is past the limit, and in the retry's division, `(limit − cost)·window`
/// over it, it rounds to 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CounterPacking {
    counter: SlidingCounter,
    bits: u32,
    cap: u64,
}

impl CounterPacking {
    /// The packing of `policy`, if its states fit 128 bits for every time
    /// up to `u64::MAX` ns.
    fn of(policy: &Policy) -> Option<Self> {
        let Policy::SlidingCounter(counter) = *policy else {
            return None;
        };
        let cap = counter
            .limit()
            .checked_mul(counter.window())?
            .checked_add(1)?;
        let bits = u64::BITS - cap.leading_zeros();
        (index_bits(counter.window()) + 2 * bits <= u128::BITS).then_some(Self {
            counter,
            bits,
            cap,
        })
    }

    #[inline(always)]
    fn state(self, word: u128, now: Nanos) -> SlidingCounterState {
        let count = |at: u32| (word >> at) as u64 & (u64::MAX >> (u64::BITS - self.bits));
        SlidingCounterState {
            seen: now,
            index: (word >> (2 * self.bits)) as u64,
            current: count(self.bits),
            previous: count(0),
        }
    }

    #[inline(always)]
    fn word(self, state: SlidingCounterState) -> u128 {
        u128::from(state.index) << (2 * self.bits)
            | u128::from(state.current.min(self.cap)) << self.bits
            | u128::from(state.previous.min(self.cap))
    }
}

impl Pack for CounterPacking {
    type Int = u128;

    fn unpack(self, word: u128, now: Nanos) -> State {
        State::SlidingCounter(self.state(word, now))
    }

    fn pack(self, state: &State) -> u128 {
        match state {
            State::SlidingCounter(s) => self.word(*s),
            // `unpack` gives no other kind.
            _ => 0,
        }
    }

    #[inline(always)]
    fn check<A: AtomicInt<Packing = Self>>(
        self,
        slot: &PackedSlot<A>,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        commit!(slot, now, |word, t| {
            let (decision, next) = self.counter.check(self.state(word, t), t, cost);
            (decision, self.word(next))
        })
    }
}

/// What a store knows besides its keys.
#[derive(Debug)]
pub(crate) struct Rules {
    policy: Policy,
    /// The policy's penalty: its keys are then [`Penalized`].
    penalty: Option<Penalty>,
    /// How a key's state fits one word, on the word path.
    word: Option<Packing>,
    /// How a sliding counter's state fits 128 bits, on the wide path.
    wide: Option<CounterPacking>,
    /// The hasher of keys, for shards and buckets alike.
    pick: Pick,
}

/// A key's state in the map.
pub(crate) trait Slot: Sized {
    fn new(rules: &Rules) -> Self;
    fn decide(&self, rules: &Rules, cost: u64, now: Nanos, op: Op) -> Result<Decision, CostError>;
    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError>;
    /// Idle at `now`, and nothing later seen.
    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool;
    /// `(remaining, reset)` at `now` with no request.
    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos);
    /// The state as last written, at the key's latest time.
    fn stored(&self, rules: &Rules) -> State;
    /// A slot holding `state` (of `rules`' policy).
    fn holding(rules: &Rules, state: &State) -> Self;
}

/// An atomic integer a state is packed in: 64 bits ([`Packing`]) or 128
/// ([`CounterPacking`]).
pub(crate) trait AtomicInt: Default {
    type Packing: Pack;
    fn packing(rules: &Rules) -> Option<Self::Packing>;
    fn get(&self) -> <Self::Packing as Pack>::Int;
    fn with(value: <Self::Packing as Pack>::Int) -> Self;
    /// Compare-and-swap (weak: it may fail spuriously).
    fn replace(
        &self,
        current: <Self::Packing as Pack>::Int,
        new: <Self::Packing as Pack>::Int,
    ) -> bool;
}

impl AtomicInt for AtomicU64 {
    type Packing = Packing;

    fn packing(rules: &Rules) -> Option<Packing> {
        rules.word
    }

    #[inline(always)]
    fn get(&self) -> u64 {
        self.load(Ordering::Acquire)
    }

    fn with(value: u64) -> Self {
        Self::new(value)
    }

    #[inline(always)]
    fn replace(&self, current: u64, new: u64) -> bool {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl AtomicInt for AtomicU128 {
    type Packing = CounterPacking;

    fn packing(rules: &Rules) -> Option<CounterPacking> {
        rules.wide
    }

    #[inline(always)]
    fn get(&self) -> u128 {
        self.load(Ordering::Acquire)
    }

    fn with(value: u128) -> Self {
        Self::new(value)
    }

    #[inline(always)]
    fn replace(&self, current: u128, new: u128) -> bool {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The packed state (as [`Packing`] or [`CounterPacking`] says), and the latest time a
/// check of the key read (a check's time is never earlier: docs/SPEC.md's clamp).
#[derive(Debug, Default)]
pub(crate) struct PackedSlot<A = AtomicU64> {
    word: A,
    seen: AtomicU64,
}

impl<A: AtomicInt> PackedSlot<A> {
    /// The state at `now` (at least the latest time seen), and that time.
    fn state(&self, rules: &Rules, now: Nanos) -> (State, Nanos) {
        let word = self.word.get();
        let now = now.max(self.seen.load(Ordering::Acquire));
        match A::packing(rules) {
            Some(packing) => (packing.unpack(word, now), now),
            None => (rules.policy.new_state(), now),
        }
    }
}

impl<A: AtomicInt> Slot for PackedSlot<A> {
    fn new(_: &Rules) -> Self {
        Self::default()
    }

    #[inline(always)]
    fn decide(&self, rules: &Rules, cost: u64, now: Nanos, op: Op) -> Result<Decision, CostError> {
        let Some(packing) = A::packing(rules) else {
            return decide_state(&rules.policy, &mut rules.policy.new_state(), cost, now, op);
        };
        match op {
            Op::Check => Ok(packing.check(self, now, cost)),
            Op::Probe => {
                let decision = self.peek(rules, cost, now)?;
                // Moves the key's latest time, charging nothing.
                packing.check(self, now, 0);
                Ok(Decision {
                    delay: 0,
                    lease: None,
                    ..decision
                })
            }
            Op::Report => Ok(commit!(self, now, |word, t| {
                let mut state = packing.unpack(word, t);
                let decision = rules.policy.report(&mut state, t, cost)?;
                (decision, packing.pack(&state))
            })),
            // A packed policy has no leases: the policy's error.
            Op::Release(_) | Op::Renew(_) => {
                decide_state(&rules.policy, &mut rules.policy.new_state(), cost, now, op)
            }
        }
    }

    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError> {
        let (state, now) = self.state(rules, now);
        rules.policy.peek(&state, now, cost)
    }

    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool {
        let (state, at) = self.state(rules, now);
        at <= now && rules.policy.is_idle(&state, now)
    }

    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos) {
        let (state, now) = self.state(rules, now);
        rules.policy.status(&state, now)
    }

    fn stored(&self, rules: &Rules) -> State {
        self.state(rules, 0).0
    }

    fn holding(rules: &Rules, state: &State) -> Self {
        Self {
            word: A::packing(rules).map_or_else(A::default, |p| A::with(p.pack(state))),
            seen: AtomicU64::new(state.seen()),
        }
    }
}

impl Slot for Mutex<State> {
    fn new(rules: &Rules) -> Self {
        Self::new(rules.policy.new_state())
    }

    #[inline(always)]
    fn decide(&self, rules: &Rules, cost: u64, now: Nanos, op: Op) -> Result<Decision, CostError> {
        decide_state(&rules.policy, &mut self.lock(), cost, now, op)
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

    fn stored(&self, _: &Rules) -> State {
        self.lock().clone()
    }

    fn holding(_: &Rules, state: &State) -> Self {
        Self::new(state.clone())
    }
}

/// A key's state under a policy with a penalty, and its ban.
#[derive(Debug)]
pub(crate) struct Penalized {
    state: State,
    ban: Ban,
}

impl Slot for Mutex<Penalized> {
    fn new(rules: &Rules) -> Self {
        Self::new(Penalized {
            state: rules.policy.new_state(),
            ban: Ban::default(),
        })
    }

    fn decide(&self, rules: &Rules, cost: u64, now: Nanos, op: Op) -> Result<Decision, CostError> {
        let mut key = self.lock();
        let Penalized { state, ban } = &mut *key;
        let op = match op {
            Op::Check => penalty::Op::Check(new_lease(&rules.policy)),
            Op::Probe => penalty::Op::Probe,
            Op::Report => penalty::Op::Report,
            Op::Release(_) | Op::Renew(_) => {
                return decide_state(&rules.policy, state, cost, now, op);
            }
        };
        match rules.penalty {
            Some(p) => p.decide(&rules.policy, state, ban, now, cost, op),
            None => decide_state(&rules.policy, state, cost, now, Op::Check),
        }
    }

    fn peek(&self, rules: &Rules, cost: u64, now: Nanos) -> Result<Decision, CostError> {
        let key = self.lock();
        match rules.penalty {
            Some(p) => p.peek(&rules.policy, &key.state, &key.ban, now, cost),
            None => rules.policy.peek(&key.state, now, cost),
        }
    }

    fn is_idle(&self, rules: &Rules, now: Nanos) -> bool {
        let key = self.lock();
        key.state.seen() <= now
            && rules.policy.is_idle(&key.state, now)
            && rules
                .penalty
                .is_none_or(|p| p.forgotten_at(&key.ban) <= now)
    }

    fn status(&self, rules: &Rules, now: Nanos) -> (u64, Nanos) {
        rules.policy.status(&self.lock().state, now)
    }

    fn stored(&self, _: &Rules) -> State {
        self.lock().state.clone()
    }

    fn holding(_: &Rules, state: &State) -> Self {
        Self::new(Penalized {
            state: state.clone(),
            ban: Ban::default(),
        })
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
            None => decide_state(
                &rules.policy,
                &mut rules.policy.new_state(),
                cost,
                now,
                Op::Check,
            ),
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
        if matches!(op, Op::Release(_) | Op::Renew(_)) {
            // A key that is not stored holds no lease: decided on a fresh
            // state, and nothing is stored (a release or renewal never
            // takes from the key budget).
            return Ok(S::new(rules).decide(rules, cost, now, op));
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

    /// Stores `key` holding `state`, replacing any slot it had.
    fn put(&self, rules: &Rules, index: usize, key: Hashed<'_>, state: &State) {
        let mut shard = write(&self.shards[index]);
        let entry = (CompactString::from(key.key), S::holding(rules, state));
        match shard.table.find_entry(key.hash, |(k, _)| k == key.key) {
            Ok(mut found) => *found.get_mut() = entry,
            Err(_) => {
                shard
                    .table
                    .insert_unique(key.hash, entry, |(k, _)| rules.pick.hash_one(k.as_str()));
            }
        }
    }

    /// Every key with its state as last written.
    fn each(&self, rules: &Rules, mut f: impl FnMut(&str, State)) {
        for shard in &self.shards {
            for (key, slot) in read(shard).table.iter() {
                f(key, slot.stored(rules));
            }
        }
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
            $kind::PackedSlot($s) => $body,
            $kind::CounterPacking($s) => $body,
            $kind::Locked($s) => $body,
            $kind::Penalized($s) => $body,
        }
    };
}

#[derive(Debug)]
enum Table {
    PackedSlot(Shards<PackedSlot>),
    CounterPacking(Shards<PackedSlot<AtomicU128>>),
    Locked(Shards<Mutex<State>>),
    Penalized(Shards<Mutex<Penalized>>),
}

/// A write-locked shard, for checks over several policies.
#[derive(Debug)]
pub(crate) enum Guard<'a> {
    PackedSlot(ShardedLockWriteGuard<'a, ShardMap<PackedSlot>>),
    CounterPacking(ShardedLockWriteGuard<'a, ShardMap<PackedSlot<AtomicU128>>>),
    Locked(ShardedLockWriteGuard<'a, ShardMap<Mutex<State>>>),
    Penalized(ShardedLockWriteGuard<'a, ShardMap<Mutex<Penalized>>>),
}

#[derive(Debug)]
pub(crate) struct Store {
    rules: Rules,
    table: Table,
    mask: usize,
}

impl Store {
    pub(crate) fn new(policy: Policy, penalty: Option<Penalty>, shards: usize) -> Self {
        let (word, wide) = match penalty {
            Some(_) => (None, None),
            None => (Packing::of(&policy), CounterPacking::of(&policy)),
        };
        let count = shards.max(1).next_power_of_two();
        let table = match (word, wide, penalty) {
            (_, _, Some(_)) => Table::Penalized(Shards::new(count)),
            (Some(_), _, _) => Table::PackedSlot(Shards::new(count)),
            (_, Some(_), _) => Table::CounterPacking(Shards::new(count)),
            (None, None, None) => Table::Locked(Shards::new(count)),
        };
        Self {
            rules: Rules {
                policy,
                penalty,
                word,
                wide,
                pick: Pick::default(),
            },
            table,
            mask: count - 1,
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.rules.policy
    }

    pub(crate) fn penalty(&self) -> Option<Penalty> {
        self.rules.penalty
    }

    /// A store of `policy` holding the keys of `old` (the same policy name
    /// with other parameters) whose state carries over ([`Policy::carry`]);
    /// the others start over. Checks `old` decides while this copies may be
    /// missed: a reload copies once, then every check goes to the new store.
    pub(crate) fn carried(
        policy: Policy,
        penalty: Option<Penalty>,
        shards: usize,
        old: &Store,
    ) -> Self {
        let store = Self::new(policy, penalty, shards);
        each_kind!(&old.table, Table, from => from.each(&old.rules, |key, state| {
            if let Some(state) = store.rules.policy.carry(&old.rules.policy, &state) {
                let key = store.hashed(key);
                let index = store.shard_of(key);
                each_kind!(&store.table, Table, to => to.put(&store.rules, index, key, &state));
            }
        }));
        store
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
            Table::PackedSlot(shards) => Guard::PackedSlot(write(&shards.shards[index])),
            Table::CounterPacking(shards) => Guard::CounterPacking(write(&shards.shards[index])),
            Table::Locked(shards) => Guard::Locked(write(&shards.shards[index])),
            Table::Penalized(shards) => Guard::Penalized(write(&shards.shards[index])),
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

    /// What a check of `cost` among others would answer before any is
    /// charged: [`Self::peek_locked`]'s decision, and for a cost of 0 the
    /// standing (or a refusal while the key is in debt, after a report).
    pub(crate) fn decide_locked(
        &self,
        guard: &Guard<'_>,
        key: Hashed<'_>,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, CostError> {
        let decision = self.peek_locked(guard, key, cost, now)?;
        if cost > 0 || !decision.allowed {
            return Ok(decision);
        }
        let (remaining, reset) = self.status_locked(guard, key, now);
        Ok(Decision {
            allowed: true,
            remaining,
            reset,
            ..Decision::default()
        })
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
    /// Forgets the ban of `key`; whether it had one.
    pub(crate) fn lift_ban(&self, key: &str) -> bool {
        let Table::Penalized(shards) = &self.table else {
            return false;
        };
        let key = self.hashed(key);
        let shard = read(&shards.shards[self.shard_of(key)]);
        shard.get(key).is_some_and(|slot| {
            let mut slot = slot.lock();
            std::mem::take(&mut slot.ban).banned_at.is_some()
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn packing(spec: &str) -> Option<Packing> {
        Packing::of(&Policy::parse(spec).expect("a valid policy"))
    }

    #[test]
    fn a_fixed_window_is_one_word_while_its_index_and_count_fit() {
        // 1 ms windows take 45 bits of index until u64::MAX ns, leaving 19
        // for a count of up to limit × 1000 (the deepest a report takes it).
        let fits = |limit: u64| {
            matches!(
                packing(&format!("fixed-window limit={limit} window=1ms")),
                Some(Packing::Window(_, 19))
            )
        };
        assert!(fits(10) && fits(524));
        assert!(!fits(525));
        assert!(matches!(
            packing("fixed-window limit=10 window=100ms"),
            Some(Packing::Window(_, 26))
        ));
        assert!(packing("fixed-window limit=1 window=1ns").is_none());
        assert!(packing("sliding-counter limit=10 window=100ms").is_none());
        assert!(packing("sliding-log limit=10 window=100ms").is_none());
        assert!(matches!(
            packing("token-bucket capacity=10 rate=100/s"),
            Some(Packing::Level(_, 1))
        ));
        assert!(packing("token-bucket capacity=10 rate=3/2s").is_none());
    }

    #[test]
    fn a_sliding_counter_is_128_bits_while_its_index_and_counts_fit() {
        let wide = |spec: &str| CounterPacking::of(&Policy::parse(spec).expect("a valid policy"));
        // 100 ms windows: 38 bits of index; counts up to 10·10^8 + 1, 30 bits.
        let w = wide("sliding-counter limit=10 window=100ms").expect("fits");
        assert_eq!((w.bits, w.cap), (30, 1_000_000_001));
        // Index and two counts fit while limit² · window is below about 2^63.
        assert!(wide("sliding-counter limit=1000 window=1h").is_some());
        assert!(wide("sliding-counter limit=10000 window=1s").is_some());
        assert!(wide("sliding-counter limit=100000 window=1s").is_none());
        assert!(wide("sliding-counter limit=100 window=1d").is_some());
        assert!(wide("fixed-window limit=10 window=100ms").is_none());
        // A map entry: the key inline, the 128-bit word, `seen`.
        assert_eq!(size_of::<(CompactString, PackedSlot<AtomicU128>)>(), 64);
        assert_eq!(size_of::<(CompactString, PackedSlot)>(), 40);
    }
}
