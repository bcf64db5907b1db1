//! TLS for every connection clamp makes or accepts, on one stack: rustls with the ring
//! provider. What lives here is configuration only (no sockets): certificates, keys and
//! root stores read from PEM files, the verifiers libpq's weaker `sslmode`s call for,
//! client and server configurations, and a reason for a failed handshake that says
//! which check failed. The users (Postgres, HTTPS steps, Kafka, the listener) build
//! their configurations here once, at startup, so a bad file stops the server there.

mod verify;

use std::error::Error as StdError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore, ServerConfig};

pub use verify::{ChainOnly, NoVerification};

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} holds no PEM private key", path.display())]
    NoKey { path: PathBuf },
    #[error("{what}: {source}")]
    Config {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("no trusted root certificate: the system store is empty and no CA file was given")]
    NoRoots,
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;

/// The crypto provider every configuration is built with: ring, which builds without
/// cmake and which the AMQP client already uses.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Makes ring the process-wide default too, for the libraries that build their own
/// configurations with `ClientConfig::builder()` (the AMQP and Kafka clients).
pub fn install_default_provider() {
    // An error only says a default is installed already (a second server in a test).
    let _ = CryptoProvider::install_default((*provider()).clone());
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate of a PEM file, in order (a chain: the leaf first).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(std::result::Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoKey {
        path: path.to_path_buf(),
    })
}

/// A certificate chain and its private key: a server's, or a client's for mutual TLS.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({} certificates, key hidden)", self.chain.len())
    }
}

impl Identity {
    /// Reads a PEM chain and its key, and checks that they belong together.
    pub fn load(cert: &Path, key: &Path) -> Result<Identity> {
        let identity = Identity {
            chain: certificates(cert)?,
            key: private_key(key)?,
        };
        rustls::sign::CertifiedKey::from_der(
            identity.chain.clone(),
            identity.key.clone_key(),
            &provider(),
        )
        .map_err(|source| TlsError::Config {
            what: "the certificate and the key do not belong together",
            source,
        })?;
        Ok(identity)
    }
}

/// The system's trusted roots (read once per process; the platform's store, or the
/// files `SSL_CERT_FILE` / `SSL_CERT_DIR` name). Unreadable entries are skipped. A
/// system without any (a container image without a CA bundle) gets Mozilla's roots as
/// compiled in, which is what such a system would have installed.
pub fn system_roots() -> RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if roots.is_empty() {
                tracing::warn!(
                    "the system has no trusted root certificates (install ca-certificates, or \
                     set SSL_CERT_FILE); using Mozilla's roots compiled into clamp"
                );
                roots.add_parsable_certificates(
                    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
                );
            }
            roots
        })
        .clone()
}

/// A root store: the system's roots when `system`, plus every certificate of `ca_file`.
pub fn roots(system: bool, ca_file: Option<&Path>) -> Result<RootCertStore> {
    let mut roots = if system {
        system_roots()
    } else {
        RootCertStore::empty()
    };
    if let Some(path) = ca_file {
        for cert in certificates(path)? {
            roots.add(cert).map_err(|source| TlsError::Config {
                what: "a CA certificate is not usable as a trust anchor",
                source,
            })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    Ok(roots)
}

/// How a client checks the server it reaches.
pub enum Verify {
    /// The chain up to one of these roots, and the host name (HTTPS; libpq's `verify-full`).
    Full(RootCertStore),
    /// The chain only, any host name (libpq's `verify-ca`).
    ChainOnly(RootCertStore),
    /// Nothing but the handshake's own signatures (libpq's `prefer` and `require`
    /// without a root certificate: encryption against passive listeners only).
    Nothing,
}

/// A client configuration: `verify` decides what is checked, `identity` is presented
/// when the server asks for a client certificate, `alpn` is offered in order.
pub fn client(verify: Verify, identity: Option<&Identity>, alpn: &[&[u8]]) -> Result<ClientConfig> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Full(roots) => full_verifier(roots, &provider)?,
        Verify::ChainOnly(roots) => Arc::new(ChainOnly::new(full_verifier(roots, &provider)?)),
        Verify::Nothing => Arc::new(NoVerification::new(provider.clone())),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config {
            what: "TLS versions",
            source,
        })?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|source| TlsError::Config {
                what: "client certificate",
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn full_verifier(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config {
            what: "certificate verifier",
            source: rustls::Error::General(e.to_string()),
        })
}

/// A server configuration presenting `identity`, offering `alpn`.
pub fn server(identity: Identity, alpn: &[&[u8]]) -> Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config {
            what: "TLS versions",
            source,
        })?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.key)
        .map_err(|source| TlsError::Config {
            what: "server certificate",
            source,
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The TLS error somewhere in `e`'s causes, if any. rustls reports through `io::Error`,
/// sometimes one inside another, whose `source` skips the error it wraps: those are
/// looked into as well as followed.
pub fn find<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(c) = next {
        if let Some(t) = c.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        if let Some(inner) = c.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            let inner: &(dyn StdError + 'static) = inner;
            if let Some(t) = find(inner) {
                return Some(t);
            }
        }
        next = c.source();
    }
    None
}

/// What a failed handshake means, in words that say which check failed.
pub fn reason(e: &rustls::Error) -> String {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(c) => format!("the server's certificate {}", certificate(c)),
        E::NoCertificatesPresented => "the server presented no certificate".into(),
        E::AlertReceived(AlertDescription::CertificateRequired) => {
            "the server requires a client certificate and none is configured".into()
        }
        E::AlertReceived(
            a @ (AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::UnsupportedCertificate),
        ) => format!("the server refused our client certificate ({a:?})"),
        E::AlertReceived(AlertDescription::HandshakeFailure) => {
            "the server ended the handshake (no common protocol or cipher, or it wants a client certificate)"
                .into()
        }
        E::PeerIncompatible(p) => format!("no TLS version or cipher in common ({p:?})"),
        other => format!("TLS handshake failed: {other}"),
    }
}

fn certificate(c: &CertificateError) -> String {
    use CertificateError as C;
    match c {
        C::UnknownIssuer => "is not signed by a trusted CA (unknown issuer)".into(),
        C::NotValidForName => "is not valid for this host name".into(),
        C::NotValidForNameContext {
            expected,
            presented,
        } => format!(
            "is not valid for host name {} (it names {})",
            server_name(expected),
            if presented.is_empty() {
                "no host".to_string()
            } else {
                presented
                    .iter()
                    .map(|p| unquote(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        C::Expired | C::ExpiredContext { .. } => "has expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => "is not valid yet".into(),
        C::Revoked => "is revoked".into(),
        C::BadSignature => "has a bad signature".into(),
        C::BadEncoding => "is malformed".into(),
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
            "is not for TLS server authentication".into()
        }
        other => format!("was refused ({other:?})"),
    }
}

/// rustls names a certificate's names as `DnsName("a.example")`; the name alone reads better.
fn unquote(presented: &str) -> &str {
    presented
        .split_once("(\"")
        .and_then(|(_, rest)| rest.strip_suffix("\")"))
        .unwrap_or(presented)
}

fn server_name(n: &rustls::pki_types::ServerName<'_>) -> String {
    match n {
        rustls::pki_types::ServerName::DnsName(d) => d.as_ref().to_string(),
        rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

/// `e` as one line, with the TLS reason in place of the raw TLS error where there is one.
pub fn describe(e: &(dyn StdError + 'static)) -> Option<String> {
    find(e).map(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_check() {
        let e = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(reason(&e).contains("unknown issuer"));
        let io = io::Error::new(io::ErrorKind::InvalidData, e);
        assert!(describe(&io).unwrap().contains("trusted CA"));
        // As hyper-rustls reports it: one io::Error inside another.
        let twice = io::Error::other(io);
        assert!(describe(&twice).unwrap().contains("trusted CA"));
        let e = rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("a.example")
                .unwrap()
                .to_owned(),
            presented: vec!["DnsName(\"b.example\")".into()],
        });
        assert!(
            reason(&e).contains("host name a.example (it names b.example)"),
            "{}",
            reason(&e)
        );
        let e = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        assert!(reason(&e).contains("requires a client certificate"));
        assert!(describe(&io::Error::other("plain")).is_none());
    }

    #[test]
    fn a_missing_file_says_which() {
        let e = certificates(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }
}
