//! weir's limiter in front of a Pingora proxy: `pingora-gw LISTEN UPSTREAM`.
//! Admitted requests go to UPSTREAM over Pingora's keep-alive pool; the rest
//! get a 429 with `Retry-After` and `RateLimit`.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use weir_limiter::Limiter;

struct Gateway {
    limiter: Arc<Limiter>,
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = ();
    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _: &mut ()) -> Result<bool> {
        let seller = session.req_header().headers.get("x-seller-id");
        let seller = seller.and_then(|v| v.to_str().ok()).unwrap_or("");
        let decision = self.limiter.check(&format!("header:{seller}"), 1);
        let decision =
            decision.map_err(|e| Error::explain(ErrorType::InternalError, e.to_string()))?;
        if decision.allowed {
            return Ok(false);
        }
        let retry = common::retry_secs(decision.retry_after);
        let mut head = ResponseHeader::build(429, Some(4))?;
        head.insert_header("Retry-After", retry.to_string())?;
        head.insert_header("RateLimit", format!("\"seller\";r=0;t={retry}"))?;
        head.insert_header("Content-Length", "0")?;
        session.write_response_header(Box::new(head), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let (listen, upstream) = common::args();
    let mut conf = ServerConf::new().expect("Pingora's default configuration");
    conf.threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    conf.upstream_keepalive_pool_size = 128;
    // Exit on SIGTERM at once, as the other gateways do: a lingering
    // server would keep the port for the next run.
    conf.grace_period_seconds = Some(0);
    conf.graceful_shutdown_timeout_seconds = Some(0);
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let gateway = Gateway {
        limiter: Arc::new(common::limiter()),
        upstream,
    };
    let mut service = http_proxy_service(&server.configuration, gateway);
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever();
}
