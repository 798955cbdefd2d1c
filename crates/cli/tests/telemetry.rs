//! `[telemetry]`: spans over OTLP/gRPC from a real `weir serve` to a
//! collector started here (the OTLP trace service, recording what it gets).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::serve::{Server, temp};

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A collector on a free port, served by `runtime`.
fn collector(runtime: &tokio::runtime::Runtime) -> (String, Collector) {
    let collector = Collector::default();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(collector.clone());
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (format!("http://{addr}"), collector)
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    Some(match value.value.as_ref()? {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    })
}

fn config(endpoint: &str, upstream: u16, include_identity: bool) -> String {
    format!(
        r#"
[telemetry]
otlp_endpoint = "{endpoint}"
include_identity = {include_identity}

[policies.api]
algorithm = "token-bucket"
capacity = 1
rate = "1/h"

[[routes]]
match = "GET /items/{{item}}"
identity = "header:x-tenant"
policies = ["api"]
upstream = "http://127.0.0.1:{upstream}"
"#
    )
}

/// Waits for spans named `names`, for at most 10 s.
fn spans(collector: &Collector, names: &[&str]) -> Vec<Span> {
    let started = Instant::now();
    loop {
        let spans = collector.0.lock().unwrap().clone();
        if names.iter().all(|n| spans.iter().any(|s| s.name == *n)) {
            return spans;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no {names:?} in {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn each_decision_is_a_span_with_its_store_and_upstream_calls() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (endpoint, collector) = collector(&runtime);
    let upstream = crate::envoy::upstream();
    let path = temp("telemetry.toml", &config(&endpoint, upstream, false));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let tenant = "X-Tenant: secret-tenant-42\r\n";
    assert_eq!(server.request_with("GET", "/items/1", tenant, "").0, 200);
    assert_eq!(server.request_with("GET", "/items/1", tenant, "").0, 429);

    let spans = spans(
        &collector,
        &["weir.gateway", "weir.decide", "weir.upstream"],
    );
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);
    // Two requests: two gateway spans, two decisions, one upstream call.
    assert_eq!(named("weir.gateway").count(), 2);
    assert_eq!(named("weir.upstream").count(), 1);
    let decisions: Vec<&Span> = named("weir.decide").collect();
    assert_eq!(decisions.len(), 2);
    let allowed: Vec<String> = decisions
        .iter()
        .filter_map(|d| attribute(d, "weir.allowed"))
        .collect();
    assert_eq!(allowed, ["true", "false"]);
    assert!(
        decisions
            .iter()
            .all(|d| attribute(d, "weir.policies").as_deref() == Some("api"))
    );
    // Each decision and upstream call is a child of its gateway span.
    for child in decisions.iter().copied().chain(named("weir.upstream")) {
        let parent = spans
            .iter()
            .find(|s| s.span_id == child.parent_span_id)
            .unwrap();
        assert_eq!(parent.name, "weir.gateway");
        assert_eq!(parent.trace_id, child.trace_id);
    }
    let statuses: Vec<String> = named("weir.gateway")
        .filter_map(|g| attribute(g, "http.response.status_code"))
        .collect();
    assert_eq!(statuses, ["200", "429"]);
    // The identity is the client's: not in any span unless asked for.
    let all = format!("{spans:?}");
    assert!(!all.contains("secret-tenant-42"), "an identity in a span");
}

#[test]
fn the_store_call_and_the_identity_when_asked_for() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (endpoint, collector) = collector(&runtime);
    let upstream = crate::envoy::upstream();
    let text = config(&endpoint, upstream, true);
    let text = format!("[store]\nurl = \"{}\"\n{text}", redis.url());
    let path = temp("telemetry-redis.toml", &text);
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    // The store comes up in the background: wait until it decides.
    let started = Instant::now();
    while !server
        .request("GET", "/readyz", "")
        .1
        .contains("\"store_up\":true")
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "Redis never up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let tenant = "X-Tenant: acme\r\n";
    assert_eq!(server.request_with("GET", "/items/1", tenant, "").0, 200);
    let spans = spans(&collector, &["weir.store"]);
    let store = spans.iter().find(|s| s.name == "weir.store").unwrap();
    assert_eq!(attribute(store, "db.system.name").as_deref(), Some("redis"));
    let decide = spans
        .iter()
        .find(|s| s.span_id == store.parent_span_id)
        .unwrap();
    assert_eq!(decide.name, "weir.decide");
    let identity = attribute(decide, "weir.identity").unwrap();
    assert!(identity.contains("acme"), "{identity}");
}
