//! Fleet grants served in process (docs/SPEC.md, "Fleet grants"): each key
//! of a policy with `grants = { ttl }` keeps its bucket, its live grants
//! and what each client asked of it lately; a client's grant is its
//! max-min fair share of the policy's rate by demand, with a capacity in
//! the same proportion of what the rate's own booking leaves, booked in
//! the key's bucket before it is sent (a smaller one that fits, or none).
//!
//! The state is in this process: one weir serves the grants of a key.
//! Redis-backed grants (the booking in the store's script) are not built
//! yet: a policy with `grants` on a Redis store is refused at config.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use weir_core::algo::grants::{Fleet, FleetState, Grant, SCALE, split};
use weir_core::{Clock, Nanos, SystemClock};

/// The most keys with grants at once (a new key past it gets none).
pub const MAX_KEYS: usize = 100_000;

/// What one key holds.
#[derive(Debug, Default)]
struct Key {
    state: FleetState,
    /// Per client: its demand (rate units) and when it said so.
    demand: HashMap<u64, (u64, Nanos)>,
}

/// Every key's grants.
#[derive(Debug)]
pub struct Grants {
    clock: SystemClock,
    keys: Mutex<HashMap<(String, String), Key>>,
}

impl Default for Grants {
    fn default() -> Self {
        Self {
            clock: SystemClock::new(),
            keys: Mutex::default(),
        }
    }
}

/// A client's usage over `elapsed` ns (allowed and denied: what it would
/// have admitted), as a rate in the fleet's units (thousandths of a token
/// per the policy's period).
pub fn demand(fleet_period: Nanos, requests: u64, elapsed: Nanos) -> u64 {
    let units = u128::from(requests) * u128::from(SCALE) * u128::from(fleet_period);
    u64::try_from(units / u128::from(elapsed.max(1))).unwrap_or(u64::MAX)
}

impl Grants {
    /// The time now, on this registry's clock.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// A grant for `client` on `key` (stored as `name`) of `fleet`, by its
    /// `demand`: the clients that said their demand within two ttls share
    /// the rate. `None`: nothing can be booked now (or too many keys).
    pub fn grant(
        &self,
        name: &str,
        fleet: &Fleet,
        key: &str,
        client: u64,
        wanted: u64,
    ) -> Option<Grant> {
        let now = self.now();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (name.to_owned(), key.to_owned());
        if !keys.contains_key(&id) && keys.len() >= MAX_KEYS {
            keys.retain(|_, k| k.state.grants.iter().any(|g| g.until > now));
            if keys.len() >= MAX_KEYS {
                return None;
            }
        }
        let entry = keys.entry(id).or_default();
        let fresh = now.saturating_sub(fleet.ttl().saturating_mul(2));
        entry.demand.retain(|_, (_, at)| *at >= fresh);
        entry.demand.insert(client, (wanted, now));
        let mut clients: Vec<u64> = entry.demand.keys().copied().collect();
        clients.sort_unstable();
        // Each client asks twice its demand (room to grow between reports);
        // the rate is split max-min fairly by those asks.
        let asks: Vec<u64> = (clients.iter())
            .map(|c| entry.demand[c].0.saturating_mul(2))
            .collect();
        let total = fleet.total_rate();
        let shares = split(total, &asks);
        let mine = clients
            .iter()
            .position(|c| *c == client)
            .map_or(0, |i| shares[i]);
        // A live grant within its share that still covers the demand (or is
        // at least four fifths of the share) is renewed as it is: a renewal
        // books only its rate over the added time and the client keeps its
        // bucket, while new terms book a whole new grant beside the old one,
        // reserved until its own expiry.
        let live = (entry.state.grants.iter())
            .filter(|g| g.client == client && g.until > now)
            .max_by_key(|g| g.until)
            .copied();
        let keeps = |g: &Grant| {
            g.rate <= mine
                && (g.rate >= wanted || g.rate.saturating_mul(5) >= mine.saturating_mul(4))
        };
        if let Some(g) = live.filter(keeps) {
            if let Some(renewed) = fleet.book(&mut entry.state, now, client, g.capacity, g.rate) {
                return Some(renewed);
            }
        }
        let capacity = fleet.grant_capacity(mine);
        fleet.book_within(&mut entry.state, now, client, capacity, mine)
    }
}
