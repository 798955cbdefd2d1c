//! The store boundary's script: the same requests asked of any
//! `weir_core::store::Store` — checks of several policies, reports into
//! debt, a lease's take, renewal and release, a peek, new keys refused, an
//! invalid request, a reset — and what each answered, without the times
//! two clocks would measure differently (the policies refill by the hour).
//! Every store must answer it alike.

pub use weir_core::CheckError;
use weir_core::Policy;
use weir_core::store::{Check, Checked, Error, LeaseOp, Mode, Store};

/// What a request answered, without the times the two clocks measure.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// A decision.
    Decided {
        /// Whether the request was admitted.
        allowed: bool,
        /// Per check: allowed, remaining, took a lease.
        each: Vec<(bool, u64, bool)>,
        /// Keys created.
        created: usize,
        /// Refused for a new key.
        new_key_refused: bool,
    },
    /// Refused as invalid.
    Invalid(CheckError),
    /// Anything else, as text.
    Other(String),
}

/// What `answer` shows of a request.
pub fn seen(answer: Result<Checked, Error>) -> Seen {
    match answer {
        Ok(c) => Seen::Decided {
            allowed: c.all.allowed,
            each: (c.all.decisions.iter())
                .map(|d| (d.allowed, d.remaining, d.lease.is_some()))
                .collect(),
            created: c.created,
            new_key_refused: c.new_key_refused,
        },
        Err(Error::Invalid(e)) => Seen::Invalid(e),
        Err(e) => Seen::Other(e.to_string()),
    }
}

/// The script's policies (name, parameters): a store that keeps its own
/// must keep these.
pub fn policies() -> [(&'static str, Policy); 3] {
    [
        (
            "burst",
            Policy::parse("token-bucket capacity=3 rate=1/h").unwrap(),
        ),
        (
            "daily",
            Policy::parse("fixed-window limit=5 window=1d").unwrap(),
        ),
        (
            "jobs",
            Policy::parse("concurrency limit=1 lease=1h").unwrap(),
        ),
    ]
}

/// The requests, asked of `store`; what each answered.
pub async fn script<S: Store>(store: &S, policies: &[(&'static str, Policy)]) -> Vec<Seen> {
    let check = |i: usize, key: &'static str, cost: u64| {
        let (name, policy) = &policies[i];
        Check::from(weir_core::Check {
            name,
            policy,
            key,
            cost,
        })
    };
    let mut seen_all = Vec::new();
    // Two policies, all-or-nothing: 3 fit the bucket, the 4th does not
    // (and the day, which would admit it, is not charged).
    for cost in [2, 1, 1] {
        let asked = [check(0, "a", cost), check(1, "a", cost)];
        seen_all.push(seen(store.decide(&asked, Mode::CHARGE).await));
    }
    // A report goes into debt; a check is refused until it is paid.
    let report = Check {
        report: true,
        ..check(0, "b", 5)
    };
    seen_all.push(seen(store.decide(&[report], Mode::CHARGE).await));
    seen_all.push(seen(store.decide(&[check(0, "b", 1)], Mode::CHARGE).await));
    // A peek charges nothing.
    for _ in 0..2 {
        seen_all.push(seen(store.decide(&[check(1, "p", 1)], Mode::Peek).await));
    }
    // A lease: taken, the next refused, renewed, released, taken again.
    let taken = store
        .decide(&[check(2, "j", 1)], Mode::CHARGE)
        .await
        .unwrap();
    let lease = taken.all.decisions[0].lease.expect("a lease");
    seen_all.push(seen(Ok(taken)));
    seen_all.push(seen(store.decide(&[check(2, "j", 1)], Mode::CHARGE).await));
    let (name, policy) = &policies[2];
    let job = weir_core::Check {
        name,
        policy,
        key: "j",
        cost: 0,
    };
    for op in [
        LeaseOp::Renew(lease),
        LeaseOp::Release(lease),
        LeaseOp::Release(lease),
    ] {
        let decided = store.on_lease(job, op).await.map(|d| Checked {
            all: weir_core::AllDecision {
                allowed: d.allowed,
                decisions: vec![d],
            },
            ..Checked::default()
        });
        seen_all.push(seen(decided));
    }
    // (Whether it creates the key again differs: Redis deletes a key whose
    // last lease was released, the limiter keeps it until a sweep.)
    let mut again = seen(store.decide(&[check(2, "j", 1)], Mode::CHARGE).await);
    if let Seen::Decided { created, .. } = &mut again {
        *created = 0;
    }
    seen_all.push(again);
    // A key that must not be created is refused, storing nothing; a known
    // one is decided as ever.
    let no_new = |key| Check {
        no_new_key: true,
        ..check(0, key, 1)
    };
    seen_all.push(seen(store.decide(&[no_new("new")], Mode::CHARGE).await));
    seen_all.push(seen(store.decide(&[no_new("a")], Mode::CHARGE).await));
    // A pair named twice is invalid, nothing charged.
    let twice = [check(1, "t", 1), check(1, "t", 1)];
    seen_all.push(seen(store.decide(&twice, Mode::CHARGE).await));
    // Exists, then reset grants a fresh allowance.
    let flag = |b: Result<bool, Error>| Seen::Other(format!("{b:?}"));
    seen_all.push(flag(store.exists("burst", "a").await));
    seen_all.push(flag(store.exists("burst", "nobody").await));
    seen_all.push(flag(store.reset("burst", "a").await));
    seen_all.push(seen(store.decide(&[check(0, "a", 3)], Mode::CHARGE).await));
    seen_all
}
