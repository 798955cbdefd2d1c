//! Several policies over one trace, side by side: how many requests each
//! admits and rejects, and the largest admitted burst in any window — the
//! number that shows a fixed window letting twice its limit through across a
//! boundary while a sliding log holds.

use std::io::{self, Write};

use weir_core::units::{DisplayDuration, Seconds};
use weir_core::{NANOS_PER_SEC, Nanos, Policy};

use crate::SimError;
use crate::simulate::{Outcome, Simulator};
use crate::trace::{Arrival, TraceError};

/// One policy's decisions for every arrival of the trace.
#[derive(Debug, Clone)]
pub struct Lane {
    /// How the lane is named (the policy, or its name in a policy file).
    pub label: String,
    /// The policy.
    pub policy: Policy,
    /// One outcome per arrival, in trace order.
    pub outcomes: Vec<Outcome>,
}

/// Counts for one lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Admitted requests that were delayed (leaky bucket).
    pub delayed: u64,
    /// The longest delay.
    pub max_delay: Nanos,
    /// The largest admitted cost released within any interval
    /// `[s, s + window)`.
    pub max_burst: u64,
}

/// Runs every arrival through each policy, each with its own keys.
pub fn compare(
    policies: Vec<(String, Policy)>,
    arrivals: impl IntoIterator<Item = Result<Arrival, TraceError>>,
) -> Result<Vec<Lane>, SimError> {
    let mut sims: Vec<_> = policies.iter().map(|(_, p)| Simulator::new(*p)).collect();
    let mut lanes: Vec<_> = policies
        .into_iter()
        .map(|(label, policy)| Lane {
            label,
            policy,
            outcomes: Vec::new(),
        })
        .collect();
    for arrival in arrivals {
        let arrival = arrival?;
        for (sim, lane) in sims.iter_mut().zip(&mut lanes) {
            let outcome = sim.step(&arrival).map_err(|error| SimError::Cost {
                line: arrival.line,
                policy: lane.label.clone(),
                error,
            })?;
            lane.outcomes.push(outcome);
        }
    }
    Ok(lanes)
}

/// The window bursts are measured over when none is given: the longest
/// window among the policies, else one second.
pub fn default_burst_window(policies: &[(String, Policy)]) -> Nanos {
    policies
        .iter()
        .filter_map(|(_, p)| p.window())
        .max()
        .unwrap_or(NANOS_PER_SEC)
}

impl Lane {
    /// Counts, with bursts measured over `window` at release times (when a
    /// shaped request actually goes out).
    pub fn summary(&self, window: Nanos) -> Summary {
        let mut summary = Summary::default();
        let mut released = Vec::new();
        for o in &self.outcomes {
            if o.decision.allowed {
                summary.admitted += 1;
                if o.decision.delay > 0 {
                    summary.delayed += 1;
                }
                summary.max_delay = summary.max_delay.max(o.decision.delay);
                released.push((o.at.saturating_add(o.decision.delay), o.cost));
            } else {
                summary.rejected += 1;
            }
        }
        released.sort_unstable();
        // Sorted, so `at - released[start].0` cannot underflow; a window of
        // at least 1 ns never drops the current release, even at the end of
        // time (where an added window would saturate).
        let window = window.max(1);
        let (mut start, mut sum) = (0, 0u128);
        for &(at, cost) in &released {
            sum += u128::from(cost);
            while at - released[start].0 >= window {
                sum -= u128::from(released[start].1);
                start += 1;
            }
            let sum = u64::try_from(sum).unwrap_or(u64::MAX);
            summary.max_burst = summary.max_burst.max(sum);
        }
        summary
    }
}

/// Prints the side-by-side summary table.
pub fn write_table(out: &mut impl Write, lanes: &[Lane], window: Nanos) -> io::Result<()> {
    let width = lanes
        .iter()
        .map(|l| l.label.len())
        .max()
        .unwrap_or(0)
        .max("policy".len());
    let burst = format!("max burst/{}", DisplayDuration(window));
    writeln!(
        out,
        "{:width$}  {:>8}  {:>8}  {:>7}  {:>13}  {burst}",
        "policy", "admitted", "rejected", "delayed", "max delay"
    )?;
    for lane in lanes {
        let s = lane.summary(window);
        writeln!(
            out,
            "{:width$}  {:>8}  {:>8}  {:>7}  {:>13}  {:>w$}",
            lane.label,
            s.admitted,
            s.rejected,
            s.delayed,
            Seconds(s.max_delay).to_string(),
            s.max_burst,
            w = burst.len()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn boundary_burst_shows_the_double_burst() {
        let scenario = Scenario::find("boundary-burst").unwrap();
        let policies = scenario.policies().unwrap();
        let window = default_burst_window(&policies);
        let lanes = compare(policies, scenario.arrivals().into_iter().map(Ok)).unwrap();
        let burst = |name: &str| {
            lanes
                .iter()
                .find(|l| l.label.starts_with(name))
                .unwrap()
                .summary(window)
                .max_burst
        };
        assert_eq!(window, 60 * NANOS_PER_SEC);
        assert_eq!(burst("fixed-window"), 240);
        assert_eq!(burst("sliding-log"), 120);
        let mut table = Vec::new();
        write_table(&mut table, &lanes, window).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("max burst/1m"), "{table}");
    }

    #[test]
    fn extreme_times_and_windows_are_counted_without_panicking() {
        let policy = Policy::parse("fixed-window limit=1 window=1ns").unwrap();
        let arrivals = [0, 9_000_000_000 * NANOS_PER_SEC, u64::MAX, u64::MAX]
            .map(|t| Ok(Arrival::new(t, "k", 1)));
        let lanes = compare(vec![("p".into(), policy)], arrivals).unwrap();
        assert_eq!(lanes[0].summary(1).max_burst, 1);
        // Half-open: the release at the end of time is outside `[0, MAX)`.
        assert_eq!(lanes[0].summary(u64::MAX).max_burst, 2);
        let svg = crate::plot::render("t", &lanes, 1).unwrap();
        assert!(svg.len() < 1 << 20, "{} bytes", svg.len());
    }

    #[test]
    fn burst_window_is_half_open() {
        let policy = Policy::parse("fixed-window limit=10 window=1s").unwrap();
        let arrivals = [0, NANOS_PER_SEC - 1, NANOS_PER_SEC].map(|t| Ok(Arrival::new(t, "k", 1)));
        let lanes = compare(vec![("p".into(), policy)], arrivals).unwrap();
        assert_eq!(lanes[0].summary(NANOS_PER_SEC).max_burst, 2);
        assert_eq!(lanes[0].summary(NANOS_PER_SEC + 1).max_burst, 3);
    }
}
