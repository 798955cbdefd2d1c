//! weir's limiter in front of a plain hyper proxy, in the shape of weir's
//! gateway (a current-thread runtime per core, each accepting from a copy of
//! one listening socket, each with its own upstream pool) but with nothing
//! else: no router, no metrics, no header rules. `hyper-gw LISTEN UPSTREAM`.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use weir_limiter::Limiter;

type Body = BoxBody<Bytes, hyper::Error>;

thread_local! {
    static UPSTREAM: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response
}

async fn handle(
    limiter: Arc<Limiter>,
    upstream: Arc<str>,
    mut request: Request<Incoming>,
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
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{upstream}{path}").parse() else {
        return Ok(empty(StatusCode::BAD_REQUEST));
    };
    *request.uri_mut() = uri;
    match UPSTREAM.with(Client::clone).request(request).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
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
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio socket");
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let (limiter, upstream) = (limiter.clone(), upstream.clone());
                        tokio::spawn(async move {
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
