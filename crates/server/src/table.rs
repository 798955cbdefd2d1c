//! The policy table: every policy of a configuration resolved once — its
//! [`TableId`], name, `Policy`, its fallback's, its store rules — beside
//! how it shows itself to clients (`shown.rs`) and what is counted of it
//! (`policy_meters.rs`). Routes and descriptor rules hold ids; the request
//! path indexes this table and never scans or compares names.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};

use weir_core::{Penalty, Policy};

use crate::config::{
    OnStateLoss, OnStoreError, Override, Plan, PolicyConfig, Quota, Setting, StoreConfig, StoreUrl,
    TableId,
};
use crate::policy_meters::PolicyMeters;
use crate::shown::Shown;

/// One policy, resolved.
#[derive(Debug)]
pub struct Entry {
    /// Its name (an override's is its policy's).
    pub name: String,
    /// The name its keys are stored under: the name, or `NAME@override-N`
    /// for an override's keys, which are its own.
    pub stored_as: String,
    /// An unlimited override: admitted, not counted.
    pub unlimited: bool,
    /// The algorithm and parameters (on the shared store, if any).
    pub policy: Policy,
    /// With a shared store: the local fallback's policy (`fallback_share`
    /// of the limit); in process, the policy itself.
    pub local: Policy,
    /// `on_store_error` (unset: the face decides).
    pub on_store_error: Option<OnStoreError>,
    /// `on_state_loss`.
    pub on_state_loss: OnStateLoss,
    /// The policy's own in-process key budget.
    pub max_keys: Option<usize>,
    /// Decides and keeps state as if enforced, but never refuses.
    pub shadow: bool,
    /// Its penalty: a refusal bans the key (docs/SPEC.md's bans).
    pub penalty: Option<Penalty>,
    /// Client networks it does not limit.
    pub exempt: crate::addresses::AddressList,
    /// Its fleet grants (`grants = { ttl }`), if it hands any out.
    pub grants: Option<weir_core::algo::grants::Fleet>,
    /// How it shows itself to clients.
    pub(crate) shown: Shown,
    /// What is counted of it.
    pub(crate) meters: PolicyMeters,
}

impl Entry {
    /// An entry of `base`'s policy under other parameters (a plan's, a
    /// per-key limit's), stored as `stored_as`, with `base`'s rules.
    fn derived(
        base: &PolicyConfig,
        setting: &Setting,
        stored_as: String,
        store: &StoreConfig,
    ) -> Result<Self, String> {
        let policy = setting
            .apply(&base.policy)
            .map_err(|(field, e)| format!("{field}: {e}"))?;
        // Its grants are those of its own bucket.
        let grants = base.grants.and_then(|fleet| match policy {
            Policy::TokenBucket(b) | Policy::Gcra(b) => {
                weir_core::algo::grants::Fleet::new(b, fleet.ttl()).ok()
            }
            _ => None,
        });
        let config = PolicyConfig {
            policy,
            max_keys: None,
            grants,
            ..base.clone()
        };
        let mut entry = Self::new(&config, stored_as, store);
        entry.unlimited = *setting == Setting::Unlimited;
        Ok(entry)
    }

    /// The rules of this entry as a policy's configuration.
    fn config(&self) -> PolicyConfig {
        PolicyConfig {
            name: self.name.clone(),
            policy: self.policy,
            on_store_error: self.on_store_error,
            on_state_loss: self.on_state_loss,
            max_keys: self.max_keys,
            shadow: self.shadow,
            penalty: self.penalty,
            exempt: self.exempt.clone(),
            grants: self.grants,
        }
    }

    fn new(config: &PolicyConfig, stored_as: String, store: &StoreConfig) -> Self {
        let name = config.name.clone();
        let local = match store.url {
            StoreUrl::Memory => config.policy,
            StoreUrl::Redis(_) => config
                .policy
                .scaled(store.fallback_share, 1_000_000)
                .unwrap_or_else(|e| {
                    tracing::warn!(policy = %name, error = %e, "the local fallback keeps the whole limit");
                    config.policy
                }),
        };
        Self {
            shown: Shown::new(&name, &config.policy, &local),
            meters: PolicyMeters::new(&name, &config.policy),
            policy: config.policy,
            local,
            on_store_error: config.on_store_error,
            on_state_loss: config.on_state_loss,
            max_keys: config.max_keys,
            shadow: config.shadow,
            penalty: config.penalty,
            exempt: config.exempt.clone(),
            grants: config.grants,
            stored_as,
            unlimited: false,
            name,
        }
    }
}

/// The most keys an override holds per identity it lists: one per scope
/// the identity arrives under (the decision API, each route's identity
/// source, Envoy).
const OVERRIDE_SCOPES: usize = 16;

/// Every policy of a configuration, by [`TableId`]; then one entry per
/// `[[overrides]]` table.
#[derive(Debug)]
pub struct PolicyTable {
    entries: Vec<Entry>,
    by_name: HashMap<String, TableId>,
    /// Per policy, the identities overridden and the entry they use instead.
    overrides: HashMap<TableId, HashMap<String, TableId>>,
    /// `[server] near_limit_ratio`, in parts per million.
    near_limit: Option<u64>,
    /// Entries added by requests that name their own limit.
    ad_hoc: Box<[OnceLock<Entry>]>,
    ad_hoc_names: Mutex<HashMap<String, AdHoc>>,
    /// Per plan, the policies it sets and the entry each uses instead.
    plans: HashMap<String, Vec<(TableId, TableId)>>,
    /// Entries of per-key limits set through the API, made when first
    /// used: one per distinct (policy, setting).
    managed: Box<[OnceLock<Entry>]>,
    managed_ids: RwLock<HashMap<TableId, HashMap<Box<str>, TableId>>>,
    store: StoreConfig,
}

/// The most distinct (policy, setting) pairs the API's per-key limits may
/// use at once (keys sharing a setting share its entry).
pub const MANAGED: usize = 256;

/// The most limits requests may name (Envoy's per-descriptor `limit`) in
/// one table; when they are all taken, the state makes a table whose limits
/// are those used within [`AD_HOC_RECENT`] (see `AppState::make_room`).
pub const AD_HOC: usize = weir_limiter::AD_HOC - MANAGED;

/// A limit named by a request within this long is kept when room is made
/// for new ones; older ones give way (and, in process, their keys).
pub const AD_HOC_RECENT: std::time::Duration = std::time::Duration::from_secs(60);

/// A limit a request named: its entry, the rule it was named under, and
/// when a request last named it.
#[derive(Debug)]
struct AdHoc {
    id: TableId,
    base: Option<TableId>,
    used: std::time::Instant,
}

/// A limit a request named, as [`PolicyTable::ad_hoc`] takes it.
#[derive(Debug, Clone)]
pub(crate) struct Named {
    pub(crate) stored_as: String,
    pub(crate) name: String,
    pub(crate) policy: Policy,
    pub(crate) base: Option<TableId>,
}

impl PolicyTable {
    /// The table of `policies` (ids are their indexes) and `overrides`.
    pub fn new(policies: &[PolicyConfig], overrides: &[Override], store: &StoreConfig) -> Self {
        let mut entries: Vec<Entry> = policies
            .iter()
            .map(|p| Entry::new(p, p.name.clone(), store))
            .collect();
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), TableId(i)))
            .collect();
        let mut table: HashMap<TableId, HashMap<String, TableId>> = HashMap::new();
        for (n, o) in overrides.iter().enumerate() {
            let base = &policies[o.policy.0];
            let config = PolicyConfig {
                policy: match o.quota {
                    Quota::Policy(policy) => policy,
                    Quota::Unlimited => base.policy,
                },
                // Only the identities it lists, each under a few scopes
                // (the API's, a route's, Envoy's): a budget of its own.
                max_keys: Some(o.keys.len().saturating_mul(OVERRIDE_SCOPES)),
                ..base.clone()
            };
            let mut entry = Entry::new(&config, format!("{}@override-{}", base.name, n + 1), store);
            entry.unlimited = o.quota == Quota::Unlimited;
            let id = TableId(entries.len());
            entries.push(entry);
            let keys = table.entry(o.policy).or_default();
            keys.extend(o.keys.iter().map(|k| (k.clone(), id)));
        }
        Self {
            entries,
            by_name,
            overrides: table,
            near_limit: None,
            ad_hoc: (0..AD_HOC).map(|_| OnceLock::new()).collect(),
            ad_hoc_names: Mutex::default(),
            plans: HashMap::new(),
            managed: (0..MANAGED).map(|_| OnceLock::new()).collect(),
            managed_ids: RwLock::default(),
            store: store.clone(),
        }
    }

    /// With the entries of `plans` (`POLICY@plan:NAME`, each stored apart:
    /// a key's state under a plan is its own).
    pub fn with_plans(mut self, plans: &[Plan]) -> Self {
        for plan in plans {
            let mut set = Vec::new();
            for (base, setting) in &plan.policies {
                let config = self.entries[base.0].config();
                let stored_as = format!("{}@plan:{}", config.name, plan.name);
                // Checked when the configuration was read.
                if let Ok(entry) = Entry::derived(&config, setting, stored_as, &self.store) {
                    set.push((*base, TableId(self.entries.len())));
                    self.entries.push(entry);
                }
            }
            self.plans.insert(plan.name.clone(), set);
        }
        self
    }

    /// Whether a plan of this name is configured.
    pub fn has_plan(&self, name: &str) -> bool {
        self.plans.contains_key(name)
    }

    /// The entry `plan` gives `policy`, if it sets it.
    pub fn plan_entry(&self, plan: &str, policy: TableId) -> Option<TableId> {
        let set = self.plans.get(plan)?;
        set.iter().find(|(p, _)| *p == policy).map(|(_, e)| *e)
    }

    /// The entry of `policy` under `setting` (written `canonical`), made
    /// on first use and stored as `POLICY@canonical`; `None` past
    /// [`MANAGED`] distinct ones, or where the setting no longer fits the
    /// policy (a reload changed it).
    pub fn managed(&self, policy: TableId, canonical: &str, setting: &Setting) -> Option<TableId> {
        let known = |ids: &HashMap<TableId, HashMap<Box<str>, TableId>>| {
            ids.get(&policy).and_then(|m| m.get(canonical)).copied()
        };
        let read = self
            .managed_ids
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = known(&read) {
            return Some(id);
        }
        drop(read);
        let mut ids = self
            .managed_ids
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = known(&ids) {
            return Some(id);
        }
        let slot = ids.values().map(HashMap::len).sum::<usize>();
        let cell = self.managed.get(slot)?;
        let base = self.get(policy);
        let stored_as = format!("{}@{canonical}", base.name);
        match Entry::derived(&base.config(), setting, stored_as, &self.store) {
            Ok(entry) => {
                let _ = cell.set(entry);
            }
            Err(e) => {
                tracing::warn!(policy = %base.name, setting = canonical, error = %e, "a per-key limit no longer fits its policy: the policy decides");
                return None;
            }
        }
        let id = TableId(self.entries.len() + AD_HOC + slot);
        ids.entry(policy).or_default().insert(canonical.into(), id);
        Some(id)
    }

    /// Whether `canonical` under `policy` has an entry, or room for one
    /// (fewer than [`MANAGED`] distinct pairs are in use).
    pub fn managed_room(&self, policy: TableId, canonical: &str) -> bool {
        let ids = self
            .managed_ids
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        ids.get(&policy).is_some_and(|m| m.contains_key(canonical))
            || ids.values().map(HashMap::len).sum::<usize>() < MANAGED
    }

    /// Counts admissions that leave less than `1 - ratio` of the limit
    /// (`ratio` in parts per million) as `near_limit` too.
    pub fn with_near_limit(mut self, ratio: Option<u64>) -> Self {
        self.near_limit = ratio;
        self
    }

    /// Whether an admission leaving `remaining` of `entry`'s limit is near it.
    pub(crate) fn near_limit(&self, entry: &Entry, remaining: u64, degraded: bool) -> bool {
        self.near_limit.is_some_and(|ratio| {
            let limit = u128::from(entry.shown.limit(degraded));
            u128::from(remaining) * 1_000_000 < limit * u128::from(1_000_000 - ratio.min(1_000_000))
        })
    }

    /// The entry that decides `identity` (as the client sent it) under
    /// `policy`: its override's, or the policy's own. One hash lookup,
    /// however many overrides.
    pub fn resolve(&self, policy: TableId, identity: &str) -> TableId {
        self.overrides
            .get(&policy)
            .and_then(|keys| keys.get(identity))
            .copied()
            .unwrap_or(policy)
    }

    /// The policy `id` (ids come from the same configuration).
    pub fn get(&self, id: TableId) -> &Entry {
        // Ad-hoc and managed ids are handed out only once their entry is set.
        let set = match id.0.checked_sub(self.entries.len()) {
            None => return &self.entries[id.0],
            Some(i) if i < AD_HOC => self.ad_hoc.get(i),
            Some(i) => self.managed.get(i - AD_HOC),
        };
        set.and_then(OnceLock::get).unwrap_or(&self.entries[0])
    }

    /// The entry of a limit a request names (an Envoy descriptor's own
    /// `limit`): `policy` under the name `stored_as`, shown as `name`, with
    /// the rules of `base`. The same `stored_as` is always the same entry;
    /// none past [`AD_HOC`] of them.
    pub(crate) fn ad_hoc(
        &self,
        stored_as: &str,
        name: &str,
        policy: Policy,
        base: Option<TableId>,
    ) -> Option<TableId> {
        let mut names = self
            .ad_hoc_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = names.get_mut(stored_as) {
            known.used = std::time::Instant::now();
            return Some(known.id);
        }
        let slot = names.len();
        let cell = self.ad_hoc.get(slot)?;
        let base_id = base;
        let base = base.map(|b| self.get(b));
        let config = PolicyConfig {
            name: name.to_owned(),
            policy,
            on_store_error: base.and_then(|b| b.on_store_error),
            on_state_loss: base.map_or(OnStateLoss::Full, |b| b.on_state_loss),
            max_keys: None,
            shadow: base.is_some_and(|b| b.shadow),
            penalty: base.and_then(|b| b.penalty),
            exempt: crate::addresses::AddressList::default(),
            grants: None,
        };
        let _ = cell.set(Entry::new(&config, stored_as.to_owned(), &self.store));
        let id = TableId(self.entries.len() + slot);
        let used = std::time::Instant::now();
        names.insert(
            stored_as.to_owned(),
            AdHoc {
                id,
                base: base_id,
                used,
            },
        );
        Some(id)
    }

    /// The limits requests named within `within`, to carry into a table
    /// that makes room for new ones; `None` when every slot is still taken
    /// by one of them (no room would be made).
    pub(crate) fn ad_hoc_recent(&self, within: std::time::Duration) -> Option<Vec<Named>> {
        let names = self
            .ad_hoc_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let recent: Vec<Named> = names
            .iter()
            .filter(|(_, a)| a.used.elapsed() < within)
            .map(|(stored_as, a)| {
                let entry = self.get(a.id);
                Named {
                    stored_as: stored_as.clone(),
                    name: entry.name.clone(),
                    policy: entry.policy,
                    base: a.base,
                }
            })
            .collect();
        (recent.len() < AD_HOC).then_some(recent)
    }

    /// Takes over the lease books of `previous`'s entries stored as these
    /// are (a reload): the leases they granted are still held, and still
    /// counted, whether the policy is as it was or its parameters changed
    /// (its leases carry over, `Policy::carry`).
    pub(crate) fn keep_books_of(&mut self, previous: &PolicyTable) {
        for entry in &mut self.entries {
            let Some(old) = previous
                .entries
                .iter()
                .find(|p| p.stored_as == entry.stored_as)
            else {
                continue;
            };
            let unchanged = old.policy == entry.policy;
            (entry.meters).keep_book_of(&old.meters, &entry.name, unchanged, &entry.policy);
        }
    }

    /// The policy a client named (the decision API, the admin endpoints).
    pub fn find(&self, name: &str) -> Option<TableId> {
        self.by_name.get(name).copied()
    }

    /// Every policy, with its id.
    pub fn iter(&self) -> impl Iterator<Item = (TableId, &Entry)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (TableId(i), e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A reload that leaves a concurrency policy as it was keeps its lease
    /// book (`weir_leases_in_use` does not drop to 0); one that changes it
    /// continues it, as its leases carry over.
    #[test]
    fn an_unchanged_policy_keeps_its_lease_book_across_a_reload() {
        let table = |limit: u32| {
            let text = format!(
                "[policies.jobs]\nalgorithm = \"concurrency\"\nlimit = {limit}\nlease = \"1m\"\n"
            );
            let config = crate::config::parse(&text, &Default::default()).unwrap();
            PolicyTable::new(&config.policies, &config.overrides, &config.store)
        };
        let book = |t: &PolicyTable| t.entries[0].meters.book().unwrap();
        let first = table(3);
        first.entries[0].meters.lease_taken(7);
        let mut same = table(3);
        same.keep_books_of(&first);
        assert!(std::sync::Arc::ptr_eq(&book(&first), &book(&same)));
        let mut changed = table(4);
        changed.keep_books_of(&first);
        assert!(!std::sync::Arc::ptr_eq(&book(&first), &book(&changed)));
        assert_eq!(
            book(&changed).open_leases(),
            1,
            "the lease taken is still counted"
        );
    }
}
