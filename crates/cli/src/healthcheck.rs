//! `weir healthcheck URL`: the container's health check, with no shell or
//! curl in the image, over plain HTTP or TLS. Exits 0 when the URL answers
//! 2xx within the timeout, 1 otherwise (saying why on standard error).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::Full;
use hyper::body::Bytes;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The URL to ask: /healthz (the process answers) or /readyz (its
    /// configuration is loaded and it decides: 2xx even while a shared store
    /// is down, since each policy's on_store_error decides then; the
    /// answer's "store_up" says which), e.g. http://127.0.0.1:9090/readyz,
    /// or https://localhost:8443/readyz on a TLS listener.
    #[arg(value_name = "URL")]
    url: hyper::Uri,
    /// How long to wait for the answer: a duration (2s, 500ms), or a bare
    /// number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = timeout)]
    timeout: Duration,
    /// For an https:// URL: the CA (PEM) that signed the listener's
    /// certificate, e.g. the file the listener's clients trust; without it,
    /// the system's roots. The certificate must name the URL's host.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
}

/// `--timeout`: `2s`, `500ms`, `1m`, or seconds as a bare number.
fn timeout(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.trim().parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    weir_core::units::parse_duration(text)
        .map(Duration::from_nanos)
        .map_err(|e| format!("{e} (a duration such as 2s or 500ms)"))
}

/// Whether the URL answered 2xx (false, exit status 1, says why on
/// standard error); `Err` is a URL it cannot ask (exit status 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<bool> {
    let url = &args.url;
    let tls = match url.scheme_str() {
        Some("http") => None,
        Some("https") => Some(
            weir_server::tls::client(args.ca.as_deref(), b"http/1.1")
                .map_err(|e| anyhow::anyhow!("--ca {e}"))?,
        ),
        _ => {
            bail!("`{url}`: weir healthcheck asks http:// or https:// URLs (http://HOST:PORT/PATH)")
        }
    };
    if tls.is_none() && args.ca.is_some() {
        bail!("--ca is for https:// URLs; `{url}` is plain HTTP");
    }
    let Some(host) = url.host() else {
        bail!("`{url}` names no host");
    };
    let port = url
        .port_u16()
        .unwrap_or(if tls.is_some() { 443 } else { 80 });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the health check")?;
    let asked = runtime.block_on(async {
        tokio::time::timeout(args.timeout, ask(url, host, port, tls, Call::GET)).await
    });
    match asked {
        Err(_) => eprintln!("{url}: no answer within {:?}", args.timeout),
        Ok(Err(e)) => eprintln!("{url}: {e}"),
        Ok(Ok((status, _))) if status.is_success() => return Ok(true),
        Ok(Ok((status, _))) => eprintln!("{url}: {status}"),
    }
    Ok(false)
}

/// A request's method, admin token and body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub(crate) method: &'a str,
    pub(crate) bearer: Option<&'a str>,
    pub(crate) body: &'a str,
}

impl Call<'_> {
    const GET: Self = Self {
        method: "GET",
        bearer: None,
        body: "",
    };
}

/// One request of weir's admin API at `base` (`--url`) and `path`, with
/// the admin token of `WEIR_ADMIN_TOKEN`: weir's answer printed (JSON,
/// indented); weir's error (exit 1) when it answers one.
pub(crate) fn admin(base: &str, method: &str, path: &str, body: &str) -> anyhow::Result<()> {
    let token = std::env::var("WEIR_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .context("WEIR_ADMIN_TOKEN: set it to an admin token of weir (`[server] admin_token` or one of `[server.admin_tokens]`)")?;
    let url: hyper::Uri = format!("{}{path}", base.trim_end_matches('/'))
        .parse()
        .with_context(|| format!("--url `{base}` is not a URL such as http://127.0.0.1:8080"))?;
    let call = Call {
        method,
        bearer: Some(&token),
        body,
    };
    let (status, answer) = request(&url, call, Duration::from_secs(10))?;
    let text = String::from_utf8_lossy(&answer);
    if !status.is_success() {
        bail!("{method} {url}: {status}: {text}");
    }
    let pretty = serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    println!("{}", pretty.unwrap_or_else(|| text.into_owned()));
    Ok(())
}

/// A path segment or query value, escaped.
pub(crate) fn escape(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// One request of `url` (plain HTTP), as `call` says: the status and body,
/// within `timeout`.
fn request(
    url: &hyper::Uri,
    call: Call<'_>,
    timeout: Duration,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let (Some("http"), Some(host)) = (url.scheme_str(), url.host()) else {
        bail!("`{url}`: an http://HOST:PORT URL of weir's API listener");
    };
    let port = url.port_u16().unwrap_or(80);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match tokio::time::timeout(timeout, ask(url, host, port, None, call)).await {
            Ok(answer) => answer,
            Err(_) => bail!("{url}: no answer within {timeout:?}"),
        }
    })
}

/// One request of `url` over a connection of its own, through `tls` if
/// given.
async fn ask(
    url: &hyper::Uri,
    host: &str,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    call: Call<'_>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((bare, port)).await?;
    let mut request = hyper::Request::builder()
        .method(call.method)
        .uri(url.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            hyper::header::HOST,
            url.authority().map_or(host, |a| a.as_str()),
        );
    if let Some(token) = call.bearer {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if !call.body.is_empty() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let request = request.body(Full::new(Bytes::from(call.body.to_owned())))?;
    let status = match tls {
        None => send(tcp, request).await?,
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from(bare.to_owned())?;
            send(tls.connect(name, tcp).await?, request).await?
        }
    };
    Ok(status)
}

async fn send<S>(
    stream: S,
    request: hyper::Request<Full<Bytes>>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let status = response.status();
    // An answer's body, at most 1 MiB.
    let body = http_body_util::Limited::new(response.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?;
    Ok((status, body.to_bytes()))
}
