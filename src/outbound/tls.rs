//! How the engine's calls leave the process over TLS: the client configurations of
//! HTTPS steps, of Kafka (steps and the response consumer) and of `amqps://` (steps and
//! the response consumer), built once at startup so that a bad file stops it there.
//! Each is shared by every runtime, and with it each client's TLS session cache, so a
//! reconnect resumes a session instead of a full handshake.

use std::sync::Arc;

use rskafka::client::{Credentials, SaslConfig};

use crate::config::{Config, KafkaSasl, SaslMechanism};
use crate::tls::{self, TlsError, Verify};
use crate::workflow::brokers::{KafkaMechanism, KafkaProtocol, KafkaTarget};

/// The engine's TLS settings for each kind of downstream.
pub struct Outbound {
    /// HTTPS steps: the system's roots and `--step-ca-file`, host names checked,
    /// `--step-client-cert` presented when a server asks. HTTP/1.1 only.
    pub https: Arc<rustls::ClientConfig>,
    /// The server's own Kafka connections (the response consumer): TLS when the
    /// security protocol says so, and SASL with the server's credentials.
    pub kafka: KafkaTransport,
    /// Kafka steps: the TLS a step's connection uses when it is secured (the system's
    /// roots and `--kafka-ca-file`), and whether a plain `host:port` list is (as the
    /// server's own connections are). A step's credentials are its own, never the
    /// server's (`workflow::brokers`).
    pub kafka_steps: KafkaSteps,
    /// `amqps://`: `--amqp-ca-file` beside the AMQP client's own roots.
    pub amqp: lapin::tcp::OwnedTLSConfig,
}

/// How Kafka steps' connections are secured.
#[derive(Clone)]
pub struct KafkaSteps {
    pub tls: Arc<rustls::ClientConfig>,
    /// A plain `host:port` list is TLS (the server's protocol is `SSL` or `SASL_SSL`).
    pub list_tls: bool,
}

/// How a Kafka connection is secured.
#[derive(Clone, Default)]
pub struct KafkaTransport {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub sasl: Option<SaslConfig>,
}

impl Outbound {
    /// Reads and checks every file `config` names.
    pub fn load(config: &Config) -> Result<Outbound, TlsError> {
        let identity = match &config.tls.step_client {
            Some((cert, key)) => Some(tls::Identity::load(cert, key)?),
            None => None,
        };
        let https = tls::client(
            Verify::Full(tls::roots(true, config.tls.step_ca.as_deref())?),
            identity.as_ref(),
            // hyper-rustls offers the ALPN of the protocols it enables (HTTP/1.1).
            &[],
        )?;
        let k = &config.brokers.kafka_security;
        let kafka_tls = Arc::new(tls::client(
            Verify::Full(tls::roots(true, k.ca_file.as_deref())?),
            None,
            &[],
        )?);
        let kafka = KafkaTransport {
            tls: k.tls.then(|| kafka_tls.clone()),
            sasl: k.sasl.as_ref().map(sasl),
        };
        let kafka_steps = KafkaSteps {
            tls: kafka_tls,
            list_tls: k.tls,
        };
        let amqp = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: match &config.brokers.amqp_ca_file {
                Some(path) => {
                    // Read now, checked as PEM certificates, so a bad file fails here.
                    tls::certificates(path)?;
                    Some(
                        std::fs::read_to_string(path).map_err(|source| TlsError::Read {
                            path: path.clone(),
                            source,
                        })?,
                    )
                }
                None => None,
            },
        };
        Ok(Outbound {
            https: Arc::new(https),
            kafka,
            kafka_steps,
            amqp,
        })
    }
}

fn sasl(s: &KafkaSasl) -> SaslConfig {
    let c = Credentials::new(s.username.clone(), s.password.clone());
    match s.mechanism {
        SaslMechanism::Plain => SaslConfig::Plain(c),
        SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(c),
        SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(c),
    }
}

impl KafkaSteps {
    /// How a step's connection to `target` is secured: its own protocol and credentials
    /// (a plain list: TLS as the server's own connections, and no credentials at all).
    pub fn transport(&self, target: &KafkaTarget) -> KafkaTransport {
        let tls = target.protocol.map_or(self.list_tls, KafkaProtocol::tls);
        KafkaTransport {
            tls: tls.then(|| self.tls.clone()),
            sasl: target.credentials.as_ref().map(|c| {
                let creds = Credentials::new(c.user.clone(), c.password.clone());
                match c.mechanism {
                    KafkaMechanism::Plain => SaslConfig::Plain(creds),
                    KafkaMechanism::ScramSha256 => SaslConfig::ScramSha256(creds),
                    KafkaMechanism::ScramSha512 => SaslConfig::ScramSha512(creds),
                }
            }),
        }
    }
}
