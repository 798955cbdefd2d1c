//! The limiter as a [`store::Store`]: the boundary every face decides
//! through, answered at once (the future is ready when made).

use weir_core::store::{self, Checked, LeaseOp, Mode};
use weir_core::{AllDecision, Decision};

use crate::{Check, Clock, Error, Limiter};

impl From<Error> for store::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(e) => Self::Invalid(e),
            Error::TooManyKeys { max } => Self::Full { max },
            // A built limiter reports its configuration once, when built;
            // an ad-hoc policy past the limit is a request it cannot take.
            Error::Config(_) => {
                Self::Unsupported("more ad-hoc policies than a limiter holds (AD_HOC)")
            }
        }
    }
}

impl<C: Clock + Send + Sync> store::Store for Limiter<C> {
    fn decide(
        &self,
        checks: &[store::Check<'_>],
        mode: Mode,
    ) -> impl Future<Output = Result<Checked, store::Error>> + Send {
        std::future::ready(self.decide_now(checks, mode))
    }

    fn exists(
        &self,
        name: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, store::Error>> + Send {
        let id = self.policy(name);
        std::future::ready(Ok(id.is_ok_and(|id| self.contains(id, key))))
    }

    fn reset(
        &self,
        name: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, store::Error>> + Send {
        let reset = match self.policy(name) {
            Ok(id) => Limiter::reset(self, id, key).map_err(store::Error::from),
            Err(_) => Ok(false),
        };
        std::future::ready(reset)
    }

    fn lift_ban(
        &self,
        name: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, store::Error>> + Send {
        let lifted = match self.policy(name) {
            Ok(id) => Limiter::lift_ban(self, id, key).map_err(store::Error::from),
            Err(_) => Ok(false),
        };
        std::future::ready(lifted)
    }

    fn parameters(&self, name: &str) -> Option<weir_core::Policy> {
        Limiter::parameters(self, name)
    }
}

impl<C: Clock> Limiter<C> {
    /// [`store::Store::decide`], at once. A check's policy is this
    /// limiter's policy of its name; a name it does not know is added from
    /// the check ([`Limiter::ad_hoc`]).
    pub fn decide_now(
        &self,
        checks: &[store::Check<'_>],
        mode: Mode,
    ) -> Result<Checked, store::Error> {
        let resolved = checks
            .iter()
            .map(|c| {
                Ok(Check {
                    policy: self.ad_hoc_penalized(c.check.name, *c.check.policy, c.penalty)?,
                    key: c.check.key,
                    cost: c.check.cost,
                    shadow: c.shadow,
                    probe: c.probe,
                })
            })
            .collect::<Result<smallvec::SmallVec<[Check<'_>; 4]>, Error>>()?;
        let decided = |decisions: Vec<Decision>, allowed| Checked {
            all: AllDecision { allowed, decisions },
            ..Checked::default()
        };
        if let ([check], [resolved]) = (checks, resolved.as_slice())
            && check.is_lease_op()
        {
            let decision = match check.lease {
                LeaseOp::Renew(id) => self.renew(resolved.policy, resolved.key, id),
                LeaseOp::Release(id) | LeaseOp::Take(id) => {
                    self.release(resolved.policy, resolved.key, id)
                }
            }?;
            return Ok(decided(vec![decision], decision.allowed));
        }
        if checks.iter().any(store::Check::is_lease_op) {
            return Err(store::Error::Unsupported(
                "a lease's release or renewal is a request of its own",
            ));
        }
        if mode == Mode::Peek {
            let decisions = (resolved.iter())
                .map(|&c| Ok(self.peek(c)?.0))
                .collect::<Result<Vec<_>, Error>>()?;
            let allowed = decisions.iter().all(|d| d.allowed);
            return Ok(decided(decisions, allowed));
        }
        // Keys this request would store: refused when it may not, counted
        // when it did.
        let is_new = |c: &Check<'_>| !self.contains(c.policy, c.key);
        if (checks.iter().zip(&resolved)).any(|(c, r)| c.no_new_key && is_new(r)) {
            let decisions = vec![Decision::default(); checks.len()];
            return Ok(Checked {
                new_key_refused: true,
                ..decided(decisions, false)
            });
        }
        let new = match checks.iter().any(|c| c.count_created) {
            true => resolved.iter().filter(|c| is_new(c)).count(),
            false => 0,
        };
        let reports = checks.iter().filter(|c| c.report).count();
        if reports == checks.len() {
            let decisions = self.report_all(&resolved)?;
            return Ok(Checked {
                created: new,
                ..decided(decisions, true)
            });
        }
        if reports > 0 {
            return Err(store::Error::Unsupported(
                "a request's checks are all reports or none",
            ));
        }
        let max_delay = match mode {
            Mode::Charge { max_delay } => max_delay,
            Mode::Peek => 0,
        };
        let all = self.check_all_within(&resolved, max_delay)?;
        Ok(Checked {
            created: if all.allowed { new } else { 0 },
            all,
            ..Checked::default()
        })
    }
}
