//! Redis behind its breaker, with the fallback (`Guarded`), is a store like
//! any other: while Redis answers, the boundary's requests are answered as
//! the in-process limiter answers them; when it does not, each check by its
//! `on_store_error` rule.

use std::sync::Arc;
use std::time::Duration;

use weir_core::store::{Check, Error, Mode, OnStoreError, Store};
use weir_limiter::Limiter;
use weir_server::breaker::Remote;
use weir_server::guarded::Guarded;
use weir_testkit::RedisServer;
use weir_testkit::boundary::{policies, script};

fn limiter() -> Arc<Limiter> {
    let mut builder = Limiter::builder();
    for (name, policy) in policies() {
        builder = builder.policy(name, policy);
    }
    Arc::new(builder.build().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guarded_store_answers_as_every_store_and_falls_back_by_each_rule() {
    let mut redis = RedisServer::start(&[]);
    let text = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"100ms\"\n\n[policies.p]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n",
        redis.url()
    );
    let config = weir_server::config::parse(&text, &Default::default()).unwrap();
    let remote = Remote::new(&redis.url(), &config.store, 1024);
    assert!(remote.wait_up(Duration::from_secs(5)).await, "Redis is up");
    let guarded = Guarded {
        remote,
        fallback: limiter(),
    };
    let policies = policies();
    assert_eq!(
        script(&guarded, &policies).await,
        script(&limiter(), &policies).await
    );

    redis.kill();
    let (name, policy) = &policies[0];
    let with = |on_error, key| Check {
        on_error,
        ..Check::from(weir_core::Check {
            name,
            policy,
            key,
            cost: 1,
        })
    };
    // Until the breaker opens, each call waits at most the timeout; then
    // none waits. The fallback's bucket holds 3.
    for _ in 0..3 {
        let asked = [with(Some(OnStoreError::Local), "f")];
        let local = guarded.decide(&asked, Mode::CHARGE).await.unwrap();
        assert!(local.degraded && local.all.allowed);
    }
    // The fallback's bucket of 3 was spent: refused, degraded.
    let asked = [with(Some(OnStoreError::Local), "f")];
    let spent = guarded.decide(&asked, Mode::CHARGE).await.unwrap();
    assert!(spent.degraded && !spent.all.allowed);
    let asked = [with(Some(OnStoreError::Allow), "g")];
    let allowed = guarded.decide(&asked, Mode::CHARGE).await.unwrap();
    assert!(allowed.degraded && allowed.all.allowed);
    assert_eq!(
        allowed.all.decisions[0].remaining, 3,
        "the full limit, uncounted"
    );
    let both = [
        with(Some(OnStoreError::Local), "h"),
        Check {
            on_error: Some(OnStoreError::Deny),
            ..with(None, "h2")
        },
    ];
    assert_eq!(
        guarded.decide(&both, Mode::CHARGE).await,
        Err(Error::Denied)
    );
    let unruled = guarded.decide(&[with(None, "i")], Mode::CHARGE).await;
    assert!(
        matches!(
            unruled,
            Err(Error::Unavailable {
                kind: "circuit_open" | "timeout" | "redis",
                ..
            })
        ),
        "{unruled:?}"
    );
    assert!(
        guarded.exists("burst", "a").await.is_err(),
        "never the fallback's word"
    );
    // An invalid request is refused as invalid, up or down.
    let twice = [
        with(Some(OnStoreError::Local), "t"),
        with(Some(OnStoreError::Local), "t"),
    ];
    assert!(matches!(
        guarded.decide(&twice, Mode::CHARGE).await,
        Err(Error::Invalid(_))
    ));
}
