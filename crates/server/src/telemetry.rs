//! `[telemetry]`: OpenTelemetry spans over OTLP/gRPC for each decision —
//! `weir.decide`, its store call (`weir.store`, or `weir.fallback` when
//! the local fallback decided), and in the gateway `weir.gateway` with the
//! upstream call (`weir.upstream`) — the policy and the outcome as
//! attributes, the identity only with `include_identity = true`.
//!
//! Off (no `[telemetry]`), a decision pays one load of an empty cell.
//! Read at start only: a reload does not change it.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::future::Either;
use opentelemetry::trace::{FutureExt, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracer, SdkTracerProvider};

use crate::config::Telemetry;

struct Installed {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    include_identity: bool,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// How often finished spans are sent.
const EVERY: Duration = Duration::from_secs(1);

/// Starts exporting spans to `config`'s collector (within a tokio runtime:
/// spans are sent by one of its tasks). Once per process.
pub fn install(config: &Telemetry) -> Result<(), String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(&config.otlp_endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("[telemetry] otlp_endpoint {}: {e}", config.otlp_endpoint))?;
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(EVERY)
        .build();
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().with_service_name("weir").build())
        .build();
    let tracer = provider.tracer("weir");
    INSTALLED
        .set(Installed {
            provider,
            tracer,
            include_identity: config.include_identity,
        })
        .map_err(|_| "telemetry is already installed".to_owned())
}

/// Sends the spans not sent yet (at shutdown).
pub fn flush() {
    if let Some(installed) = INSTALLED.get() {
        let _ = installed.provider.force_flush();
    }
}

/// A span, or nothing when tracing is off. Ended when dropped.
pub(crate) struct Traced(Option<Context>);

impl Traced {
    /// A span named `name`, a child of the current one.
    pub(crate) fn start(name: &'static str) -> Self {
        Self(INSTALLED.get().map(|installed| {
            let parent = Context::current();
            let span = installed.tracer.start_with_context(name, &parent);
            parent.with_span(span)
        }))
    }

    /// Whether spans are recorded (to skip building attributes when not).
    pub(crate) fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// The identity, where `include_identity = true` allows it.
    pub(crate) fn identity(&self, key: &str) {
        if INSTALLED.get().is_some_and(|i| i.include_identity) {
            self.set("weir.identity", key.to_owned());
        }
    }

    pub(crate) fn error(&self, message: String) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(message));
        }
    }

    /// Runs `future` with this span as the parent of the spans it starts.
    /// Not an `async fn`: that would hold `future` twice (as its argument
    /// and as what it awaits), doubling the size of every caller's future.
    pub(crate) fn around<F: Future>(&self, future: F) -> impl Future<Output = F::Output> {
        match &self.0 {
            Some(cx) => Either::Left(future.with_context(cx.clone())),
            None => Either::Right(future),
        }
    }

    /// [`Traced::around`], boxed: for a large future on a hot path, awaited
    /// only when tracing is on, so that the caller's future holds the
    /// untraced one once (see `gateway::forward`).
    pub(crate) fn boxed<'a, F: Future + Send + 'a>(
        &self,
        future: F,
    ) -> Pin<Box<dyn Future<Output = F::Output> + Send + 'a>> {
        match &self.0 {
            Some(cx) => Box::pin(future.with_context(cx.clone())),
            None => Box::pin(future),
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}
