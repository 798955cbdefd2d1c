//! envoyproxy/ratelimit's configuration: one YAML file per domain, a tree of
//! `descriptors`, each node a `key` (and optionally a `value`, with `*`
//! wildcards) and perhaps a `rate_limit`. This crate loads such files,
//! validated as strictly as envoyproxy/ratelimit validates them (the same
//! errors, each naming its file and, where there is one, the descriptor),
//! and finds a request descriptor's limit by its rules to the letter:
//!
//! - at each level the entry's `key_value` is looked up first, then the
//!   wildcard values of that level in file order (`*` matches any run of
//!   characters, anywhere in the value), then the bare `key` (the default for
//!   any value);
//! - a limit applies only at the node reached by the request's **last**
//!   entry; a deeper or shallower request gets none;
//! - the walk stops where a node has no children or nothing matches (no
//!   backtracking to another branch);
//! - an unknown domain has no limits.
//!
//! Their windows are fixed and aligned to the unit since the Unix epoch
//! (`second` to `year`, a month 30 days and a year 365), the windows of
//! weir's `fixed-window`, so weir can decide their limits exactly.
//!
//! ```
//! use weir_envoy_ratelimit::{Found, Limits, Unit};
//!
//! let yaml = "
//! domain: shop
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: minute, requests_per_unit: 60 }
//!   - key: path
//!     value: /admin*
//!     rate_limit: { unit: second, requests_per_unit: 1 }
//! ";
//! let limits = Limits::load([("config/shop.yaml", yaml)], false)?;
//! let Found::Limit { limit, .. } = limits.find("shop", &[("path", "/admin/users")]) else {
//!     panic!("a wildcard limit");
//! };
//! assert_eq!((limit.requests_per_unit, limit.unit), (1, Some(Unit::Second)));
//! assert!(matches!(limits.find("shop", &[("path", "/cart")]), Found::None));
//! assert!(matches!(limits.find("other", &[("path", "/")]), Found::UnknownDomain));
//! # Ok::<(), weir_envoy_ratelimit::ConfigError>(())
//! ```

use std::collections::HashMap;

use serde_yaml::Value;
use thiserror::Error;

pub mod weir;

/// A `rate_limit` unit: a window of whole seconds, aligned to the Unix
/// epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year,
}

impl Unit {
    const ALL: [Self; 7] = [
        Self::Second,
        Self::Minute,
        Self::Hour,
        Self::Day,
        Self::Week,
        Self::Month,
        Self::Year,
    ];

    /// The unit named `text`, in any case (`minute`, `MINUTE`).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(text))
    }

    /// Its name, lower case.
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// The window, in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        }
    }
}

/// A node's `rate_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`; `None` only with `unlimited`.
    pub unit: Option<Unit>,
    /// `unlimited: true`: matched, and never limited.
    pub unlimited: bool,
    /// The node's `shadow_mode`: decided and counted, never refusing.
    pub shadow_mode: bool,
    /// `name`, if any.
    pub name: Option<String>,
    /// `replaces`: the names of the limits this one replaces when both
    /// apply to one request.
    pub replaces: Vec<String>,
    /// The node's `detailed_metric`.
    pub detailed_metric: bool,
    /// Its path as envoyproxy/ratelimit names it in stats:
    /// `domain.key_value.key`.
    pub path: String,
}

/// One node of a domain's tree.
#[derive(Debug)]
struct Node<T> {
    /// By `key_value`, or `key` alone for a default.
    children: HashMap<String, Node<T>>,
    /// The children whose `key_value` holds a `*`, in file order, split on
    /// it.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<T>,
    /// `share_threshold`: every value its wildcard matches counts as one.
    share_threshold: bool,
    /// Its `key`.
    key: String,
    /// Its place among its siblings, in file order.
    order: usize,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Self {
            children: HashMap::new(),
            wildcards: Vec::new(),
            limit: None,
            share_threshold: false,
            key: String::new(),
            order: 0,
        }
    }
}

/// Descriptor trees, one per domain, each node holding perhaps a `T`:
/// [`Limits`] for envoyproxy/ratelimit's files, or whatever another
/// configuration (weir's own rules) maps descriptors to.
#[derive(Debug)]
pub struct Tree<T> {
    domains: HashMap<String, Node<T>>,
}

impl<T> Default for Tree<T> {
    fn default() -> Self {
        Self {
            domains: HashMap::new(),
        }
    }
}

/// The limits of every domain, as envoyproxy/ratelimit's files give them.
pub type Limits = Tree<Limit>;

/// A configuration that cannot be loaded: the file, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file, as named when loaded.
    pub file: String,
    /// What is wrong, naming the descriptor (`domain.key_value.key`) where
    /// there is one.
    pub message: String,
}

/// What a request descriptor finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Found<'a, T = Limit> {
    /// The domain is not configured: no limit (`OK`), as theirs answers.
    UnknownDomain,
    /// No limit at the node its last entry reaches.
    None,
    /// This limit.
    Limit {
        /// The limit.
        limit: &'a T,
        /// Per entry, the wildcard value that stands for the entry's own in
        /// its counter's key (`share_threshold`): every value it matches
        /// shares one counter. Empty when none does.
        shared: Vec<Option<&'a str>>,
    },
}

/// The keys envoyproxy/ratelimit accepts anywhere in a file.
const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

impl Tree<Limit> {
    /// Loads `(file name, text)` pairs, one domain each; with
    /// `merge_domains` (their `MERGE_DOMAIN_CONFIG`), files of one domain
    /// add to it instead of being an error.
    pub fn load<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge_domains: bool,
    ) -> Result<Self, ConfigError> {
        let mut limits = Self::default();
        for (file, text) in files {
            let error = |message: String| ConfigError {
                file: file.to_owned(),
                message,
            };
            let root: Value = serde_yaml::from_str(text)
                .map_err(|e| error(format!("error loading config file: {e}")))?;
            let root = match root {
                Value::Mapping(_) => root,
                Value::Null => Value::Mapping(Default::default()),
                _ => return Err(error("the file is not a YAML mapping".into())),
            };
            validate_keys(&root).map_err(error)?;
            let domain = scalar(root.get("domain")).map_err(|e| error(format!("`domain`: {e}")))?;
            let domain = domain.unwrap_or_default();
            if domain.is_empty() {
                return Err(error("config file cannot have empty domain".into()));
            }
            if limits.domains.contains_key(&domain) && !merge_domains {
                return Err(error(format!("duplicate domain '{domain}' in config file")));
            }
            let node = limits.domains.entry(domain.clone()).or_default();
            let descriptors =
                list(root.get("descriptors")).map_err(|e| error(format!("`descriptors`: {e}")))?;
            node.load(&format!("{domain}."), descriptors)
                .map_err(error)?;
        }
        Ok(limits)
    }

    /// Every limit of every domain, with the path to its node
    /// (`(key, value)` pairs, a value `None` for a default) and whether
    /// each node of the path shares its wildcard's counter, in file order.
    pub fn limits(&self) -> Vec<Leaf<'_>> {
        let mut out = Vec::new();
        for (domain, node) in &self.domains {
            node.walk(domain, &mut Vec::new(), &mut out);
        }
        out
    }
}

/// A limit of [`Limits::limits`], where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf<'a> {
    /// Its domain.
    pub domain: &'a str,
    /// The path to its node: each step's key, value (`None` for the
    /// key's default) and `share_threshold`.
    pub path: Vec<(&'a str, Option<&'a str>, bool)>,
    /// The limit; `None` for a node without a `rate_limit` (no limit
    /// applies to what it matches, however a default or wildcard beside
    /// it is limited).
    pub limit: Option<&'a Limit>,
}

impl Node<Limit> {
    /// The limits under this node, in file order (`path`: the steps to it).
    fn walk<'a>(
        &'a self,
        domain: &'a str,
        path: &mut Vec<(&'a str, Option<&'a str>, bool)>,
        out: &mut Vec<Leaf<'a>>,
    ) {
        // Every node but the domain's root: one without a limit still
        // matches before a default or wildcard does.
        if self.limit.is_some() || !path.is_empty() {
            out.push(Leaf {
                domain,
                path: path.clone(),
                limit: self.limit.as_ref(),
            });
        }
        let mut children: Vec<(&String, &Node<Limit>)> = self.children.iter().collect();
        children.sort_by_key(|(_, child)| child.order);
        for (full, child) in children {
            let (key, value) = (child.key.as_str(), full.get(child.key.len() + 1..));
            path.push((key, value, child.share_threshold));
            child.walk(domain, path, out);
            path.pop();
        }
    }
}

impl<T> Tree<T> {
    /// The configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Adds `limit` at the node of `path` in `domain` (`(key, value)`
    /// steps, a value `None` for the key's default, `*` a wildcard), making
    /// the nodes on the way; `share_threshold` marks the path's wildcard
    /// steps as sharing one counter. An error when the node has one
    /// already (their duplicate composite key).
    pub fn insert(
        &mut self,
        domain: &str,
        path: &[(&str, Option<&str>)],
        limit: T,
        share_threshold: bool,
    ) -> Result<(), String> {
        let mut node = self.domains.entry(domain.to_owned()).or_default();
        let mut name = domain.to_owned();
        for &(key, value) in path {
            let full = match value {
                Some(v) if !v.is_empty() => format!("{key}_{v}"),
                _ => key.to_owned(),
            };
            name = format!("{name}.{full}");
            let order = node.children.len();
            if !node.children.contains_key(&full) && full.contains('*') {
                let parts = full.split('*').map(str::to_owned).collect();
                node.wildcards.push((full.clone(), parts));
            }
            node = node.children.entry(full).or_insert_with(|| Node {
                key: key.to_owned(),
                order,
                ..Node::default()
            });
            node.share_threshold |= share_threshold && value.is_some_and(|v| v.contains('*'));
        }
        if node.limit.is_some() {
            return Err(format!("duplicate descriptor composite key '{name}'"));
        }
        node.limit = Some(limit);
        Ok(())
    }

    /// The limit of a request descriptor's `(key, value)` entries in
    /// `domain` (its own `limit`, which bypasses the tree, is the caller's).
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Found<'_, T> {
        let Some(mut node) = self.domains.get(domain) else {
            return Found::UnknownDomain;
        };
        // Made only for a shared wildcard: most lookups allocate one key.
        let mut shared = Vec::new();
        let mut found = None;
        let mut full = String::new();
        for (i, &(key, value)) in entries.iter().enumerate() {
            full.clear();
            full.push_str(key);
            full.push('_');
            full.push_str(value);
            let mut next = node.children.get(&full);
            if next.is_none() {
                let wild = node
                    .wildcards
                    .iter()
                    .find(|(_, parts)| matches(parts, &full));
                if let Some((pattern, _)) = wild {
                    next = node.children.get(pattern);
                    if next.is_some_and(|n| n.share_threshold) {
                        shared.resize(entries.len(), None);
                        shared[i] = pattern.get(key.len() + 1..);
                    }
                }
            }
            let Some(child) = next.or_else(|| node.children.get(key)) else {
                break;
            };
            if i == entries.len() - 1 {
                found = child.limit.as_ref();
            }
            if child.children.is_empty() {
                break;
            }
            node = child;
        }
        match found {
            Some(limit) => Found::Limit { limit, shared },
            None => Found::None,
        }
    }
}

/// Whether `value` matches a pattern split on its `*`s: each `*` matches
/// any run of characters, none included.
fn matches(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Every mapping key in `value` is a string and one of [`VALID_KEYS`]; every
/// list holds mappings (`metadata` is free-form).
fn validate_keys(value: &Value) -> Result<(), String> {
    let Value::Mapping(map) = value else {
        return Ok(());
    };
    for (key, value) in map {
        let Value::String(key) = key else {
            return Err(format!(
                "config error, key is not of type string: {}",
                text(key)
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "config error, unknown key '{key}' (valid: {})",
                VALID_KEYS.join(", ")
            ));
        }
        if key == "metadata" {
            continue;
        }
        match value {
            Value::Sequence(items) => {
                for item in items {
                    if !matches!(item, Value::Mapping(_)) {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            text(item)
                        ));
                    }
                    validate_keys(item)?;
                }
            }
            Value::Mapping(_) => validate_keys(value)?,
            _ => {}
        }
    }
    Ok(())
}

/// A value as written, for an error.
fn text(value: &Value) -> String {
    serde_yaml::to_string(value)
        .map(|t| t.trim().to_owned())
        .unwrap_or_default()
}

/// A scalar field as text (numbers and booleans as written).
fn scalar(value: Option<&Value>) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(format!("expected a string, found {}", text(other))),
    }
}

fn flag(value: Option<&Value>) -> Result<bool, String> {
    match value {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("expected true or false, found {}", text(other))),
    }
}

fn list(value: Option<&Value>) -> Result<&[Value], String> {
    match value {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(other) => Err(format!("expected a list, found {}", text(other))),
    }
}

impl Node<Limit> {
    /// Adds `descriptors` under this node, whose path is `parent`.
    fn load(&mut self, parent: &str, descriptors: &[Value]) -> Result<(), String> {
        for descriptor in descriptors {
            let field = |name: &str| descriptor.get(name);
            let at = |name: &str, e: String| format!("descriptor under {parent}: `{name}`: {e}");
            let key = scalar(field("key"))
                .map_err(|e| at("key", e))?
                .unwrap_or_default();
            if key.is_empty() {
                return Err(format!("descriptor has empty key (under {parent})"));
            }
            let value = scalar(field("value"))
                .map_err(|e| at("value", e))?
                .unwrap_or_default();
            let full = match value.is_empty() {
                true => key.clone(),
                false => format!("{key}_{value}"),
            };
            let path = format!("{parent}{full}");
            if self.children.contains_key(&full) {
                return Err(format!("duplicate descriptor composite key '{path}'"));
            }
            let here = |name: &str, e: String| format!("descriptor {path}: `{name}`: {e}");
            let shadow_mode = flag(field("shadow_mode")).map_err(|e| here("shadow_mode", e))?;
            let detailed_metric =
                flag(field("detailed_metric")).map_err(|e| here("detailed_metric", e))?;
            let share_threshold =
                flag(field("share_threshold")).map_err(|e| here("share_threshold", e))?;
            let limit = match field("rate_limit") {
                None | Some(Value::Null) => None,
                Some(rate) => Some(Limit::load(rate, &path, shadow_mode, detailed_metric)?),
            };
            if share_threshold && !full.contains('*') {
                return Err(format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{full}'"
                ));
            }
            let mut child = Node {
                limit,
                share_threshold,
                key: key.clone(),
                order: self.children.len(),
                ..Node::default()
            };
            let descriptors = list(field("descriptors")).map_err(|e| here("descriptors", e))?;
            child.load(&format!("{path}."), descriptors)?;
            if full.contains('*') {
                let parts = full.split('*').map(str::to_owned).collect();
                self.wildcards.push((full.clone(), parts));
            }
            self.children.insert(full, child);
        }
        Ok(())
    }
}

impl Limit {
    fn load(
        rate: &Value,
        path: &str,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<Self, String> {
        let at = |name: &str, e: String| format!("descriptor {path}: rate_limit `{name}`: {e}");
        let unlimited = flag(rate.get("unlimited")).map_err(|e| at("unlimited", e))?;
        let unit_text = scalar(rate.get("unit")).map_err(|e| at("unit", e))?;
        let unit = unit_text.as_deref().and_then(Unit::parse);
        match (unlimited, unit, &unit_text) {
            (true, Some(_), _) => {
                return Err(format!(
                    "descriptor {path}: should not specify rate limit unit when unlimited"
                ));
            }
            (false, None, written) => {
                return Err(format!(
                    "descriptor {path}: invalid rate limit unit '{}' (valid: second, minute, hour, day, week, month, year)",
                    written.as_deref().unwrap_or_default()
                ));
            }
            _ => {}
        }
        let requests_per_unit = match rate.get("requests_per_unit") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => {
                n.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        at(
                            "requests_per_unit",
                            format!("{n} is not a whole number of at most 4294967295"),
                        )
                    })?
            }
            Some(other) => {
                return Err(at(
                    "requests_per_unit",
                    format!("expected a whole number, found {}", text(other)),
                ));
            }
        };
        let name = scalar(rate.get("name")).map_err(|e| at("name", e))?;
        let mut replaces = Vec::new();
        for item in list(rate.get("replaces")).map_err(|e| at("replaces", e))? {
            let replaced = scalar(item.get("name")).map_err(|e| at("replaces", e))?;
            match replaced {
                Some(n) if !n.is_empty() && Some(&n) == name.as_ref() => {
                    return Err(format!(
                        "descriptor {path}: replaces should not contain name of same descriptor"
                    ));
                }
                Some(n) if !n.is_empty() => replaces.push(n),
                _ => {
                    return Err(format!(
                        "descriptor {path}: should not have an empty replaces entry"
                    ));
                }
            }
        }
        Ok(Self {
            requests_per_unit,
            unit,
            unlimited,
            shadow_mode,
            name: name.filter(|n| !n.is_empty()),
            replaces,
            detailed_metric,
            path: path.to_owned(),
        })
    }
}

/// The config files under `dir`, as envoyproxy/ratelimit's runtime reads
/// them: every regular file in it and in its subdirectories (dotfiles and
/// dot-directories skipped with `ignore_dotfiles`), named by their path
/// relative to `dir`'s parent, in path order.
pub fn read_dir(
    dir: &std::path::Path,
    ignore_dotfiles: bool,
) -> std::io::Result<Vec<(String, String)>> {
    fn walk(
        dir: &std::path::Path,
        ignore_dotfiles: bool,
        out: &mut Vec<std::path::PathBuf>,
    ) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let dotted = entry.file_name().to_string_lossy().starts_with('.');
            if dotted && ignore_dotfiles {
                continue;
            }
            let path = entry.path();
            // Through symlinks, as the runtime's swap is one.
            let meta = std::fs::metadata(&path)?;
            if meta.is_dir() {
                walk(&path, ignore_dotfiles, out)?;
            } else if meta.is_file() {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut paths = Vec::new();
    walk(dir, ignore_dotfiles, &mut paths)?;
    paths.sort();
    let base = dir.parent().unwrap_or(dir);
    paths
        .into_iter()
        .map(|path| {
            let name = path
                .strip_prefix(base)
                .unwrap_or(&path)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Ok((name, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_as_theirs() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        for (pattern, value, hit) in [
            ("k_foo*", "k_foo1", true),
            ("k_foo*", "k_foo", true),
            ("k_foo*", "k_bar", false),
            ("k_bar*b", "k_barab", true),
            ("k_bar*b", "k_barb", true),
            ("k_bar*b", "k_bara", false),
            ("k_bar*b", "k_xbarb", false),
            ("k_foo*bar*baz", "k_foo123bar456baz", true),
            ("k_foo*bar*baz", "k_foobarbaz", true),
            ("k_foo*bar*baz", "k_foo123baz", false),
            ("k_aa*aa", "k_aaa", false),
            ("k_plain", "k_plain", true),
        ] {
            assert_eq!(matches(&parts(pattern), value), hit, "{pattern} {value}");
        }
    }
}
