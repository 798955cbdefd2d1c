//! TLS on weir's listeners (rustls, TLS 1.2 and 1.3): a certificate and key
//! re-read when their files change, and, with a client CA, client
//! certificates required and verified (mTLS).
//!
//! A changed pair is picked up by the next handshake that comes a second or
//! more after the last look at the files (a cert-manager renewal, a Secret's
//! symlink swap): connections already open keep theirs. A pair that does
//! not load is logged, and the old one goes on serving.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use crate::config::{ConfigError, ConfigErrors, ServerConfig};
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

pub use crate::config::TlsFiles;

/// Loads every listener's certificate and key once, as the configuration
/// is read: a pair that does not load is an error naming its table and
/// line, before anything is served.
pub fn check(server: &ServerConfig) -> Result<(), ConfigErrors> {
    let tables = [
        &server.tls,
        &server.internal_tls,
        &server.grpc_tls,
        &server.resp_tls,
    ];
    let errors: Vec<ConfigError> = (tables.into_iter().flatten())
        .filter_map(|files| {
            let alpn = match files.table {
                "grpc_tls" => Alpn::Grpc,
                _ => Alpn::Http,
            };
            Tls::new(files, alpn).err().map(|message| ConfigError {
                line: files.line,
                place: format!("[server.{}]", files.table),
                message,
            })
        })
        .collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(ConfigErrors(errors)),
    }
}

/// What ALPN a listener offers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Alpn {
    /// HTTP/2 and HTTP/1.1 (the public and internal listeners).
    Http,
    /// HTTP/2 only (gRPC).
    Grpc,
}

/// A listener's TLS: what accepts a handshake.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // `ring`: no C toolchain beyond a compiler (see weir-redis's `access`).
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Loads `files` (an error names the file and what is wrong with it).
    pub(crate) fn new(files: &TlsFiles, alpn: Alpn) -> Result<Self, String> {
        let provider = provider();
        let pair = Pair::new(files.clone(), provider.clone())?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
            .map_err(|e| e.to_string())?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(path)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(Arc::new(pair));
        config.alpn_protocols = match alpn {
            Alpn::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Alpn::Grpc => vec![b"h2".to_vec()],
        };
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// The certificates of a PEM file.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let read = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&read)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The certificate and key, as last loaded, and when the files were seen.
struct Pair {
    files: TlsFiles,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The files' modification times when `current` was loaded (or last
    /// failed to load).
    stamps: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
    /// When the files were last looked at, in ms since `origin`.
    looked: AtomicU64,
    origin: Instant,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn stamp(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Pair {
    fn new(files: TlsFiles, provider: Arc<rustls::crypto::CryptoProvider>) -> Result<Self, String> {
        let stamps = (stamp(&files.cert), stamp(&files.key));
        let key = load(&files, &provider)?;
        Ok(Self {
            files,
            provider,
            current: ArcSwap::from_pointee(key),
            stamps: Mutex::new(stamps),
            looked: AtomicU64::new(0),
            origin: Instant::now(),
        })
    }

    /// Reloads the pair if its files changed since last seen (looked at
    /// once a second at most).
    fn refresh(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let looked = self.looked.load(Ordering::Relaxed);
        if now.saturating_sub(looked) < 1_000
            || self
                .looked
                .compare_exchange(looked, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let seen = (stamp(&self.files.cert), stamp(&self.files.key));
        let mut stamps = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
        if *stamps == seen {
            return;
        }
        *stamps = seen;
        match load(&self.files, &self.provider) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(error) => tracing::error!(
                %error,
                "TLS certificate not reloaded: the previous one goes on serving"
            ),
        }
    }
}

impl ResolvesServerCert for Pair {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        Some(self.current.load_full())
    }
}

/// A certificate chain and its key, checked to belong together.
fn load(
    files: &TlsFiles,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, String> {
    let certs = certificates(&files.cert)?;
    let key = std::fs::read(&files.key)
        .map_err(|e| format!("cannot read {}: {e}", files.key.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| format!("{}: not a PEM private key: {e}", files.key.display()))?;
    let key = CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        format!(
            "{} and {} do not make a pair: {e}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    Ok(key)
}

/// A TLS client offering `alpn`, verifying servers against the roots in
/// `ca` (a PEM file) or, without one, the system's: the gateway's `https://`
/// upstreams and `weir healthcheck`.
pub fn client(ca: Option<&Path>, alpn: &[u8]) -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no PEM certificate in it", path.display()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}
