//! The policy flags shared by `weir simulate` and `weir bench`.

use anyhow::{anyhow, bail};
use clap::builder::PossibleValuesParser;
use weir_core::{Algorithm, Policy};

#[derive(Debug, clap::Args)]
pub(crate) struct PolicyFlags {
    /// The algorithm of the policy.
    #[arg(long, value_name = "ALG", value_parser = PossibleValuesParser::new(Algorithm::ALL.map(Algorithm::name)))]
    algorithm: Option<String>,
    /// token-bucket: bucket size, in tokens.
    #[arg(long, value_name = "C")]
    capacity: Option<String>,
    /// gcra: largest burst, in requests.
    #[arg(long, value_name = "B")]
    burst: Option<String>,
    /// token-bucket, gcra, leaky-bucket: N/DURATION or N/UNIT (2/s, 120/m, 10/1500ms).
    #[arg(long, value_name = "R")]
    rate: Option<String>,
    /// fixed-window, sliding-log, sliding-counter: admitted cost per window;
    /// concurrency: cost in flight at once.
    #[arg(long, value_name = "L")]
    limit: Option<String>,
    /// fixed-window, sliding-log, sliding-counter: window length (60s, 1500ms, 1m).
    #[arg(long, value_name = "W")]
    window: Option<String>,
    /// leaky-bucket: slots that may wait.
    #[arg(long, value_name = "Q")]
    queue: Option<String>,
    /// concurrency: how long a lease lives unless released or renewed (30s, 10m).
    #[arg(long, value_name = "D")]
    lease: Option<String>,
    /// fixed-window: calendar windows instead of --window: day, week (from Monday), month, year.
    #[arg(long, value_name = "PERIOD")]
    calendar: Option<String>,
    /// With --calendar: the IANA time zone its days are counted in (default UTC), e.g. Europe/Paris.
    #[arg(long, value_name = "ZONE", requires = "calendar")]
    zone: Option<String>,
    /// With --calendar month: the day each month's window starts on (1 to 31; 31 is each month's last day).
    #[arg(long, value_name = "DAY", requires = "calendar")]
    anchor: Option<String>,
}

impl PolicyFlags {
    /// The policy given by --algorithm and its flags, if any; errors name the flag.
    pub(crate) fn policy(&self) -> anyhow::Result<Option<Policy>> {
        let flags = [
            ("capacity", &self.capacity),
            ("burst", &self.burst),
            ("rate", &self.rate),
            ("limit", &self.limit),
            ("window", &self.window),
            ("queue", &self.queue),
            ("lease", &self.lease),
            ("calendar", &self.calendar),
            ("zone", &self.zone),
            ("anchor", &self.anchor),
        ];
        let given = flags
            .iter()
            .filter_map(|(name, value)| Some((*name, value.as_deref()?)));
        let Some(algorithm) = &self.algorithm else {
            if let Some((name, _)) = given.clone().next() {
                bail!("--{name} needs --algorithm");
            }
            return Ok(None);
        };
        Policy::from_params(algorithm, given)
            .map(Some)
            .map_err(|e| anyhow!("--{}: {}", e.field, e.kind))
    }
}
