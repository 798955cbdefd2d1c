//! Probes and penalties (docs/SPEC.md, "Probes" and "Penalties (bans)").
//!
//! A [`Penalty`] turns "over the limit" into "shut out for a while, longer
//! each time": after a refusal the key is refused until its ban ends, and
//! each ban within `memory` of the last is `factor` times longer, up to
//! `max`. Its state, [`Ban`], sits beside the policy's own; both change
//! only through [`Penalty::decide`], a pure transition like every
//! algorithm's.

use std::fmt;

use crate::algo::LeaseId;
use crate::policy::{PolicyError, PolicyErrorKind};
use crate::units::{DisplayDuration, parse_duration};
use crate::{CostError, Decision, NANOS_PER_SEC, Nanos, Policy, State};

/// The longest ban, `max` and `memory`: 100 days (every time a ban adds
/// stays exact in the Redis store's doubles, below 2^53 ns).
pub const MAX_BAN: Nanos = 100 * 86_400 * NANOS_PER_SEC;

/// The largest `factor`.
pub const MAX_FACTOR: u64 = 1_000;

/// What one request does to a key (the store's decision of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A check: charged when allowed (a concurrency admission takes this
    /// lease).
    Check(LeaseId),
    /// Answered as a check would be, charging nothing (docs/SPEC.md's probe).
    Probe,
    /// Usage after the fact: always charged.
    Report,
}

/// A policy's `penalty`: `ban` B, `factor` F, `max` X, `memory` M.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    ban: Nanos,
    factor: u64,
    max: Nanos,
    memory: Nanos,
}

/// A key's ban: until when, its level, and when the last one began
/// (`None`: never banned, or forgotten).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ban {
    /// When the current (or last) ban ends.
    pub until: Nanos,
    /// How many bans in a row, each within `memory` of the last.
    pub level: u64,
    /// When the last ban began.
    pub banned_at: Option<Nanos>,
}

impl Ban {
    /// The wait until the ban ends, at `t`: 0 when not banned.
    pub fn wait(&self, t: Nanos) -> Nanos {
        match self.banned_at {
            Some(_) if t < self.until => self.until - t,
            _ => 0,
        }
    }
}

fn bad(field: &str, message: String) -> PolicyError {
    PolicyError {
        field: field.to_owned(),
        kind: PolicyErrorKind::OutOfBounds(message),
    }
}

impl Penalty {
    /// A penalty: bans of `ban`, each within `memory` of the last `factor`
    /// times longer, up to `max`. `factor` defaults to 1, `max` to `ban`,
    /// `memory` to `max`.
    pub fn new(
        ban: Nanos,
        factor: Option<u64>,
        max: Option<Nanos>,
        memory: Option<Nanos>,
    ) -> Result<Self, PolicyError> {
        let max = max.unwrap_or(ban);
        let memory = memory.unwrap_or(max);
        let factor = factor.unwrap_or(1);
        for (field, value) in [("ban", ban), ("max", max), ("memory", memory)] {
            if value == 0 || value > MAX_BAN {
                return Err(bad(
                    field,
                    format!(
                        "{} is not between 1ns and {}",
                        DisplayDuration(value),
                        DisplayDuration(MAX_BAN)
                    ),
                ));
            }
        }
        if max < ban {
            return Err(bad(
                "max",
                format!(
                    "{} is shorter than `ban` ({})",
                    DisplayDuration(max),
                    DisplayDuration(ban)
                ),
            ));
        }
        if factor == 0 || factor > MAX_FACTOR {
            return Err(bad(
                "factor",
                format!("{factor} is not between 1 and {MAX_FACTOR}"),
            ));
        }
        Ok(Self {
            ban,
            factor,
            max,
            memory,
        })
    }

    /// Reads `ban`, `factor`, `max` and `memory` from `(name, text)` pairs
    /// (config and flags alike); `ban` is required.
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, PolicyError> {
        let (mut ban, mut factor, mut max, mut memory) = (None, None, None, None);
        for (name, value) in params {
            let invalid = |source| PolicyError {
                field: name.to_owned(),
                kind: PolicyErrorKind::Invalid {
                    value: value.to_owned(),
                    source,
                },
            };
            match name {
                "ban" => ban = Some(parse_duration(value).map_err(invalid)?),
                "max" => max = Some(parse_duration(value).map_err(invalid)?),
                "memory" => memory = Some(parse_duration(value).map_err(invalid)?),
                "factor" => {
                    factor = Some(crate::units::parse_count(value).map_err(invalid)?);
                }
                other => {
                    return Err(bad(
                        other,
                        "not a field of a penalty (it takes ban, factor, max, memory)".into(),
                    ));
                }
            }
        }
        let ban = ban.ok_or_else(|| bad("ban", "missing: how long the first ban lasts".into()))?;
        Self::new(ban, factor, max, memory)
    }

    /// The first ban's length.
    pub fn ban(&self) -> Nanos {
        self.ban
    }

    /// Each ban within `memory` of the last is this many times longer.
    pub fn factor(&self) -> u64 {
        self.factor
    }

    /// The longest ban.
    pub fn max(&self) -> Nanos {
        self.max
    }

    /// How long a ban's level is remembered, from its start.
    pub fn memory(&self) -> Nanos {
        self.memory
    }

    /// The length of a ban of `level` (1 for the first):
    /// `min(ban · factor^(level − 1), max)`.
    pub fn length(&self, level: u64) -> Nanos {
        let mut length = self.ban;
        if self.factor > 1 {
            for _ in 1..level.min(64) {
                length = length.saturating_mul(self.factor);
                if length >= self.max {
                    break;
                }
            }
        }
        length.min(self.max)
    }

    /// When a key's ban state may be forgotten: its ban over and its level
    /// no longer remembered (docs/SPEC.md: `until` and `banned_at + memory`).
    pub fn forgotten_at(&self, ban: &Ban) -> Nanos {
        ban.banned_at
            .map_or(0, |at| ban.until.max(at.saturating_add(self.memory)))
    }

    /// Decides `op` of `cost` at `now` under `policy` with this penalty:
    /// while banned, checks and probes are refused and charge nothing; a
    /// check or probe the policy refuses starts a ban (or the next, longer
    /// one); a report is charged as always, and answers the ban's wait.
    pub fn decide(
        &self,
        policy: &Policy,
        state: &mut State,
        ban: &mut Ban,
        now: Nanos,
        cost: u64,
        op: Op,
    ) -> Result<Decision, CostError> {
        let t = now.max(state.seen());
        if op == Op::Report {
            let decision = policy.report(state, now, cost)?;
            return Ok(with_ban(decision, ban.wait(t)));
        }
        if cost > 0 {
            policy.validate_cost(cost)?;
        }
        if ban.wait(t) > 0 {
            let own = policy.peek(state, t, cost)?;
            // Moves the key's latest time, charging nothing.
            let standing = policy.check(state, t, 0)?;
            return Ok(refused(own, standing.reset, ban.wait(t)));
        }
        let decision = match op {
            Op::Check(lease) => policy.acquire(state, now, cost, lease)?,
            _ => policy.probe(state, now, cost)?,
        };
        if decision.allowed {
            return Ok(decision);
        }
        let remembered = ban
            .banned_at
            .is_some_and(|at| t.saturating_sub(at) < self.memory);
        ban.level = if remembered { ban.level + 1 } else { 1 };
        ban.until = t.saturating_add(self.length(ban.level));
        ban.banned_at = Some(t);
        let standing = policy.peek(state, t, 0)?;
        Ok(Decision {
            new_ban: true,
            ..refused(decision, standing.reset, ban.wait(t))
        })
    }

    /// The answer [`Penalty::decide`] would give to a check or probe,
    /// changing nothing: a banned key's refusal, or the policy's own
    /// decision (which would start a ban when it refuses).
    pub fn peek(
        &self,
        policy: &Policy,
        state: &State,
        ban: &Ban,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CostError> {
        let t = now.max(state.seen());
        let own = policy.peek(state, t, cost)?;
        match ban.wait(t) {
            0 => Ok(own),
            wait => Ok(refused(own, policy.peek(state, t, 0)?.reset, wait)),
        }
    }
}

/// A refusal while banned `wait` more: `retry_after` and `reset` at least
/// the ban's wait, nothing remaining.
fn refused(own: Decision, own_reset: Nanos, wait: Nanos) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_after: wait.max(if own.allowed { 0 } else { own.retry_after }),
        reset: wait.max(own_reset),
        delay: 0,
        lease: None,
        banned: wait,
        new_ban: false,
    }
}

/// A report's answer while banned `wait` more.
fn with_ban(decision: Decision, wait: Nanos) -> Decision {
    Decision {
        retry_after: decision.retry_after.max(wait),
        reset: decision.reset.max(wait),
        banned: wait,
        ..decision
    }
}

impl fmt::Display for Penalty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ban={} factor={} max={} memory={}",
            DisplayDuration(self.ban),
            self.factor,
            DisplayDuration(self.max),
            DisplayDuration(self.memory)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    #[test]
    fn lengths_grow_by_factor_up_to_max() {
        let p = Penalty::new(15 * 60 * S, Some(4), Some(86_400 * S), None).unwrap();
        assert_eq!(p.length(1), 15 * 60 * S);
        assert_eq!(p.length(2), 60 * 60 * S);
        assert_eq!(p.length(3), 4 * 60 * 60 * S);
        assert_eq!(p.length(5), 86_400 * S);
        assert_eq!(p.length(u64::MAX), 86_400 * S);
        let flat = Penalty::new(S, None, None, None).unwrap();
        assert_eq!(flat.length(u64::MAX), S);
        assert_eq!(flat.memory(), S);
    }

    #[test]
    fn errors_name_the_field() {
        let e = |p: &[(&str, &str)]| Penalty::from_params(p.iter().copied()).unwrap_err().field;
        assert_eq!(e(&[("factor", "2")]), "ban");
        assert_eq!(e(&[("ban", "1m"), ("max", "1s")]), "max");
        assert_eq!(e(&[("ban", "1m"), ("factor", "0")]), "factor");
        assert_eq!(e(&[("ban", "101d")]), "ban");
        assert_eq!(e(&[("ban", "1m"), ("length", "1s")]), "length");
    }

    /// A token bucket of 2 per 10 s, banned 1 s then 4 s (within 100 s).
    #[test]
    fn a_refusal_bans_and_bans_grow_within_memory() {
        let policy = Policy::parse("token-bucket capacity=2 rate=1/10s").unwrap();
        let penalty = Penalty::new(S, Some(4), Some(60 * S), Some(100 * S)).unwrap();
        let mut state = policy.new_state();
        let mut ban = Ban::default();
        let mut go = |t: Nanos, op: Op| {
            penalty
                .decide(&policy, &mut state, &mut ban, t, 1, op)
                .unwrap()
        };
        assert!(go(0, Op::Check(0)).allowed);
        assert!(go(0, Op::Probe).allowed);
        assert!(go(0, Op::Check(0)).allowed);
        // Empty: refused by the bucket (retry 10 s), banned 1 s.
        let d = go(0, Op::Check(0));
        assert_eq!((d.allowed, d.retry_after, d.banned), (false, 10 * S, S));
        assert_eq!(d.reset, 20 * S);
        // At 10 s one token is back, no ban: admitted.
        assert!(go(10 * S, Op::Check(0)).allowed);
        // Refused again within memory: level 2, 4 s.
        let d = go(11 * S, Op::Probe);
        assert_eq!((d.allowed, d.banned, d.retry_after), (false, 4 * S, 9 * S));
        // At 14 s still banned though a token... not yet; at 20 s a token is
        // back but the ban ended at 15 s: admitted.
        let d = go(14 * S, Op::Check(0));
        assert_eq!((d.allowed, d.banned, d.retry_after), (false, S, 6 * S));
        assert!(go(20 * S, Op::Check(0)).allowed);
        // A report while banned is charged and answers the ban's wait.
        let d = go(20 * S, Op::Check(0));
        assert_eq!(d.banned, 16 * S);
        let d = go(21 * S, Op::Report);
        assert!(d.allowed);
        assert_eq!(d.banned, 15 * S);
        assert!(d.retry_after >= 15 * S);
    }
}
