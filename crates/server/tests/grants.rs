//! The Rate Limit Quota Service over real gRPC on loopback, with the client
//! generated from Envoy's `rlqs.proto` (the `envoy-types` crate): usage
//! reports answered with token-bucket assignments booked as fleet grants,
//! `DENY_ALL` when nothing can be booked, abandonment of idle buckets, and
//! the service's bounds.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use weir_server::{AppState, Shared, config};

const CONFIG: &str = r#"
# 200 tokens, 50 a second; grants live 2 s.
[policies.api]
algorithm = "token-bucket"
capacity = 200
rate = "50/s"
grants = { ttl = "2s" }

[[quota_buckets]]
match = { name = "api" }
key = "tenant"
policy = "api"
abandon_after = "1s"
"#;

/// A stream to weir's RLQS: reports sent, answers received.
struct Client {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

async fn connect(addr: std::net::SocketAddr) -> Client {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (reports, rx) = mpsc::channel(4);
    let answers = client
        .stream_rate_limit_quotas(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(
            rx,
        ))
        .await
        .unwrap()
        .into_inner();
    Client { reports, answers }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect::<HashMap<_, _>>(),
    }
}

/// A report of `allowed` requests over the last second for each bucket.
fn report(buckets: &[BucketId], allowed: u64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "test".into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|b| BucketQuotaUsage {
                bucket_id: Some(b.clone()),
                time_elapsed: Some(PbDuration {
                    seconds: 1,
                    nanos: 0,
                }),
                num_requests_allowed: allowed,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

impl Client {
    async fn ask(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        self.reports.send(report).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .unwrap()
        {
            Ok(answer) => Ok(answer.unwrap()),
            Err(status) => Err(status),
        }
    }
}

async fn start() -> std::net::SocketAddr {
    let config = config::parse(CONFIG, &Default::default()).unwrap();
    let state = AppState::new(Shared::new(config, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weir_server::run_grpc(
        listener,
        state,
        std::future::pending(),
    ));
    addr
}

/// The token bucket an answer assigns, as (max_tokens, fill interval in
/// ns, ttl in ns); `None` for a blanket rule.
fn assigned(answer: &RateLimitQuotaResponse) -> Vec<Option<(u32, u64, u64)>> {
    let ns = |d: &PbDuration| d.seconds as u64 * 1_000_000_000 + d.nanos as u64;
    answer
        .bucket_action
        .iter()
        .filter_map(|a| match a.bucket_action.as_ref()? {
            Action::QuotaAssignmentAction(q) => {
                Some(match q.rate_limit_strategy.as_ref()?.strategy.as_ref()? {
                    Strategy::TokenBucket(b) => Some((
                        b.max_tokens,
                        ns(b.fill_interval.as_ref()?)
                            / u64::from(b.tokens_per_fill.as_ref()?.value),
                        ns(q.assignment_time_to_live.as_ref()?),
                    )),
                    Strategy::BlanketRule(r) => {
                        assert_eq!(*r, BlanketRule::DenyAll as i32);
                        None
                    }
                    Strategy::RequestsPerTimeUnit(_) => panic!("not a strategy weir sends"),
                })
            }
            Action::AbandonAction(_) => None,
        })
        .collect()
}

/// One client alone gets twice its demand (10 a second: room to grow
/// between reports), with a capacity in the same share of what the rate's
/// booking leaves (two fifths of 100), for
/// the grant's ttl less the margin in whole seconds; an unmatched bucket
/// gets nothing.
#[tokio::test]
async fn a_report_is_answered_with_a_grant_by_its_demand() {
    let mut client = connect(start().await).await;
    let acme = bucket(&[("name", "api"), ("tenant", "acme")]);
    let other = bucket(&[("name", "web"), ("tenant", "acme")]);
    let answer = client.ask(report(&[acme, other], 10)).await.unwrap();
    let got = assigned(&answer);
    assert_eq!(got.len(), 1, "{answer:?}");
    let (tokens, interval, ttl) = got[0].unwrap();
    assert_eq!(
        tokens, 40,
        "two fifths of the 100 the rate's booking leaves"
    );
    assert_eq!(interval, 50_000_000, "20 a second: twice its demand");
    assert_eq!(ttl, 1_000_000_000, "2 s less the margin, in whole seconds");
}

/// Clients that together ask more than the bucket holds: the first books
/// the whole bucket (50 a second for 2 s and 100 tokens), the next can book
/// nothing and is told DENY_ALL for the ttl.
#[tokio::test]
async fn a_booking_that_does_not_fit_is_a_blanket_deny() {
    let addr = start().await;
    let acme = bucket(&[("name", "api"), ("tenant", "acme")]);
    let mut first = connect(addr).await;
    let got = assigned(
        &first
            .ask(report(std::slice::from_ref(&acme), 1_000))
            .await
            .unwrap(),
    );
    assert_eq!(got, [Some((100, 20_000_000, 1_000_000_000))]);
    let mut second = connect(addr).await;
    let got = assigned(&second.ask(report(&[acme], 1_000)).await.unwrap());
    assert_eq!(got, [None], "DENY_ALL");
}

/// A bucket no longer reported is abandoned after its rule's time; a
/// report larger than the bound ends the stream INVALID_ARGUMENT.
#[tokio::test]
async fn idle_buckets_are_abandoned_and_reports_are_bounded() {
    let addr = start().await;
    let mut client = connect(addr).await;
    let (a, b) = (
        bucket(&[("name", "api"), ("tenant", "a")]),
        bucket(&[("name", "api"), ("tenant", "b")]),
    );
    client
        .ask(report(&[a.clone(), b.clone()], 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let answer = client.ask(report(&[a], 1)).await.unwrap();
    let abandoned: Vec<_> = (answer.bucket_action.iter())
        .filter(|x| matches!(x.bucket_action, Some(Action::AbandonAction(_))))
        .map(|x| x.bucket_id.clone().unwrap())
        .collect();
    assert_eq!(abandoned, [b]);
    let mut flood = connect(addr).await;
    let many: Vec<BucketId> = (0..1_001)
        .map(|i| bucket(&[("name", "api"), ("tenant", &i.to_string())]))
        .collect();
    let refused = flood.ask(report(&many, 1)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    // A bucket identity past 1 KiB is refused too: a stream keeps what
    // it reported.
    let mut large = connect(addr).await;
    let long = "x".repeat(1_100);
    let refused = large
        .ask(report(&[bucket(&[("name", "api"), ("tenant", &long)])], 1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

/// A policy whose capacity cannot hold one grant's booking, grants on
/// another algorithm, a bucket rule on a policy without grants, and grants
/// on a Redis store are configuration errors that say why.
#[test]
fn grants_that_cannot_work_are_config_errors() {
    let errors = |text: &str| {
        config::parse(text, &Default::default())
            .unwrap_err()
            .to_string()
    };
    let small = errors(
        "[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"50/s\"\ngrants = { ttl = \"2s\" }\n",
    );
    assert!(
        small.contains("[policies.api] grants") && small.contains("raise the capacity"),
        "{small}"
    );
    let window = errors(
        "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\ngrants = { ttl = \"2s\" }\n",
    );
    assert!(window.contains("token-bucket or gcra"), "{window}");
    let ungranted = errors(
        "[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"1/s\"\n\n[[quota_buckets]]\nkey = \"tenant\"\npolicy = \"api\"\n",
    );
    assert!(ungranted.contains("hands out no grants"), "{ungranted}");
    let redis = errors(
        "[store]\nurl = \"redis://127.0.0.1:6379\"\n\n[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 100\nrate = \"1/s\"\ngrants = { ttl = \"2s\" }\n",
    );
    assert!(redis.contains("in-process store"), "{redis}");
    let short = errors(
        "[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 100\nrate = \"1/s\"\ngrants = { ttl = \"1s\" }\n",
    );
    assert!(short.contains("grants.ttl: at least 2s"), "{short}");
    let routed = errors(&format!(
        "{CONFIG}\n[[routes]]\nmatch = \"GET /\"\nidentity = \"peer\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:9\"\n"
    ));
    assert!(
        routed.contains("Rate Limit Quota Service clients only"),
        "{routed}"
    );
}
