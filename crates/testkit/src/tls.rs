//! Certificates a test makes for itself: a CA, a server certificate for
//! `localhost` and 127.0.0.1, and a client certificate, as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and the certificates it signed, written to a directory of their own.
#[derive(Debug)]
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Makes a CA, a server and a client certificate (`name` tells the
    /// directory apart).
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("weir-certs-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Names of their own: a leaf named as its issuer reads as self-signed.
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, "weir test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        for (leaf, names) in [
            (
                "server",
                vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ),
            ("client", vec!["weir-client".to_owned()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, leaf);
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.join(format!("{leaf}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{leaf}-key.pem")), key.serialize_pem()).unwrap();
        }
        Self { dir }
    }

    /// A file of the set: `ca.pem`, `server.pem`, `server-key.pem`,
    /// `client.pem`, `client-key.pem`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A file's contents.
    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).unwrap()
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A TLS client that trusts this CA, offers `alpn`, and shows the client
    /// certificate when `client` is true.
    pub fn connector(&self, client: bool, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.read("ca.pem")) {
            roots.add(cert.unwrap()).unwrap();
        }
        #[allow(deprecated)]
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            true => {
                let chain = CertificateDer::pem_slice_iter(&self.read("client.pem"))
                    .map(Result::unwrap)
                    .collect();
                let key = PrivateKeyDer::from_pem_slice(&self.read("client-key.pem")).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            false => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // Every connection a full handshake: a resumed session shows the
        // certificate of the one it resumes.
        config.resumption = rustls::client::Resumption::disabled();
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    }

    /// One HTTP/1.1 exchange over TLS with `addr` (as `localhost`): the
    /// whole answer, or what went wrong.
    pub async fn request(
        &self,
        addr: std::net::SocketAddr,
        client: bool,
        raw: &str,
    ) -> Result<String, std::io::Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = self
            .connector(client, &[b"http/1.1"])
            .connect(name, tcp)
            .await?;
        tls.write_all(raw.as_bytes()).await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}

impl Certs {
    /// The DER of this set's server certificate (`server.pem`'s leaf).
    pub fn leaf(&self) -> Vec<u8> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let leaf: CertificateDer<'static> =
            CertificateDer::pem_slice_iter(&self.read("server.pem"))
                .next()
                .unwrap()
                .unwrap();
        leaf.to_vec()
    }

    /// The leaf certificate a TLS server at `addr` shows in a full
    /// handshake, trusting this set's CA.
    pub async fn shown(&self, addr: std::net::SocketAddr) -> Result<Vec<u8>, std::io::Error> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = self
            .connector(false, &[b"http/1.1"])
            .connect(name, tcp)
            .await?;
        let shown = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
        Ok(shown.map(|c| c.to_vec()).unwrap_or_default())
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new P-256 key pair as PEM: the private key (PKCS#8) and the public
/// key (SubjectPublicKeyInfo), for signing and verifying tokens in tests.
pub fn ec_key_pair() -> (String, String) {
    let key = KeyPair::generate().unwrap();
    (key.serialize_pem(), key.public_key_pem())
}
