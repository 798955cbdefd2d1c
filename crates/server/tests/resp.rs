//! The Redis protocol listener (`[server] resp`) over real sockets, asked
//! by the `redis` crate's client: `CL.THROTTLE` as redis-cell answers it,
//! `WEIR.*` on the configuration's policies (the decision API's keys),
//! `AUTH`/`HELLO`, and input that is not a command.

use std::net::SocketAddr;

use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_server::{AppState, Shared, config};

const CONFIG: &str = r#"
[policies.api]
algorithm = "gcra"
burst = 3
rate = "1/h"

[policies.jobs]
algorithm = "concurrency"
limit = 1
lease = "1m"
"#;

/// weir on `text`: its HTTP listener and its Redis protocol listener.
async fn start(text: &str) -> (SocketAddr, SocketAddr) {
    let config = config::parse(text, &Default::default()).unwrap();
    let state = AppState::new(Shared::new(config, None).unwrap());
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let resp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = (http.local_addr().unwrap(), resp.local_addr().unwrap());
    // On Redis: connected before the first command (until then each
    // policy's on_store_error decides).
    let shared = state.current();
    let up = shared
        .backend
        .wait_up(std::time::Duration::from_secs(5))
        .await;
    assert!(up, "the store did not come up");
    tokio::spawn(weir_server::run(
        http,
        state.clone(),
        std::future::pending(),
    ));
    tokio::spawn(weir_server::run_resp(resp, state, std::future::pending()));
    addrs
}

async fn client(addr: SocketAddr) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

async fn throttle(conn: &mut MultiplexedConnection, args: &[&str]) -> Vec<i64> {
    redis::cmd("CL.THROTTLE")
        .arg(args)
        .query_async(conn)
        .await
        .unwrap()
}

/// redis-cell's answers: limited, limit (max_burst + 1), remaining, retry
/// after (-1 when admitted) and reset after, in whole seconds rounded up.
#[tokio::test]
async fn cl_throttle_answers_as_redis_cell() {
    let (_, resp) = start(CONFIG).await;
    let mut conn = client(resp).await;
    // redis-cell's README: 15 at once, 30 per minute.
    assert_eq!(
        throttle(&mut conn, &["user123", "15", "30", "60", "1"]).await,
        [0, 16, 15, -1, 2]
    );
    // One an hour, one more at once: two, then refused for an hour.
    assert_eq!(
        throttle(&mut conn, &["u", "1", "1", "3600"]).await,
        [0, 2, 1, -1, 3600]
    );
    assert_eq!(
        throttle(&mut conn, &["u", "1", "1", "3600"]).await,
        [0, 2, 0, -1, 7200]
    );
    assert_eq!(
        throttle(&mut conn, &["u", "1", "1", "3600"]).await,
        [1, 2, 0, 3600, 7200]
    );
    // A quantity of 0 asks, charging nothing; a quantity over the burst
    // never fits.
    assert_eq!(
        throttle(&mut conn, &["u", "1", "1", "3600", "0"]).await,
        [0, 2, 0, -1, 7200]
    );
    assert_eq!(
        throttle(&mut conn, &["v", "4", "5", "10", "3"]).await,
        [0, 5, 2, -1, 6]
    );
    // The same key under other parameters is another limit.
    assert_eq!(
        throttle(&mut conn, &["u", "2", "1", "3600"]).await,
        [0, 3, 2, -1, 3600]
    );
    let bad: redis::RedisResult<Vec<i64>> = redis::cmd("CL.THROTTLE")
        .arg(&["u", "x", "1", "60"])
        .query_async(&mut conn)
        .await;
    assert!(bad.unwrap_err().to_string().contains("max_burst"));
    let few: redis::RedisResult<Vec<i64>> = redis::cmd("CL.THROTTLE")
        .arg(&["u", "1"])
        .query_async(&mut conn)
        .await;
    assert!(
        few.unwrap_err()
            .to_string()
            .contains("wrong number of arguments")
    );
}

/// `WEIR.CHECK` decides a policy of the configuration on the decision
/// API's key: what one face spends, the other sees. A concurrency
/// policy's lease comes back, and `WEIR.RELEASE` frees it once.
#[tokio::test]
async fn weir_commands_share_the_decision_apis_keys() {
    let (http, resp) = start(CONFIG).await;
    let mut conn = client(resp).await;
    let check = |policy: &'static str| redis::cmd("WEIR.CHECK").arg(policy).arg("me").clone();
    for remaining in [2, 1] {
        let answer: Vec<i64> = check("api").query_async(&mut conn).await.unwrap();
        assert_eq!(answer[..2], [1, remaining]);
    }
    let body = r#"{"policy":"api","key":"me"}"#;
    let api = weir_testkit::send("POST", &format!("http://{http}/v1/check"), &[], body).await;
    assert!(api.body.contains("\"remaining\":0"), "{}", api.body);
    let refused: Vec<i64> = check("api").query_async(&mut conn).await.unwrap();
    assert_eq!(refused[..2], [0, 0]);
    assert!(refused[2] > 3_500_000, "retry after {} ms", refused[2]);
    let reported: Vec<i64> = redis::cmd("WEIR.REPORT")
        .arg(&["api", "other", "2"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reported[..2], [1, 1]);
    // A lease: taken, refused while held, released once.
    let (admitted, _, _, _, lease): (i64, i64, i64, i64, String) =
        check("jobs").query_async(&mut conn).await.unwrap();
    assert_eq!(admitted, 1);
    let held: Vec<redis::Value> = check("jobs").query_async(&mut conn).await.unwrap();
    assert_eq!(held[0], redis::Value::Int(0));
    let release = redis::cmd("WEIR.RELEASE")
        .arg(&["jobs", "me", &lease])
        .clone();
    let released: Vec<i64> = release.query_async(&mut conn).await.unwrap();
    let again: Vec<i64> = release.query_async(&mut conn).await.unwrap();
    assert_eq!((released[0], again[0]), (1, 0));
    let unknown: redis::RedisResult<Vec<i64>> = check("nope").query_async(&mut conn).await;
    assert!(unknown.unwrap_err().to_string().contains("unknown policy"));
}

/// With a password, nothing but `AUTH`, `HELLO … AUTH` and `QUIT` is
/// answered before the client authenticates.
#[tokio::test]
async fn a_password_is_asked_for_when_set() {
    let dir = std::env::temp_dir().join(format!("weir-resp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("password");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let text = format!(
        "[server]\nresp_user = \"app\"\nresp_password_file = \"{}\"\n{CONFIG}",
        secret.display()
    );
    let (_, resp) = start(&text).await;
    let mut conn = client(resp).await;
    let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
    assert!(ping.unwrap_err().to_string().contains("NOAUTH"));
    let wrong: redis::RedisResult<String> = redis::cmd("AUTH")
        .arg(&["app", "nope"])
        .query_async(&mut conn)
        .await;
    assert!(wrong.unwrap_err().to_string().contains("WRONGPASS"));
    let ok: String = redis::cmd("AUTH")
        .arg(&["app", "s3cret"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ok, "OK");
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    // The client's own URL credentials (AUTH on connect).
    let client = redis::Client::open(format!("redis://app:s3cret@{resp}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let answer: Vec<i64> = redis::cmd("WEIR.CHECK")
        .arg(&["api", "k"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answer[0], 1);
}

/// What is not a command is answered with an error and the connection
/// closed; pipelined commands are answered in order.
#[tokio::test]
async fn bad_input_is_refused_and_pipelines_are_answered_in_order() {
    let (_, resp) = start(CONFIG).await;
    let exchange = |bytes: Vec<u8>| async move {
        let mut stream = tokio::net::TcpStream::connect(resp).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            stream.read_to_end(&mut answer),
        )
        .await;
        String::from_utf8_lossy(&answer).into_owned()
    };
    let long = format!("*2\r\n$4\r\nPING\r\n$5000\r\n{}\r\n", "x".repeat(5000));
    assert!(
        exchange(long.into_bytes())
            .await
            .starts_with("-ERR Protocol error: an argument longer than 4096 bytes")
    );
    assert!(
        exchange(b"GET x\r\n".to_vec())
            .await
            .starts_with("-ERR Protocol error: expected an array")
    );
    let many = format!("*17\r\n{}", "$1\r\nx\r\n".repeat(17));
    assert!(
        exchange(many.into_bytes())
            .await
            .starts_with("-ERR Protocol error: a command has 1 to 16 arguments")
    );
    let nested = "*1\r\n".repeat(1000);
    assert!(
        exchange(nested.into_bytes())
            .await
            .starts_with("-ERR Protocol error: expected a bulk string")
    );
    let mut pipeline: Vec<u8> = (0..100)
        .flat_map(|i| {
            format!("*2\r\n$4\r\nPING\r\n${}\r\n{i}\r\n", i.to_string().len()).into_bytes()
        })
        .collect();
    pipeline.extend_from_slice(b"*1\r\n$4\r\nQUIT\r\n");
    let answers = exchange(pipeline).await;
    let expected: String = (0..100)
        .map(|i| format!("${}\r\n{i}\r\n", i.to_string().len()))
        .collect::<String>()
        + "+OK\r\n";
    assert_eq!(answers, expected);
}

/// On Redis, two weirs answer one balance: what one admits, the other
/// counts — for `CL.THROTTLE` and the configuration's policies alike.
#[tokio::test]
async fn two_weirs_on_one_redis_share_every_key() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let text = format!("[store]\nurl = \"{}\"\n{CONFIG}", redis.url());
    let (_, first) = start(&text).await;
    let (_, second) = start(&text).await;
    let (mut a, mut b) = (client(first).await, client(second).await);
    let args = ["shared", "2", "1", "3600"];
    assert_eq!(throttle(&mut a, &args).await, [0, 3, 2, -1, 3600]);
    assert_eq!(throttle(&mut b, &args).await, [0, 3, 1, -1, 7200]);
    assert_eq!(throttle(&mut a, &args).await, [0, 3, 0, -1, 10800]);
    assert_eq!(throttle(&mut b, &args).await, [1, 3, 0, 3600, 10800]);
    let check = redis::cmd("WEIR.CHECK").arg(&["api", "me"]).clone();
    let mut remaining = Vec::new();
    for i in 0..4 {
        let conn = if i % 2 == 0 { &mut a } else { &mut b };
        let answer: Vec<i64> = check.query_async(conn).await.unwrap();
        remaining.push((answer[0], answer[1]));
    }
    assert_eq!(remaining, [(1, 2), (1, 1), (1, 0), (0, 0)]);
}
