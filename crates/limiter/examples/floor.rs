//! The floor under one hot key's check: what any exact design built on
//! weir's lookup costs on this machine, with nothing else on the path.
//!
//! It keeps only the skeleton of the in-process store's check — weir's
//! clock, crossbeam's `ShardedLock` over a hashbrown table with foldhash
//! and keys inline, the key's two words — and a token bucket's admission
//! reduced to one compare. `floor clamp` moves a refused key's latest time,
//! as docs/SPEC.md's clamp requires of every check (one locked instruction);
//! `floor no-clamp` moves it on admissions only, as governor, which has no
//! clamp, does. Run them beside `keyed governor 1 1` (`docs/BENCHMARKS.md`):
//!
//! ```sh
//! cargo run --release -p weir-limiter --example floor -- clamp
//! cargo run --release -p weir-limiter --example floor -- no-clamp
//! ```

#![allow(clippy::expect_used, missing_docs)]

use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[path = "../benches/support/walk.rs"]
mod walk;

use compact_str::CompactString;
use crossbeam_utils::sync::ShardedLock;
use hashbrown::HashTable;
use weir_core::{Clock, SystemClock};

const CHECKS: u64 = 20_000_000;
/// `token-bucket capacity=10 rate=100/s`: one token is 10 ms of refill.
const TOKEN: u64 = 10_000_000;
const FULL: u64 = 10 * TOKEN;

#[derive(Default)]
struct Slot {
    /// The theoretical arrival time.
    tat: AtomicU64,
    /// The latest time a check of the key read.
    seen: AtomicU64,
}

type Shard = ShardedLock<HashTable<(CompactString, Slot)>>;

struct Floor {
    shards: Box<[Shard]>,
    pick: foldhash::fast::RandomState,
    clock: SystemClock,
    clamp: bool,
}

impl Floor {
    fn check(&self, key: &str) -> bool {
        let now = self.clock.now();
        let hash = self.pick.hash_one(key);
        let shard = &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)];
        if let Some((_, slot)) = shard
            .read()
            .expect("no panics")
            .find(hash, |(k, _)| k == key)
        {
            return self.decide(slot, now);
        }
        let mut table = shard.write().expect("no panics");
        let entry = (CompactString::from(key), Slot::default());
        table.insert_unique(hash, entry, |(k, _)| self.pick.hash_one(k.as_str()));
        true
    }

    #[inline(always)]
    fn decide(&self, slot: &Slot, now: u64) -> bool {
        loop {
            let tat = slot.tat.load(Ordering::Acquire);
            let seen = slot.seen.load(Ordering::Acquire);
            let now = now.max(seen);
            let need = tat.saturating_sub(now) + TOKEN;
            let allowed = need <= FULL;
            if now > seen && (allowed || self.clamp) {
                slot.seen.fetch_max(now, Ordering::AcqRel);
            }
            if !allowed {
                return false;
            }
            if slot
                .tat
                .compare_exchange_weak(tat, now + need, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "clamp".into());
    let floor = Floor {
        shards: (0..64).map(|_| ShardedLock::default()).collect(),
        pick: foldhash::fast::RandomState::default(),
        clock: SystemClock::new(),
        clamp: mode != "no-clamp",
    };
    let keys = Arc::new(vec!["user-0".to_owned()]);
    floor.check(&keys[0]);
    let check = Arc::new(move |key: &String| {
        black_box(floor.check(key));
    });
    let took = walk::run(check, &keys, 1, CHECKS);
    let per_second = CHECKS as f64 / took.as_secs_f64();
    println!("floor {mode} 1 keys 1 threads: {per_second:.0} decisions/s");
}
