//! The Envoy rate limit service over real gRPC on loopback, with the client
//! generated from Envoy's `rls.proto` (the `envoy-types` crate).

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;
use weir_server::{AppState, Shared, config};

const CONFIG: &str = r#"
[policies.seller]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"

[policies.stock-read]
algorithm = "fixed-window"
limit = 1
window = "1h"

[policies.shaper]
algorithm = "leaky-bucket"
rate = "1/m"
queue = 3

[[descriptors]]
domain = "kartly"
entries = ["seller"]
policy = "seller"

[[descriptors]]
domain = "kartly"
entries = ["seller", "endpoint=stock-read"]
policy = "stock-read"

[[descriptors]]
domain = "kartly"
entries = ["crawler"]
policy = "shaper"
"#;

async fn start(config_text: &str) -> (RateLimitServiceClient<Channel>, SocketAddr, Arc<AppState>) {
    let config = config::parse(config_text, &Default::default()).unwrap();
    let state = AppState::new(Shared::new(config, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weir_server::run_grpc(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, addr, state)
}

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    let request = RateLimitRequest {
        domain: "kartly".into(),
        descriptors,
        hits_addend,
    };
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

const HOUR: i64 = 3600;

#[tokio::test]
async fn ok_then_over_limit_with_full_statuses() {
    let (mut client, _, _) = start(CONFIG).await;
    let seller = || vec![descriptor(&[("seller", "7")], None)];
    for remaining in [2, 1, 0] {
        let r = ask(&mut client, seller(), 0).await.unwrap();
        assert_eq!(r.overall_code, i32::from(Code::Ok));
        let status = &r.statuses[0];
        assert_eq!(status.limit_remaining, remaining);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("seller", 1, i32::from(Unit::Hour))
        );
        // The time until the bucket is full again: exactly an hour per token
        // spent, less the (real) time since the first was.
        let reset = status.duration_until_reset.unwrap();
        let ns = i128::from(reset.seconds) * 1_000_000_000 + i128::from(reset.nanos);
        let full = i128::from(3 - i64::from(remaining)) * i128::from(HOUR) * 1_000_000_000;
        if remaining == 2 {
            assert_eq!(ns, full);
        }
        assert!(ns <= full && ns > full - 1_000_000_000, "{reset:?}");
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"seller\";q=3;w=10800")
        );
        assert!(header(&r, "retry-after").is_none() && r.raw_body.is_empty());
    }
    let r = ask(&mut client, seller(), 0).await.unwrap();
    assert_eq!(r.overall_code, i32::from(Code::OverLimit));
    assert_eq!(r.statuses[0].code, i32::from(Code::OverLimit));
    assert_eq!(header(&r, "retry-after"), Some("3600"));
    assert_eq!(header(&r, "ratelimit"), Some("\"seller\";r=0;t=10800"));
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["error"], "RATE_LIMITED");
    assert_eq!(body["policy"], "seller");
}

#[tokio::test]
async fn hits_addend_sets_the_cost_and_zero_charges_nothing() {
    let (mut client, _, _) = start(CONFIG).await;
    let r = ask(&mut client, vec![descriptor(&[("seller", "h")], None)], 2)
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "the request's hits_addend"
    );
    let r = ask(
        &mut client,
        vec![descriptor(&[("seller", "h")], Some(0))],
        5,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (i32::from(Code::Ok), 1),
        "0 only reports"
    );
    let r = ask(
        &mut client,
        vec![descriptor(&[("seller", "h")], Some(2))],
        0,
    )
    .await
    .unwrap();
    assert_eq!(
        r.overall_code,
        i32::from(Code::OverLimit),
        "the descriptor's own hits_addend"
    );
    let r = ask(
        &mut client,
        vec![descriptor(&[("seller", "h")], Some(1))],
        9,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (i32::from(Code::Ok), 0)
    );
}

#[tokio::test]
async fn descriptors_are_decided_all_or_nothing_and_unmatched_ones_are_unlimited() {
    let (mut client, _, _) = start(CONFIG).await;
    let both = || {
        vec![
            descriptor(&[("seller", "9")], None),
            descriptor(&[("remote_address", "10.0.0.1")], None),
            descriptor(&[("seller", "9"), ("endpoint", "stock-read")], None),
        ]
    };
    let r = ask(&mut client, both(), 0).await.unwrap();
    assert_eq!(r.overall_code, i32::from(Code::Ok));
    assert_eq!(r.statuses.len(), 3);
    assert!(r.statuses[1].current_limit.is_none() && r.statuses[1].code == i32::from(Code::Ok));
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[2].limit_remaining),
        (2, 0)
    );

    let r = ask(&mut client, both(), 0).await.unwrap();
    assert_eq!(r.overall_code, i32::from(Code::OverLimit));
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit].map(i32::from));
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "the seller was not charged"
    );
    let r = ask(&mut client, vec![descriptor(&[("seller", "9")], None)], 0)
        .await
        .unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 1);

    // The same descriptor twice (two actions producing it): one check of
    // both costs, one status for both.
    let twice = vec![
        descriptor(&[("seller", "9")], None),
        descriptor(&[("seller", "9")], None),
    ];
    let r = ask(&mut client, twice.clone(), 0).await.unwrap();
    assert_eq!(
        r.overall_code,
        i32::from(Code::OverLimit),
        "2 asked, 1 left: {r:?}"
    );
    let r = ask(&mut client, twice[..1].to_vec(), 0).await.unwrap();
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (i32::from(Code::Ok), 0)
    );

    // A value the rule does not name: no rule, unlimited.
    let other = descriptor(&[("seller", "9"), ("endpoint", "stock-write")], None);
    let r = ask(&mut client, vec![other], 0).await.unwrap();
    assert_eq!(r.overall_code, i32::from(Code::Ok));
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn a_shaper_admits_only_what_it_would_release_at_once() {
    let (mut client, _, _) = start(CONFIG).await;
    let crawler = || vec![descriptor(&[("crawler", "c")], None)];
    assert_eq!(
        ask(&mut client, crawler(), 0).await.unwrap().overall_code,
        i32::from(Code::Ok)
    );
    let r = ask(&mut client, crawler(), 0).await.unwrap();
    assert_eq!(
        r.overall_code,
        i32::from(Code::OverLimit),
        "Envoy cannot hold it for a minute"
    );
    assert_eq!(header(&r, "retry-after"), Some("60"));
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments() {
    let (mut client, _, _) = start(CONFIG).await;
    // A message past the bound is refused before it is decoded whole.
    let huge = RateLimitRequest {
        domain: "kartly".into(),
        descriptors: vec![descriptor(&[("seller", &"x".repeat(300 * 1024))], None)],
        hits_addend: 0,
    };
    let refused = client.should_rate_limit(huge).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                descriptors: vec![descriptor(&[("seller", "1")], None)],
                hits_addend: 0,
            },
            "`domain` is empty",
        ),
        (
            RateLimitRequest {
                domain: "kartly".into(),
                descriptors: vec![],
                hits_addend: 0,
            },
            "no descriptors",
        ),
        (
            RateLimitRequest {
                domain: "kartly".into(),
                descriptors: vec![descriptor(&[], None)],
                hits_addend: 0,
            },
            "has no entries",
        ),
        (
            RateLimitRequest {
                domain: "kartly".into(),
                descriptors: vec![descriptor(&[("seller", &"x".repeat(300))], None)],
                hits_addend: 0,
            },
            "above the limit",
        ),
        (
            // 65 distinct descriptors matching one rule: one past the cap.
            RateLimitRequest {
                domain: "kartly".into(),
                descriptors: (0..65)
                    .map(|i| descriptor(&[("seller", &i.to_string())], None))
                    .collect(),
                hits_addend: 0,
            },
            "65 descriptors, above the limit of 64",
        ),
        (
            RateLimitRequest {
                domain: "kartly".into(),
                descriptors: vec![descriptor(&[("seller", "1")], Some(4))],
                hits_addend: 0,
            },
            "never",
        ),
    ];
    for (request, message) in cases {
        let status = client.should_rate_limit(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(message), "{status:?}");
    }
    // An unknown domain has no limits (`OK`), as envoyproxy/ratelimit.
    let unknown = RateLimitRequest {
        domain: "other".into(),
        descriptors: vec![descriptor(&[("seller", "1")], None)],
        hits_addend: 0,
    };
    let answer = client
        .should_rate_limit(unknown)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    // Still serving.
    assert!(
        ask(&mut client, vec![descriptor(&[("seller", "ok")], None)], 0)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_store_failure_follows_the_rule_or_is_unavailable() {
    // Nothing listens on this port: every store call fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "[store]\nurl = \"redis://127.0.0.1:{closed}\"\n\n[policies.unset]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1s\"\n\n[policies.open]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1s\"\non_store_error = \"allow\"\n\n[policies.closed]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1s\"\non_store_error = \"deny\"\n\n[policies.local]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\non_store_error = \"local\"\n\n[[descriptors]]\ndomain = \"kartly\"\nentries = [\"unset\"]\npolicy = \"unset\"\n\n[[descriptors]]\ndomain = \"kartly\"\nentries = [\"open\"]\npolicy = \"open\"\n\n[[descriptors]]\ndomain = \"kartly\"\nentries = [\"closed\"]\npolicy = \"closed\"\n\n[[descriptors]]\ndomain = \"kartly\"\nentries = [\"local\"]\npolicy = \"local\"\n"
    );
    let (mut client, _, state) = start(&config).await;
    let status = ask(&mut client, vec![descriptor(&[("unset", "a")], None)], 0)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let r = ask(&mut client, vec![descriptor(&[("open", "a")], None)], 0)
        .await
        .unwrap();
    assert_eq!(r.overall_code, i32::from(Code::Ok));
    let r = ask(&mut client, vec![descriptor(&[("closed", "a")], None)], 0)
        .await
        .unwrap();
    assert_eq!(r.overall_code, i32::from(Code::OverLimit));
    for _ in 0..5 {
        let r = ask(&mut client, vec![descriptor(&[("local", "a")], None)], 0)
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::Ok));
    }
    let r = ask(&mut client, vec![descriptor(&[("local", "a")], None)], 0)
        .await
        .unwrap();
    assert_eq!(
        r.overall_code,
        i32::from(Code::OverLimit),
        "the local fallback still limits"
    );

    // gRPC calls join the HTTP metrics.
    let metrics = state.render_metrics();
    assert!(
        metrics.contains("weir_fallback_decisions_total{policy=\"local\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_grpc_requests_total{code=\"unavailable\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_grpc_duration_seconds_count"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_grpc_health_service_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let (_, addr, _) = start(CONFIG).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let service = "envoy.service.ratelimit.v3.RateLimitService".to_owned();
    let reply = health
        .check(HealthCheckRequest { service })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status, 1, "SERVING");
}

#[tokio::test]
async fn a_method_weir_does_not_serve_is_unimplemented_and_the_service_stays_up() {
    use envoy_types::pb::envoy::service::accesslog::v3::StreamAccessLogsMessage;
    use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;
    let (mut client, addr, _) = start(CONFIG).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let logs = futures_util::stream::iter([StreamAccessLogsMessage::default()]);
    let status = AccessLogServiceClient::new(channel)
        .stream_access_logs(logs)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    let seller = vec![descriptor(&[("seller", "7")], None)];
    let served = ask(&mut client, seller, 0).await.unwrap();
    assert_eq!(served.overall_code, i32::from(Code::Ok));
}

#[tokio::test]
async fn a_descriptor_with_its_own_limit_is_decided_at_that_limit() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let (mut client, _, _) = start(CONFIG).await;
    let limited = |entries: &[(&str, &str)], requests_per_unit: u32| RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit: Unit::Minute.into(),
        }),
        ..descriptor(entries, None)
    };
    // The seller rule's token bucket (capacity 3) with the quota replaced:
    // 2 per minute.
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = ask(&mut client, vec![limited(&[("seller", "7")], 2)], 0)
            .await
            .unwrap();
        let status = &answer.statuses[0];
        let current = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (current.requests_per_unit, current.unit),
            (2, i32::from(Unit::Minute))
        );
        codes.push(status.code);
    }
    let (ok, over) = (i32::from(Code::Ok), i32::from(Code::OverLimit));
    assert_eq!(codes, [ok, ok, over]);
    // The rule's own state is apart: seller 7 still has its 3.
    let plain = ask(&mut client, vec![descriptor(&[("seller", "7")], None)], 0)
        .await
        .unwrap();
    assert_eq!(plain.statuses[0].limit_remaining, 2);
    // No rule matches: a fixed window of the limit.
    let mut codes = Vec::new();
    for _ in 0..2 {
        let answer = ask(&mut client, vec![limited(&[("tenant", "x")], 1)], 0)
            .await
            .unwrap();
        codes.push(answer.statuses[0].code);
    }
    assert_eq!(codes, [ok, over]);
    // A domain weir does not know has no limits, not even the request's
    // own (as envoyproxy/ratelimit).
    for _ in 0..3 {
        let request = RateLimitRequest {
            domain: "nobody-knows".into(),
            descriptors: vec![limited(&[("tenant", "y")], 1)],
            hits_addend: 0,
        };
        let answer = client.should_rate_limit(request).await.unwrap();
        assert_eq!(answer.into_inner().overall_code, ok);
    }
}

#[tokio::test]
async fn a_report_rule_charges_the_admission_rules_key_after_the_fact() {
    let config = r#"
[policies.tokens]
algorithm = "token-bucket"
capacity = 1000
rate = "100/s"

# Admission: a check of cost 1 per request, by tenant.
[[descriptors]]
domain = "llm"
entries = ["tenant"]
policy = "tokens"

# When the stream is done (Envoy's apply_on_stream_done): the tokens used,
# as hits_addend, charged to the same key.
[[descriptors]]
domain = "llm"
entries = ["tenant", "phase=done"]
policy = "tokens"
report = true
key_entries = ["tenant"]
"#;
    let (client, _, _) = start(config).await;
    let ask_llm = |descriptors: Vec<RateLimitDescriptor>| {
        let mut client = client.clone();
        async move {
            let request = RateLimitRequest {
                domain: "llm".into(),
                descriptors,
                hits_addend: 0,
            };
            client
                .should_rate_limit(request)
                .await
                .unwrap()
                .into_inner()
        }
    };
    let admit = || descriptor(&[("tenant", "t1")], None);
    let done = |tokens| descriptor(&[("tenant", "t1"), ("phase", "done")], Some(tokens));
    let (ok, over) = (i32::from(Code::Ok), i32::from(Code::OverLimit));
    assert_eq!(ask_llm(vec![admit()]).await.overall_code, ok);
    // The answer used 2,999 tokens: reported, always OK, into debt.
    let reported = ask_llm(vec![done(2_999)]).await;
    assert_eq!(reported.overall_code, ok);
    assert_eq!(reported.statuses[0].limit_remaining, 0);
    // The same tenant is refused until the debt is paid back (about 20 s).
    let refused = ask_llm(vec![admit()]).await;
    assert_eq!(refused.overall_code, over);
    let wait: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((19..=21).contains(&wait), "{wait}");
    // Another tenant is not affected.
    let other = ask_llm(vec![descriptor(&[("tenant", "t2")], None)]).await;
    assert_eq!(other.overall_code, ok);
}

#[test]
fn key_entries_must_be_entries_of_the_rule() {
    let text = "[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"tenant\"]\npolicy = \"a\"\nreport = true\nkey_entries = [\"seller\"]\n";
    let errors = config::parse(text, &Default::default()).unwrap_err().0;
    assert_eq!(
        errors[0].place, "[[descriptors]] #1 key_entries",
        "{errors:?}"
    );
}

/// The gRPC listener goes through the listeners' one accept loop: its
/// connections are capped per address, a connection that never finishes
/// (or never starts) its first call is closed at `header_timeout` — while
/// calls on an open connection go on.
#[tokio::test]
async fn the_grpc_listener_holds_the_connection_bounds() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bounded = CONFIG.replacen(
        "[policies.",
        "[server]\nmax_connections_per_ip = 3\nheader_timeout = \"300ms\"\nidle_timeout = \"700ms\"\n\n[policies.",
        1,
    );
    let (_client, addr, _) = start(&bounded).await;
    let closed_within = |mut stream: tokio::net::TcpStream, within: Duration| async move {
        let started = std::time::Instant::now();
        let mut sink = Vec::new();
        let read = tokio::time::timeout(within, stream.read_to_end(&mut sink)).await;
        assert!(read.is_ok(), "still open after {within:?}");
        started.elapsed()
    };
    // The client holds one connection; a half preface and a silent one.
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let silent_since = std::time::Instant::now();
    // A fourth from the same address is over the cap: closed at once.
    let over = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(over, Duration::from_millis(500)).await < Duration::from_millis(500));
    let took = closed_within(half, Duration::from_secs(3)).await;
    assert!(
        took >= Duration::from_millis(250),
        "header timeout: {took:?}"
    );
    // A connection that sends nothing owes its preface from the start: the
    // header timeout, not the idle one, closes it.
    closed_within(silent, Duration::from_secs(3)).await;
    let took = silent_since.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(650),
        "a silent connection is closed by the header timeout: {took:?}"
    );
    // Calls on a connection in use go on, each within the idle bound.
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    for _ in 0..4 {
        ask(
            &mut client,
            vec![descriptor(&[("seller", "gRPC")], None)],
            0,
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// weir's own rules matched as envoyproxy/ratelimit matches its tree: a
/// value before wildcards (in file order) before the key's default; a rule
/// only at the node the last entry reaches; unlimited rules; `replaces`;
/// `share_threshold` making every value a wildcard matches one key.
#[tokio::test]
async fn rules_match_as_envoyproxy_ratelimit_matches_its_tree() {
    let config = r#"
[policies.one]
algorithm = "fixed-window"
limit = 1
window = "1h"

[policies.two]
algorithm = "fixed-window"
limit = 2
window = "1h"

[[descriptors]]
domain = "kartly"
entries = ["path=/api/*"]
policy = "one"

[[descriptors]]
domain = "kartly"
entries = ["path=/api/health"]
unlimited = true

[[descriptors]]
domain = "kartly"
entries = ["path"]
policy = "two"

[[descriptors]]
domain = "kartly"
entries = ["path=/status"]
no_limit = true

[[descriptors]]
domain = "kartly"
entries = ["banned"]
refuse = true
unit = "minute"

[[descriptors]]
domain = "kartly"
entries = ["file=*.pdf"]
policy = "one"
share_threshold = true

[[descriptors]]
domain = "kartly"
entries = ["tenant", "plan=free"]
policy = "one"
name = "free"

[[descriptors]]
domain = "kartly"
entries = ["tenant=vip"]
policy = "two"
replaces = ["free"]
"#;
    let (mut client, _, _) = start(config).await;
    let code = |r: &RateLimitResponse| Code::try_from(r.overall_code).unwrap();
    let mut decide = async |entries: &[(&str, &str)]| {
        code(
            &ask(&mut client, vec![descriptor(entries, None)], 0)
                .await
                .unwrap(),
        )
    };
    // The wildcard: one per hour for each path under /api/.
    assert_eq!(decide(&[("path", "/api/a")]).await, Code::Ok);
    assert_eq!(decide(&[("path", "/api/a")]).await, Code::OverLimit);
    assert_eq!(decide(&[("path", "/api/b")]).await, Code::Ok, "its own key");
    // The exact value before the wildcard: unlimited, with
    // envoyproxy/ratelimit's limit_remaining (math.MaxUint32); no rule at
    // all answers 0.
    for _ in 0..3 {
        assert_eq!(decide(&[("path", "/api/health")]).await, Code::Ok);
    }
    let remaining = |r: RateLimitResponse| r.statuses[0].limit_remaining;
    let health = vec![descriptor(&[("path", "/api/health")], None)];
    let unlimited = ask(&mut client, health, 0).await.unwrap();
    assert_eq!(remaining(unlimited), u32::MAX);
    let nothing = vec![descriptor(&[("nothing", "here")], None)];
    assert_eq!(remaining(ask(&mut client, nothing, 0).await.unwrap()), 0);
    // A refusing rule answers 0 per its own unit (their requests_per_unit: 0).
    let banned = vec![descriptor(&[("banned", "x")], None)];
    let answered = ask(&mut client, banned, 0).await.unwrap();
    let limit = answered.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (0, i32::from(Unit::Minute))
    );
    // A rule's YAML-style `name` is its descriptors' current_limit.name.
    let free = vec![descriptor(&[("tenant", "t1"), ("plan", "free")], None)];
    let answered = ask(&mut client, free, 0).await.unwrap();
    assert_eq!(
        answered.statuses[0].current_limit.as_ref().unwrap().name,
        "free"
    );
    // A node without a limit (their whitelisting): the default beside it
    // does not apply, and it answers as no rule does.
    for _ in 0..4 {
        let status = vec![descriptor(&[("path", "/status")], None)];
        let answered = ask(&mut client, status, 0).await.unwrap();
        assert_eq!(answered.overall_code, i32::from(Code::Ok));
        assert_eq!(remaining(answered), 0);
    }
    let mut decide = async |entries: &[(&str, &str)]| {
        code(
            &ask(&mut client, vec![descriptor(entries, None)], 0)
                .await
                .unwrap(),
        )
    };
    // The default after both: two.
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(decide(&[("path", "/cart")]).await, expected);
    }
    // A deeper descriptor than any rule: no limit.
    for _ in 0..3 {
        assert_eq!(
            decide(&[("path", "/cart"), ("method", "GET")]).await,
            Code::Ok
        );
    }
    // share_threshold: every PDF shares one key.
    assert_eq!(decide(&[("file", "a.pdf")]).await, Code::Ok);
    assert_eq!(decide(&[("file", "b.pdf")]).await, Code::OverLimit);
    // replaces: with `vip` matched, `free` is not checked.
    let both = || {
        vec![
            descriptor(&[("tenant", "vip"), ("plan", "free")], None),
            descriptor(&[("tenant", "vip")], None),
        ]
    };
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&ask(&mut client, both(), 0).await.unwrap()), expected);
    }
}

/// envoyproxy/ratelimit's files, imported: every descriptor of a matrix —
/// values, defaults, wildcards, nesting, unlimited, zero, unknown domains
/// — finds the limit the files give it, and a shared wildcard one key.
#[test]
fn an_imported_envoyproxy_ratelimit_config_decides_as_its_files() {
    use weir_envoy_ratelimit::{Found, Limits, read_dir, weir};
    use weir_server::envoy::{Target, translate};
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/envoy-ratelimit/config");
    let files = read_dir(&dir, false).unwrap();
    let limits = Limits::load(files.iter().map(|(n, t)| (n.as_str(), t.as_str())), false).unwrap();
    let toml = weir::to_toml(&limits, weir::Options::default());
    let config = config::parse(&toml, &Default::default()).unwrap();
    let keys = [
        "remote_address",
        "path",
        "tenant",
        "plan",
        "database",
        "other",
    ];
    let values = [
        "10.0.0.1",
        "1.2.3.4",
        "/checkout",
        "/api/v2/x",
        "/api/v1/items",
        "/api/v9/items",
        "/other",
        "acme",
        "beta",
        "free",
        "banned",
        "trial",
        "users",
        "7",
        "",
    ];
    let mut requests: Vec<Vec<(&str, &str)>> = Vec::new();
    for k1 in keys {
        for v1 in values {
            requests.push(vec![(k1, v1)]);
            for k2 in ["plan", "path"] {
                for v2 in ["free", "banned", "trial", "x", "/checkout"] {
                    requests.push(vec![(k1, v1), (k2, v2)]);
                }
            }
        }
    }
    let mut limited = 0;
    for domain in ["shop", "mongo", "elsewhere"] {
        for entries in &requests {
            let request = RateLimitRequest {
                domain: domain.into(),
                descriptors: vec![descriptor(entries, None)],
                hits_addend: 0,
            };
            let got = translate(&config, &request).unwrap().remove(0);
            let why = format!("{domain} {entries:?}");
            match limits.find(domain, entries) {
                Found::Limit { limit, shared } if !limit.unlimited => {
                    let (target, key, _) = got.expect(&why);
                    match target {
                        Target::Rule(id) => {
                            assert_eq!(
                                config.policies[id.0].name,
                                weir::policy_name(&limit.path),
                                "{why}"
                            );
                            limited += 1;
                        }
                        Target::Refuse(unit) => {
                            assert_eq!(limit.requests_per_unit, 0, "{why}");
                            assert_eq!(Some(unit), limit.unit, "{why}");
                        }
                        other => panic!("{why}: {other:?}"),
                    }
                    let sharing = shared.iter().any(Option::is_some);
                    assert_eq!(key.contains('~'), sharing, "{why}: {key}");
                }
                Found::Limit { .. } => {
                    assert_eq!(got.map(|g| g.0), Some(Target::Unlimited), "{why}")
                }
                _ => assert_eq!(got, None, "{why}"),
            }
        }
    }
    assert!(limited > 100, "{limited}");
    // A shared wildcard: one key for every value; another: one each.
    let key = |path: &str| {
        let request = RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor(&[("path", path)], None)],
            hits_addend: 0,
        };
        translate(&config, &request).unwrap().remove(0).unwrap().1
    };
    assert_eq!(key("/api/v1/items"), key("/api/v9/items"));
    assert_ne!(key("/api/v2/x"), key("/api/v2/y"));
}

/// `[server] shadow` (envoyproxy/ratelimit's SHADOW_MODE): each descriptor
/// answered as if enforced — OVER_LIMIT, with its fields, under their
/// renamed headers — and only the overall code OK. A policy's own `shadow`
/// (their `shadow_mode`) answers its descriptor OK.
#[tokio::test]
async fn global_shadow_mode_keeps_each_descriptors_status() {
    let config = format!(
        "[server]\nshadow = true\nheaders = \"both\"\nenvoy_header_names = [\"L\", \"R\", \"T\"]\n\n{CONFIG}"
    );
    let (mut client, _, _) = start(&config).await;
    let read = || {
        vec![descriptor(
            &[("seller", "9"), ("endpoint", "stock-read")],
            None,
        )]
    };
    let first = ask(&mut client, read(), 0).await.unwrap();
    assert_eq!(first.overall_code, i32::from(Code::Ok));
    let over = ask(&mut client, read(), 0).await.unwrap();
    assert_eq!(
        over.overall_code,
        i32::from(Code::Ok),
        "shadow: never refused"
    );
    assert_eq!(
        over.statuses[0].code,
        i32::from(Code::OverLimit),
        "{over:?}"
    );
    assert_eq!(header(&over, "R"), Some("0"), "{over:?}");
    // A policy in shadow mode of its own: its descriptor OK.
    let own = CONFIG.replace("limit = 1\n", "limit = 1\nshadow = true\n");
    let (mut client, _, _) = start(&own).await;
    ask(&mut client, read(), 0).await.unwrap();
    let over = ask(&mut client, read(), 0).await.unwrap();
    assert_eq!(over.statuses[0].code, i32::from(Code::Ok));
}
