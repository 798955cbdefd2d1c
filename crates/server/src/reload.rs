//! Changing limits while traffic flows: a configuration file read, checked
//! and applied as one step — by the file watcher, SIGHUP or `POST
//! /v1/admin/reload` alike. A file that fails to parse or validate changes
//! nothing: every error is logged and the old configuration keeps serving.
//! Unchanged policies keep their keys (see `Builder::keep_state_of`).

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify_debouncer_mini::notify::{RecursiveMode, Watcher};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};

use crate::config::{self, Config};

/// Where a configuration comes from.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The file; none: the built-in example.
    pub path: Option<PathBuf>,
    /// Secrets from the environment (`WEIR_ADMIN_TOKEN`,
    /// `WEIR_REDIS_PASSWORD`).
    pub env: config::Env,
    /// Listeners given on the command line, which override the file's.
    pub listen: Option<std::net::SocketAddr>,
    /// `--grpc`.
    pub grpc: Option<std::net::SocketAddr>,
    /// `--internal`.
    pub internal: Option<std::net::SocketAddr>,
    /// `--resp`.
    pub resp: Option<std::net::SocketAddr>,
    /// Instead of a file: a configuration made when it is read (its name
    /// and text), as `weir envoy-ratelimit` makes one from another's files.
    pub generated: Option<Generator>,
}

/// Makes a configuration's text, named for its errors.
#[derive(Clone)]
pub struct Generator(pub Arc<dyn Fn() -> Result<(String, String), String> + Send + Sync>);

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Generator")
    }
}

impl Source {
    /// The file at `path` (the built-in example without one), with the
    /// secrets of this process's environment.
    pub fn file(path: Option<PathBuf>) -> Self {
        Self {
            path,
            env: config::Env::from_process(),
            ..Self::default()
        }
    }

    /// Reads and validates the configuration; every error names the file,
    /// line, table and key.
    pub fn load(&self) -> Result<(Config, u64), String> {
        let (name, text) = match (&self.generated, &self.path) {
            (Some(generate), _) => (generate.0)()?,
            (None, Some(path)) => (
                path.display().to_string(),
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            ),
            (None, None) => ("the example config".to_owned(), config::EXAMPLE.to_owned()),
        };
        let named = |errors: config::ConfigErrors| {
            let lines: Vec<String> = (errors.0.iter())
                .map(|e| match e.line {
                    0 => e.to_string(),
                    _ => format!("{name}:{e}"),
                })
                .collect();
            lines.join("\n")
        };
        let mut config = config::parse(&text, &self.env).map_err(named)?;
        crate::tls::check(&config.server).map_err(named)?;
        let server = &mut config.server;
        server.listen = self.listen.unwrap_or(server.listen);
        server.grpc = self.grpc.or(server.grpc);
        server.internal = self.internal.or(server.internal);
        server.resp = self.resp.or(server.resp);
        Ok((config, fingerprint(&text)))
    }
}

/// A fingerprint of a configuration's text, for `weir_config_info{hash}`:
/// two instances of one weir version serving the same file show the same.
pub fn fingerprint(text: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration serves.
    Applied,
    /// The file is the one already served.
    Unchanged,
}

/// Counts a reload's result and records the configuration served.
pub(crate) fn record(result: &Result<Reloaded, String>, hash: Option<(u64, u64)>) {
    let label = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => label).increment(1);
    if let Some((old, new)) = hash {
        metrics::gauge!(crate::metrics::CONFIG_INFO, "hash" => format!("{old:016x}")).set(0.0);
        metrics::gauge!(crate::metrics::CONFIG_INFO, "hash" => format!("{new:016x}")).set(1.0);
    }
    if result.is_ok() {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        metrics::gauge!(crate::metrics::CONFIG_LAST_RELOAD).set(now.as_secs_f64());
    }
}

/// What a reload changed, for its log line: policies added, removed or
/// changed, and the number of routes, descriptor rules and overrides.
pub(crate) fn changes(old: &Config, new: &Config) -> String {
    let policy = |c: &'_ Config, name: &str| c.policies.iter().find(|p| p.name == name).cloned();
    let names = |c: &Config, pick: &dyn Fn(&str) -> bool| -> Vec<String> {
        c.policies
            .iter()
            .map(|p| p.name.clone())
            .filter(|n| pick(n))
            .collect()
    };
    let added = names(new, &|n| policy(old, n).is_none());
    let removed = names(old, &|n| policy(new, n).is_none());
    let changed = names(new, &|n| {
        policy(old, n).is_some_and(|o| Some(o) != policy(new, n))
    });
    let mut parts = Vec::new();
    for (what, list) in [("added", added), ("removed", removed), ("changed", changed)] {
        if !list.is_empty() {
            parts.push(format!("policies {what}: {}", list.join(", ")));
        }
    }
    let counts = [
        ("routes", old.routes.len(), new.routes.len()),
        (
            "descriptor rules",
            old.descriptors.len(),
            new.descriptors.len(),
        ),
        ("overrides", old.overrides.len(), new.overrides.len()),
    ];
    for (what, before, after) in counts {
        if before != after {
            parts.push(format!("{what}: {before} -> {after}"));
        }
    }
    match parts.is_empty() {
        true => "no policy added, removed or changed".to_owned(),
        false => parts.join("; "),
    }
}

/// Watches the configuration file `path` and calls `reload` within
/// [`DEBOUNCE`] of a change (on a blocking thread: it reads the file). Two
/// directories are watched: the one the path names (an editor's rename, a
/// Kubernetes ConfigMap's swapped `..data` symlink) and the one the file
/// resolves to (an edit in place behind a symlink), followed as the symlink
/// moves. The task runs as long as the process.
pub fn watch(
    path: PathBuf,
    reload: impl Fn() + Clone + Send + Sync + 'static,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let (tx, mut changed) = tokio::sync::mpsc::unbounded_channel();
    let mut debouncer = new_debouncer(DEBOUNCE, move |events: DebounceEventResult| {
        if events.is_ok() {
            let _ = tx.send(());
        }
    })
    .map_err(|e| format!("cannot watch {}: {e}", path.display()))?;
    let mut watched = BTreeSet::new();
    follow(&mut debouncer, &mut watched, &path)?;
    tracing::info!(file = %path.display(), "watching the configuration file");
    Ok(tokio::spawn(async move {
        while changed.recv().await.is_some() {
            let _ = tokio::task::spawn_blocking(reload.clone()).await;
            if let Err(e) = follow(&mut debouncer, &mut watched, &path) {
                tracing::warn!(error = %e, "the configuration file is no longer watched fully");
            }
        }
    }))
}

/// Watches the directories of `path` and of the file it resolves to.
fn follow<W: Watcher>(
    debouncer: &mut Debouncer<W>,
    watched: &mut BTreeSet<PathBuf>,
    path: &Path,
) -> Result<(), String> {
    let parent = |p: &Path| match p.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut dirs = vec![parent(path)];
    if let Ok(resolved) = std::fs::canonicalize(path) {
        dirs.push(parent(&resolved));
    }
    for dir in dirs {
        if !watched.contains(&dir) {
            debouncer
                .watcher()
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
            watched.insert(dir);
        }
    }
    Ok(())
}

/// What the last reload said when the file is the one served (as it is
/// at start).
pub(crate) const UNCHANGED: &str = "unchanged";

/// Changes closer together than this are one reload.
pub const DEBOUNCE: Duration = Duration::from_millis(250);
