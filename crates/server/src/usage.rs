//! Usage known only once the upstream has answered (the tokens of an LLM
//! answer): read from the answer as it streams to the client, unbuffered,
//! and reported as soon as weir reads it — what it exceeds the admission
//! charge (and what was reported before) by.
//!
//! The report is charged before the client sees the bytes that carried the
//! usage (a header's at the first frame, an event's or a line's with that
//! event or line, a JSON body's at its end), so a client's next request
//! already meets its debt, whatever the client does after: stall, hang up,
//! or never read the rest. A client that leaves early does not escape it
//! either: the rest of the answer is read in the background and reported
//! all the same. An answer that says no usage is charged the route's
//! `usage_missing`, when it has one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use hyper::body::{Body, Bytes, Frame, SizeHint};

use crate::backend::Check;
use crate::config::{TableId, Usage};
use crate::state::Shared;
use crate::upstream::Answer;

/// The most of a JSON answer, or of one event of a streamed answer, kept
/// to find the usage in: past it, the usage is counted as missing.
pub(crate) const MAX_SCAN: usize = 1 << 20;

/// What a request was admitted with, to be settled once its usage is known.
pub(crate) struct Charge {
    pub(crate) shared: Arc<Shared>,
    pub(crate) route: Arc<str>,
    pub(crate) policies: Vec<TableId>,
    pub(crate) key: String,
    /// What the admission check charged.
    pub(crate) admitted: u64,
    /// The route's `usage_missing`: the usage of an answer that says none.
    pub(crate) missing: Option<u64>,
}

impl Charge {
    /// The usage of an answer that ended saying `usage` (counted and
    /// logged when it said none).
    fn at_end(&self, usage: Option<u64>, said: bool) -> Option<u64> {
        if usage.is_some() || said {
            return usage;
        }
        metrics::counter!(crate::metrics::USAGE_MISSING, "route" => self.route.to_string())
            .increment(1);
        tracing::warn!(route = %self.route, charged = ?self.missing, "the upstream's answer did not say its usage");
        self.missing
    }

    /// Reports what `used` exceeds `reported` (what admission and earlier
    /// reports charged) by: nothing when it is smaller (no refunds). A
    /// failed report is counted and logged, never the client's error.
    fn settle(&self, used: u64, reported: u64) -> Settling {
        let excess = used.saturating_sub(reported);
        let (shared, route) = (Arc::clone(&self.shared), Arc::clone(&self.route));
        let (policies, key) = (self.policies.clone(), self.key.clone());
        Box::pin(async move {
            Self::report(&shared, &route, &policies, &key, excess, used).await;
        })
    }

    pub(crate) async fn report(
        shared: &Shared,
        route: &str,
        policies: &[TableId],
        key: &str,
        excess: u64,
        used: u64,
    ) {
        let table = &shared.table;
        // A report over a policy's bound is charged up to it.
        let checks: Vec<Check<'_>> = policies
            .iter()
            // A concurrency policy holds what runs, not what it used.
            .filter(|&&policy| {
                let entry = table.get(policy);
                let leased = matches!(entry.policy, weir_core::Policy::Concurrency(_));
                excess > 0 && !entry.unlimited && !leased
            })
            .map(|&policy| Check {
                policy,
                key,
                cost: excess.min(table.get(policy).policy.max_report()),
            })
            .collect();
        if checks.is_empty() {
            return;
        }
        // The keys were admitted a moment ago: no new-key guard.
        let reported = shared.report(&checks, None);
        if let Err(e) = reported.await {
            metrics::counter!(crate::metrics::USAGE_UNREPORTED, "route" => route.to_owned())
                .increment(1);
            let error = crate::answer::ApiError::from(e).detail();
            tracing::warn!(route, used, %error, "usage could not be reported");
        }
    }
}

/// Finds the usage in an answer, frame by frame.
pub(crate) struct Scanner {
    found: Option<u64>,
    read: Read,
}

enum Read {
    /// Trailers only (a header was read with the head).
    Trailers(http::HeaderName),
    /// A JSON body, kept up to [`MAX_SCAN`] (`None` past it).
    Json {
        pointer: String,
        body: Option<Vec<u8>>,
    },
    /// JSON lines (`application/x-ndjson`, `application/jsonl`): the line
    /// being read; each line a JSON document.
    Lines {
        pointer: String,
        line: Vec<u8>,
        too_long: bool,
    },
    /// Server-sent events: the line being read and the event's data.
    Events {
        pointer: String,
        line: Vec<u8>,
        data: Vec<u8>,
        too_long: bool,
    },
    /// Nothing to read: not a JSON answer.
    Nothing,
}

fn number(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

impl Scanner {
    /// A scanner for the answer whose head is `headers`.
    pub(crate) fn new(usage: &Usage, headers: &HeaderMap) -> Self {
        let read = match usage {
            Usage::Header(name) => {
                let found = headers.get(name).and_then(|v| number(v.as_bytes()));
                return Self {
                    found,
                    read: Read::Trailers(name.clone()),
                };
            }
            Usage::Json(pointer) => {
                let kind = headers
                    .get(CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| {
                        v.split(';')
                            .next()
                            .unwrap_or("")
                            .trim()
                            .to_ascii_lowercase()
                    });
                let pointer = pointer.clone();
                match kind.as_deref() {
                    Some("text/event-stream") => Read::Events {
                        pointer,
                        line: Vec::new(),
                        data: Vec::new(),
                        too_long: false,
                    },
                    Some(
                        "application/x-ndjson" | "application/jsonl" | "application/json-lines",
                    ) => Read::Lines {
                        pointer,
                        line: Vec::new(),
                        too_long: false,
                    },
                    Some(k) if k == "application/json" || k.ends_with("+json") => Read::Json {
                        pointer,
                        body: Some(Vec::new()),
                    },
                    _ => Read::Nothing,
                }
            }
        };
        Self { found: None, read }
    }

    /// Reads one frame of the answer.
    fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(trailers) = frame.trailers_ref() {
            if let Read::Trailers(name) = &self.read {
                if let Some(n) = trailers.get(name).and_then(|v| number(v.as_bytes())) {
                    self.found = Some(n);
                }
            }
            return;
        }
        let Some(data) = frame.data_ref() else {
            return;
        };
        match &mut self.read {
            Read::Json { body, .. } => {
                if body
                    .as_ref()
                    .is_some_and(|b| b.len() + data.len() > MAX_SCAN)
                {
                    *body = None;
                }
                if let Some(body) = body {
                    body.extend_from_slice(data);
                }
            }
            Read::Events { .. } => {
                for chunk in data.split_inclusive(|&b| b == b'\n') {
                    self.line(chunk);
                }
            }
            Read::Lines { .. } => {
                for chunk in data.split_inclusive(|&b| b == b'\n') {
                    self.json_line(chunk);
                }
            }
            Read::Trailers(_) | Read::Nothing => {}
        }
    }

    /// A piece of a JSON line, ending with `\n` when complete: a line that
    /// holds the usage sets it (the last one wins).
    fn json_line(&mut self, chunk: &[u8]) {
        let Read::Lines {
            pointer,
            line,
            too_long,
        } = &mut self.read
        else {
            return;
        };
        if line.len() + chunk.len() > MAX_SCAN {
            *too_long = true;
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        if !chunk.ends_with(b"\n") {
            return;
        }
        if !std::mem::take(too_long) {
            let text = line.trim_ascii();
            if let Some(n) = lookup(text, pointer) {
                self.found = Some(n);
            }
        }
        line.clear();
    }

    /// A piece of an event stream's line, ending with `\n` when complete.
    fn line(&mut self, chunk: &[u8]) {
        let Read::Events {
            pointer,
            line,
            data,
            too_long,
        } = &mut self.read
        else {
            return;
        };
        if line.len() + chunk.len() > MAX_SCAN {
            *too_long = true;
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        if !chunk.ends_with(b"\n") {
            return;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.is_empty() {
            // A blank line ends the event.
            if !std::mem::take(too_long) {
                if let Some(n) = lookup(data, pointer) {
                    self.found = Some(n);
                }
            }
            data.clear();
        } else if let Some(value) = text.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if data.len() + value.len() + 1 > MAX_SCAN {
                *too_long = true;
            } else {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(value);
            }
        }
        line.clear();
    }

    /// The usage, once the answer has ended.
    fn finish(&mut self) -> Option<u64> {
        match &mut self.read {
            Read::Json {
                pointer,
                body: Some(body),
            } => self.found = lookup(body, pointer),
            Read::Events { .. } => {
                // Ends the last line, then the last event.
                self.line(b"\n");
                self.line(b"\n");
            }
            Read::Lines { .. } => self.json_line(b"\n"),
            Read::Json { body: None, .. } | Read::Trailers(_) | Read::Nothing => {}
        }
        self.found
    }
}

/// The whole number at `pointer` in the JSON document `text`, if any.
fn lookup(text: &[u8], pointer: &str) -> Option<u64> {
    if text.is_empty() || text == b"[DONE]" {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(text).ok()?;
    value.pointer(pointer)?.as_u64()
}

type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The upstream's answer on its way to the client, scanned for its usage.
pub(crate) struct Metered {
    inner: Option<Answer>,
    scanner: Scanner,
    charge: Charge,
    /// What admission and the reports so far charged.
    reported: u64,
    /// A report under way, and the frame held back until it is charged.
    settling: Option<(Settling, Option<Frame<Bytes>>)>,
    /// The answer has ended and its usage was settled (or is settling).
    done: bool,
    /// The longest the rest of an answer may pause once the client left.
    idle: Duration,
}

impl Metered {
    pub(crate) fn new(inner: Answer, scanner: Scanner, charge: Charge, idle: Duration) -> Self {
        Self {
            inner: Some(inner),
            scanner,
            reported: charge.admitted,
            charge,
            settling: None,
            done: false,
            idle,
        }
    }

    /// Usage read beyond what was reported: reported now, `held` back
    /// until it is charged.
    fn settle_read(&mut self, held: Option<Frame<Bytes>>) -> Option<Frame<Bytes>> {
        match self.scanner.found {
            Some(used) if used > self.reported => {
                self.settling = Some((self.charge.settle(used, self.reported), held));
                self.reported = used;
                None
            }
            _ => held,
        }
    }

    /// The answer has ended: report what is left, holding back `last`
    /// until charged.
    fn finish(&mut self, last: Option<Frame<Bytes>>) {
        self.inner = None;
        self.done = true;
        let said = self.scanner.found.is_some();
        let usage = self.scanner.finish();
        let used = self.charge.at_end(usage, said).unwrap_or(0);
        let settle = match used > self.reported {
            true => self.charge.settle(used, self.reported),
            false => Box::pin(async {}) as Settling,
        };
        self.reported = self.reported.max(used);
        self.settling = Some((settle, last));
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some((settle, held)) = &mut this.settling {
                ready!(settle.as_mut().poll(cx));
                let held = held.take();
                this.settling = None;
                match held {
                    Some(frame) => return Poll::Ready(Some(Ok(frame))),
                    None if this.inner.is_none() => return Poll::Ready(None),
                    None => continue,
                }
            }
            let Some(inner) = &mut this.inner else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    this.scanner.frame(&frame);
                    if inner.is_end_stream() {
                        this.finish(Some(frame));
                        continue;
                    }
                    match this.settle_read(Some(frame)) {
                        Some(frame) => return Poll::Ready(Some(Ok(frame))),
                        None => continue,
                    }
                }
                Some(Err(e)) => {
                    // Cut short by the upstream: what was read is all there is.
                    this.finish(None);
                    if let Some((settle, _)) = this.settling.take() {
                        tokio::spawn(settle);
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.finish(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none() && self.settling.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => SizeHint::with_exact(
                self.settling
                    .as_ref()
                    .and_then(|(_, last)| last.as_ref()?.data_ref())
                    .map_or(0, |d| d.len() as u64),
            ),
        }
    }
}

impl Drop for Metered {
    /// The client left before the end: the report still happens.
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some((settle, _)) = self.settling.take() {
            runtime.spawn(settle);
        }
        if self.done {
            return;
        }
        let Some(mut inner) = self.inner.take() else {
            return;
        };
        let mut scanner = std::mem::replace(
            &mut self.scanner,
            Scanner {
                found: None,
                read: Read::Nothing,
            },
        );
        let charge = Charge {
            shared: Arc::clone(&self.charge.shared),
            route: Arc::clone(&self.charge.route),
            policies: std::mem::take(&mut self.charge.policies),
            key: std::mem::take(&mut self.charge.key),
            ..self.charge
        };
        let (idle, reported) = (self.idle, self.reported);
        runtime.spawn(async move {
            use http_body_util::BodyExt;
            while let Ok(Some(Ok(frame))) = tokio::time::timeout(idle, inner.frame()).await {
                scanner.frame(&frame);
            }
            let said = scanner.found.is_some();
            let usage = scanner.finish();
            if let Some(used) = charge.at_end(usage, said) {
                charge.settle(used, reported).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(kind: &str, usage: &Usage, chunks: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, kind.parse().unwrap());
        let mut scanner = Scanner::new(usage, &headers);
        for chunk in chunks {
            scanner.frame(&Frame::data(Bytes::from(chunk.to_string())));
        }
        scanner.finish()
    }

    #[test]
    fn finds_usage_in_json_and_in_events_split_anywhere() {
        let json = Usage::Json("/usage/total_tokens".into());
        assert_eq!(
            scan(
                "application/json; charset=utf-8",
                &json,
                &[r#"{"usage":{"total_"#, r#"tokens": 420}}"#]
            ),
            Some(420)
        );
        assert_eq!(scan("application/json", &json, &["{\"usage\":null}"]), None);
        assert_eq!(
            scan("text/plain", &json, &["{\"usage\":{\"total_tokens\":1}}"]),
            None
        );
        let events = [
            "data: {\"usage\":null}\n\nda",
            "ta: {\"usage\":{\"total_tokens\":7}}\r\n\r\n",
            ": comment\n\ndata: [DONE]\n\n",
        ];
        assert_eq!(scan("text/event-stream", &json, &events), Some(7));
        // The last event needs no blank line after it.
        assert_eq!(
            scan(
                "text/event-stream",
                &json,
                &["data: {\"usage\":{\"total_tokens\":9}}"]
            ),
            Some(9)
        );
        // An event over the bound is skipped, not half read.
        let long = format!("data: {}\n\n", "x".repeat(MAX_SCAN + 1));
        assert_eq!(scan("text/event-stream", &json, &[&long]), None);
    }

    #[test]
    fn finds_usage_in_a_header_or_a_trailer() {
        let usage = Usage::Header(http::HeaderName::from_static("x-usage"));
        let mut headers = HeaderMap::new();
        headers.insert("x-usage", " 12 ".parse().unwrap());
        assert_eq!(Scanner::new(&usage, &headers).finish(), Some(12));
        let mut scanner = Scanner::new(&usage, &HeaderMap::new());
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage", "30".parse().unwrap());
        scanner.frame(&Frame::trailers(trailers));
        assert_eq!(scanner.finish(), Some(30));
    }
}
