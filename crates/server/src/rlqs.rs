//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`,
//! `StreamRateLimitQuotas`) on the gRPC listener: each data-plane client
//! (an Envoy with the `rate_limit_quota` filter) streams usage reports per
//! bucket; weir matches each bucket to a policy with grants and a key
//! (`[[quota_buckets]]`), books the client a grant by its demand
//! (`grants.rs`) and answers a `token_bucket` assignment that lives until
//! the grant's expiry less [`MARGIN`], in whole seconds — renewed on each
//! report, so a grant's ttl must outlast the clients' reporting interval
//! (Envoy 1.40 reports every 5 s) — or a
//! blanket `DENY_ALL` for the ttl while nothing can be booked. A bucket not
//! reported for its rule's `abandon_after` is abandoned.
//!
//! Bounds: [`MAX_BUCKETS`] buckets per stream (more are answered
//! `DENY_ALL`), [`MAX_USAGES`] usages per report and [`MAX_BUCKET_BYTES`]
//! per bucket identity (more ends the stream `INVALID_ARGUMENT`), and the
//! listener's own bounds on streams and message sizes.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tonic::{Request, Response, Status, Streaming};
use weir_core::algo::grants::{Grant, SCALE};
use weir_core::Nanos;

use crate::state::AppState;

/// The most buckets one stream may report.
pub(crate) const MAX_BUCKETS: usize = 1_000;
/// The most entries in one `BucketId`, and their most bytes (names and
/// values): a stream keeps at most [`MAX_BUCKETS`] of them, so at most
/// about 1 MiB of bucket identities.
pub(crate) const MAX_ENTRIES: usize = 16;
pub(crate) const MAX_BUCKET_BYTES: usize = 1024;
/// The most usages in one report.
pub(crate) const MAX_USAGES: usize = 1_000;
/// What an assignment's time to live is short of its grant's expiry: the
/// network's time, so that no client uses a grant past it.
pub(crate) const MARGIN: Duration = Duration::from_millis(100);

/// The service: every stream a client of its own.
#[derive(Debug, Clone)]
pub(crate) struct Quotas {
    state: Arc<AppState>,
}

impl Quotas {
    pub(crate) fn service(state: Arc<AppState>) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(Self { state })
            .max_decoding_message_size(crate::answer::MAX_GRPC_MESSAGE)
    }
}

type Answers = Pin<
    Box<
        dyn tonic::codegen::tokio_stream::Stream<Item = Result<RateLimitQuotaResponse, Status>>
            + Send,
    >,
>;

#[tonic::async_trait]
impl RateLimitQuotaService for Quotas {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let mut reports = request.into_inner();
        let state = self.state.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut stream = Stream {
                client: fastrand::u64(..),
                buckets: HashMap::new(),
            };
            while let Some(report) = reports.message().await.transpose() {
                let answer = report.and_then(|r| stream.answer(&state, &r));
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        let answers = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(answers)))
    }
}

/// One client's stream: its buckets and when each was last reported.
struct Stream {
    client: u64,
    buckets: HashMap<Vec<(String, String)>, (BucketId, Instant, Duration)>,
}

/// A bucket's identity as a map key (its entries in order).
fn entries(id: &BucketId) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort();
    entries
}

fn duration(ns: Nanos) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

fn nanos(d: Option<&PbDuration>) -> Nanos {
    d.map_or(0, |d| {
        u64::try_from(d.seconds)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            + u64::try_from(d.nanos).unwrap_or(0)
    })
}

/// An assignment of `strategy` for `ttl` ns.
fn assign(bucket: BucketId, ttl: Nanos, strategy: Strategy) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// `grant` as Envoy's token bucket: `c` tokens, filled `n` tokens every
/// `k` whole seconds with `n/k` at most ρ (rounded down: never faster than
/// granted). Whole seconds, since Envoy 1.40 reads a fill interval's
/// seconds only (a shorter one would fill without end).
fn token_bucket(grant: &Grant, period: Nanos, ttl: Nanos) -> Strategy {
    const SECOND: u128 = 1_000_000_000;
    // ρ in tokens per second is m·1 s / (SCALE·P).
    let per = u128::from(SCALE) * u128::from(period);
    let (tokens, seconds) = match u128::from(grant.rate) * SECOND / per {
        0 if grant.rate == 0 => (1, u128::from(ttl) / SECOND + 1),
        0 => (1, (per.div_ceil(u128::from(grant.rate))).div_ceil(SECOND)),
        n => (n, 1),
    };
    Strategy::TokenBucket(TokenBucket {
        max_tokens: u32::try_from(grant.capacity).unwrap_or(u32::MAX),
        tokens_per_fill: Some(UInt32Value {
            value: u32::try_from(tokens).unwrap_or(u32::MAX),
        }),
        fill_interval: Some(duration(
            u64::try_from(seconds * SECOND).unwrap_or(u64::MAX),
        )),
    })
}

impl Stream {
    /// The answer to one report: an assignment per bucket reported, and an
    /// abandonment per bucket idle past its rule's time.
    fn answer(
        &mut self,
        state: &AppState,
        report: &RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        if report.bucket_quota_usages.len() > MAX_USAGES {
            return Err(Status::invalid_argument(format!(
                "a report of {} buckets: at most {MAX_USAGES}",
                report.bucket_quota_usages.len()
            )));
        }
        let shared = state.current();
        let config = &shared.config;
        let mut actions = Vec::new();
        let now = Instant::now();
        for usage in &report.bucket_quota_usages {
            let Some(bucket) = usage.bucket_id.clone() else {
                continue;
            };
            let size: usize = bucket.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
            if bucket.bucket.len() > MAX_ENTRIES || size > MAX_BUCKET_BYTES {
                return Err(Status::invalid_argument(format!(
                    "a BucketId of {} entries and {size} bytes: at most {MAX_ENTRIES} entries and {MAX_BUCKET_BYTES} bytes",
                    bucket.bucket.len()
                )));
            }
            let id = entries(&bucket);
            let Some((rule, key)) =
                crate::config::find_bucket(&config.quota_buckets, &bucket.bucket)
            else {
                metrics::counter!(crate::metrics::GRANTS, "policy" => "", "outcome" => "unmatched")
                    .increment(1);
                continue;
            };
            let entry = shared.table.get(shared.resolve(rule.policy, key));
            let Some(fleet) = entry.grants else {
                continue;
            };
            let ttl = fleet.ttl();
            if !self.buckets.contains_key(&id) && self.buckets.len() >= MAX_BUCKETS {
                actions.push(assign(
                    bucket,
                    ttl,
                    Strategy::BlanketRule(BlanketRule::DenyAll.into()),
                ));
                continue;
            }
            self.buckets
                .insert(id, (bucket.clone(), now, rule.abandon_after));
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let elapsed = nanos(usage.time_elapsed.as_ref()).max(1);
            let wanted = crate::grants::demand(fleet.period(), requests, elapsed);
            let name = entry.name.as_str();
            metrics::gauge!(crate::metrics::GRANT_DEMAND, "policy" => name.to_owned())
                .set(wanted as f64 / SCALE as f64 * 1e9 / fleet.period() as f64);
            let key = crate::backend::scoped_key("rlqs", key)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let granted = shared
                .grants
                .grant(&entry.stored_as, &fleet, &key, self.client, wanted);
            match granted {
                Some(grant) => {
                    // Whole seconds, rounded down: Envoy 1.40 reads only the
                    // seconds of a TTL (one under 1 s expires at once).
                    let left = grant.until.saturating_sub(shared.grants.now());
                    let ttl = left.saturating_sub(u64::try_from(MARGIN.as_nanos()).unwrap_or(0));
                    let ttl = ttl - ttl % 1_000_000_000;
                    metrics::counter!(crate::metrics::GRANTS, "policy" => name.to_owned(), "outcome" => "granted").increment(1);
                    metrics::gauge!(crate::metrics::GRANT_RATE, "policy" => name.to_owned())
                        .set(grant.rate as f64 / SCALE as f64 * 1e9 / fleet.period() as f64);
                    actions.push(assign(
                        bucket,
                        ttl,
                        token_bucket(&grant, fleet.period(), ttl),
                    ));
                }
                None => {
                    metrics::counter!(crate::metrics::GRANTS, "policy" => name.to_owned(), "outcome" => "refused").increment(1);
                    actions.push(assign(
                        bucket,
                        ttl,
                        Strategy::BlanketRule(BlanketRule::DenyAll.into()),
                    ));
                }
            }
        }
        let idle: Vec<_> = (self.buckets.iter())
            .filter(|(_, (_, at, after))| now.duration_since(*at) > *after)
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            if let Some((bucket, _, _)) = self.buckets.remove(&id) {
                actions.push(BucketAction {
                    bucket_id: Some(bucket),
                    bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                });
            }
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }
}
