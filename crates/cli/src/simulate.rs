//! `weir simulate`: flags to a policy (or several) and a trace, then the
//! simulator of `weir-sim`. See the README for the contract.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::ValueEnum;
use clap::builder::PossibleValuesParser;

use crate::policy_flags::PolicyFlags;
use weir_core::units::parse_duration;
use weir_core::{Penalty, Policy};
use weir_redis::{Check, LeaseOp, Mode, StoreError};
use weir_sim::compare::{compare, default_burst_window, write_table};
use weir_sim::scenario::{SCENARIOS, Scenario};
use weir_sim::{Arrival, Format, TraceError, TraceReader, plot::render};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutputFormat {
    Csv,
    Json,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    policy: PolicyFlags,
    /// A penalty (docs/SPEC.md's bans): a refused check or probe bans the key this long (15m).
    #[arg(long, value_name = "DURATION")]
    ban: Option<String>,
    /// With --ban: each ban within --ban-memory of the last is this many times longer (default 1).
    #[arg(long, value_name = "F", requires = "ban")]
    ban_factor: Option<String>,
    /// With --ban: the longest ban (default: --ban).
    #[arg(long, value_name = "DURATION", requires = "ban")]
    ban_max: Option<String>,
    /// With --ban: how long a ban's level is remembered, from its start (default: --ban-max).
    #[arg(long, value_name = "DURATION", requires = "ban")]
    ban_memory: Option<String>,
    /// The trace: CSV with a `time` column (seconds) and optional `cost`, `key`, `op` (check, probe, report; release and renew with a concurrency policy) and `lease` (a name for the lease a check takes, or the one a release or renewal acts on) columns; `-` reads stdin.
    #[arg(long, value_name = "FILE", required_unless_present = "scenario")]
    trace: Option<PathBuf>,
    /// Use a built-in trace instead of --trace.
    #[arg(long, value_name = "NAME", conflicts_with = "trace",
          value_parser = PossibleValuesParser::new(SCENARIOS.map(|s| s.name)))]
    scenario: Option<String>,
    /// Decide with this store instead of the pure core: `memory`, or a
    /// `redis://host:port` / `redis-cluster://h:p,h:p` URL (explicit times;
    /// each run uses fresh keys), to check a deployment against docs/SPEC.md.
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// Output format for decisions.
    #[arg(long, value_enum, default_value = "csv")]
    format: OutputFormat,
    /// Compare several policies on the trace and print a summary table.
    #[arg(long)]
    compare: bool,
    /// With --compare: a policy as `ALGORITHM key=value …`, e.g. 'token-bucket capacity=10 rate=2/s'; repeatable.
    #[arg(long = "policy", value_name = "SPEC", requires = "compare")]
    policy_specs: Vec<String>,
    /// With --compare: a TOML file of [policies.NAME] tables.
    #[arg(long = "policies", value_name = "FILE", requires = "compare")]
    policy_file: Option<PathBuf>,
    /// With --compare: the window the largest burst is measured over (default: the longest policy window, else 1s).
    #[arg(long, value_name = "DURATION", requires = "compare")]
    burst_window: Option<String>,
    /// With --compare: draw the lanes to this file, SVG or PNG by its name.
    #[arg(long, value_name = "FILE.svg|FILE.png", requires = "compare")]
    plot: Option<PathBuf>,
}

impl Args {
    /// The penalty given by --ban and its flags; errors name the flag.
    fn penalty(&self) -> anyhow::Result<Option<Penalty>> {
        let Some(ban) = &self.ban else {
            return Ok(None);
        };
        let given = [
            ("ban", Some(ban)),
            ("factor", self.ban_factor.as_ref()),
            ("max", self.ban_max.as_ref()),
            ("memory", self.ban_memory.as_ref()),
        ];
        let params = given
            .iter()
            .filter_map(|(name, value)| Some((*name, value.as_deref()?.as_str())));
        Penalty::from_params(params).map(Some).map_err(|e| {
            let flag = match e.field.as_str() {
                "ban" => "--ban".to_owned(),
                field => format!("--ban-{field}"),
            };
            anyhow!("{flag}: {}", e.kind)
        })
    }

    fn arrivals(&self) -> anyhow::Result<Box<dyn Iterator<Item = Result<Arrival, TraceError>>>> {
        if let Some(name) = &self.scenario {
            let scenario =
                Scenario::find(name).ok_or_else(|| anyhow!("--scenario: unknown `{name}`"))?;
            return Ok(Box::new(scenario.arrivals().into_iter().map(Ok)));
        }
        let path = self
            .trace
            .as_ref()
            .ok_or_else(|| anyhow!("--trace FILE or --scenario NAME is required"))?;
        let input: Box<dyn Read> = if path.as_os_str() == "-" {
            Box::new(io::stdin().lock())
        } else {
            let file = File::open(path)
                .with_context(|| format!("--trace: cannot read {}", path.display()))?;
            Box::new(BufReader::new(file))
        };
        Ok(Box::new(TraceReader::new(input)))
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if !args.compare {
        let policy = args
            .policy
            .policy()?
            .ok_or_else(|| anyhow!("--algorithm is required (or --compare with --policy)"))?;
        let format = match args.format {
            OutputFormat::Csv => Format::Csv,
            OutputFormat::Json => Format::Json,
        };
        let penalty = args.penalty()?;
        if args.store != "memory" {
            return simulate_on_redis(&args.store, policy, penalty, args.arrivals()?, out, format);
        }
        return Ok(weir_sim::simulate(
            policy,
            penalty,
            args.arrivals()?,
            out,
            format,
        )?);
    }
    let scenario = args.scenario.as_deref().and_then(Scenario::find);
    let mut policies = Vec::new();
    if let Some(policy) = args.policy.policy()? {
        policies.push((policy.to_string(), policy));
    }
    for spec in &args.policy_specs {
        let policy = Policy::parse(spec).map_err(|e| anyhow!("--policy '{spec}': {e}"))?;
        policies.push((policy.to_string(), policy));
    }
    if let Some(path) = &args.policy_file {
        policies.extend(
            crate::config::load(Some(path))?
                .policies
                .into_iter()
                .map(|p| (p.name, p.policy)),
        );
    }
    if policies.is_empty() {
        match scenario {
            Some(s) => {
                policies = s
                    .policies()
                    .map_err(|e| anyhow!("scenario {}: {e}", s.name))?
            }
            None => bail!(
                "--compare needs policies: --policy SPEC, --policies FILE or --algorithm with its flags"
            ),
        }
    }
    let window = match &args.burst_window {
        Some(text) => parse_duration(text)
            .map_err(|e| anyhow!("--burst-window: `{text}` is not valid: {e}"))?,
        None => default_burst_window(&policies),
    };
    let lanes = compare(policies, args.arrivals()?)?;
    if let Some(s) = scenario {
        writeln!(out, "scenario {}: {}\n", s.name, s.about)?;
    }
    write_table(&mut out, &lanes, window)?;
    if let Some(path) = &args.plot {
        let title = scenario.map_or_else(
            || "weir simulate".to_owned(),
            |s| format!("scenario {}", s.name),
        );
        let svg = render(&title, &lanes, window).map_err(|e| anyhow!("--plot: {e}"))?;
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let bytes = match extension.as_deref() {
            Some("svg") => svg.into_bytes(),
            Some("png") => png(&svg).map_err(|e| anyhow!("--plot {}: {e}", path.display()))?,
            _ => bail!("--plot {}: name the file .svg or .png", path.display()),
        };
        std::fs::write(path, bytes)
            .map_err(|e| anyhow!("--plot: cannot write {}: {e}", path.display()))?;
        writeln!(out, "\nplot written to {}", path.display())?;
    }
    out.flush()?;
    Ok(())
}

/// `--store redis://…`: the same rows, decided by the Redis store's script
/// at each row's time.
fn simulate_on_redis(
    url: &str,
    policy: Policy,
    penalty: Option<Penalty>,
    arrivals: Box<dyn Iterator<Item = Result<Arrival, TraceError>>>,
    out: impl Write,
    format: Format,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let store = runtime
        .block_on(crate::store_flag::redis_store(url))?
        .with_timeout(std::time::Duration::from_secs(5));
    // Fresh keys for every run: a policy name no earlier run used.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("simulate-{}-{stamp}", std::process::id());
    let mut rows = weir_sim::RowWriter::new(out, format);
    let mut leases = weir_sim::LeaseNames::default();
    let result = arrivals.into_iter().try_for_each(|arrival| {
        let arrival = arrival?;
        let at = Some(arrival.time);
        let on_lease = |op| store.on_lease(&name, &policy, &arrival.key, op, at);
        let decide = |report, probe| {
            let check = Check {
                report,
                probe,
                penalty,
                ..Check::from(weir_core::Check {
                    name: &name,
                    policy: &policy,
                    key: &arrival.key,
                    cost: arrival.cost,
                })
            };
            let checked = runtime.block_on(store.decide(&[check], at, Mode::CHARGE))?;
            checked
                .all
                .decisions
                .first()
                .copied()
                .ok_or(StoreError::Reply)
        };
        let decided = match arrival.op {
            Some(weir_sim::Op::Report) => decide(true, false),
            Some(weir_sim::Op::Release) => {
                runtime.block_on(on_lease(LeaseOp::Release(leases.of(&arrival))))
            }
            Some(weir_sim::Op::Renew) => {
                runtime.block_on(on_lease(LeaseOp::Renew(leases.of(&arrival))))
            }
            op @ (Some(weir_sim::Op::Check | weir_sim::Op::Probe) | None) => {
                if arrival.cost > 0 {
                    policy
                        .validate_cost(arrival.cost)
                        .map_err(|e| anyhow!("line {}: {e}", arrival.line))?;
                }
                decide(false, op == Some(weir_sim::Op::Probe))
            }
        };
        let decision = decided.map_err(|e| anyhow!("line {}: {e}", arrival.line))?;
        leases.took(&arrival, &decision);
        rows.row(&arrival, &decision)?;
        Ok::<_, anyhow::Error>(())
    });
    rows.finish()?;
    result
}

/// An SVG picture as PNG, its text set in the system's sans-serif font
/// (DejaVu Sans or Liberation Sans where there, else the first family
/// found; with no fonts at all, the text is left out).
fn png(svg: &str) -> anyhow::Result<Vec<u8>> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    let families: Vec<String> = fonts
        .faces()
        .flat_map(|face| face.families.iter().map(|(name, _)| name.clone()))
        .collect();
    let sans = ["DejaVu Sans", "Liberation Sans"]
        .into_iter()
        .map(str::to_owned)
        .find(|f| families.contains(f))
        .or_else(|| families.first().cloned());
    if let Some(sans) = sans {
        fonts.set_sans_serif_family(sans);
    }
    let tree = usvg::Tree::from_str(svg, &options)?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow!("an empty picture"))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    Ok(pixmap.encode_png()?)
}
