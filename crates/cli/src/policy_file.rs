//! Policy files for `weir simulate --compare --policies FILE`: the
//! `[policies.NAME]` tables of a weir config, each an `algorithm` and its
//! parameters.
//!
//! ```toml
//! [policies.seller-stock-read]
//! algorithm = "token-bucket"
//! capacity = 10
//! rate = "2/s"
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use toml::{Spanned, Value};
use weir_core::Policy;

#[derive(Debug, Deserialize)]
struct PolicyFile {
    #[serde(default)]
    policies: BTreeMap<String, BTreeMap<String, Spanned<Value>>>,
}

/// Reads every `[policies.NAME]` table of `path`, in name order.
pub(crate) fn read(path: &Path) -> anyhow::Result<Vec<(String, Policy)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<(String, Policy)>> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let file: PolicyFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(s.start));
        anyhow::anyhow!("{line}: {}", e.message())
    })?;
    if file.policies.is_empty() {
        bail!("1: no [policies.NAME] table (each needs `algorithm` and its parameters)");
    }
    let mut policies = Vec::new();
    for (name, table) in &file.policies {
        let first = table
            .values()
            .map(|v| line_of(v.span().start))
            .min()
            .unwrap_or(1);
        let at = |key: &str| table.get(key).map_or(first, |v| line_of(v.span().start));
        let mut params = Vec::new();
        let mut algorithm = None;
        for (key, value) in table {
            let text = match value.get_ref() {
                Value::String(s) => s.clone(),
                Value::Integer(i) => i.to_string(),
                other => bail!(
                    "{}: [policies.{name}] `{key}`: expected a string or an integer, found {}",
                    at(key),
                    other.type_str()
                ),
            };
            if key == "algorithm" {
                algorithm = Some(text);
            } else {
                params.push((key.as_str(), text));
            }
        }
        let Some(algorithm) = algorithm else {
            bail!("{first}: [policies.{name}] has no `algorithm`");
        };
        let policy = Policy::from_params(&algorithm, params.iter().map(|(k, v)| (*k, v.as_str())))
            .map_err(|e| anyhow::anyhow!("{}: [policies.{name}] {e}", at(&e.field)))?;
        policies.push((name.clone(), policy));
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_policies_and_names_bad_lines() {
        let ok =
            parse("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"2/s\"\n")
                .unwrap();
        assert_eq!(ok[0].0, "a");
        assert_eq!(ok[0].1.to_string(), "token-bucket capacity=10 rate=2/s");
        let e = parse("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 0\nrate = \"2/s\"\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "3: [policies.a] `capacity`: `0` is not valid: `0` is not a positive whole number"
        );
        let e = parse("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 1.5\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("3: [policies.a] `capacity`: expected a string or an integer"),
            "{e}"
        );
        let e = parse("[policies.a\n").unwrap_err();
        assert!(e.to_string().starts_with("1: "), "{e}");
    }
}
