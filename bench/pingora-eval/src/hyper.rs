//! weir's limiter in front of a plain hyper proxy, in the shape of weir's
//! gateway — a current-thread runtime per core, each accepting from a copy
//! of one listening socket, each with its own upstream pool, a connection
//! going back to it when its answer's body ends, and mimalloc — but with
//! nothing else: no router, no metrics, no header rules, no timeouts. The
//! floor of weir's stack: `hyper-gw LISTEN UPSTREAM`.

mod common;

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use weir_limiter::Limiter;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

thread_local! {
    static POOL: RefCell<Vec<SendRequest<Incoming>>> = const { RefCell::new(Vec::new()) };
}

/// An answer's body, or none; at the end of an answer its connection goes
/// back to the pool.
enum Body {
    Answer(Incoming, Option<SendRequest<Incoming>>),
    Empty,
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Body::Answer(body, sender) = self.get_mut() else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(&mut *body).poll_frame(cx);
        if body.is_end_stream() || matches!(frame, Poll::Ready(None)) {
            if let Some(sender) = sender.take() {
                POOL.with(|pool| pool.borrow_mut().push(sender));
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Answer(body, _) => body.is_end_stream(),
            Body::Empty => true,
        }
    }
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = status;
    response
}

/// A pooled connection to `upstream` that is ready, or a new one.
async fn sender(upstream: &str) -> Option<SendRequest<Incoming>> {
    while let Some(sender) = POOL.with(|pool| pool.borrow_mut().pop()) {
        if sender.is_ready() {
            return Some(sender);
        }
    }
    let stream = tokio::net::TcpStream::connect(upstream).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::task::spawn_local(connection);
    Some(sender)
}

async fn handle(
    limiter: Arc<Limiter>,
    upstream: Arc<str>,
    request: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let seller = request.headers().get("x-seller-id");
    let seller = seller.and_then(|v| v.to_str().ok()).unwrap_or("");
    let Ok(decision) = limiter.check(&format!("header:{seller}"), 1) else {
        return Ok(empty(StatusCode::BAD_REQUEST));
    };
    if !decision.allowed {
        let retry = common::retry_secs(decision.retry_after);
        let mut response = empty(StatusCode::TOO_MANY_REQUESTS);
        let headers = response.headers_mut();
        headers.insert("retry-after", retry.into());
        let field = format!("\"seller\";r=0;t={retry}");
        headers.insert("ratelimit", field.parse().expect("an ASCII field"));
        return Ok(response);
    }
    let Some(mut sender) = sender(&upstream).await else {
        return Ok(empty(StatusCode::BAD_GATEWAY));
    };
    match sender.send_request(request).await {
        Ok(response) => Ok(response.map(|body| Body::Answer(body, Some(sender)))),
        Err(_) => Ok(empty(StatusCode::BAD_GATEWAY)),
    }
}

fn main() {
    let (listen, upstream) = common::args();
    let (limiter, upstream) = (Arc::new(common::limiter()), Arc::<str>::from(upstream));
    let listener = std::net::TcpListener::bind(&listen).expect("LISTEN is free");
    listener
        .set_nonblocking(true)
        .expect("a non-blocking socket");
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads: Vec<_> = (0..cores)
        .map(|_| {
            let (limiter, upstream) = (limiter.clone(), upstream.clone());
            let listener = listener.try_clone().expect("a copy of the socket");
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                tokio::task::LocalSet::new().block_on(&runtime, async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio socket");
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let (limiter, upstream) = (limiter.clone(), upstream.clone());
                        tokio::task::spawn_local(async move {
                            let service =
                                service_fn(move |r| handle(limiter.clone(), upstream.clone(), r));
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}
