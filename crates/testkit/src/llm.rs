//! A fake LLM upstream over real HTTP/1.1: `POST` a JSON body
//! `{"usage": N, "stream": bool, "pause_ms": M, "head_ms": H, "hold_ms":
//! D, "ndjson": bool}` and it
//! answers, `H` ms later, with `N` tokens used — in an `x-usage-tokens`
//! header, in an OpenAI-style `application/json` body
//! (`/usage/total_tokens`; gzipped when the request accepts `gzip`, as
//! real APIs do), or, with `stream`, in the last `data:` event of a
//! `text/event-stream` answer (events `M` ms apart; the end `D` ms after
//! the usage event) and in an `x-usage-tokens` trailer; with `ndjson`, as
//! Ollama streams: `application/x-ndjson` lines, the last with the usage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Either, Full, channel::Channel};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

type Body = Either<Full<Bytes>, Channel<Bytes, std::convert::Infallible>>;

/// A running fake LLM.
#[derive(Debug)]
pub struct Llm {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Answers sent to their end (a streamed one counts once its last
    /// event is written).
    pub finished: Arc<AtomicUsize>,
}

/// The events of a streamed answer, before the one that carries usage.
pub const CONTENT_EVENTS: [&str; 3] = ["Rate", " limits", " work."];

impl Llm {
    /// Starts one on a free loopback port, served by the current runtime.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let finished = Arc::new(AtomicUsize::new(0));
        let done = finished.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let done = done.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| answer(request, done.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, finished }
    }

    /// How many answers were sent to their end.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
}

/// The JSON body of an answer (or the usage event of a stream) that used
/// `tokens`.
pub fn usage_json(tokens: u64) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"Rate limits work."}}}}],"usage":{{"prompt_tokens":1,"completion_tokens":{},"total_tokens":{tokens}}}}}"#,
        tokens.saturating_sub(1)
    )
}

async fn answer(
    request: hyper::Request<Incoming>,
    finished: Arc<AtomicUsize>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    let gzip = request
        .headers()
        .get_all("accept-encoding")
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("gzip")));
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let asked: serde_json::Value = body
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let tokens = asked["usage"].as_u64();
    let pause = Duration::from_millis(asked["pause_ms"].as_u64().unwrap_or(0));
    tokio::time::sleep(Duration::from_millis(
        asked["head_ms"].as_u64().unwrap_or(0),
    ))
    .await;
    let mut response = hyper::Response::builder();
    if !asked["stream"].as_bool().unwrap_or(false) {
        if let Some(tokens) = tokens {
            response = response.header("x-usage-tokens", tokens);
        }
        let json = tokens.map_or_else(
            || r#"{"id":"chatcmpl-1","choices":[]}"#.to_owned(),
            usage_json,
        );
        finished.fetch_add(1, Ordering::SeqCst);
        let response = response.header("content-type", "application/json");
        let response = match gzip {
            true => response
                .header("content-encoding", "gzip")
                .body(Either::Left(Full::from(gzipped(json.as_bytes())))),
            false => response.body(Either::Left(Full::from(json))),
        };
        return Ok(response.unwrap());
    }
    let hold = Duration::from_millis(asked["hold_ms"].as_u64().unwrap_or(0));
    let ndjson = asked["ndjson"].as_bool().unwrap_or(false);
    let (mut tx, body) = Channel::new(1);
    tokio::spawn(async move {
        for content in CONTENT_EVENTS {
            let event = match ndjson {
                true => format!("{{\"message\":{{\"content\":\"{content}\"}},\"done\":false}}\n"),
                false => format!(
                    "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{content}\"}}}}],\"usage\":null}}\n\n"
                ),
            };
            if tx.send_data(Bytes::from(event)).await.is_err() {
                return;
            }
            tokio::time::sleep(pause).await;
        }
        let (last, end) = match (ndjson, tokens) {
            (true, Some(t)) => (format!("{}\n", usage_json(t)), String::new()),
            (true, None) => ("{\"done\":true}\n".to_owned(), String::new()),
            (false, Some(t)) => (
                format!("data: {}\n\n", usage_json(t)),
                "data: [DONE]\n\n".to_owned(),
            ),
            (false, None) => (String::new(), "data: [DONE]\n\n".to_owned()),
        };
        if tx.send_data(Bytes::from(last)).await.is_err() {
            return;
        }
        tokio::time::sleep(hold).await;
        let _ = tx.send_data(Bytes::from(end)).await;
        let mut trailers = http::HeaderMap::new();
        if let Some(tokens) = tokens {
            trailers.insert("x-usage-tokens", tokens.into());
        }
        let _ = tx.send_trailers(trailers).await;
        finished.fetch_add(1, Ordering::SeqCst);
    });
    let kind = match ndjson {
        true => "application/x-ndjson",
        false => "text/event-stream",
    };
    let response = response
        .header("content-type", kind)
        .header("trailer", "x-usage-tokens")
        .body(Either::Right(body));
    Ok(response.unwrap())
}

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}
