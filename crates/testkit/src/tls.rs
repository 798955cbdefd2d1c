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
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
