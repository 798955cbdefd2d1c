//! Built-in scenarios: the classic examples, each a trace and the policies
//! that tell its story, so `weir simulate --compare --scenario NAME` needs no
//! file.

use weir_core::{NANOS_PER_SEC as S, Nanos, Policy, PolicyError};

use crate::trace::Arrival;

/// A named trace with the policies it is meant to compare.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// The name given to `--scenario`.
    pub name: &'static str,
    /// One line on what it shows.
    pub about: &'static str,
    policies: &'static [&'static str],
}

/// Every built-in scenario.
pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "boundary-burst",
        about: "120 requests just before a minute boundary and 120 just after, then 120 a minute later: \
                the fixed window admits 240 in 0.2 s, the sliding log never more than 120 a minute",
        policies: &[
            "fixed-window limit=120 window=60s",
            "sliding-log limit=120 window=60s",
            "sliding-counter limit=120 window=60s",
            "token-bucket capacity=120 rate=2/s",
        ],
    },
    Scenario {
        name: "dashboard-burst",
        about: "a dashboard fires 25 requests at once every 20 s, over a steady poll of one a second: \
                buckets absorb the bursts, the shaper spreads them out, the windows cut them",
        policies: &[
            "token-bucket capacity=30 rate=2/s",
            "fixed-window limit=60 window=30s",
            "sliding-log limit=60 window=30s",
            "leaky-bucket rate=5/s queue=20",
        ],
    },
    Scenario {
        name: "steady-overload",
        about: "a client sending 4 requests a second for a minute against policies allowing 2 a second",
        policies: &[
            "token-bucket capacity=10 rate=2/s",
            "gcra burst=10 rate=2/s",
            "fixed-window limit=20 window=10s",
            "sliding-counter limit=20 window=10s",
            "leaky-bucket rate=2/s queue=10",
        ],
    },
];

impl Scenario {
    /// The scenario called `name`.
    pub fn find(name: &str) -> Option<&'static Scenario> {
        SCENARIOS.iter().find(|s| s.name == name)
    }

    /// The policies the scenario compares, labelled by their spec.
    pub fn policies(&self) -> Result<Vec<(String, Policy)>, PolicyError> {
        self.policies
            .iter()
            .map(|spec| Policy::parse(spec).map(|p| (p.to_string(), p)))
            .collect()
    }

    /// The scenario's trace.
    pub fn arrivals(&self) -> Vec<Arrival> {
        let burst = |at: Nanos, n: usize| std::iter::repeat_n(at, n);
        let times: Vec<Nanos> = match self.name {
            "boundary-burst" => burst(59_900_000_000, 120)
                .chain(burst(60_100_000_000, 120))
                .chain(burst(120_100_000_000, 120))
                .collect(),
            "dashboard-burst" => {
                let mut times: Vec<Nanos> = (0..120).map(|i| i * S).collect();
                times.extend((0..6).flat_map(|i| burst(i * 20 * S + S / 2, 25)));
                times.sort_unstable();
                times
            }
            _ => (0..240).map(|i| i * S / 4).collect(),
        };
        times
            .into_iter()
            .map(|t| Arrival::new(t, "default", 1))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_builds() {
        for s in SCENARIOS {
            assert!(!s.policies().unwrap().is_empty());
            assert!(!s.arrivals().is_empty());
            assert!(Scenario::find(s.name).is_some());
        }
    }
}
