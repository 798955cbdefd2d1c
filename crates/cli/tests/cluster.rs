//! A Redis Cluster of three masters and three replicas behind `weir serve`,
//! under load over many keys on every shard: one master killed degrades
//! only its own slots, and weir is back on Redis soon after the promotion.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_redis::cluster::slot;
use weir_testkit::Cluster;

use crate::serve::{Server, temp};

/// One answer: when, which key, degraded or not, how long it took.
type Answer = (Instant, usize, bool, Duration);

const KEYS: usize = 300;

fn identity(key: usize) -> String {
    // The decision API stores `KEY` as `api:KEY`.
    format!("api:k{key}")
}

/// Checks keys round-robin from `threads` threads until `stop` is set.
fn load(
    server: &Arc<Server>,
    threads: usize,
    stop: &Arc<Mutex<bool>>,
) -> Vec<std::thread::JoinHandle<Vec<Answer>>> {
    (0..threads)
        .map(|t| {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                let mut key = t;
                while !*stop.lock().unwrap() {
                    let body = format!(r#"{{"policy":"api","key":"k{key}"}}"#);
                    let started = Instant::now();
                    let (status, reply) = server.request("POST", "/v1/check", &body);
                    assert_eq!(status, 200, "{reply}");
                    answers.push((
                        started,
                        key,
                        reply.contains("\"degraded\":true"),
                        started.elapsed(),
                    ));
                    key = (key + threads) % KEYS;
                }
                answers
            })
        })
        .collect()
}

#[test]
fn one_master_down_degrades_only_its_own_slots() {
    let mut cluster = Cluster::with_replicas(3, 1);
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"100ms\"\n\n[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 1000000\nrate = \"1000000/s\"\n",
        cluster.url()
    );
    let path = temp("cluster-failover.toml", &config);
    let server = Arc::new(Server::start(&["--config", path.to_str().unwrap()]));
    let started = Instant::now();
    while server
        .request("GET", "/readyz", "")
        .1
        .matches("\"up\":true")
        .count()
        < 3
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the cluster never came up in weir"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The master of k0's slot dies; a surviving master tells the promotion.
    let victim = cluster.master_of(slot(&identity(0)), 0).unwrap();
    let survivor = cluster
        .masters(0)
        .into_iter()
        .map(|(i, _)| i)
        .find(|&i| i != victim)
        .unwrap();
    let on_victim: Vec<bool> = (0..KEYS)
        .map(|k| cluster.master_of(slot(&identity(k)), survivor) == Some(victim))
        .collect();
    assert!(on_victim.iter().any(|v| *v) && on_victim.iter().any(|v| !*v));

    let stop = Arc::new(Mutex::new(false));
    let threads = load(&server, 4, &stop);
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = loop {
        let owner = cluster.master_of(slot(&identity(0)), survivor);
        if owner.is_some_and(|o| o != victim) {
            break Instant::now();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no replica was promoted"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_secs(2));
    *stop.lock().unwrap() = true;
    let answers: Vec<Answer> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();

    // Other shards' keys were never degraded.
    let others = answers.iter().filter(|a| !on_victim[a.1]);
    let degraded_others = others.clone().filter(|a| a.2).count();
    assert_eq!(
        degraded_others,
        0,
        "{degraded_others} of {} answers for other shards degraded",
        others.count()
    );
    // Its own keys were, while it was down — and not long after.
    let own_degraded: Vec<&Answer> = answers.iter().filter(|a| on_victim[a.1] && a.2).collect();
    assert!(
        !own_degraded.is_empty(),
        "the dead master's keys were never degraded"
    );
    let last = own_degraded.iter().map(|a| a.0 + a.3).max().unwrap();
    let back = last.saturating_duration_since(promoted);
    eprintln!(
        "failover: promoted {:?} after the kill; last degraded answer {back:?} after the promotion; {} of {} answers degraded",
        promoted - killed,
        own_degraded.len(),
        answers.len()
    );
    assert!(
        back <= Duration::from_secs(1),
        "back on Redis {back:?} after the promotion"
    );
    // Every answer within the store timeout and a margin.
    let slowest = answers.iter().map(|a| a.3).max().unwrap();
    assert!(
        slowest <= Duration::from_millis(400),
        "slowest answer {slowest:?}"
    );
}
