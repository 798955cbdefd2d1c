//! A flood of distinct identities: memory stays bounded, and a key that is
//! still limited is never evicted to make room.

use weir_limiter::{Check, Error, FakeClock, Limiter, Policy};

const MILLION: u64 = 1_000_000;

/// Slow refill: every identity stays limited, so at the cap new identities
/// are refused — and the limited ones keep their state.
#[test]
fn a_million_identities_never_reset_a_limited_key() {
    let limiter = Limiter::builder()
        .policy(
            "p",
            Policy::parse("token-bucket capacity=1 rate=1/h").unwrap(),
        )
        .max_keys(100_000)
        .policy_max_keys("p", 100_000)
        .clock(FakeClock::at(1))
        .build()
        .unwrap();
    let (mut allowed, mut refused) = (0, 0);
    for i in 0..MILLION {
        match limiter.check(&format!("id-{i}"), 1) {
            Ok(d) => allowed += u64::from(d.allowed),
            Err(Error::TooManyKeys { max: 100_000 }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        if i % 100_000 == 0 {
            limiter.clock().advance(1_000_000); // 1 ms: nobody refills
        }
    }
    assert_eq!((allowed, refused), (100_000, 900_000));
    assert_eq!(limiter.len(), 100_000);
    for i in [0, 50_000, 99_999] {
        let d = limiter.check(&format!("id-{i}"), 1).unwrap();
        assert!(!d.allowed, "id-{i} is still limited, not reset");
    }
    // An hour later every key is idle again and new identities get room.
    limiter.clock().advance(3_600_000_000_000);
    assert!(limiter.check("newcomer", 1).unwrap().allowed);
    assert!(
        limiter.len() <= 2,
        "swept without anyone asking: {}",
        limiter.len()
    );
}

/// Fast refill: identities go idle as fast as they come, and the store stays
/// bounded without a single refusal or explicit sweep: by growth sweeps
/// (10,000 new identities a second, idle after 10 ms, removed a second
/// later) well below the cap, and by room sweeps at a cap below that or
/// under a million new identities a second.
#[test]
fn a_million_short_lived_identities_stay_bounded() {
    for (max_keys, bound, step) in [
        (100_000, 50_000, 100_000),
        (5_000, 5_000, 100_000),
        (50_000, 50_000, 1_000),
    ] {
        let policy = Policy::parse("fixed-window limit=3 window=10ms").unwrap();
        let limiter = Limiter::builder()
            .policy("p", policy)
            .max_keys(max_keys)
            .clock(FakeClock::at(1))
            .build()
            .unwrap();
        let mut largest = 0;
        for i in 0..MILLION {
            limiter.clock().advance(step);
            let d = limiter.check(&format!("id-{i}"), 1);
            assert!(d.unwrap().allowed, "cap {max_keys}, identity {i}");
            if i % 1_000 == 0 {
                largest = largest.max(limiter.len());
            }
        }
        assert!(largest <= bound, "cap {max_keys}: {largest} keys held");
    }
}

#[test]
fn a_flood_on_one_policy_leaves_the_others_new_keys() {
    let slow = Policy::parse("token-bucket capacity=1 rate=1/h").unwrap();
    let limiter = Limiter::builder()
        .policy("flooded", slow)
        .policy("other", slow)
        .max_keys(1_000)
        .policy_max_keys("flooded", 100)
        .build()
        .unwrap();
    let (flooded, other) = (
        limiter.policy("flooded").unwrap(),
        limiter.policy("other").unwrap(),
    );
    let mut refused = 0;
    for i in 0..500 {
        match limiter.check_one(Check::new(flooded, &format!("f-{i}"))) {
            Ok(d) => assert!(d.allowed),
            Err(Error::TooManyKeys { max: 100 }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 400, "the flooded policy holds its own 100");
    // The other has its share of the rest: (1,000 - 100) / 2.
    for i in 0..450 {
        let d = limiter
            .check_one(Check::new(other, &format!("o-{i}")))
            .unwrap();
        assert!(d.allowed, "new identities elsewhere are admitted");
    }
    assert_eq!(limiter.len(), 550);
}

/// With no budget of their own, policies share `max_keys` equally (one
/// share more for the ad-hoc policies): a flood on one never refuses new
/// identities on another, nor on an ad-hoc policy.
#[test]
fn by_default_each_policy_has_its_share_of_the_budget() {
    let slow = Policy::parse("token-bucket capacity=1 rate=1/h").unwrap();
    let limiter = Limiter::builder()
        .policy("flooded", slow)
        .policy("other", slow)
        .policy("listed", slow)
        .policy_max_keys("listed", 300)
        .max_keys(1_200)
        .build()
        .unwrap();
    let flooded = limiter.policy("flooded").unwrap();
    let refused = (0..1_000)
        .filter(|i| {
            let check = limiter.check_one(Check::new(flooded, &format!("f-{i}")));
            matches!(check, Err(Error::TooManyKeys { max: 300 }))
        })
        .count();
    assert_eq!(
        refused, 700,
        "the flooded policy holds its share, (1,200 - 300) / 3"
    );
    let other = limiter.policy("other").unwrap();
    let ad_hoc = limiter.ad_hoc("envoy-limit", slow).unwrap();
    let listed = limiter.policy("listed").unwrap();
    for i in 0..300 {
        for id in [other, ad_hoc, listed] {
            let d = limiter.check_one(Check::new(id, &format!("o-{i}")));
            assert!(d.unwrap().allowed, "new identities elsewhere are admitted");
        }
    }
}

/// Leases are bounded in number (so in bytes): with `max_leases` of 1,000
/// over two concurrency policies, one with a limit of 100 stores at most
/// 500 / 100 = 5 keys, whatever its key budget, and one with a limit of
/// 1 at most 500.
#[test]
fn leases_are_bounded_by_max_leases() {
    let limiter = Limiter::builder()
        .policy(
            "wide",
            Policy::parse("concurrency limit=100 lease=7d").unwrap(),
        )
        .policy(
            "narrow",
            Policy::parse("concurrency limit=1 lease=7d").unwrap(),
        )
        .max_leases(1_000)
        .clock(FakeClock::at(1))
        .build()
        .unwrap();
    let mut held = 0;
    for (name, keys, per_key, stored) in [("wide", 10, 100, 5), ("narrow", 1_000, 1, 500)] {
        let id = limiter.policy(name).unwrap();
        for k in 0..keys {
            for _ in 0..per_key {
                match limiter.check_all(&[Check::new(id, &format!("{name}-{k}"))]) {
                    Ok(d) => held += usize::from(d.allowed),
                    Err(Error::TooManyKeys { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let kept = (0..keys)
            .filter(|k| limiter.contains(id, &format!("{name}-{k}")))
            .count();
        assert_eq!(kept, stored, "{name}");
    }
    assert_eq!(held, 5 * 100 + 500, "no more leases than max_leases");
}

/// A release or a renewal of a key that is not stored holds nothing and
/// stores nothing: it takes no key from the budget.
#[test]
fn releases_and_renewals_store_no_key() {
    let limiter = Limiter::builder()
        .policy(
            "jobs",
            Policy::parse("concurrency limit=2 lease=1m").unwrap(),
        )
        .max_keys(10)
        .clock(FakeClock::at(1))
        .build()
        .unwrap();
    let id = limiter.policy("jobs").unwrap();
    for i in 0..100 {
        let key = format!("k-{i}");
        assert!(!limiter.release(id, &key, 42).unwrap().allowed);
        assert!(!limiter.renew(id, &key, 42).unwrap().allowed);
    }
    assert_eq!(limiter.len(), 0);
}
