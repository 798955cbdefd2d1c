//! The store boundary (`weir_core::store::Store`) answered alike by the
//! in-process limiter and by Redis: `weir_testkit::boundary`'s requests,
//! asked only through the trait, give the same decisions. (The exact
//! timings are the contract suites'.)

use std::sync::Arc;

use weir_limiter::Limiter;
use weir_testkit::RedisServer;
use weir_testkit::boundary::{CheckError, Seen, policies, script};

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
        // Semantics, not timeouts: a machine busy with other tests may
        // hold a call past the 50 ms default.
        let redis = weir_redis::RedisStore::connect(&server.url())
            .await
            .unwrap()
            .with_timeout(std::time::Duration::from_secs(5));
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
