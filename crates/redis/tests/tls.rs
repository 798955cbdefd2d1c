//! A Redis that speaks TLS only, requires a client certificate and a
//! password (or an ACL user): reached with rustls, refused without what it
//! asks for, and every refusal a clear error.

use weir_core::{NANOS_PER_SEC, Policy};
use weir_redis::{Access, RedisStore, StoreError};
use weir_testkit::{Certs, RedisServer};

/// weir's least privilege on a single node (docs/SECURITY.md): its keys, its
/// channel, and the commands it and its script run.
pub(crate) const ACL: &str = "resetkeys ~rl:* resetchannels &rl:v1:resets -@all \
    +evalsha +eval +script|load +get +set +del +exists +dbsize +time +ping \
    +publish +subscribe +wait +cluster|slots";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn full(certs: &Certs) -> Access {
    Access {
        tls_ca: Some(certs.read("ca.pem")),
        tls_client: Some((certs.read("client.pem"), certs.read("client-key.pem"))),
        ..Access::default()
    }
}

/// A decision through `store` on a new key (returned): a token bucket of
/// 2, one token taken.
fn decides(runtime: &tokio::runtime::Runtime, store: &RedisStore) -> String {
    static KEYS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let key = KEYS
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string();
    // A thread's first check opens its own connection: a TLS handshake in
    // a debug build takes longer than the default timeout.
    let store = store
        .clone()
        .with_timeout(std::time::Duration::from_secs(5));
    let policy = Policy::parse("token-bucket capacity=2 rate=1/s").unwrap();
    let at = Some(1_796_000_000 * NANOS_PER_SEC);
    let d = runtime
        .block_on(store.check("tls", &policy, &key, 1, at))
        .unwrap();
    assert!(d.allowed && d.remaining == 1, "{d:?}");
    key
}

#[test]
fn tls_with_a_client_certificate_and_a_password() {
    let certs = Certs::new("redis-tls");
    let server = RedisServer::start_tls(&certs, &["--requirepass", "s3cret-pw"]);
    let runtime = runtime();
    let url = server.url();
    let connect = |access: &Access| runtime.block_on(RedisStore::connect_with(&url, access));

    let with = Access {
        password: Some("s3cret-pw".into()),
        ..full(&certs)
    };
    let store = connect(&with).unwrap();
    decides(&runtime, &store);
    // The password inside the URL works too, and is never shown.
    let inside = format!("rediss://:s3cret-pw@localhost:{}", server.port);
    let store = runtime
        .block_on(RedisStore::connect_with(&inside, &full(&certs)))
        .unwrap();
    decides(&runtime, &store);
    assert!(!weir_redis::redacted(&inside).contains("s3cret-pw"));

    let wrong = connect(&Access {
        password: Some("not-it".into()),
        ..full(&certs)
    })
    .unwrap_err();
    assert!(
        matches!(&wrong, StoreError::Credentials { user } if user == "default"),
        "{wrong}"
    );
    assert!(wrong.to_string().contains("user `default`"), "{wrong}");
    assert!(!wrong.to_string().contains("not-it"));
    // No client certificate, or the system's roots (which do not hold the
    // test's CA): no connection.
    let no_cert = Access {
        tls_client: None,
        ..with.clone()
    };
    assert!(connect(&no_cert).is_err());
    let system_roots = Access {
        tls_ca: None,
        ..with.clone()
    };
    assert!(connect(&system_roots).is_err());
    // Unverified, for the clouds that need it: the certificate is not
    // checked, the client certificate still sent.
    let unverified = Access {
        tls_ca: None,
        tls_insecure_skip_verify: true,
        ..with
    };
    decides(&runtime, &connect(&unverified).unwrap());
}

#[test]
fn an_acl_user_with_exactly_weirs_rule_is_enough() {
    let certs = Certs::new("redis-acl");
    let user = format!("weir on >weir-pw {ACL}");
    let user: Vec<&str> = std::iter::once("--user").chain(user.split(' ')).collect();
    let mut args = user;
    args.extend(["--user", "default", "off"]);
    let server = RedisServer::start_tls(&certs, &args);
    let runtime = runtime();
    let access = Access {
        username: Some("weir".into()),
        password: Some("weir-pw".into()),
        ..full(&certs)
    };
    let store = runtime
        .block_on(RedisStore::connect_with(&server.url(), &access))
        .unwrap();
    let key = decides(&runtime, &store);
    let store = store
        .with_marker(true)
        .with_timeout(std::time::Duration::from_secs(5));
    runtime.block_on(store.init_marker()).unwrap();
    runtime.block_on(store.ping()).unwrap();
    assert!(runtime.block_on(store.reset("tls", &key)).unwrap());
    let wrong = runtime
        .block_on(RedisStore::connect_with(
            &server.url(),
            &Access {
                password: Some("nope".into()),
                ..access
            },
        ))
        .unwrap_err();
    assert!(wrong.to_string().contains("user `weir`"), "{wrong}");
}

/// A Redis Cluster speaking TLS only: `tls = true` with `redis-cluster://`
/// reaches every master (the slots of several identities), client
/// certificate shown.
#[test]
fn a_tls_cluster_is_reached_with_tls_on() {
    let certs = Certs::new("cluster-tls");
    let cluster = weir_testkit::Cluster::start_tls(&certs);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis-cluster://{}", seeds.join(","));
    let runtime = runtime();
    let access = Access {
        tls: true,
        ..full(&certs)
    };
    let store = runtime
        .block_on(RedisStore::connect_with(&url, &access))
        .unwrap();
    // Identities whose slots fall on every master.
    for _ in 0..12 {
        decides(&runtime, &store);
    }
    // Without TLS the same seeds do not answer.
    let plain = runtime.block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(3),
            RedisStore::connect_with(&url, &full(&certs)),
        )
        .await
    });
    assert!(!matches!(plain, Ok(Ok(_))), "connected without TLS");
}

/// The same least-privilege rule on a Redis Cluster: the ACL user decides
/// on every master.
#[test]
fn the_acl_rule_is_enough_on_a_cluster() {
    let user = format!("weir on >weir-pw {ACL}");
    let args: Vec<&str> = std::iter::once("--user").chain(user.split(' ')).collect();
    let cluster = weir_testkit::Cluster::start_with(&args);
    let seeds: Vec<String> = (cluster.nodes.iter())
        .map(|n| format!("weir:weir-pw@127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis-cluster://{}", seeds.join(","));
    let runtime = runtime();
    let store = runtime
        .block_on(RedisStore::connect_with(&url, &Access::default()))
        .unwrap();
    for _ in 0..12 {
        decides(&runtime, &store);
    }
}

/// The common Sentinel layout: the master asks for a password, the
/// sentinels for none. Without sentinel credentials of its own, weir tries
/// the master's on the sentinels, and asks them without when they refuse;
/// an empty sentinel password says "none" outright. A sentinel that cannot
/// be asked is named in the error.
#[test]
fn sentinels_without_a_password_before_a_master_with_one() {
    let group = weir_testkit::Sentinels::start();
    // Both nodes: the sentinels, without it, may see the master fail and
    // promote the replica.
    for node in group.nodes.iter().rev() {
        node.cli(&["CONFIG", "SET", "masterauth", "master-pw"]);
        node.cli(&["CONFIG", "SET", "requirepass", "master-pw"]);
    }
    let runtime = runtime();
    let url = group.url();
    let connect = |access: &Access| runtime.block_on(RedisStore::connect_with(&url, access));
    let master = Access {
        password: Some("master-pw".into()),
        ..Access::default()
    };
    let store = connect(&master).expect("the sentinels asked without the master's password");
    decides(&runtime, &store);
    let none_for_sentinels = Access {
        sentinel_password: Some(String::new()),
        ..master.clone()
    };
    let store = connect(&none_for_sentinels).expect("an empty sentinel password: none");
    decides(&runtime, &store);
    let wrong = Access {
        sentinel_password: Some("not-theirs".into()),
        ..master
    };
    let error = connect(&wrong).unwrap_err().to_string();
    assert!(error.contains("sentinel 127.0.0.1:"), "{error}");
    assert!(
        !error.contains("not-theirs") && !error.contains("master-pw"),
        "{error}"
    );
}
