//! One request's checks, validated once for every store.
//!
//! The in-process limiter, the Redis store and the server all refuse the same
//! requests with the same errors because they all call [`validate`]: a cost
//! that can never fit, a key over the bound and a (policy, key) pair named
//! twice are refused before anything is charged. [`AllDecision`] is the one
//! all-or-nothing answer every store gives, and [`escape`] the one way an
//! untrusted identity becomes part of a stored key.

use thiserror::Error;

use crate::{CostError, Decision, Nanos, Policy};

/// The longest identity a client may send, in bytes, whatever its source
/// (a decision API key, a header, a path segment, an Envoy descriptor).
pub const MAX_IDENTITY: usize = 256;

/// One check of a request: a policy (resolved, with its name), a key and
/// the cost to charge. A cost of 0 reports the key's standing, charging and
/// refusing nothing.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The policy's name (part of its keys and of errors).
    pub name: &'a str,
    /// The policy.
    pub policy: &'a Policy,
    /// Whose allowance.
    pub key: &'a str,
    /// The charge; 0 reports the standing.
    pub cost: u64,
}

/// Why a request can never be decided as given. A rejection is not an
/// error: it is a [`Decision`] with `allowed: false`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No policy has this name.
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    /// The cost can never be admitted under the policy.
    #[error("policy `{policy}`: {error}")]
    Cost {
        /// The policy's name.
        policy: String,
        /// What is wrong with the cost.
        error: CostError,
    },
    /// The key (or identity) is longer than the bound.
    #[error("key of {len} bytes is longer than the limit of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The same (policy, key) pair appears twice in one request.
    #[error("policy `{policy}` and key `{key}` appear twice in one check")]
    DuplicateCheck {
        /// The policy's name.
        policy: String,
        /// The key.
        key: String,
    },
}

/// `Ok` when `key` is at most `max` bytes.
pub fn check_key(key: &str, max: usize) -> Result<(), CheckError> {
    if key.len() > max {
        return Err(CheckError::KeyTooLong {
            len: key.len(),
            max,
        });
    }
    Ok(())
}

/// A report's cost within the report's own bound
/// ([`Policy::validate_report`](crate::Policy::validate_report)), as the
/// request error that names the policy.
pub fn validate_report(check: &Check<'_>) -> Result<(), CheckError> {
    check
        .policy
        .validate_report(check.cost)
        .map_err(|error| CheckError::Cost {
            policy: check.name.to_owned(),
            error,
        })
}

/// Validates one request's checks: each cost could ever fit its policy
/// (0 is a standing report and always valid), each key is at most
/// `max_key_len` bytes, and no (policy, key) pair appears twice.
pub fn validate(checks: &[Check<'_>], max_key_len: usize) -> Result<(), CheckError> {
    for (i, check) in checks.iter().enumerate() {
        check
            .policy
            .validate_cost(check.cost.max(1))
            .map_err(|error| CheckError::Cost {
                policy: check.name.to_owned(),
                error,
            })?;
        check_key(check.key, max_key_len)?;
        if checks[..i]
            .iter()
            .any(|c| c.name == check.name && c.key == check.key)
        {
            return Err(CheckError::DuplicateCheck {
                policy: check.name.to_owned(),
                key: check.key.to_owned(),
            });
        }
    }
    Ok(())
}

/// The outcome of a request over several policies, from any store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllDecision {
    /// True when every policy allowed, and so every policy was charged.
    pub allowed: bool,
    /// One decision per check, in order. When the request was rejected,
    /// nothing was charged: the policies that refused report their
    /// rejection, and the others `allowed: true` with their `remaining` and
    /// `reset` as they stand (and the `delay` they would have imposed).
    pub decisions: Vec<Decision>,
}

impl AllDecision {
    /// The earliest wait after which every refusing policy could admit:
    /// the largest `retry_after` among them (0 if allowed).
    pub fn retry_after(&self) -> Nanos {
        self.decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after)
            .max()
            .unwrap_or(0)
    }
}

/// Appends `text` to `out` with every byte outside `[A-Za-z0-9._-]` written
/// as `%XX`: no two texts escape alike, and the result holds none of the
/// separators keys are built with (`:`, `=`, `{`, `}`).
pub fn escape(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    out.reserve(text.len());
    // Runs of plain bytes are copied whole, the others written one by one. A
    // run is ASCII, so it starts and ends on character boundaries.
    let mut run = 0;
    for (at, b) in text.bytes().enumerate() {
        if plain(b) {
            continue;
        }
        if run < at {
            out.push_str(&text[run..at]);
        }
        for c in [b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xF)]] {
            out.push(char::from(c));
        }
        run = at + 1;
    }
    if run < text.len() {
        out.push_str(&text[run..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_validator() {
        let p = Policy::parse("token-bucket capacity=3 rate=1/s").unwrap();
        let check = |key, cost| Check {
            name: "a",
            policy: &p,
            key,
            cost,
        };
        assert!(validate(&[check("k", 3), check("j", 0)], 4).is_ok());
        assert!(matches!(
            validate(&[check("k", 4)], 4),
            Err(CheckError::Cost { .. })
        ));
        assert_eq!(
            validate(&[check("12345", 1)], 4),
            Err(CheckError::KeyTooLong { len: 5, max: 4 })
        );
        assert!(matches!(
            validate(&[check("k", 1), check("k", 1)], 4),
            Err(CheckError::DuplicateCheck { .. })
        ));
    }

    #[test]
    fn escaping_is_injective_on_separators() {
        let e = |t: &str| {
            let mut s = String::new();
            escape(&mut s, t);
            s
        };
        assert_eq!(e("a-b_c.9"), "a-b_c.9");
        assert_eq!(e("x}:{y"), "x%7D%3A%7By");
        assert_ne!(e("%41"), e("A"));
        assert_eq!(e("é"), "%C3%A9");
    }

    proptest::proptest! {
        /// The same text as escaping each byte on its own.
        #[test]
        fn escaping_matches_byte_by_byte(text in ".{0,40}") {
            let mut fast = String::from(">");
            escape(&mut fast, &text);
            let mut naive = String::from(">");
            for b in text.bytes() {
                if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
                    naive.push(char::from(b));
                } else {
                    naive.push_str(&format!("%{b:02X}"));
                }
            }
            proptest::prop_assert_eq!(fast, naive);
        }
    }
}
