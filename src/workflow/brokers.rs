//! One reading of a broker connection string, shared by the definition's checks, the
//! destination policy and the client that connects. An AMQP URL is read by the URL parser
//! the AMQP client itself uses (`url`, WHATWG rules: the authority ends at `/`, `?` or
//! `#`), its host percent-decoded as the AMQP client decodes it; the engine dials the
//! host read here itself (the AMQP client's own reading would turn a bracketed IPv6
//! address into `localhost`). A Kafka
//! bootstrap list is read by the parser below, and the Kafka client is built from what it
//! returns, never from the text: there is no second reading to disagree with.
//!
//! Kafka connection strings are Clamp's `host:port[,host:port…]`, or beyond Clamp a URL
//! that carries the step's own security and credentials:
//! `kafka://user:password@host:port[,host:port…][?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-256]`
//! (user and password percent-encoded; with credentials the protocol defaults to
//! `SASL_SSL` and the mechanism to `PLAIN`).
//!
//! `{{secret:NAME}}` references may give a user, a password, a virtual host or a query
//! value, never a host: a definition is read with each reference replaced by a marker
//! (`for_definition`), and a host holding the marker is refused, so the policy can judge
//! every host when the workflow is defined. At call time the references are resolved,
//! percent-encoded, before the same reading.

use std::fmt;
use std::net::IpAddr;

/// What a secret reference reads as while a definition is checked: valid in a user, a
/// password, a path and a query, and a reserved name (RFC 2606) no real host has.
const SECRET_MARKER: &str = "clamp-secret-ref.invalid";

/// A broker's host as a connection names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Addr(IpAddr),
}

impl Host {
    /// A host as text: a name (lowercase, without a final dot) or an address.
    fn read(text: &str) -> Result<Host, String> {
        let bare = text.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Addr(ip));
        }
        let name = text.trim_end_matches('.').to_ascii_lowercase();
        let ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if !ok {
            return Err(format!("{text:?} is not a host name or an address"));
        }
        Ok(Host::Name(name))
    }

    /// As a policy rule or a TLS server name reads it (an address without brackets).
    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Host::Name(n) => n.as_str().into(),
            Host::Addr(ip) => ip.to_string().into(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Addr(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Addr(v4) => write!(f, "{v4}"),
        }
    }
}

/// A host and port to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// An AMQP step's broker, read as the AMQP client reads the URL.
#[derive(Debug, Clone)]
pub struct AmqpTarget {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// `amqps://`.
    pub tls: bool,
    /// The rest (credentials, virtual host, query), as the AMQP client reads it.
    pub uri: lapin::uri::AMQPUri,
}

impl AmqpTarget {
    /// Reads an `amqp://` or `amqps://` URL.
    pub fn read(text: &str) -> Result<AmqpTarget, String> {
        let url = url::Url::parse(text).map_err(|e| format!("not an AMQP URL ({e})"))?;
        let tls = match url.scheme() {
            "amqp" => false,
            "amqps" => true,
            _ => return Err("must be an amqp:// or amqps:// URL".into()),
        };
        if url.fragment().is_some() {
            return Err("an AMQP URL has no #fragment".into());
        }
        let host = match url.host() {
            // `amqp` is not a scheme the URL standard knows, so its host is kept as
            // written; the AMQP client decodes it, and so does this reading.
            Some(url::Host::Domain(d)) => Host::read(&decode(d)?)?,
            Some(url::Host::Ipv4(v4)) => Host::Addr(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Host::Addr(IpAddr::V6(v6)),
            None => return Err("an AMQP URL needs a host".into()),
        };
        let port = url.port().unwrap_or(if tls { 5671 } else { 5672 });
        let uri: lapin::uri::AMQPUri = text.parse()?;
        Ok(AmqpTarget {
            endpoint: Endpoint { host, port },
            tls,
            uri,
        })
    }
}

/// How a Kafka connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl KafkaProtocol {
    fn read(s: &str) -> Option<KafkaProtocol> {
        Some(match s.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => KafkaProtocol::Plaintext,
            "SSL" => KafkaProtocol::Ssl,
            "SASL_PLAINTEXT" => KafkaProtocol::SaslPlaintext,
            "SASL_SSL" => KafkaProtocol::SaslSsl,
            _ => return None,
        })
    }

    pub fn tls(self) -> bool {
        matches!(self, KafkaProtocol::Ssl | KafkaProtocol::SaslSsl)
    }

    fn sasl(self) -> bool {
        matches!(self, KafkaProtocol::SaslPlaintext | KafkaProtocol::SaslSsl)
    }
}

/// A SASL mechanism a Kafka step may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

/// A Kafka step's own credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaCredentials {
    pub mechanism: KafkaMechanism,
    pub user: String,
    pub password: String,
}

impl fmt::Debug for KafkaCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KafkaCredentials({:?}, {}, password hidden)",
            self.mechanism, self.user
        )
    }
}

/// A Kafka step's cluster, read once; the client is built from this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaTarget {
    pub brokers: Vec<Endpoint>,
    /// None: Clamp's plain list, secured as the server's own Kafka connections are (TLS
    /// only: a step never gets the server's credentials).
    pub protocol: Option<KafkaProtocol>,
    pub credentials: Option<KafkaCredentials>,
}

fn decode(s: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "a percent-escape does not decode to UTF-8".into())
}

/// `host:port` with a required port; an IPv6 address in brackets.
fn endpoint(text: &str) -> Result<Endpoint, String> {
    let text = decode(text.trim())?;
    let bad = || format!("{text:?} must be host:port");
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        (format!("[{h}]"), p)
    } else {
        let (h, p) = text.rsplit_once(':').ok_or_else(bad)?;
        if h.contains(':') {
            return Err(format!("{text:?}: an IPv6 address goes in brackets"));
        }
        (h.to_string(), p)
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    Ok(Endpoint {
        host: Host::read(&host)?,
        port,
    })
}

/// A `kafka://` URL's settings: its security protocol and SASL mechanism, if it names them.
fn kafka_settings(query: &str) -> Result<(Option<KafkaProtocol>, Option<KafkaMechanism>), String> {
    let mut protocol = None;
    let mut mechanism = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "security.protocol" => {
                protocol = Some(KafkaProtocol::read(&v).ok_or_else(|| {
                    format!(
                        "security.protocol {v:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
                    )
                })?)
            }
            "sasl.mechanism" => {
                mechanism = Some(match v.to_ascii_uppercase().as_str() {
                    "PLAIN" => KafkaMechanism::Plain,
                    "SCRAM-SHA-256" => KafkaMechanism::ScramSha256,
                    "SCRAM-SHA-512" => KafkaMechanism::ScramSha512,
                    _ => {
                        return Err(format!(
                            "sasl.mechanism {v:?} is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                        ))
                    }
                })
            }
            other => {
                return Err(format!(
                    "{other:?} is not a kafka:// setting (security.protocol, sasl.mechanism)"
                ))
            }
        }
    }
    Ok((protocol, mechanism))
}

impl KafkaTarget {
    /// Reads a bootstrap list or a `kafka://` URL.
    pub fn read(text: &str) -> Result<KafkaTarget, String> {
        let text = text.trim();
        let Some((scheme, rest)) = text.split_once("://") else {
            let brokers = text.split(',').map(endpoint).collect::<Result<_, _>>()?;
            return Ok(KafkaTarget {
                brokers,
                protocol: None,
                credentials: None,
            });
        };
        if !scheme.eq_ignore_ascii_case("kafka") {
            return Err(format!(
                "{scheme}:// is not a Kafka connection string (host:port[,…] or kafka://)"
            ));
        }
        if rest.contains('#') {
            return Err("a kafka:// URL has no #fragment".into());
        }
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err("a kafka:// URL has no path".into());
        }
        // The user information ends at the last '@', as in a URL.
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let brokers = hosts.split(',').map(endpoint).collect::<Result<_, _>>()?;
        let (protocol, mechanism) = kafka_settings(query.unwrap_or(""))?;
        let credentials = match userinfo {
            None => None,
            Some(u) => {
                let (user, password) = u.split_once(':').unwrap_or((u, ""));
                Some(KafkaCredentials {
                    mechanism: mechanism.unwrap_or(KafkaMechanism::Plain),
                    user: decode(user)?,
                    password: decode(password)?,
                })
            }
        };
        let protocol = protocol.unwrap_or(if credentials.is_some() {
            KafkaProtocol::SaslSsl
        } else {
            KafkaProtocol::Plaintext
        });
        match (protocol.sasl(), &credentials) {
            (true, None) => {
                return Err(format!(
                    "security.protocol {protocol:?} needs user:password@ in the URL"
                ))
            }
            (false, Some(_)) => {
                return Err("credentials need security.protocol SASL_SSL or SASL_PLAINTEXT".into())
            }
            _ => {}
        }
        if mechanism.is_some() && credentials.is_none() {
            return Err("sasl.mechanism needs user:password@ in the URL".into());
        }
        Ok(KafkaTarget {
            brokers,
            protocol: Some(protocol),
            credentials,
        })
    }

    /// The bootstrap list as the Kafka client takes it (`host:port` each).
    pub fn bootstrap(&self) -> Vec<String> {
        self.brokers.iter().map(|b| b.to_string()).collect()
    }
}

/// `text` as a definition is checked: each secret reference replaced by a marker. The
/// reading that follows refuses the marker in a host (`refuse_secret_host`).
pub fn for_definition(text: &str) -> Result<String, String> {
    crate::secrets::names(text)?;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("{{secret:") {
        out.push_str(&rest[..at]);
        out.push_str(SECRET_MARKER);
        let after = &rest[at..];
        let end = after.find("}}").map_or(after.len(), |e| e + 2);
        rest = &after[end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Refuses a host that a secret reference would give (read from `for_definition`'s text).
pub fn refuse_secret_host(e: &Endpoint) -> Result<(), String> {
    match &e.host {
        Host::Name(n) if n.contains(SECRET_MARKER) => {
            Err("a {{secret:…}} reference may give a user, a password or a virtual host, not a host: the policy must see every host when the workflow is defined".into())
        }
        _ => Ok(()),
    }
}

/// A secret's value as it goes into a connection string: every byte but the unreserved
/// ones percent-encoded, so a password with `@`, `:` or `/` stays one value.
pub fn encode_secret(v: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(v, SET).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp_host(text: &str) -> Result<String, String> {
        AmqpTarget::read(text).map(|t| t.endpoint.to_string())
    }

    #[test]
    fn amqp_urls_are_read_as_the_url_parser_reads_them() {
        for (text, want) in [
            ("amqp://guest:guest@127.0.0.1:5672/%2f", "127.0.0.1:5672"),
            (
                "amqp://guest:guest@127%2E0%2E0%2E1:5672/%2f",
                "127.0.0.1:5672",
            ),
            ("amqps://rabbit.internal/vhost", "rabbit.internal:5671"),
            ("amqp://u:p@[::1]:5673/", "[::1]:5673"),
            ("amqp://u:p@RABBIT:5672", "rabbit:5672"),
            ("amqp://u:p%40x@rabbit:5672/", "rabbit:5672"),
        ] {
            assert_eq!(amqp_host(text).as_deref(), Ok(want), "{text}");
        }
        // The authority ends at '#': the host is 127.0.0.1, and the URL is refused.
        assert!(amqp_host("amqp://guest:guest@127.0.0.1:5672#@example.com/").is_err());
        assert!(amqp_host("http://rabbit/").is_err());
        assert!(amqp_host("amqp:///vhost").is_err());
        let t = AmqpTarget::read("amqp://us%3Aer:p%40ss@h:1/v%2Fh").unwrap();
        assert_eq!(t.uri.authority.userinfo.username, "us:er");
        assert_eq!(t.uri.authority.userinfo.password, "p@ss");
        assert_eq!(t.uri.vhost, "v/h");
    }

    #[test]
    fn kafka_lists_and_urls_have_one_reading() {
        let hosts = |text: &str| {
            KafkaTarget::read(text).map(|t| {
                t.brokers
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
        };
        assert_eq!(hosts("k1:9092, K2:9093").as_deref(), Ok("k1:9092,k2:9093"));
        assert_eq!(hosts("[::1]:9092").as_deref(), Ok("[::1]:9092"));
        assert_eq!(
            hosts("127%2E0%2E0%2E1:9092").as_deref(),
            Ok("127.0.0.1:9092")
        );
        // Read as two brokers, each judged: not one URL with an odd host.
        assert!(hosts("x://example.com:1,127.0.0.1:9092").is_err());
        assert_eq!(
            hosts("kafka://example.com:1,127.0.0.1:9092").as_deref(),
            Ok("example.com:1,127.0.0.1:9092")
        );
        for bad in [
            "k1",
            "k1:0",
            "k1:x",
            "::1:9092",
            "a@b:9092",
            "kafka://h:1#x",
            "kafka://h:1/path",
            "kafka://h:1?acks=all",
            "kafka://h:1?security.protocol=SASL_SSL",
            "kafka://u:p@h:1?security.protocol=SSL",
            "kafka://h:1?sasl.mechanism=PLAIN",
            "kafka://u:p@h:1?sasl.mechanism=GSSAPI",
        ] {
            assert!(KafkaTarget::read(bad).is_err(), "{bad}");
        }
        let t = KafkaTarget::read("kafka://us%40r:p%3Aw%2Fd@k1:9092?sasl.mechanism=SCRAM-SHA-512")
            .unwrap();
        assert_eq!(t.protocol, Some(KafkaProtocol::SaslSsl));
        let c = t.credentials.unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("us@r", "p:w/d"));
        assert_eq!(c.mechanism, KafkaMechanism::ScramSha512);
        assert!(!format!("{c:?}").contains("p:w/d"));
        let plain = KafkaTarget::read("k1:9092").unwrap();
        assert_eq!((plain.protocol, plain.credentials), (None, None));
    }

    #[test]
    fn secrets_may_not_give_a_host() {
        let text = for_definition("kafka://{{secret:user}}:{{secret:pw}}@k1:9092").unwrap();
        let t = KafkaTarget::read(&text).unwrap();
        assert!(t.brokers.iter().all(|b| refuse_secret_host(b).is_ok()));
        let text = for_definition("kafka://u:p@{{secret:host}}:9092").unwrap();
        let t = KafkaTarget::read(&text).unwrap();
        assert!(refuse_secret_host(&t.brokers[0]).is_err());
        let text = for_definition("amqp://u:{{secret:pw}}@{{secret:host}}/").unwrap();
        let t = AmqpTarget::read(&text).unwrap();
        assert!(refuse_secret_host(&t.endpoint).is_err());
        assert!(for_definition("amqp://u:{{secret:/etc/x}}@h/").is_err());
        assert_eq!(encode_secret("p@ss:w/rd ~ok"), "p%40ss%3Aw%2Frd%20~ok");
    }
}
