//! `weir config`: print the example, check a file, import another rate
//! limiter's configuration; and the loading every command shares.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use weir_server::config::{Config, EXAMPLE};
use weir_server::reload::Source;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print an example config.
    Example,
    /// Validate a config file: every error with its line, table and key.
    Check {
        /// The file to check.
        file: PathBuf,
    },
    /// Print another rate limiter's configuration as weir's: its limits as
    /// policies, its descriptors as `[[descriptors]]` rules that decide
    /// alike.
    #[command(subcommand)]
    Import(Import),
}

/// What `weir config import` reads.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Import {
    /// envoyproxy/ratelimit's config directory
    /// (`$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config`, or
    /// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`): one YAML
    /// file per domain.
    EnvoyRatelimit {
        /// The directory of YAML files.
        dir: PathBuf,
        /// Files of one domain add to it (their MERGE_DOMAIN_CONFIG).
        #[arg(long)]
        merge_domains: bool,
        /// Skip dotfiles (their RUNTIME_IGNOREDOTFILES).
        #[arg(long)]
        ignore_dotfiles: bool,
    },
    /// Kuadrant limitador's limits file (`LIMITS_FILE`): each limit a
    /// policy, its conditions and variables a descriptor rule's entries.
    Limitador {
        /// The limits file.
        file: PathBuf,
        /// Print what translates and exit 0 even when some limits do not
        /// (without it, the output is printed all the same and the exit
        /// status is 1).
        #[arg(long)]
        partial: bool,
    },
}

/// Reads and validates a config (the example without a path); errors name
/// the file, line, table and key. `weir simulate --policies` reads its
/// `[policies.NAME]` tables the same way.
pub(crate) fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Source::file(path.cloned())
        .load()
        .map(|(config, _)| config)
        .map_err(|e| anyhow!("{e}"))
}

pub(crate) fn config(command: &ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Example => {
            print!("{EXAMPLE}");
            Ok(())
        }
        ConfigCommand::Import(Import::EnvoyRatelimit {
            dir,
            merge_domains,
            ignore_dotfiles,
        }) => {
            let toml = crate::envoy_ratelimit::import(dir, *merge_domains, *ignore_dotfiles)?;
            print!(
                "# weir config import envoy-ratelimit {}\n# Each limit is a fixed window aligned to its unit since the Unix epoch, as\n# envoyproxy/ratelimit counts; move a rule to another policy (a token bucket,\n# a sliding window) by naming it. Listeners and the store go in [server]\n# and [store] (weir config example).\n{toml}",
                dir.display()
            );
            Ok(())
        }
        ConfigCommand::Import(Import::Limitador { file, partial }) => {
            let name = file.display().to_string();
            let text =
                std::fs::read_to_string(file).map_err(|e| anyhow!("cannot read {name}: {e}"))?;
            let (toml, problems) = crate::limitador::import(&name, &text)?;
            let mut header = format!(
                "# weir config import limitador {name}\n# Envoy's domain is the namespace; a descriptor's entries must be the rule's,\n# in the rule's order (conditions, then variables). Listeners and the store go\n# in [server] and [store] (weir config example).\n"
            );
            if !problems.is_empty() {
                header.push_str("#\n# Not translated:\n");
                for problem in &problems {
                    header.push_str(&format!("#   {problem}\n"));
                    eprintln!("not translated: {problem}");
                }
            }
            print!("{header}{toml}");
            if !problems.is_empty() && !partial {
                bail!(
                    "{} of the limits were not translated (named above, and in the output's header); --partial accepts the rest",
                    problems.len()
                );
            }
            Ok(())
        }
        ConfigCommand::Check { file } => {
            let config = load(Some(file))?;
            let grpc = config
                .server
                .grpc
                .map_or(String::new(), |g| format!(", gRPC on {g}"));
            let count = |n: usize, one: &str, many: &str| match n {
                1 => format!("1 {one}"),
                n => format!("{n} {many}"),
            };
            println!(
                "{}: ok ({}, {}, {}, store {}, listening on {}{grpc})",
                file.display(),
                count(config.policies.len(), "policy", "policies"),
                count(config.routes.len(), "route", "routes"),
                count(
                    config.descriptors.len(),
                    "descriptor rule",
                    "descriptor rules"
                ),
                config.store.url,
                config.server.listen
            );
            Ok(())
        }
    }
}
