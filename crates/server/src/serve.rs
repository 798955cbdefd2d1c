//! The listeners' one accept loop (`listen`), which holds what a server on
//! the internet must hold — a header timeout, an idle timeout, a cap on
//! connections in all and per client address, counted accept errors, and a
//! graceful shutdown with a deadline — for HTTP/1.1 (the public and
//! internal listeners; h2c is not offered), HTTP/2 (gRPC, and the HTTP
//! listeners over TLS when ALPN picks it) and TLS (a listener's `tls`, its
//! handshake timed as a request head) alike.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::either::Either;
use tower_service::Service;

use axum::extract::ConnectInfo;
use axum::response::IntoResponse;

use crate::config::ConnectionLimits;
use crate::http_app::{App, bounded_and_counted};
use crate::tls::Tls;

/// The largest request head hyper buffers (headers over
/// [`crate::answer::MAX_HEADER_BYTES`] are refused before that, with `431`).
const MAX_BUF: usize = 64 * 1024;

/// Raises the soft limit on open files to the hard limit, so that the
/// connection caps, not the process's descriptors, bound connections.
pub fn raise_fd_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
}

/// Open connections, in all and per client address.
#[derive(Debug, Default)]
pub(crate) struct Open {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// One admitted connection: counted until dropped.
struct Slot {
    open: Arc<Mutex<Open>>,
    ip: IpAddr,
}

/// `weir_connections_open`: admitted connections of every listener.
fn connections_open() -> &'static metrics::Gauge {
    static GAUGE: std::sync::OnceLock<metrics::Gauge> = std::sync::OnceLock::new();
    GAUGE.get_or_init(|| metrics::gauge!(crate::metrics::CONNECTIONS_OPEN))
}

impl Drop for Slot {
    fn drop(&mut self) {
        connections_open().decrement(1.0);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(n) = open.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&self.ip);
            }
        }
    }
}

fn admit(open: &Arc<Mutex<Open>>, ip: IpAddr, limits: &ConnectionLimits) -> Option<Slot> {
    let mut guard = open.lock().unwrap_or_else(PoisonError::into_inner);
    let mine = guard.per_ip.get(&ip).copied().unwrap_or(0);
    if guard.total >= limits.max_connections || mine >= limits.max_connections_per_ip {
        return None;
    }
    guard.total += 1;
    *guard.per_ip.entry(ip).or_default() += 1;
    connections_open().increment(1.0);
    Some(Slot {
        open: open.clone(),
        ip,
    })
}

/// What the socket and the service note for a connection's watchdog:
/// flags and counts only, no clock (a reading on every read and write was
/// a measurable cost per request); the watchdog reads the time on its
/// ticks.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Bytes moved, or a request ended, since the watchdog last looked.
    moved: AtomicBool,
    /// A request head's first bytes have arrived; its request has not
    /// reached the service yet.
    head: AtomicBool,
    /// Request heads completed (each reached the service).
    heads: AtomicU64,
    in_flight: AtomicU64,
    /// HTTP/2: only the first request's head is timed (the preface and the
    /// first call); bytes on a connection with calls behind it (pings,
    /// window updates) are not a head, and bytes in either direction are
    /// not progress (a client's pings, and weir's answers to them, would
    /// keep a connection whose answers cannot move): only requests and the
    /// frames of answers the client takes are.
    first_head_only: bool,
    /// The watchdog's ticks so far: the clock of `answers`.
    ticks: AtomicU64,
    /// The answers being sent, each with the tick since which its next
    /// frame waits on the client ([`NOT_WAITING`] when it waits on weir or
    /// the upstream).
    answers: Mutex<Vec<Arc<AtomicU64>>>,
    /// Requests and answers the client gave up on before their end (an
    /// HTTP/2 stream reset) in this period of [`RESET_PERIOD`].
    cancelled: AtomicU64,
    /// Wakes the watchdog when `cancelled` passes [`MAX_CLIENT_RESETS`].
    too_many: tokio::sync::Notify,
}

/// An answer that waits on weir or its upstream, not on the client.
const NOT_WAITING: u64 = u64::MAX;

/// The watchdog's tick.
const TICK: Duration = Duration::from_millis(250);

/// Requests and answers one HTTP/2 client may cancel (reset) in each
/// [`RESET_PERIOD`] before its connection is closed: a reset stream's
/// request has been decided and perhaps forwarded, so resets are work the
/// client makes weir do for nothing ("rapid reset" on accepted streams).
pub(crate) const MAX_CLIENT_RESETS: u64 = 20;

/// The period over which [`MAX_CLIENT_RESETS`] counts.
pub(crate) const RESET_PERIOD: Duration = Duration::from_secs(10);

impl Activity {
    fn new(h2: bool) -> Self {
        Self {
            first_head_only: h2,
            // A connection owes its first request head (over HTTP/2, the
            // preface) from the start: one that sends nothing is a stalled
            // head, closed at `header_timeout`.
            head: AtomicBool::new(true),
            ..Self::default()
        }
    }

    /// The most ticks an answer now being sent has waited on the client;
    /// forgets the answers that ended.
    fn longest_wait(&self, tick: u64) -> u64 {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        answers.retain(|a| Arc::strong_count(a) > 1);
        answers
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .filter(|&since| since != NOT_WAITING)
            .map(|since| tick.saturating_sub(since))
            .max()
            .unwrap_or(0)
    }

    /// The client gave up on a request or an answer before its end.
    fn cancelled(&self) {
        if self.cancelled.fetch_add(1, Ordering::AcqRel) + 1 > MAX_CLIENT_RESETS {
            self.too_many.notify_one();
        }
    }

    /// An answer about to be sent, its first frame waiting on the client.
    fn answer(self: &Arc<Self>) -> Arc<AtomicU64> {
        let since = Arc::new(AtomicU64::new(self.ticks.load(Ordering::Acquire)));
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(since.clone());
        since
    }
}

/// An answer's body as the connection sends it: notes, for the watchdog,
/// whether its next frame waits on the client (taken frames are progress)
/// and whether the client gave up on it before its end.
pub(crate) struct Progress {
    body: axum::body::Body,
    activity: Arc<Activity>,
    since: Arc<AtomicU64>,
    ended: bool,
}

impl hyper::body::Body for Progress {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let since = match &polled {
            Poll::Pending => NOT_WAITING,
            Poll::Ready(Some(Ok(_))) => {
                self.activity.moved.store(true, Ordering::Release);
                self.activity.ticks.load(Ordering::Acquire)
            }
            Poll::Ready(_) => {
                self.ended = true;
                NOT_WAITING
            }
        };
        self.since.store(since, Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if !self.ended && !hyper::body::Body::is_end_stream(&self.body) {
            self.activity.cancelled();
        }
    }
}

/// The watchdog's own view of a connection: when it last saw bytes move,
/// and when it first saw the request head now being read.
#[derive(Debug)]
struct Watch {
    last_io: Instant,
    head_began: Option<Instant>,
    heads: u64,
}

impl Watch {
    fn new(now: Instant) -> Self {
        Self {
            last_io: now,
            head_began: None,
            heads: 0,
        }
    }

    /// Whether the connection has outlived its bounds at `now`, a tick.
    /// Each time is taken at the first tick that sees it, so a bound is
    /// enforced late by up to two ticks, never early.
    fn expired(
        &mut self,
        activity: &Activity,
        limits: &ConnectionLimits,
        now: Instant,
    ) -> Option<&'static str> {
        if activity.moved.swap(false, Ordering::AcqRel) {
            self.last_io = now;
        }
        // An answer whose next frame has waited on the client for the idle
        // timeout (a full socket, an HTTP/2 window never granted): whatever
        // else moves, its connection is closed (nginx's `send_timeout`).
        let tick = activity.ticks.load(Ordering::Acquire);
        let waited = activity.longest_wait(tick);
        if u128::from(waited) * TICK.as_nanos() > limits.idle_timeout.as_nanos() {
            return Some("send");
        }
        let heads = activity.heads.load(Ordering::Acquire);
        if heads != self.heads {
            self.heads = heads;
            self.head_began = None;
        }
        if activity.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if !activity.head.load(Ordering::Acquire) {
            self.head_began = None;
            return (now.duration_since(self.last_io) > limits.idle_timeout).then_some("idle");
        }
        let began = *self.head_began.get_or_insert(now);
        (now.duration_since(began) > limits.header_timeout).then_some("header")
    }
}

/// A connection's bytes: plain TCP (`Left`), or TLS over it (`Right`).
pub(crate) type Stream = Either<TcpStream, Box<tokio_rustls::server::TlsStream<TcpStream>>>;

/// The socket, noting every read and write for the watchdog.
pub(crate) struct Tracked {
    stream: Stream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            let a = &self.activity;
            if !a.first_head_only {
                a.moved.store(true, Ordering::Release);
                if a.in_flight.load(Ordering::Acquire) == 0 {
                    a.head.store(true, Ordering::Release);
                }
            }
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if !self.activity.first_head_only && matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.moved.store(true, Ordering::Release);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// One connection's service: the app, counting requests in flight for the
/// watchdog (a request's head is complete when it reaches the service).
struct Conn {
    app: App,
    peer: SocketAddr,
    activity: Arc<Activity>,
    /// Over TLS: the gateway says `X-Forwarded-Proto: https`.
    secure: bool,
}

use crate::answer::Secure;

/// Decrements the in-flight count when the response (head) is ready or the
/// request is dropped (then counted as cancelled by the client).
pub(crate) struct InFlight {
    activity: Arc<Activity>,
    answered: bool,
}

impl InFlight {
    /// A request's head has reached the service: counted in flight.
    pub(crate) fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.head.store(false, Ordering::Release);
        activity.heads.fetch_add(1, Ordering::AcqRel);
        activity.moved.store(true, Ordering::Release);
        Self {
            activity: activity.clone(),
            answered: false,
        }
    }

    /// The answer's head is ready (its body not watched).
    pub(crate) fn finish(&mut self) {
        self.answered = true;
    }

    /// The answer's head is ready: its body, watched for progress over
    /// HTTP/2. (Over HTTP/1.1 an answer the client does not take moves no
    /// byte, and the idle timeout already bounds it: nothing to watch, no
    /// cost per request.)
    pub(crate) fn answered(
        mut self,
        response: axum::response::Response,
    ) -> axum::response::Response {
        self.finish();
        if !self.activity.first_head_only || hyper::body::Body::is_end_stream(response.body()) {
            return response;
        }
        let since = self.activity.answer();
        let activity = self.activity.clone();
        response.map(|body| {
            axum::body::Body::new(Progress {
                body,
                activity,
                since,
                ended: false,
            })
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.activity;
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
        a.moved.store(true, Ordering::Release);
        if !self.answered {
            a.cancelled();
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Conn {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let guard = InFlight::start(&self.activity);
        // No host: nothing to route by, and nothing the upstream may be
        // told of it but what the client wrote elsewhere.
        if request.version() >= http::Version::HTTP_11
            && request.uri().authority().is_none()
            && !request.headers().contains_key(http::header::HOST)
        {
            let response = crate::answer::ApiError::MissingHost.into_response();
            return Box::pin(std::future::ready(Ok(guard.answered(response))));
        }
        // A request without a body (most) gets the empty one, which is not
        // boxed: nothing to allocate, nothing to poll through a pointer.
        let mut request = request.map(|body| match hyper::body::Body::is_end_stream(&body) {
            true => axum::body::Body::empty(),
            false => axum::body::Body::new(body),
        });
        if self.secure {
            request.extensions_mut().insert(Secure);
        }
        if let Some(state) = self.app.gateway(request.uri().path()) {
            let (state, peer) = (state.clone(), self.peer);
            return Box::pin(async move {
                let forward = |request| crate::gateway::forward(&state, Some(peer), request);
                let response = bounded_and_counted(&state, None, request, forward).await;
                Ok(guard.answered(response))
            });
        }
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let called = self.app.router().clone().call(request);
        Box::pin(async move {
            let Ok(response) = called.await;
            Ok(guard.answered(response))
        })
    }
}

/// Logs accept errors at most once a second; counts every one.
fn accept_error(e: &std::io::Error, last: &mut Option<Instant>) {
    metrics::counter!(crate::metrics::ACCEPT_ERRORS).increment(1);
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        tracing::error!(error = %e, "accept failed (logged at most once a second; weir_accept_errors_total counts them)");
        *last = Some(Instant::now());
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`
/// completes; then stops accepting and gives the connections in flight up
/// to `shutdown_timeout` to finish.
pub async fn serve(
    listener: TcpListener,
    app: App,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Mutex::new(Open::default()));
    serve_counted(listener, app, limits, open, shutdown).await
}

/// Serves `app` on `listener` from `threads` threads ([`per_core`]),
/// sharing the connection caps, until `stop` turns true.
pub fn serve_per_core(
    listener: std::net::TcpListener,
    threads: usize,
    app: App,
    limits: ConnectionLimits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<std::io::Result<()>>>> {
    let open = Arc::new(Mutex::new(Open::default()));
    per_core(listener, threads, "weir-http", move |listener| {
        let (app, open) = (app.clone(), open.clone());
        serve_counted(listener, app, limits, open, stopped(stop.clone()))
    })
}

/// Completes when `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs `serve` on `listener` from `threads` threads, each a current-thread
/// tokio runtime accepting from the same listening socket: a connection,
/// its requests and the calls they make stay on the thread that accepted it
/// (no wake-up crosses threads, no task migrates), as with nginx's worker
/// per core. One socket, not one per thread with `SO_REUSEPORT`, so that a
/// second process on the same port fails to start instead of silently
/// sharing the load. Each thread ends when its `serve` does.
pub fn per_core<F, Fut>(
    listener: std::net::TcpListener,
    threads: usize,
    name: &str,
    serve: F,
) -> std::io::Result<Vec<std::thread::JoinHandle<std::io::Result<()>>>>
where
    F: Fn(TcpListener) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = std::io::Result<()>>,
{
    listener.set_nonblocking(true)?;
    (0..threads.max(1))
        .map(|i| {
            let (listener, serve) = (listener.try_clone()?, serve.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async move { serve(TcpListener::from_std(listener)?).await })
                })
        })
        .collect()
}

async fn serve_counted(
    listener: TcpListener,
    app: App,
    limits: ConnectionLimits,
    open: Arc<Mutex<Open>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = app.tls().map_err(std::io::Error::other)?;
    let http = move |accepted: Accepted, watcher: Watcher| {
        let secure = accepted.secure;
        let service = Conn {
            app: app.clone(),
            peer: accepted.peer,
            activity: accepted.activity,
            secure,
        };
        if accepted.h2 {
            // HTTP/2 over TLS (ALPN): bounded as the HTTP/1.1 heads are.
            let connection = http2(HTTP_STREAMS).serve_connection(accepted.io, service);
            return futures_util::future::Either::Left(watcher.watch(connection));
        }
        // No timer: hyper's own header timeout (30 s once a timer is set)
        // would cut a configured `header_timeout` above it; the watchdog
        // enforces the configured one.
        let connection = hyper::server::conn::http1::Builder::new()
            .header_read_timeout(None)
            .max_buf_size(MAX_BUF)
            .serve_connection(accepted.io, service);
        futures_util::future::Either::Right(watcher.watch(connection))
    };
    let refusal = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\nretry-after: 1\r\n\r\n";
    let protocol = match tls {
        // Over TLS a refusal in clear would not be read: closed instead.
        Some(tls) => Protocol::Tls(tls),
        None => Protocol::Plain { refusal },
    };
    listen(listener, limits, open, shutdown, protocol, http).await
}

/// An HTTP/2 server connection with the hardening bounds: at most
/// `streams` at once, each head within [`crate::answer::MAX_HEADER_BYTES`] (so a
/// connection holds at most `streams` × 32 KiB of heads), and resets a
/// client may cause (the "rapid reset" attack).
pub(crate) fn http2(streams: u32) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(streams)
        .max_header_list_size(u32::try_from(crate::answer::MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .max_local_error_reset_streams(Some(MAX_PENDING_RESETS));
    builder
}

/// Streams one HTTP/2 connection of the public or internal listener may
/// have open at once: 1 MiB of heads at most, as 16 HTTP/1.1 connections.
pub(crate) const HTTP_STREAMS: u32 = 32;

/// Streams one gRPC connection may have open at once: Envoy multiplexes
/// its rate limit calls on few connections.
pub(crate) const GRPC_STREAMS: u32 = 256;

/// Streams a client may reset before they are accepted, and errors it may
/// provoke, before its connection is closed.
const MAX_PENDING_RESETS: usize = 20;

/// A connection as the accept loop hands it to its protocol: the socket
/// (noting its traffic for the watchdog), the peer, and that activity.
pub(crate) struct Accepted {
    pub(crate) io: TokioIo<Tracked>,
    pub(crate) peer: SocketAddr,
    pub(crate) activity: Arc<Activity>,
    /// HTTP/2, as TLS's ALPN chose (gRPC: always).
    pub(crate) h2: bool,
    /// Over TLS.
    pub(crate) secure: bool,
}

/// What a listener speaks, as far as its accept loop must know.
#[derive(Debug, Clone)]
pub(crate) enum Protocol {
    /// HTTP/1.1 or the Redis protocol, in plain text: every request's head
    /// (a command) is timed; a connection over a cap is answered `refusal`
    /// before it is closed.
    Plain { refusal: &'static [u8] },
    /// HTTP/2 (gRPC): the preface and first call are timed as a head, then
    /// only idleness; a connection over a cap is closed.
    Http2,
    /// TLS, then HTTP/2 or HTTP/1.1 as ALPN picks: the handshake is timed
    /// as a head; a connection over a cap is closed.
    Tls(Tls),
    /// TLS, then HTTP/2 (gRPC).
    Http2Tls(Tls),
}

/// The one accept loop of every listener — public, internal and gRPC:
/// connection caps in all and per address (`open`, shared by the threads
/// of one listener), the watchdog's header and idle timeouts, counted and
/// rate-limited accept errors, and a drain within `shutdown_timeout` once
/// `shutdown` completes. `serve` makes each admitted connection's future.
pub(crate) async fn listen<S, F>(
    listener: TcpListener,
    limits: ConnectionLimits,
    open: Arc<Mutex<Open>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    protocol: Protocol,
    serve: S,
) -> std::io::Result<()>
where
    S: Fn(Accepted, Watcher) -> F + Clone + Send + 'static,
    F: Future<Output = Result<(), hyper::Error>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut last_error = None;
    tokio::pin!(shutdown);
    while let Some((stream, peer)) = accept(&listener, shutdown.as_mut(), &mut last_error).await {
        let Some(slot) = admit(&open, limits.client(peer.ip()), &limits) else {
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED).increment(1);
            // Over a cap: the refusal if the socket takes it at once, then close.
            if let Protocol::Plain { refusal } = protocol {
                let _ = stream.try_write(refusal);
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (protocol, serve, watcher) = (protocol.clone(), serve.clone(), graceful.watcher());
        tokio::spawn(async move {
            let _slot = slot;
            let (stream, h2) = match protocol {
                Protocol::Plain { .. } => (Either::Left(stream), false),
                Protocol::Http2 => (Either::Left(stream), true),
                Protocol::Tls(tls) | Protocol::Http2Tls(tls) => {
                    // A stalled handshake is a stalled head; a plaintext
                    // request fails it, and is closed.
                    let handshake = tls.acceptor.accept(stream);
                    match tokio::time::timeout(limits.header_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                            (Either::Right(Box::new(stream)), h2)
                        }
                        Ok(Err(e)) => {
                            metrics::counter!(crate::metrics::TLS_HANDSHAKES_FAILED).increment(1);
                            handshake_failed(peer, &e);
                            return;
                        }
                        Err(_) => {
                            metrics::counter!(crate::metrics::CONNECTIONS_TIMED_OUT, "phase" => "handshake").increment(1);
                            return;
                        }
                    }
                }
            };
            let secure = matches!(stream, Either::Right(_));
            let activity = Arc::new(Activity::new(h2));
            let io = TokioIo::new(Tracked {
                stream,
                activity: activity.clone(),
            });
            let watched = activity.clone();
            let accepted = Accepted {
                io,
                peer,
                activity,
                h2,
                secure,
            };
            let connection = serve(accepted, watcher);
            let watchdog = async {
                let mut tick = tokio::time::interval(TICK);
                let mut watch = Watch::new(Instant::now());
                let period = RESET_PERIOD.as_nanos() / TICK.as_nanos();
                loop {
                    tokio::select! {
                        at = tick.tick() => {
                            let ticks = watched.ticks.fetch_add(1, Ordering::AcqRel) + 1;
                            if u128::from(ticks) % period == 0 {
                                watched.cancelled.store(0, Ordering::Release);
                            }
                            if let Some(why) = watch.expired(&watched, &limits, at.into_std()) {
                                return why;
                            }
                        }
                        () = watched.too_many.notified() => {
                            if watched.cancelled.load(Ordering::Acquire) > MAX_CLIENT_RESETS {
                                return "resets";
                            }
                        }
                    }
                }
            };
            tokio::select! {
                served = connection => {
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                why = watchdog => {
                    metrics::counter!(crate::metrics::CONNECTIONS_TIMED_OUT, "phase" => why).increment(1);
                    tracing::debug!(%peer, phase = why, "connection closed: timeout");
                }
            }
        });
    }
    drop(listener);
    drain(graceful, limits.shutdown_timeout).await;
    Ok(())
}

/// A failed TLS handshake: a client certificate refused (one not of the
/// `client_ca`, a v1 certificate, an expired one) is a setup problem its
/// operator must see, logged at warn at most once a second; the rest
/// (plaintext to a TLS port, a scanner) at debug.
fn handshake_failed(peer: SocketAddr, error: &std::io::Error) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let certificate = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        });
    if !certificate {
        tracing::debug!(%peer, %error, "TLS handshake failed");
        return;
    }
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *last = Some(Instant::now());
        tracing::warn!(%peer, %error, "TLS handshake failed: the client's certificate was refused (logged at most once a second; weir_tls_handshakes_failed_total counts them)");
    }
}

/// The next connection on `listener`, or `None` once `shutdown` completes.
/// An accept error is counted and logged (at most once a second), then
/// the loop pauses: out of descriptors or memory, let some go first.
pub(crate) async fn accept(
    listener: &TcpListener,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    last_error: &mut Option<Instant>,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return None,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
                Err(e) => {
                    accept_error(&e, last_error);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// Gives the connections `graceful` watches up to `deadline` to finish.
pub(crate) async fn drain(graceful: GracefulShutdown, deadline: Duration) {
    if tokio::time::timeout(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            after = ?deadline,
            "shutdown deadline passed: closing the connections still open"
        );
    }
}
