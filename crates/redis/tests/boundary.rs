//! The store boundary (`weir_core::store::Store`) answered alike by the
//! in-process limiter and by Redis: the same requests — checks of several
//! policies, reports into debt, a lease's take, renewal and release, a
//! peek, new keys refused, an invalid request, a reset — give the same
//! decisions, asked only through the trait. (The exact timings are the
//! contract suites'; the policies here refill by the hour, so that the two
//! clocks cannot tell them apart.)

use std::sync::Arc;

use weir_core::store::{Check, Checked, Error, LeaseOp, Mode, Store};
use weir_core::{CheckError, Policy};
use weir_limiter::Limiter;
use weir_testkit::RedisServer;

/// What a request answered, without the times the two clocks measure.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Decided {
        allowed: bool,
        each: Vec<(bool, u64, bool)>,
        created: usize,
        new_key_refused: bool,
    },
    Invalid(CheckError),
    Other(String),
}

fn seen(answer: Result<Checked, Error>) -> Seen {
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

fn policies() -> [(&'static str, Policy); 3] {
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
async fn script<S: Store>(store: &S, policies: &[(&'static str, Policy)]) -> Vec<Seen> {
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

#[test]
fn every_store_answers_the_boundary_alike() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start(&[]);
    let policies = policies();
    let mut builder = Limiter::builder();
    for (name, policy) in &policies {
        builder = builder.policy(*name, *policy);
    }
    let limiter = Arc::new(builder.build().unwrap());
    runtime.block_on(async {
        let redis = weir_redis::RedisStore::connect(&server.url())
            .await
            .unwrap();
        let in_process = script(&limiter, &policies).await;
        let on_redis = script(&redis, &policies).await;
        assert_eq!(in_process, on_redis);
        // And the answers are the spec's, not merely the same.
        assert_eq!(
            in_process[2],
            Seen::Decided {
                allowed: false,
                each: vec![(false, 0, false), (true, 2, false)],
                created: 0,
                new_key_refused: false,
            },
            "the bucket refuses, the day is not charged: {in_process:#?}"
        );
        assert!(matches!(
            &in_process[13],
            Seen::Decided {
                new_key_refused: true,
                allowed: false,
                ..
            }
        ));
        assert!(matches!(
            in_process[15],
            Seen::Invalid(CheckError::DuplicateCheck { .. })
        ));
    });
}
