//! Limits managed by API: per-key settings (`PUT /v1/limits/{policy}/{key}`)
//! and plans (`PUT /v1/keys/{key}/plan`), each a [`Record`] with who set
//! it, why, and until when. They outlive a reload (the registry is handed
//! from one configuration to the next) and, on Redis, are shared by every
//! weir (see `limits_feed.rs`).
//!
//! Which entry decides a key under a policy, first match wins: its per-key
//! setting (while not expired), its plan's setting for the policy (while
//! the plan is not expired), the file's `[[overrides]]`, the policy. A
//! request reads a key's records once ([`Resolver`]), so a plan changed
//! meanwhile changes all of its policies at once or none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use serde_json::{Map, Value, json};

use crate::config::{Setting, TableId};
use crate::table::PolicyTable;

/// The most records (per-key settings and plans) the registry holds.
pub const MAX_LIMITS: usize = 2_000_000;

/// One setting, with who set it, why, when, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<T> {
    /// The setting (or the plan's name).
    pub value: T,
    /// The second it ends (Unix time); none: until removed.
    pub expires_at: Option<i64>,
    /// Why, as the admin said.
    pub reason: Box<str>,
    /// The admin token's name.
    pub by: Box<str>,
    /// When it was set (Unix time).
    pub at: i64,
}

impl<T> Record<T> {
    /// In force at `now` (Unix seconds): until the second `expires_at`.
    pub fn live(&self, now: i64) -> bool {
        self.expires_at.is_none_or(|end| now < end)
    }

    fn meta(&self, out: &mut Map<String, Value>) {
        if let Some(end) = self.expires_at {
            out.insert("expires_at".into(), time(end).into());
        }
        out.insert("reason".into(), self.reason.as_ref().into());
        out.insert("set_by".into(), self.by.as_ref().into());
        out.insert("set_at".into(), time(self.at).into());
    }

    /// Reads the fields [`Record::meta`] writes, with `value`.
    fn read_meta(value: T, map: &Map<String, Value>) -> Option<Self> {
        let text = |name: &str| map.get(name).and_then(Value::as_str).unwrap_or_default();
        let at = |name: &str| map.get(name).and_then(Value::as_str).and_then(unix);
        Some(Self {
            value,
            expires_at: match map.get("expires_at") {
                None => None,
                Some(_) => Some(at("expires_at")?),
            },
            reason: text("reason").into(),
            by: text("set_by").into(),
            at: at("set_at").unwrap_or(0),
        })
    }
}

/// `at` (Unix seconds) in RFC 3339.
pub fn time(at: i64) -> String {
    jiff::Timestamp::from_second(at).map_or_else(|_| at.to_string(), |t| t.to_string())
}

/// An RFC 3339 time in Unix seconds (rounded down).
pub fn unix(text: &str) -> Option<i64> {
    text.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// The seconds since the Unix epoch now.
pub fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Everything set for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Its plan.
    pub plan: Option<Record<Box<str>>>,
    /// Its per-key settings: policy, setting (with its canonical text).
    pub settings: Vec<(Box<str>, Record<Setting>, Box<str>)>,
}

impl KeyLimits {
    fn is_empty(&self) -> bool {
        self.plan.is_none() && self.settings.is_empty()
    }

    /// The entry that decides `policy` for this key at `now`, if one of
    /// its records applies.
    fn entry(&self, table: &PolicyTable, policy: TableId, now: i64) -> Option<TableId> {
        let name = table.get(policy).name.as_str();
        let set = (self.settings.iter()).find(|(p, r, _)| p.as_ref() == name && r.live(now));
        if let Some((_, record, canonical)) = set {
            return table.managed(policy, canonical, &record.value);
        }
        let plan = self.plan.as_ref().filter(|p| p.live(now))?;
        table.plan_entry(&plan.value, policy)
    }

    fn expires(&self) -> bool {
        let plan = self.plan.iter().any(|p| p.expires_at.is_some());
        plan || self.settings.iter().any(|(_, r, _)| r.expires_at.is_some())
    }
}

/// A change to the registry (from the API, or read from the shared store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `key`'s setting under `policy`: set, or removed (`None`).
    Setting {
        /// The policy's name.
        policy: String,
        /// The identity, as clients send it.
        key: String,
        /// The new record.
        record: Option<Record<Setting>>,
    },
    /// `key`'s plan: set, or removed.
    Plan {
        /// The identity.
        key: String,
        /// The new record.
        record: Option<Record<Box<str>>>,
    },
}

impl Change {
    /// The shared store's field for what this changes: `s:POLICY:KEY` or
    /// `p:KEY` (a policy's name has no `:`).
    pub fn field(&self) -> String {
        match self {
            Self::Setting { policy, key, .. } => format!("s:{policy}:{key}"),
            Self::Plan { key, .. } => format!("p:{key}"),
        }
    }

    /// The new record as the shared store keeps it (`None`: removed).
    pub fn stored(&self) -> Option<String> {
        Some(self.shown()?.to_string())
    }

    /// The new record as the API shows it.
    pub fn shown(&self) -> Option<Value> {
        let mut out = Map::new();
        match self {
            Self::Setting {
                policy,
                key,
                record,
            } => {
                let record = record.as_ref()?;
                out.insert("policy".into(), policy.as_str().into());
                out.insert("key".into(), key.as_str().into());
                out.extend(record.value.to_json());
                record.meta(&mut out);
            }
            Self::Plan { key, record } => {
                let record = record.as_ref()?;
                out.insert("key".into(), key.as_str().into());
                out.insert("plan".into(), record.value.as_ref().into());
                record.meta(&mut out);
            }
        }
        Some(Value::Object(out))
    }

    /// The change a shared store's field and value (empty: removed) make.
    pub fn from_stored(field: &str, value: &str) -> Option<Self> {
        let map = match value {
            "" => None,
            _ => match serde_json::from_str::<Value>(value).ok()? {
                Value::Object(map) => Some(map),
                _ => return None,
            },
        };
        if let Some(key) = field.strip_prefix("p:") {
            let record = match map {
                None => None,
                Some(map) => {
                    let plan = map.get("plan").and_then(Value::as_str)?;
                    Some(Record::read_meta(plan.into(), &map)?)
                }
            };
            return Some(Self::Plan {
                key: key.to_owned(),
                record,
            });
        }
        let (policy, key) = field.strip_prefix("s:")?.split_once(':')?;
        let record = match map {
            None => None,
            Some(map) => {
                let fields = map
                    .iter()
                    .filter(|(k, _)| !META.contains(&k.as_str()))
                    .map(|(k, v)| Some((k.as_str(), scalar(v)?)))
                    .collect::<Option<Vec<_>>>()?;
                Some(Record::read_meta(Setting::read(fields).ok()?, &map)?)
            }
        };
        Some(Self::Setting {
            policy: policy.to_owned(),
            key: key.to_owned(),
            record,
        })
    }
}

/// The fields of a record that are not its setting.
pub const META: [&str; 6] = ["policy", "key", "expires_at", "reason", "set_by", "set_at"];

/// A JSON scalar as the text a setting reads.
pub fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Every key's records.
#[derive(Debug, Default)]
pub struct Limits {
    /// How many keys have records: 0 skips every lookup.
    len: AtomicUsize,
    keys: RwLock<HashMap<Box<str>, Arc<KeyLimits>>>,
}

/// Why a change was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{MAX_LIMITS} keys have limits set already: remove some first")]
pub struct Full;

impl Limits {
    /// Whether no key has a record.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// How many keys have records.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// `key`'s records.
    pub fn get(&self, key: &str) -> Option<Arc<KeyLimits>> {
        if self.is_empty() {
            return None;
        }
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        keys.get(key).cloned()
    }

    /// Makes `change`; the record it replaced, as the API shows it.
    pub fn apply(&self, change: &Change) -> Result<Option<Value>, Full> {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        let key = match change {
            Change::Setting { key, .. } | Change::Plan { key, .. } => key.as_str(),
        };
        let old = keys.get(key).cloned();
        if old.is_none() && keys.len() >= MAX_LIMITS {
            return Err(Full);
        }
        let mut limits = old.as_deref().cloned().unwrap_or_default();
        let before = match change {
            Change::Setting {
                policy,
                key,
                record,
            } => {
                let at = (limits.settings.iter()).position(|(p, _, _)| p.as_ref() == policy);
                let before = at.map(|i| limits.settings.remove(i).1);
                if let Some(record) = record {
                    let canonical = record.value.canonical().into();
                    limits
                        .settings
                        .push((policy.as_str().into(), record.clone(), canonical));
                }
                before.and_then(|b| {
                    let change = Change::Setting {
                        policy: policy.clone(),
                        key: key.clone(),
                        record: Some(b),
                    };
                    change.shown()
                })
            }
            Change::Plan { key, record } => {
                let before = std::mem::replace(&mut limits.plan, record.clone());
                before.and_then(|b| {
                    let change = Change::Plan {
                        key: key.clone(),
                        record: Some(b),
                    };
                    change.shown()
                })
            }
        };
        if limits.is_empty() {
            keys.remove(key);
        } else {
            keys.insert(key.into(), Arc::new(limits));
        }
        self.len.store(keys.len(), Ordering::Release);
        Ok(before)
    }

    /// Holds `other`'s records instead of its own, at once (the shared
    /// store's, loaded again).
    pub fn replace_with(&self, other: Self) {
        let fresh = other
            .keys
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        *keys = fresh;
        self.len.store(keys.len(), Ordering::Release);
    }

    /// A page of records whose key starts with `prefix` and comes after
    /// `after`, in key order, under `policy` when one is named (plans when
    /// `plans`); at most `limit`, and whether more follow.
    pub fn list(&self, filter: &Filter<'_>, limit: usize) -> (Vec<Value>, bool) {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        let mut found: Vec<(&str, &KeyLimits)> = keys
            .iter()
            .filter(|(k, _)| {
                k.starts_with(filter.prefix) && filter.after.is_none_or(|a| k.as_ref() > a)
            })
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .collect();
        let more = found.len() > limit;
        if more {
            found.select_nth_unstable_by(limit, |a, b| a.0.cmp(b.0));
            found.truncate(limit);
        }
        found.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let shown = found
            .into_iter()
            .flat_map(|(key, limits)| filter.shown(key, limits))
            .collect();
        (shown, more)
    }
}

/// Which records [`Limits::list`] shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    /// Keys starting with this.
    pub prefix: &'a str,
    /// Keys after this one (the previous page's last).
    pub after: Option<&'a str>,
    /// Only this policy's settings.
    pub policy: Option<&'a str>,
    /// Only plans.
    pub plans: bool,
}

impl Filter<'_> {
    /// The records of `key` this filter shows.
    pub fn shown(&self, key: &str, limits: &KeyLimits) -> Vec<Value> {
        let mut shown = Vec::new();
        if self.policy.is_none() {
            if let Some(plan) = &limits.plan {
                let change = Change::Plan {
                    key: key.to_owned(),
                    record: Some(plan.clone()),
                };
                shown.extend(change.shown());
            }
        }
        if self.plans {
            return shown;
        }
        for (policy, record, _) in &limits.settings {
            if self.policy.is_some_and(|p| p != policy.as_ref()) {
                continue;
            }
            let change = Change::Setting {
                policy: policy.to_string(),
                key: key.to_owned(),
                record: Some(record.clone()),
            };
            shown.extend(change.shown());
        }
        shown
    }
}

/// Resolves a request's policies for its identities: each identity's
/// records read once (one lookup, skipped when no key has any), so that a
/// request sees a key's plan as it was or as it is, never half of each.
#[derive(Debug)]
pub struct Resolver<'a> {
    limits: &'a Limits,
    table: &'a PolicyTable,
    last: Option<(String, Option<Arc<KeyLimits>>)>,
    now: Option<i64>,
}

impl<'a> Resolver<'a> {
    /// A resolver over `limits` and `table`.
    pub fn new(limits: &'a Limits, table: &'a PolicyTable) -> Self {
        Self {
            limits,
            table,
            last: None,
            now: None,
        }
    }

    /// The entry that decides `identity` (as the client sent it) under
    /// `policy`: its records', its file override's, or the policy's own.
    pub fn resolve(&mut self, policy: TableId, identity: &str) -> TableId {
        if self.limits.is_empty() {
            return self.table.resolve(policy, identity);
        }
        if self.last.as_ref().is_none_or(|(k, _)| k != identity) {
            self.last = Some((identity.to_owned(), self.limits.get(identity)));
        }
        let managed = self.last.as_ref().and_then(|(_, l)| l.clone());
        let found = managed.and_then(|limits| {
            let now = match limits.expires() {
                true => *self.now.get_or_insert_with(now),
                false => i64::MIN,
            };
            limits.entry(self.table, policy, now)
        });
        found.unwrap_or_else(|| self.table.resolve(policy, identity))
    }

    /// What decides `identity` under `policy`, as `GET /v1/explain` says
    /// it: the per-key setting or plan in force, if any.
    pub fn applied(&mut self, policy: TableId, identity: &str) -> Option<Value> {
        let limits = self.limits.get(identity)?;
        let now = now();
        let name = self.table.get(policy).name.as_str();
        let set = (limits.settings.iter()).find(|(p, r, _)| p.as_ref() == name && r.live(now));
        if let Some((policy, record, _)) = set {
            let change = Change::Setting {
                policy: policy.to_string(),
                key: identity.to_owned(),
                record: Some(record.clone()),
            };
            return change.shown().map(|s| json!({ "limit": s }));
        }
        let plan = limits.plan.as_ref().filter(|p| p.live(now))?;
        self.table.plan_entry(&plan.value, policy)?;
        let change = Change::Plan {
            key: identity.to_owned(),
            record: Some(plan.clone()),
        };
        change.shown().map(|s| json!({ "plan": s }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record<T>(value: T, expires_at: Option<i64>) -> Record<T> {
        Record {
            value,
            expires_at,
            reason: "test".into(),
            by: "admin".into(),
            at: 1_800_000_000,
        }
    }

    /// What the shared store keeps reads back as the same change.
    #[test]
    fn changes_read_back_as_stored() {
        let setting = Setting::read([("limit", "20".to_owned())]).unwrap();
        let changes = [
            Change::Setting {
                policy: "monthly".into(),
                key: "acme:1".into(),
                record: Some(record(setting, Some(1_900_000_000))),
            },
            Change::Setting {
                policy: "monthly".into(),
                key: "acme".into(),
                record: None,
            },
            Change::Plan {
                key: "acme".into(),
                record: Some(record("pro".into(), None)),
            },
        ];
        for change in changes {
            let value = change.stored().unwrap_or_default();
            assert_eq!(Change::from_stored(&change.field(), &value), Some(change));
        }
    }

    #[test]
    fn a_page_is_in_key_order_and_says_when_more_follow() {
        let limits = Limits::default();
        for key in ["b", "a", "c", "ab"] {
            let change = Change::Plan {
                key: key.into(),
                record: Some(record("pro".into(), None)),
            };
            limits.apply(&change).unwrap();
        }
        let keys = |(page, more): (Vec<Value>, bool)| {
            let keys: Vec<String> = page
                .iter()
                .map(|v| v["key"].as_str().unwrap().to_owned())
                .collect();
            (keys, more)
        };
        let all = Filter::default();
        assert_eq!(
            keys(limits.list(&all, 2)),
            (vec!["a".into(), "ab".into()], true)
        );
        let next = Filter {
            after: Some("ab"),
            ..all
        };
        assert_eq!(
            keys(limits.list(&next, 2)),
            (vec!["b".into(), "c".into()], false)
        );
        let prefixed = Filter { prefix: "a", ..all };
        assert_eq!(
            keys(limits.list(&prefixed, 10)),
            (vec!["a".into(), "ab".into()], false)
        );
        let removed = Change::Plan {
            key: "a".into(),
            record: None,
        };
        assert!(limits.apply(&removed).unwrap().is_some());
        assert_eq!(limits.len(), 3);
    }
}
