//! What the faces share: one configuration ready to serve — the config, its
//! policy table, the backend, the upstream client and the metrics — swapped
//! whole on reload.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use weir_core::{Policy, Rate};
use weir_limiter::Limiter;

use crate::backend::Backend;
use crate::config::{Config, StoreUrl, TableId};
use crate::metrics::Meters;
use crate::reload::{Reloaded, Source, UNCHANGED, changes, record};
use crate::table::PolicyTable;

/// One configuration, ready to serve.
#[derive(Debug)]
pub struct Shared {
    /// The validated config.
    pub config: Config,
    /// Its policies, resolved.
    pub table: PolicyTable,
    /// Limits managed by API: kept from one configuration to the next.
    pub limits: Arc<crate::limits::Limits>,
    /// Fleet grants served in process: kept from one configuration to the next.
    pub grants: Arc<crate::grants::Grants>,
    /// Where decisions are made.
    pub backend: Backend,
    pub(crate) meters: Meters,
    /// `[server] new_keys_per_ip`: new keys each client address may create.
    pub(crate) new_keys: Option<Arc<Limiter>>,
    /// The fingerprint of the configuration's text (0: not from a file).
    pub hash: u64,
}

impl Shared {
    /// Builds what `config` needs, keeping from `previous` the Redis
    /// connection and the keys of every unchanged policy. With Redis, call
    /// it within a tokio runtime: the connection is made (and probed when
    /// down) by a task of that runtime.
    pub fn new(config: Config, previous: Option<&Shared>) -> Result<Self, weir_limiter::Error> {
        let meters = Meters::new(match config.store.url {
            StoreUrl::Memory => "memory",
            StoreUrl::Redis(_) => "redis",
        });
        let mut table = PolicyTable::new(&config.policies, &config.overrides, &config.store)
            .with_near_limit(config.server.near_limit_ratio)
            .with_plans(&config.plans);
        if let Some(previous) = previous {
            table.keep_books_of(&previous.table);
        }
        let backend = Backend::new(&config, &table, previous.map(|p| &p.backend))?;
        let new_keys = match config.server.new_keys_per_ip {
            None => None,
            Some(n) => {
                let rate = Rate::per_second(u64::from(n)).ok_or_else(|| {
                    weir_limiter::Error::Config("new_keys_per_ip must be at least 1".into())
                })?;
                let policy = Policy::token_bucket(u64::from(n), rate)
                    .map_err(|e| weir_limiter::Error::Config(e.to_string()))?;
                Some(Arc::new(
                    Limiter::builder()
                        .policy(NEW_KEYS, policy)
                        .max_keys(NEW_KEY_CLIENTS)
                        .policy_max_keys(NEW_KEYS, NEW_KEY_CLIENTS)
                        .build()?,
                ))
            }
        };
        Ok(Self {
            meters,
            limits: previous.map(|p| p.limits.clone()).unwrap_or_default(),
            grants: previous.map(|p| p.grants.clone()).unwrap_or_default(),
            config,
            table,
            backend,
            new_keys,
            hash: 0,
        })
    }
}

impl Shared {
    /// Resolves a request's policies for its identities (API-managed
    /// limits, plans, file overrides), each identity's records read once.
    pub fn resolver(&self) -> crate::limits::Resolver<'_> {
        crate::limits::Resolver::new(&self.limits, &self.table)
    }

    /// The entry that decides `identity` (as sent) under `policy`.
    pub fn resolve(&self, policy: TableId, identity: &str) -> TableId {
        self.resolver().resolve(policy, identity)
    }
}

/// The policy of `new_keys_per_ip`: new keys per client address.
pub(crate) const NEW_KEYS: &str = "new-keys";

/// Client addresses tracked by `new_keys_per_ip` at once.
const NEW_KEY_CLIENTS: usize = 100_000;

/// Failed admin attempts a client may make in [`ADMIN_WINDOW`].
pub const ADMIN_FAILURES: u32 = 5;
/// The window failed admin attempts are counted in.
pub const ADMIN_WINDOW: Duration = Duration::from_secs(60);
/// Clients tracked for failed admin attempts (more: those not throttled
/// are dropped).
const ADMIN_TRACKED: usize = 10_000;

/// The server's state: the current configuration, the metrics handle, and
/// failed admin attempts per client.
#[derive(Debug)]
pub struct AppState {
    current: ArcSwap<Shared>,
    pub(crate) metrics: PrometheusHandle,
    admin_failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
    /// Where the configuration is read again from on reload.
    pub(crate) source: Source,
    /// What the last reload logged (an outcome is logged once).
    pub(crate) last_reload: Mutex<String>,
    /// The dashboard's counts of the last minutes.
    pub(crate) history: crate::live::History,
}

impl AppState {
    /// The state for `shared`.
    /// Within a tokio runtime, a task follows the limits managed by API
    /// on a shared store (`limits_feed.rs`) as long as the state lives.
    pub fn new(shared: Shared) -> Arc<Self> {
        Self::following(Self {
            current: ArcSwap::from_pointee(shared),
            metrics: crate::metrics::handle(),
            admin_failures: Mutex::default(),
            source: Source::default(),
            last_reload: Mutex::default(),
            history: crate::live::History::default(),
        })
    }

    /// `state`, with the task that follows its limits managed by API when
    /// within a tokio runtime.
    fn following(state: Self) -> Arc<Self> {
        let state = Arc::new(state);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&state);
            runtime.spawn(crate::limits_feed::follow(Box::new(move || {
                let shared = weak.upgrade()?.current();
                Some((shared.limits.clone(), shared.backend.remote().cloned()))
            })));
        }
        state
    }

    /// The state for the configuration `source` holds, which reloads read
    /// again (the file watcher, SIGHUP, `POST /v1/admin/reload`).
    pub fn from_source(source: Source) -> Result<Arc<Self>, String> {
        let (config, hash) = source.load()?;
        let mut shared = Shared::new(config, None).map_err(|e| e.to_string())?;
        shared.hash = hash;
        crate::reload::record(&Ok(crate::reload::Reloaded::Applied), Some((hash, hash)));
        Ok(Self::following(Self {
            current: ArcSwap::from_pointee(shared),
            metrics: crate::metrics::handle(),
            admin_failures: Mutex::default(),
            source,
            // Served as read: an event that finds it so is not news.
            last_reload: Mutex::new(crate::reload::UNCHANGED.to_owned()),
            history: crate::live::History::default(),
        }))
    }

    /// How long `ip` must wait before trying the admin token again, if it
    /// failed too often.
    pub(crate) fn admin_locked(&self, ip: IpAddr) -> Option<Duration> {
        let failures = self
            .admin_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let &(count, since) = failures.get(&ip)?;
        let left = ADMIN_WINDOW.checked_sub(since.elapsed())?;
        (count >= ADMIN_FAILURES).then_some(left)
    }

    /// Notes one failed admin attempt from `ip`.
    pub(crate) fn admin_failed(&self, ip: IpAddr) {
        metrics::counter!(crate::metrics::ADMIN_AUTH_FAILURES).increment(1);
        let mut failures = self
            .admin_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Full: the expired go first, then those not throttled; a
        // throttled address is never forgotten because others filled the
        // table. Full of throttled addresses, a new one goes untracked (an
        // attacker with that many addresses has as many tries either way).
        if failures.len() >= ADMIN_TRACKED && !failures.contains_key(&ip) {
            failures.retain(|_, (_, since)| since.elapsed() < ADMIN_WINDOW);
            if failures.len() >= ADMIN_TRACKED {
                failures.retain(|_, (count, _)| *count >= ADMIN_FAILURES);
            }
            if failures.len() >= ADMIN_TRACKED {
                return;
            }
        }
        let entry = failures.entry(ip).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= ADMIN_WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }

    /// The configuration file reloads read, if it is one.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.source.path.as_deref()
    }

    /// The metrics, in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        crate::metrics::process().collect();
        let shared = self.current();
        metrics::gauge!(crate::metrics::KEYS).set(shared.backend.local().len() as f64);
        metrics::gauge!(crate::metrics::MAX_KEYS).set(shared.config.store.max_keys as f64);
        for (_, entry) in shared.table.iter() {
            entry.meters.sweep_leases();
        }
        self.metrics.render()
    }

    /// Makes room for limits requests name (Envoy's per-descriptor
    /// `limit`) when the table `seen` holds its most of them: serves from
    /// now on the same configuration with a table that keeps the limits
    /// named within [`crate::table::AD_HOC_RECENT`] (with their keys) and
    /// lets the others go, as a least-recently-used cache would. The old
    /// table lives on until the requests that use it end. False when every
    /// limit was named that recently (no room can be made: the request is
    /// refused as `RESOURCE_EXHAUSTED`, for a minute at most).
    pub(crate) fn make_room(&self, seen: &Arc<Shared>) -> bool {
        self.make_room_within(seen, crate::table::AD_HOC_RECENT)
    }

    /// [`AppState::make_room`], keeping the limits named within `within`.
    pub(crate) fn make_room_within(&self, seen: &Arc<Shared>, within: Duration) -> bool {
        let current = self.current();
        if !Arc::ptr_eq(&current, seen) {
            // Reloaded, or room made by another request, since.
            return true;
        }
        let Some(recent) = current.table.ad_hoc_recent(within) else {
            return false;
        };
        let mut next = match Shared::new(current.config.clone(), Some(&current)) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "cannot make room for new descriptor limits");
                return false;
            }
        };
        next.hash = current.hash;
        next.new_keys = current.new_keys.clone();
        let (limiter, previous) = (&next.backend.local(), &current.backend.local());
        for named in &recent {
            let kept = next
                .table
                .ad_hoc(&named.stored_as, &named.name, named.policy, named.base);
            if kept.is_some() {
                limiter.adopt_ad_hoc(&named.stored_as, previous);
            }
        }
        tracing::info!(
            kept = recent.len(),
            "descriptor limits: room made for new ones; those unused for a minute let go"
        );
        let _ = self.current.compare_and_swap(&current, Arc::new(next));
        true
    }

    /// The configuration being served.
    pub fn current(&self) -> Arc<Shared> {
        self.current.load_full()
    }

    /// Serves `config` (whose text has fingerprint `hash`) from now on:
    /// requests in flight finish on the old one; unchanged policies keep
    /// their keys.
    pub fn reload(&self, config: Config, hash: u64) -> Result<(), weir_limiter::Error> {
        let mut next = Shared::new(config, Some(&self.current()))?;
        next.hash = hash;
        self.current.store(Arc::new(next));
        Ok(())
    }
}

impl AppState {
    /// Reads the source again and serves it if it is valid and changed.
    /// Logged once per distinct outcome: a file that stays broken (or
    /// missing) while the watcher fires is one error line, and the next
    /// success — or the file restored as it was — is one line more.
    pub fn reload_from_source(&self) -> Result<Reloaded, String> {
        let loaded = self.source.load();
        let mut changed = String::new();
        let outcome = loaded.and_then(|(config, hash)| {
            let old = self.current().hash;
            if hash == old {
                return Ok((Reloaded::Unchanged, None));
            }
            let listen = self.current().config.server.listen;
            if config.server.listen != listen {
                tracing::warn!(old = %listen, new = %config.server.listen, "a new listen address needs a restart");
            }
            changed = changes(&self.current().config, &config);
            self.reload(config, hash).map_err(|e| e.to_string())?;
            Ok((Reloaded::Applied, Some((old, hash))))
        });
        let result = outcome
            .as_ref()
            .map(|(r, _)| r.clone())
            .map_err(Clone::clone);
        record(&result, outcome.ok().and_then(|(_, h)| h));
        let said = match &result {
            Ok(Reloaded::Applied) => format!("applied: {changed}"),
            Ok(Reloaded::Unchanged) => UNCHANGED.to_owned(),
            Err(e) => e.clone(),
        };
        let mut last = self
            .last_reload
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last == said && !matches!(result, Ok(Reloaded::Applied)) {
            return result;
        }
        let file = match (&self.source.generated, &self.source.path) {
            (Some(_), _) => "the generated configuration".into(),
            (None, Some(p)) => p.display().to_string(),
            (None, None) => "the example config".into(),
        };
        match &result {
            Ok(Reloaded::Applied) => {
                tracing::info!(%file, changes = %changed, "configuration reloaded")
            }
            Ok(Reloaded::Unchanged) => {
                tracing::info!(%file, "configuration unchanged: the one served")
            }
            Err(e) => {
                tracing::error!(errors = %e, "reload rejected; the old configuration keeps serving")
            }
        }
        // Once applied, the file is the one served: the watcher's next
        // event that finds it so is not news.
        *last = match &result {
            Ok(Reloaded::Applied) => UNCHANGED.to_owned(),
            _ => said,
        };
        result
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_throttled_address_outlives_a_full_table() {
        let text = "[policies.api]\nalgorithm = \"gcra\"\nburst = 5\nrate = \"1/s\"\n";
        let config = crate::config::parse(text, &Default::default()).unwrap();
        let state = AppState::new(Shared::new(config, None).unwrap());
        let throttled = IpAddr::from([192, 0, 2, 1]);
        for _ in 0..ADMIN_FAILURES {
            state.admin_failed(throttled);
        }
        assert!(state.admin_locked(throttled).is_some());
        for i in 0..=ADMIN_TRACKED as u32 {
            state.admin_failed(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        }
        assert!(state.admin_locked(throttled).is_some());
    }
}
