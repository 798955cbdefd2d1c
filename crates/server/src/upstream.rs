//! The gateway's upstream connections: HTTP/1.1 with keep-alive, pooled per
//! thread and per upstream authority. With a runtime per core
//! (`serve::per_core`), a proxied request, its upstream connection and that
//! connection's task stay on the thread that accepted the request, and
//! taking or returning a connection is a look-up in a map no other thread
//! touches.
//!
//! A connection goes back to its pool only once its answer's body has been
//! read to the end, so a request is never written behind an answer still
//! arriving (no pipelining). Dropping an answer before its end closes its
//! connection (hyper does), as does a request abandoned for a timeout. A
//! pooled connection the upstream has closed is skipped; when one closes
//! just as a request is handed to it, before any byte of the request is
//! sent, the request goes to another connection (as hyper-util's client
//! retries it). At most [`MAX_IDLE`] connections per upstream wait in a
//! thread's pool, for at most [`IDLE_TIMEOUT`] each; the closed and the
//! expired are dropped when a request next looks for one there.
//!
//! In place of hyper-util's general-purpose client, whose pool sits behind
//! a mutex and hashes its `(scheme, authority)` key with SipHash on each
//! checkout and return, a measurable share of a forwarded request's
//! instructions (docs/BENCHMARKS.md).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::uri::Authority;
use http::{Request, Response, Uri};
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

/// Idle connections kept per upstream in each thread's pool.
const MAX_IDLE: usize = 64;

/// How long a connection may wait in a pool before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Why an upstream call failed: the connection could not be made, or the
/// exchange failed (hyper's error, whose source may be the client's body).
pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

#[derive(Default)]
struct Pool {
    /// Keyed by [`Key`]'s text.
    idle: HashMap<Box<str>, Vec<Idle>, foldhash::fast::RandomState>,
    connector: Option<HttpConnector>,
    /// TLS to `https` upstreams, by the roots they are verified against
    /// (`None`: the system's).
    tls: HashMap<Option<PathBuf>, tokio_rustls::TlsConnector>,
}

/// An upstream as the pool knows it: its authority, and whether it is
/// reached over TLS.
#[derive(Debug, Clone)]
pub(crate) struct Upstream<'a> {
    pub(crate) uri: &'a Uri,
    pub(crate) authority: &'a Authority,
    /// `upstream_ca`, for an `https` upstream.
    pub(crate) ca: Option<&'a Path>,
}

impl Upstream<'_> {
    fn tls(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }

    /// Which pooled connections may carry this upstream's requests.
    fn key(&self) -> Key {
        match self.tls() {
            false => Key::Plain(self.authority.clone()),
            // Verified against these roots: never shared with a route that
            // verifies against others.
            true => {
                let ca = self.ca.map_or(String::new(), |p| p.display().to_string());
                Key::Tls(format!("https://{}#{ca}", self.authority).into())
            }
        }
    }
}

/// A pool's key: an `http` upstream's authority as configured (no
/// allocation), or an `https` one's with the roots it is verified against.
#[derive(Debug, Clone)]
enum Key {
    Plain(Authority),
    Tls(Box<str>),
}

impl Key {
    fn as_str(&self) -> &str {
        match self {
            Self::Plain(authority) => authority.as_str(),
            Self::Tls(text) => text,
        }
    }
}

/// The TLS connector verifying against `ca`'s roots, or the system's.
fn tls_connector(ca: Option<&Path>) -> Result<tokio_rustls::TlsConnector, Failure> {
    if let Some(connector) =
        POOL.with_borrow(|pool| pool.tls.get(&ca.map(Path::to_path_buf)).cloned())
    {
        return Ok(connector);
    }
    let connector = crate::tls::client(ca, b"http/1.1")?;
    POOL.with_borrow_mut(|pool| {
        pool.tls
            .insert(ca.map(Path::to_path_buf), connector.clone())
    });
    Ok(connector)
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::default();
}

/// A ready connection to `authority` from this thread's pool, if one
/// waits; the closed and the expired are dropped on the way.
fn checkout(key: &Key) -> Option<SendRequest<Body>> {
    POOL.with_borrow_mut(|pool| {
        let waiting = pool.idle.get_mut(key.as_str())?;
        let now = Instant::now();
        waiting.retain(|idle| {
            !idle.sender.is_closed() && now.duration_since(idle.since) < IDLE_TIMEOUT
        });
        // The most recently returned first: the likeliest to be open.
        let ready = waiting.iter().rposition(|idle| idle.sender.is_ready())?;
        Some(waiting.swap_remove(ready).sender)
    })
}

/// Returns a connection whose answer has ended to this thread's pool.
fn checkin(key: Key, sender: SendRequest<Body>) {
    if sender.is_closed() {
        return;
    }
    POOL.with_borrow_mut(|pool| {
        let idle = Idle {
            sender,
            since: Instant::now(),
        };
        match pool.idle.get_mut(key.as_str()) {
            Some(waiting) if waiting.len() < MAX_IDLE => waiting.push(idle),
            Some(_) => {}
            None => {
                pool.idle.insert(key.as_str().into(), vec![idle]);
            }
        }
    });
}

/// A new connection to `upstream` (over TLS for `https`, its certificate
/// verified for its host name), its task spawned on this thread's runtime.
async fn connect(upstream: &Upstream<'_>) -> Result<SendRequest<Body>, Failure> {
    let mut connector = POOL.with_borrow_mut(|pool| {
        pool.connector
            .get_or_insert_with(|| {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                // The scheme is this module's to check: https is TLS below.
                connector.enforce_http(false);
                connector
            })
            .clone()
    });
    std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
    let io = connector.call(upstream.uri.clone()).await?;
    if !upstream.tls() {
        return serve_connection(io).await;
    }
    let host = upstream
        .authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
    let tls = tls_connector(upstream.ca)?
        .connect(name, io.into_inner())
        .await?;
    serve_connection(hyper_util::rt::TokioIo::new(tls)).await
}

/// An HTTP/1.1 client connection over `io`, its task spawned.
async fn serve_connection<I>(io: I) -> Result<SendRequest<Body>, Failure>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

/// Sends `request` (origin-form URI, `Host` set) to `upstream` over a pooled
/// connection or a new one.
pub(crate) async fn send(
    upstream: Upstream<'_>,
    mut request: Request<Body>,
) -> Result<Response<Answer>, Failure> {
    let key = upstream.key();
    loop {
        let (mut sender, reused) = match checkout(&key) {
            Some(sender) => (sender, true),
            None => {
                let connecting = Box::pin(connect(&upstream));
                (connecting.await?, false)
            }
        };
        match sender.try_send_request(request).await {
            Ok(response) => {
                return Ok(response.map(|body| Answer::new(body, (key, sender))));
            }
            Err(mut e) => match e.take_message() {
                // Closed before anything was sent: another connection.
                Some(unsent) if reused => request = unsent,
                _ => return Err(e.into_error().into()),
            },
        }
    }
}

/// An upstream answer's body; at its end its connection goes back to the
/// pool of the thread that reads it.
pub(crate) struct Answer {
    body: Incoming,
    home: Option<(Key, SendRequest<Body>)>,
}

impl Answer {
    fn new(body: Incoming, home: (Key, SendRequest<Body>)) -> Self {
        let mut answer = Self {
            body,
            home: Some(home),
        };
        if hyper::body::Body::is_end_stream(&answer.body) {
            answer.ended();
        }
        answer
    }

    fn ended(&mut self) {
        if let Some((key, sender)) = self.home.take() {
            checkin(key, sender);
        }
    }
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            // A body of known length ends with its last byte (a server
            // writing it need not poll again).
            None => this.ended(),
            Some(Ok(_)) if this.body.is_end_stream() => this.ended(),
            Some(Ok(_)) => {}
            // A failed answer's connection is not reused.
            Some(Err(_)) => this.home = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
