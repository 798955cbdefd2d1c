//! envoyproxy/ratelimit's limits as weir's configuration: a fixed-window
//! policy per limit and a `[[descriptors]]` rule per node (one without a
//! limit exempts what it matches). The
//! rules form the same tree, matched the same way, so the configuration
//! decides every descriptor as the files do; `weir config import
//! envoy-ratelimit` prints it, and `weir envoy-ratelimit` serves it.

use std::collections::HashSet;
use std::fmt::Write as _;

use crate::{Limits, Unit};

/// Options of the translation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Every limit in shadow mode (their `SHADOW_MODE`).
    pub shadow: bool,
}

/// The policies and rules of `limits` as weir TOML (no `[server]` or
/// `[store]`): a policy per limit, named by [`policy_name`] (made unique),
/// and a rule per node — `unlimited = true` for theirs, `refuse = true` for
/// a `requests_per_unit` of 0, `no_limit = true` for a node without a
/// `rate_limit`.
pub fn to_toml(limits: &Limits, options: Options) -> String {
    let leaves = limits.limits();
    let mut out = String::new();
    let mut rules = String::new();
    let mut names = HashSet::new();
    for leaf in &leaves {
        let entries: Vec<String> = leaf
            .path
            .iter()
            .map(|(key, value, _)| match value {
                Some(v) => quote(&format!("{key}={v}")),
                None => quote(key),
            })
            .collect();
        let _ = writeln!(rules, "\n[[descriptors]]");
        let _ = writeln!(rules, "domain = {}", quote(leaf.domain));
        let _ = writeln!(rules, "entries = [{}]", entries.join(", "));
        let Some(limit) = leaf.limit else {
            // A node without a limit: what it matches is exempt.
            let _ = writeln!(rules, "no_limit = true");
            continue;
        };
        match (limit.unlimited, limit.unit) {
            (true, _) => {
                let _ = writeln!(rules, "unlimited = true");
            }
            (false, Some(unit)) if limit.requests_per_unit > 0 => {
                let name = unique_name(limit, &mut names);
                let _ = writeln!(out, "\n# {}", limit.path);
                let _ = writeln!(out, "[policies.{name}]");
                let _ = writeln!(out, "algorithm = \"fixed-window\"");
                let _ = writeln!(out, "limit = {}", limit.requests_per_unit);
                let _ = writeln!(out, "window = \"{}\"", window(unit));
                if limit.shadow_mode || options.shadow {
                    let _ = writeln!(out, "shadow = true");
                }
                let _ = writeln!(rules, "policy = {}", quote(&name));
            }
            // requests_per_unit 0: every request over the limit.
            (false, unit) => {
                let _ = writeln!(rules, "refuse = true");
                if let Some(unit) = unit {
                    let _ = writeln!(rules, "unit = \"{}\"", unit.name());
                }
            }
        }
        if let Some(name) = &limit.name {
            let _ = writeln!(rules, "name = {}", quote(name));
        }
        if !limit.replaces.is_empty() {
            let replaces: Vec<String> = limit.replaces.iter().map(|r| quote(r)).collect();
            let _ = writeln!(rules, "replaces = [{}]", replaces.join(", "));
        }
        if leaf.path.iter().any(|&(_, _, shared)| shared) {
            let _ = writeln!(rules, "share_threshold = true");
        }
    }
    out.push_str(&rules);
    out
}

/// A TOML basic string.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A window as weir writes durations.
fn window(unit: Unit) -> String {
    match unit {
        Unit::Second => "1s".into(),
        Unit::Minute => "1m".into(),
        Unit::Hour => "1h".into(),
        other => format!("{}d", other.seconds() / 86_400),
    }
}

/// The policy name of a limit's path (`domain.key_value.key`): its letters,
/// digits, `-` and `_`, anything else a `-`; a path longer than a policy
/// name may be (60 bytes, room left for a `-N` that tells two apart) keeps its
/// start and its end around a `--`, so that the key it ends with still
/// shows.
pub fn policy_name(path: &str) -> String {
    let name: String = path
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '-',
        })
        .collect();
    if name.len() <= 60 {
        return name;
    }
    // ASCII only by now: byte positions are characters.
    format!("{}--{}", &name[..29], &name[name.len() - 29..])
}

/// [`policy_name`], with `-2`, `-3`… where it is taken.
fn unique_name(limit: &crate::Limit, taken: &mut HashSet<String>) -> String {
    let base = policy_name(&limit.path);
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}
