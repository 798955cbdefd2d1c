//! `weir config import limitador limits.yaml`: Kuadrant limitador's limits
//! as weir policies and Envoy descriptor rules. Its CEL conditions are
//! parsed by the `cel` crate (limitador's own); a condition weir can say —
//! `descriptors[0]['key'] == 'value'` — becomes an entry `key=value`, a
//! variable `descriptors[0]['key']` an entry `key` (a counter per value).
//! Limitador's older syntax says the same with the key bare — `req.method ==
//! 'GET'`, `variables: [user_id]` — and reads as the same entries. Anything
//! else is named with its line.

use std::collections::HashSet;
use std::fmt::Write as _;

use anyhow::{anyhow, bail};
use cel::common::ast::{CallExpr, Expr, IdedExpr, operators};
use cel::common::value::CelVal;
use serde_yaml::Value;
use weir_envoy_ratelimit::weir::{policy_name, quote};

/// One limit of the file.
struct Limit {
    namespace: String,
    max_value: u64,
    seconds: u64,
    conditions: Vec<String>,
    variables: Vec<String>,
    name: Option<String>,
    /// Its line in the file.
    line: usize,
}

/// The TOML of `text` (a limitador limits file named `file`), and what
/// cannot be translated, each with its line.
pub(crate) fn import(file: &str, text: &str) -> anyhow::Result<(String, Vec<String>)> {
    let limits = read(file, text)?;
    let mut problems = Vec::new();
    let (mut policies, mut rules) = (String::new(), String::new());
    let (mut names, mut paths) = (HashSet::new(), HashSet::new());
    for limit in &limits {
        let at = |what: &str, text: &str| {
            let line =
                line_of(text_after(text, limit.line), what).map_or(limit.line, |l| l + limit.line);
            format!("{file}:{line}")
        };
        let mut entries = Vec::new();
        let mut failed = false;
        for condition in &limit.conditions {
            match equality(condition) {
                Ok((key, value)) => entries.push(format!("{key}={value}")),
                Err(why) => {
                    problems.push(format!(
                        "{}: condition `{condition}`: {why}",
                        at(condition, text)
                    ));
                    failed = true;
                }
            }
        }
        for variable in &limit.variables {
            match entry(variable) {
                Ok(key) => entries.push(key),
                Err(why) => {
                    problems.push(format!(
                        "{}: variable `{variable}`: {why}",
                        at(variable, text)
                    ));
                    failed = true;
                }
            }
        }
        if failed {
            continue;
        }
        let place = format!("{file}:{}", limit.line);
        if entries.is_empty() {
            problems.push(format!(
                "{place}: a limit without conditions or variables counts every request of its namespace; weir's rules name the entries of a descriptor (give Envoy an action such as generic_key, and a rule of that entry)"
            ));
            continue;
        }
        if entries.iter().any(|e| e.contains('*')) {
            problems.push(format!(
                "{place}: `*` in a value is a wildcard in weir's rules"
            ));
            continue;
        }
        if !paths.insert((limit.namespace.clone(), entries.clone())) {
            problems.push(format!(
                "{place}: another limit of namespace `{}` has the same conditions and variables; weir decides a descriptor by one rule (keep the stricter, or give Envoy another descriptor for it)",
                limit.namespace
            ));
            continue;
        }
        let mut name = policy_name(&format!(
            "{}.{}",
            limit.namespace,
            limit.name.clone().unwrap_or_else(|| entries.join("."))
        ));
        let base = name.clone();
        let mut n = 2;
        while !names.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        let seconds = limit.seconds;
        let _ = writeln!(
            policies,
            "\n# {place}: {} per {seconds}s. limitador's window starts at a counter's first hit;\n# weir's fixed window is aligned to multiples of {seconds}s since the Unix epoch. Both admit\n# up to {} across a window's edge; a sliding-log policy never admits more than {} in\n# any {seconds}s.",
            limit.max_value,
            limit.max_value * 2,
            limit.max_value
        );
        let _ = writeln!(policies, "[policies.{name}]");
        let _ = writeln!(policies, "algorithm = \"fixed-window\"");
        let _ = writeln!(policies, "limit = {}", limit.max_value);
        let _ = writeln!(policies, "window = \"{seconds}s\"");
        let entries: Vec<String> = entries.iter().map(|e| quote(e)).collect();
        let _ = writeln!(rules, "\n[[descriptors]]");
        let _ = writeln!(rules, "domain = {}", quote(&limit.namespace));
        let _ = writeln!(rules, "entries = [{}]", entries.join(", "));
        let _ = writeln!(rules, "policy = {}", quote(&name));
    }
    policies.push_str(&rules);
    Ok((policies, problems))
}

/// The limits of the file, each with its line; errors name the line.
fn read(file: &str, text: &str) -> anyhow::Result<Vec<Limit>> {
    let root: Value = serde_yaml::from_str(text).map_err(|e| anyhow!("{file}: {e}"))?;
    let items = match root {
        Value::Sequence(items) => items,
        Value::Null => Vec::new(),
        _ => bail!("{file}: expected a list of limits (- namespace: …, max_value: …, seconds: …)"),
    };
    // Each limit's line: the `n`-th list item at the top level.
    let starts: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("- "))
        .map(|(i, _)| i + 1)
        .collect();
    let mut limits = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let line = starts.get(i).copied().unwrap_or(0);
        let at = |e: String| anyhow!("{file}:{line}: {e}");
        let Value::Mapping(map) = item else {
            return Err(at("a limit is a mapping".into()));
        };
        for key in map.keys() {
            let known = [
                "namespace",
                "max_value",
                "seconds",
                "conditions",
                "variables",
                "name",
            ];
            match key.as_str() {
                Some(k) if known.contains(&k) => {}
                _ => {
                    return Err(at(format!(
                        "unknown key {key:?} (valid: {})",
                        known.join(", ")
                    )));
                }
            }
        }
        let text_of = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
        let number = |k: &str| -> anyhow::Result<u64> {
            item.get(k)
                .and_then(Value::as_u64)
                .filter(|n| *n > 0)
                .ok_or_else(|| at(format!("`{k}`: expected a whole number of at least 1")))
        };
        let strings = |k: &str| -> anyhow::Result<Vec<String>> {
            match item.get(k) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Sequence(list)) => list
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| at(format!("`{k}`: expected strings")))
                    })
                    .collect(),
                Some(_) => Err(at(format!("`{k}`: expected a list of strings"))),
            }
        };
        limits.push(Limit {
            namespace: text_of("namespace")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| at("`namespace`: expected a name".into()))?,
            max_value: number("max_value")?,
            seconds: number("seconds")?,
            conditions: strings("conditions")?,
            variables: strings("variables")?,
            name: text_of("name"),
            line,
        });
    }
    Ok(limits)
}

/// The text from line `from` (1-based) on.
fn text_after(text: &str, from: usize) -> &str {
    let skip: usize = text
        .lines()
        .take(from.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    text.get(skip.min(text.len())..).unwrap_or_default()
}

/// The 0-based line of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(needle))
}

fn parse(source: &str) -> Result<IdedExpr, String> {
    cel::parser::Parser::new()
        .parse(source)
        .map_err(|e| format!("not CEL: {e}"))
}

/// `descriptors[0]['key'] == 'value'` (either way round): the key and value.
fn equality(condition: &str) -> Result<(String, String), String> {
    let expr = parse(condition)?;
    let Expr::Call(CallExpr {
        func_name, args, ..
    }) = &expr.expr
    else {
        return Err(UNSAYABLE.into());
    };
    let [a, b] = args.as_slice() else {
        return Err(UNSAYABLE.into());
    };
    if func_name != operators::EQUALS {
        return Err(UNSAYABLE.into());
    }
    let literal = |e: &IdedExpr| match &e.expr {
        Expr::Literal(CelVal::String(s)) => Some(s.clone()),
        _ => None,
    };
    match (key_of(a), literal(b), key_of(b), literal(a)) {
        (Ok(key), Some(value), _, _) | (_, _, Ok(key), Some(value)) => Ok((key, value)),
        _ => Err(UNSAYABLE.into()),
    }
}

const UNSAYABLE: &str =
    "weir's rules say only descriptors[0]['key'] == 'value' (an entry with that value)";

/// A variable `descriptors[0]['key']`: its key.
fn entry(variable: &str) -> Result<String, String> {
    key_of(&parse(variable)?)
}

/// `descriptors[0]['key']` or `descriptors[0].key`, or in limitador's older
/// syntax the key bare (`user_id`, `req.method`): the key.
fn key_of(expr: &IdedExpr) -> Result<String, String> {
    if let Some(key) = bare(expr).filter(|k| !k.starts_with("descriptors")) {
        return Ok(key);
    }
    let wrong =
        || "expected descriptors[0]['key']: weir matches the first descriptor's entries".to_owned();
    let (operand, key) = match &expr.expr {
        Expr::Call(CallExpr {
            func_name, args, ..
        }) if func_name == operators::INDEX => match args.as_slice() {
            [
                operand,
                IdedExpr {
                    expr: Expr::Literal(CelVal::String(key)),
                    ..
                },
            ] => (operand, key.clone()),
            _ => return Err(wrong()),
        },
        Expr::Select(select) => (&*select.operand, select.field.clone()),
        _ => return Err(wrong()),
    };
    match &operand.expr {
        Expr::Call(CallExpr {
            func_name, args, ..
        }) if func_name == operators::INDEX => match args.as_slice() {
            [
                IdedExpr {
                    expr: Expr::Ident(name),
                    ..
                },
                IdedExpr {
                    expr: Expr::Literal(CelVal::Int(0)),
                    ..
                },
            ] if name == "descriptors" => Ok(key),
            _ => Err(wrong()),
        },
        _ => Err(wrong()),
    }
}

/// A dotted name (`user_id`, `req.method`): the older syntax's key.
fn bare(expr: &IdedExpr) -> Option<String> {
    match &expr.expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(select) if !select.test => {
            Some(format!("{}.{}", bare(&select.operand)?, select.field))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_weir_can_say_and_those_it_cannot() {
        assert_eq!(
            equality("descriptors[0]['req.method'] == 'GET'"),
            Ok(("req.method".into(), "GET".into()))
        );
        assert_eq!(
            equality("'GET' == descriptors[0].method"),
            Ok(("method".into(), "GET".into()))
        );
        for unsayable in [
            "descriptors[0]['req.path'] != '/json'",
            "descriptors[1]['a'] == 'b'",
            "descriptors[0]['a'] == 'b' && descriptors[0]['c'] == 'd'",
            "descriptors[0]['a'].startsWith('x')",
            "size(descriptors) == 1",
        ] {
            assert!(equality(unsayable).is_err(), "{unsayable}");
        }
        assert!(
            equality("descriptors[0]['a' ==")
                .unwrap_err()
                .starts_with("not CEL")
        );
        assert_eq!(entry("descriptors[0]['user_id']"), Ok("user_id".into()));
        // Limitador's older syntax: the descriptor's key bare.
        assert_eq!(
            equality("req.method == 'GET'"),
            Ok(("req.method".into(), "GET".into()))
        );
        assert_eq!(entry("user_id"), Ok("user_id".into()));
        assert!(entry("descriptors[0]").is_err());
    }
}
