//! A real three-node Redis Cluster: keys spread over the nodes, one
//! identity's policies in one slot.

use weir_core::{NANOS_PER_SEC, Policy};

use crate::contract::{
    LeaseStep, POLICIES, connect, queued_requests_decide_in_order, replay, replay_leases,
    replay_ops,
};
use weir_testkit::Cluster;

#[test]
fn a_cluster_decides_as_the_core() {
    let cluster = Cluster::start();
    let (runtime, store) = connect(&cluster.url());
    let trace: Vec<(i64, u8, u64)> = (0..60u64)
        .map(|i| (((i * 37) % 400) as i64 - 50, (i % 4) as u8, 1 + i % 2))
        .collect();
    // Then checks and reports, on and after each key's debt.
    let ops: Vec<(i64, u8, u64, bool)> = (0..60u64)
        .map(|i| (((i * 53) % 700) as i64, (i % 4) as u8, i % 9, i % 3 == 0))
        .collect();
    for (case, spec) in POLICIES.iter().enumerate() {
        let policy = Policy::parse(spec).unwrap();
        replay(&store, &runtime, policy, &trace, 1_000 + case as u64);
        replay_ops(&store, &runtime, policy, &ops, 2_000 + case as u64);
    }
    // A concurrency limit's checks, releases and renewals, on every node.
    let leases: Vec<(i64, u8, LeaseStep)> = (0..60u64)
        .map(|i| {
            let step = match i % 5 {
                0..=2 => LeaseStep::Check(1 + i % 2),
                3 => LeaseStep::Release((i / 2) as usize),
                _ => LeaseStep::Renew((i / 3) as usize),
            };
            (((i * 41) % 600) as i64 - 50, (i % 4) as u8, step)
        })
        .collect();
    let policy = Policy::parse("concurrency limit=3 lease=1s").unwrap();
    replay_leases(&store, &runtime, policy, &leases, 3_000);
    // Queued requests: a script call per hash slot, decided in order.
    queued_requests_decide_in_order(&cluster.url(), 2);
    // Several policies of one identity: one slot, one script.
    let a = Policy::parse("gcra burst=1 rate=1/h").unwrap();
    let b = Policy::parse("sliding-log limit=5 window=1h").unwrap();
    let at = Some(1_796_000_000 * NANOS_PER_SEC);
    let checks = [("a", &a, "tenant-9"), ("b", &b, "tenant-9")];
    assert!(
        runtime
            .block_on(store.check_all(&checks, 1, at))
            .unwrap()
            .all
            .allowed
    );
    assert!(
        !runtime
            .block_on(store.check_all(&checks, 1, at))
            .unwrap()
            .all
            .allowed
    );
    // Two identities may live on two nodes: refused, not decided by halves.
    let across = [("a", &a, "tenant-9"), ("b", &b, "tenant-10")];
    let refused = runtime
        .block_on(store.check_all(&across, 1, at))
        .unwrap_err();
    assert!(
        matches!(&refused, weir_redis::StoreError::Unsupported(m) if m.contains("share one identity")),
        "{refused}"
    );
}
