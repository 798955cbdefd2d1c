//! envoyproxy/ratelimit's configuration, read for weir: `weir config import
//! envoy-ratelimit` and `weir envoy-ratelimit` share this translation.

use std::path::Path;

use anyhow::{anyhow, bail};
use weir_envoy_ratelimit::{Limits, read_dir, weir};

/// The weir TOML (policies and descriptor rules) of the YAML files in
/// `dir`; errors name the file and the descriptor.
pub(crate) fn import(
    dir: &Path,
    merge_domains: bool,
    ignore_dotfiles: bool,
    shadow: bool,
) -> anyhow::Result<String> {
    let files = read_dir(dir, ignore_dotfiles)
        .map_err(|e| anyhow!("cannot read the config directory {}: {e}", dir.display()))?;
    if files.is_empty() {
        bail!(
            "{}: no config files (one YAML file per domain)",
            dir.display()
        );
    }
    let limits = Limits::load(
        files
            .iter()
            .map(|(name, text)| (name.as_str(), text.as_str())),
        merge_domains,
    )?;
    Ok(weir::to_toml(&limits, weir::Options { shadow }))
}
