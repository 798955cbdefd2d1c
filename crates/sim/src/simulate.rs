//! Replaying arrivals through one policy, and writing the decisions as
//! docs/SPEC.md's simulator contract says: CSV with the header
//! `time,key,cost,allowed,remaining,retry_after,reset,delay` (durations in
//! seconds with nine decimals), or the same fields as JSON lines.

use std::collections::HashMap;
use std::io::{self, Write};

use weir_core::algo::LeaseId;
use weir_core::penalty::{self, Ban, Penalty};
use weir_core::units::Seconds;
use weir_core::{CostError, Decision, Nanos, Policy, State};

use crate::trace::{Arrival, Op};

/// One policy and the state of every key it has seen.
#[derive(Debug)]
pub struct Simulator {
    policy: Policy,
    penalty: Option<Penalty>,
    keys: HashMap<String, (State, Ban)>,
    leases: LeaseNames,
    /// The identity the next lease takes.
    next: LeaseId,
}

/// A trace's lease names (per key) and the identities their store chose.
#[derive(Debug, Default)]
pub struct LeaseNames(HashMap<(String, String), LeaseId>);

impl LeaseNames {
    /// The identity of the lease `arrival` names; 0 (no lease) for a name
    /// no admission took.
    pub fn of(&self, arrival: &Arrival) -> LeaseId {
        let name = arrival.lease.clone().unwrap_or_default();
        self.0
            .get(&(arrival.key.clone(), name))
            .copied()
            .unwrap_or(0)
    }

    /// Records the lease a check's admission took under the row's name.
    pub fn took(&mut self, arrival: &Arrival, decision: &Decision) {
        if let (Some(id), Some(name)) = (decision.lease, &arrival.lease) {
            self.0.insert((arrival.key.clone(), name.clone()), id);
        }
    }
}

/// A decision and the time it was evaluated at (`max(now, last_seen)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Evaluation time of the check.
    pub at: Nanos,
    /// The request's cost.
    pub cost: u64,
    /// What the policy decided.
    pub decision: Decision,
}

impl Simulator {
    /// A simulator where every key is new.
    pub fn new(policy: Policy) -> Self {
        Self::with_penalty(policy, None)
    }

    /// A simulator of `policy` under `penalty` (docs/SPEC.md's bans), where
    /// every key is new.
    pub fn with_penalty(policy: Policy, penalty: Option<Penalty>) -> Self {
        Self {
            policy,
            penalty,
            keys: HashMap::new(),
            leases: LeaseNames::default(),
            next: 1,
        }
    }

    /// The policy simulated.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decides one arrival (a check, or a report) against its key's state.
    pub fn step(&mut self, arrival: &Arrival) -> Result<Outcome, CostError> {
        let (state, ban) = match self.keys.get_mut(&arrival.key) {
            Some(key) => key,
            None => self
                .keys
                .entry(arrival.key.clone())
                .or_insert_with(|| (self.policy.new_state(), Ban::default())),
        };
        let at = arrival.time.max(state.seen());
        let (now, cost) = (arrival.time, arrival.cost);
        let decision = match (arrival.op, self.penalty) {
            (Some(Op::Release), _) => self.policy.release(state, now, self.leases.of(arrival))?,
            (Some(Op::Renew), _) => self.policy.renew(state, now, self.leases.of(arrival))?,
            (op, Some(p)) => {
                let op = match op {
                    Some(Op::Report) => penalty::Op::Report,
                    Some(Op::Probe) => penalty::Op::Probe,
                    _ => penalty::Op::Check(self.next),
                };
                let decision = p.decide(&self.policy, state, ban, now, cost, op)?;
                self.next += 1;
                self.leases.took(arrival, &decision);
                decision
            }
            (Some(Op::Report), None) => self.policy.report(state, now, cost)?,
            (Some(Op::Probe), None) => self.policy.probe(state, now, cost)?,
            (Some(Op::Check) | None, None) => {
                let decision = self.policy.acquire(state, now, cost, self.next)?;
                self.next += 1;
                self.leases.took(arrival, &decision);
                decision
            }
        };
        Ok(Outcome {
            at,
            cost: arrival.cost,
            decision,
        })
    }
}

/// Output formats of `weir simulate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// CSV with a header.
    #[default]
    Csv,
    /// One JSON object per line.
    Json,
}

/// Writes decision rows in the simulator's output format.
#[derive(Debug)]
pub struct RowWriter<W: Write> {
    out: W,
    format: Format,
    started: bool,
}

const HEADER: &str = "time,key,cost,allowed,remaining,retry_after,reset,delay";
const HEADER_OP: &str = "time,key,cost,op,allowed,remaining,retry_after,reset,delay";
const HEADER_LEASE: &str = "time,key,cost,op,lease,allowed,remaining,retry_after,reset,delay";

impl<W: Write> RowWriter<W> {
    /// A writer; the CSV header is written with the first row (or on finish).
    pub fn new(out: W, format: Format) -> Self {
        Self {
            out,
            format,
            started: false,
        }
    }

    fn start(&mut self, op: bool, lease: bool) -> io::Result<()> {
        if !self.started && self.format == Format::Csv {
            match (op, lease) {
                // A trace with a `lease` column: echoed after `op`.
                (_, true) => writeln!(self.out, "{HEADER_LEASE}")?,
                // A trace with an `op` column: echoed after `cost`.
                (true, false) => writeln!(self.out, "{HEADER_OP}")?,
                (false, false) => writeln!(self.out, "{HEADER}")?,
            }
        }
        self.started = true;
        Ok(())
    }

    /// Writes one decision row.
    pub fn row(&mut self, arrival: &Arrival, decision: &Decision) -> io::Result<()> {
        self.start(arrival.op.is_some(), arrival.lease.is_some())?;
        let name = match (arrival.op, &arrival.lease) {
            (None, None) => None,
            (op, _) => Some(op.unwrap_or(Op::Check).name()),
        };
        let mut op = name.map_or(String::new(), |name| match self.format {
            Format::Csv => format!(",{name}"),
            Format::Json => format!(r#","op":"{name}""#),
        });
        if let Some(lease) = &arrival.lease {
            match self.format {
                Format::Csv => op.push_str(&format!(",{}", csv_field(lease))),
                Format::Json => op.push_str(&format!(
                    r#","lease":{}"#,
                    serde_json::Value::from(lease.as_str())
                )),
            }
        }
        let d = decision;
        let (retry, reset, delay) = (Seconds(d.retry_after), Seconds(d.reset), Seconds(d.delay));
        match self.format {
            Format::Csv => writeln!(
                self.out,
                "{},{},{}{op},{},{},{retry},{reset},{delay}",
                arrival.time_text,
                csv_field(&arrival.key),
                arrival.cost,
                d.allowed,
                d.remaining
            ),
            Format::Json => writeln!(
                self.out,
                r#"{{"time":{},"key":{},"cost":{}{op},"allowed":{},"remaining":{},"retry_after":{retry},"reset":{reset},"delay":{delay}}}"#,
                json_number(&arrival.time_text),
                serde_json::Value::from(arrival.key.as_str()),
                arrival.cost,
                d.allowed,
                d.remaining
            ),
        }
    }

    /// Writes the header if no row was written, and flushes.
    pub fn finish(&mut self) -> io::Result<()> {
        self.start(false, false)?;
        self.out.flush()
    }
}

/// Quotes a CSV field when it holds a separator, quote or line break.
fn csv_field(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) || text.starts_with(' ') || text.ends_with(' ') {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

/// A validated decimal as a JSON number (JSON forbids leading zeros).
fn json_number(text: &str) -> &str {
    let trimmed = text.trim_start_matches('0');
    if trimmed.is_empty() || trimmed.starts_with('.') {
        &text[text.len() - trimmed.len() - 1..]
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_have_no_leading_zeros() {
        assert_eq!(json_number("0"), "0");
        assert_eq!(json_number("000"), "0");
        assert_eq!(json_number("0.25"), "0.25");
        assert_eq!(json_number("007.5"), "7.5");
        assert_eq!(json_number("00.5"), "0.5");
        assert_eq!(json_number("100"), "100");
    }

    #[test]
    fn csv_keys_are_quoted_when_needed() {
        assert_eq!(csv_field("842"), "842");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn keys_are_independent_and_times_clamped() {
        let policy = Policy::parse("fixed-window limit=1 window=10s").unwrap();
        let mut sim = Simulator::new(policy);
        let s = weir_core::NANOS_PER_SEC;
        assert!(
            sim.step(&Arrival::new(5 * s, "a", 1))
                .unwrap()
                .decision
                .allowed
        );
        assert!(
            sim.step(&Arrival::new(5 * s, "b", 1))
                .unwrap()
                .decision
                .allowed
        );
        // Back in time for `a`: evaluated at 5 s, still in the same window.
        let out = sim.step(&Arrival::new(s, "a", 1)).unwrap();
        assert_eq!(out.at, 5 * s);
        assert_eq!(out.decision.retry_after, 5 * s);
        assert!(sim.step(&Arrival::new(5 * s, "a", 2)).is_err());
    }
}
