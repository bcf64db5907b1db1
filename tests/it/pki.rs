//! Certificates the TLS tests make for themselves: a CA, and server and client
//! certificates it signs, written as PEM files into a directory of the test's own (removed
//! with the CA). Nothing here reaches outside the machine.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate file and its key file.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority of the test's own.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub dir: PathBuf,
    name: String,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let dir = std::env::temp_dir().join(format!(
            "clamp-it-pki-{}-{name}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("clamp test CA {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), issuer.pem()).unwrap();
        Ca {
            issuer,
            dir,
            name: name.to_string(),
        }
    }

    /// The CA's certificate (PEM), what a client or server trusts it by.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    fn issue(&self, file: &str, mut params: CertificateParams) -> Pair {
        let key = KeyPair::generate().unwrap();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        set_mode(&pair.key, 0o600);
        pair
    }

    /// A server certificate for `names` (host names or IP addresses).
    pub fn server(&self, file: &str, names: &[&str]) -> Pair {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(file, params)
    }

    /// A client certificate whose common name is `cn` (Postgres's `cert` authentication
    /// takes the user from it).
    pub fn client(&self, file: &str, cn: &str) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(file, params)
    }

    /// A TLS server presenting `pair`; with `clients`, a client certificate of that CA is
    /// required.
    pub fn server_config(pair: &Pair, clients: Option<&Ca>) -> Arc<rustls::ServerConfig> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(read_certs(&ca.ca_file()).remove(0)).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(read_certs(&pair.cert), read_key(&pair.key))
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A TLS client that trusts this CA alone.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(read_certs(&self.ca_file()).remove(0)).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A TLS client that trusts this CA alone and offers no ALPN (Kafka's clients do not).
    pub fn client_config_plain(&self) -> Arc<rustls::ClientConfig> {
        let mut c = (*self.client_config()).clone();
        c.alpn_protocols.clear();
        Arc::new(c)
    }

    /// Makes the files readable by the user Postgres runs as (the test may be root, and a
    /// server key must belong to the server's user with mode 0600).
    pub fn give_to_postgres(&self) {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let out = std::process::Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .unwrap();
        let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        std::os::unix::fs::chown(&self.dir, Some(uid), None).unwrap();
        for e in std::fs::read_dir(&self.dir).unwrap() {
            std::os::unix::fs::chown(e.unwrap().path(), Some(uid), None).unwrap();
        }
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn read_certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

pub fn read_key(path: &Path) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_file(path).unwrap()
}
