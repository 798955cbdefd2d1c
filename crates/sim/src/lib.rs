//! `weir simulate`: replay a trace through a policy and print every
//! decision, or through several policies to compare and plot them.
//!
//! The simulator is the reference face of weir's contract (docs/SPEC.md): it
//! passes each row's time to the pure algorithms of `weir-core` and prints
//! their decisions unchanged, so its output is the expected output of every
//! store and every other face for the same trace.

pub mod compare;
pub mod plot;
pub mod scenario;
pub mod simulate;
pub mod trace;

use std::io::{Read, Write};

use thiserror::Error;
use weir_core::{CostError, Policy};

pub use simulate::{Format, LeaseNames, Outcome, RowWriter, Simulator};
pub use trace::{Arrival, Op, TraceError, TraceReader};

/// Why a simulation stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SimError {
    /// A row of the trace is malformed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A row asks for a cost the policy can never admit.
    #[error("line {line}: {error}{}", if policy.is_empty() { String::new() } else { format!(" (policy {policy})") })]
    Cost {
        /// The trace line.
        line: u64,
        /// The policy's label, empty when there is only one.
        policy: String,
        /// What is wrong with the cost.
        error: CostError,
    },
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
}

/// Replays `input` through `policy`, writing a decision row per arrival as it
/// goes; at the first bad row it stops, having written nothing for that row
/// or any after it.
pub fn simulate(
    policy: Policy,
    penalty: Option<weir_core::Penalty>,
    arrivals: impl IntoIterator<Item = Result<Arrival, TraceError>>,
    out: impl Write,
    format: Format,
) -> Result<(), SimError> {
    let mut sim = Simulator::with_penalty(policy, penalty);
    let mut rows = RowWriter::new(out, format);
    let result = arrivals.into_iter().try_for_each(|arrival| {
        let arrival = arrival?;
        let outcome = sim.step(&arrival).map_err(|error| SimError::Cost {
            line: arrival.line,
            policy: String::new(),
            error,
        })?;
        rows.row(&arrival, &outcome.decision)?;
        Ok::<_, SimError>(())
    });
    rows.finish()?;
    result
}

/// Reads a trace from `input` (see [`trace`]).
pub fn read_trace<R: Read>(input: R) -> TraceReader<R> {
    TraceReader::new(input)
}
