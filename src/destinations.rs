//! Where steps may call (beyond Clamp): a destination policy for HTTP, AMQP and Kafka
//! steps. Link-local addresses and the cloud metadata services are always refused (a
//! step that reads 169.254.169.254 would hand the server's cloud credentials to whoever
//! can define a workflow); `--deny-destinations` refuses more, and `--allow-destinations`,
//! when given, refuses everything it does not name. Rules are networks (`10.0.0.0/8`, an
//! address), host names (`payments.internal`) or domains (`.internal`: every name under
//! it). A workflow is checked when it is defined (a literal address, a name), and an HTTP
//! call again after name resolution, whose denied addresses are dropped (a name that
//! resolves only to denied ones is refused), so DNS cannot slip past the policy.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// Refused always: link-local networks and the metadata services' addresses and names.
pub const ALWAYS_DENIED: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254",
    "100.100.100.200",
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    Net(IpNet),
    /// A host name, lowercase.
    Name(String),
    /// Every name under a domain, lowercase, with its leading dot.
    Domain(String),
}

impl Rule {
    fn parse(s: &str) -> Result<Rule, String> {
        let s = s.trim().to_ascii_lowercase();
        if let Ok(n) = s.parse::<IpNet>() {
            return Ok(Rule::Net(n.trunc()));
        }
        if let Ok(ip) = s.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Ok(Rule::Net(IpNet::from(ip)));
        }
        let name = s.strip_prefix('*').unwrap_or(&s);
        let ok = |n: &str| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        };
        match name.strip_prefix('.') {
            Some(d) if ok(d) => Ok(Rule::Domain(format!(".{d}"))),
            None if ok(name) => Ok(Rule::Name(name.to_string())),
            _ => Err(format!(
                "{s:?} is not a network (10.0.0.0/8), an address, a host name or a domain (.internal)"
            )),
        }
    }

    fn names(&self, host: &str) -> bool {
        match self {
            Rule::Name(n) => n == host,
            Rule::Domain(d) => host.ends_with(d.as_str()) || host == &d[1..],
            Rule::Net(_) => false,
        }
    }

    fn holds(&self, ip: IpAddr) -> bool {
        matches!(self, Rule::Net(n) if n.contains(&ip))
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Net(n) => write!(f, "{n}"),
            Rule::Name(n) | Rule::Domain(n) => write!(f, "{n}"),
        }
    }
}

/// Why a destination was refused: the message names the policy and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused by the destination policy: {0}")]
pub struct Refused(pub String);

/// The policy in force.
#[derive(Debug, Clone)]
pub struct Destinations {
    allow: Vec<Rule>,
    /// `ALWAYS_DENIED` first, then `--deny-destinations`.
    deny: Vec<Rule>,
    /// How many of `deny` are `ALWAYS_DENIED`, for the messages.
    always: usize,
}

impl Default for Destinations {
    fn default() -> Destinations {
        Destinations::new::<&str>(&[], &[]).expect("the built-in rules parse")
    }
}

/// An address as the policy sees it: an IPv4 address mapped into IPv6 is the IPv4 one.
fn plain(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Destinations {
    pub fn new<S: AsRef<str>>(allow: &[S], deny: &[S]) -> Result<Destinations, String> {
        let parse = |list: &[S]| -> Result<Vec<Rule>, String> {
            list.iter()
                .map(AsRef::as_ref)
                .filter(|s| !s.trim().is_empty())
                .map(Rule::parse)
                .collect()
        };
        let mut d: Vec<Rule> = ALWAYS_DENIED
            .iter()
            .map(|s| Rule::parse(s).expect("built in"))
            .collect();
        let always = d.len();
        d.extend(parse(deny)?);
        Ok(Destinations {
            allow: parse(allow)?,
            deny: d,
            always,
        })
    }

    fn why_denied(&self, i: usize) -> &'static str {
        if i < self.always {
            "link-local and cloud metadata destinations are always denied"
        } else {
            "--deny-destinations"
        }
    }

    /// A host as a URL names it (an address, bracketed or not, or a name): refused when
    /// denied by name or address, or outside an allow-list that can tell without
    /// resolving it (an address, or a name when the list names no network).
    pub fn check_host(&self, host: &str) -> Result<(), Refused> {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        let host = host.trim_end_matches('.');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.check_addr(None, ip);
        }
        if let Some(i) = self.deny.iter().position(|r| r.names(host)) {
            return Err(Refused(format!(
                "{host} is denied ({}: {})",
                self.deny[i],
                self.why_denied(i)
            )));
        }
        let nets_allowed = self.allow.iter().any(|r| matches!(r, Rule::Net(_)));
        if !self.allow.is_empty() && !nets_allowed && !self.allow.iter().any(|r| r.names(host)) {
            return Err(Refused(format!("{host} is not in --allow-destinations")));
        }
        Ok(())
    }

    /// An address a call would connect to, for the host `name` (None: a literal address).
    pub fn check_addr(&self, name: Option<&str>, ip: IpAddr) -> Result<(), Refused> {
        let ip = plain(ip);
        let shown = match name {
            Some(n) => format!("{n} ({ip})"),
            None => ip.to_string(),
        };
        if let Some(i) = self.deny.iter().position(|r| r.holds(ip)) {
            return Err(Refused(format!(
                "{shown} is in {} ({})",
                self.deny[i],
                self.why_denied(i)
            )));
        }
        if self.allow.is_empty()
            || self.allow.iter().any(|r| r.holds(ip))
            || name.is_some_and(|n| self.allow.iter().any(|r| r.names(n)))
        {
            return Ok(());
        }
        Err(Refused(format!("{shown} is not in --allow-destinations")))
    }

    /// The addresses a name resolved to that the policy lets a call use; refused when
    /// none is left.
    pub fn filter(&self, name: &str, addrs: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, Refused> {
        let mut first = None;
        let kept: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.check_addr(Some(name), a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    first.get_or_insert(e);
                    false
                }
            })
            .collect();
        match (kept.is_empty(), first) {
            (true, Some(e)) => Err(e),
            _ => Ok(kept),
        }
    }

    /// The hosts of a broker connection string: an AMQP URL's, or Kafka's
    /// `host:port[,host:port…]`.
    pub fn check_brokers(&self, connection: &str) -> Result<(), Refused> {
        if let Some((_, rest)) = connection.split_once("://") {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            let hostport = authority.rsplit('@').next().unwrap_or("");
            return self.check_host(host_of(hostport));
        }
        for b in connection.split(',') {
            self.check_host(host_of(b.trim()))?;
        }
        Ok(())
    }
}

impl Destinations {
    /// A broker connection about to be opened: every host of its connection string (an
    /// AMQP URL's, Kafka's bootstrap list), by name and by every address it resolves to
    /// now. The broker's client resolves the name again when it connects, so one denied
    /// address among a name's refuses it (the client might pick that one). A name that
    /// does not resolve is left to the client's own error.
    pub async fn check_connection(&self, connection: &str) -> Result<(), Refused> {
        let (hosts, default_port): (Vec<&str>, u16) = match connection.split_once("://") {
            Some((scheme, rest)) => {
                let authority = rest.split(['/', '?']).next().unwrap_or("");
                let port = if scheme == "amqps" { 5671 } else { 5672 };
                (vec![authority.rsplit('@').next().unwrap_or("")], port)
            }
            None => (connection.split(',').map(str::trim).collect(), 9092),
        };
        for hostport in hosts {
            let host = host_of(hostport);
            self.check_host(host)?;
            let bare = host.trim_matches(['[', ']']);
            if bare.parse::<IpAddr>().is_ok() {
                continue;
            }
            let port = hostport
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(default_port);
            if let Ok(addrs) = tokio::net::lookup_host((bare, port)).await {
                for a in addrs {
                    self.check_addr(Some(bare), a.ip())?;
                }
            }
        }
        Ok(())
    }
}

/// The host of `host:port` (an IPv6 address in brackets keeps them).
fn host_of(hostport: &str) -> &str {
    if hostport.starts_with('[') {
        return hostport
            .split(']')
            .next()
            .map_or(hostport, |h| &hostport[..h.len() + 1]);
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => hostport,
    }
}

/// The name resolver of HTTP steps: the system's (getaddrinfo, as hyper's), then the
/// policy's filter, so a name is checked by the addresses the call will use.
#[derive(Clone)]
pub struct Resolver {
    gai: hyper_util::client::legacy::connect::dns::GaiResolver,
    policy: Arc<Destinations>,
}

impl Resolver {
    pub fn new(policy: Arc<Destinations>) -> Resolver {
        Resolver {
            gai: hyper_util::client::legacy::connect::dns::GaiResolver::new(),
            policy,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let mut gai = self.gai.clone();
        let policy = self.policy.clone();
        Box::pin(async move {
            policy.check_host(name.as_str())?;
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = gai.call(name).await?.collect();
            Ok(policy.filter(&host, addrs)?.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_and_link_local_are_always_refused() {
        let d = Destinations::default();
        for host in [
            "169.254.169.254",
            "[fe80::1]",
            "[::ffff:169.254.169.254]",
            "metadata.google.internal",
            "METADATA.google.internal.",
            "100.100.100.200",
        ] {
            let e = d.check_host(host).unwrap_err();
            assert!(e.to_string().contains("destination policy"), "{host}: {e}");
        }
        for host in ["127.0.0.1", "10.0.0.1", "payments.example.com", "[::1]"] {
            assert_eq!(d.check_host(host), Ok(()), "{host}");
        }
    }

    #[test]
    fn deny_and_allow_lists_narrow_it() {
        let d = Destinations::new(
            &["10.0.0.0/8", ".internal"],
            &["10.9.0.0/16", "admin.internal"],
        )
        .unwrap();
        assert!(d.check_host("10.1.2.3").is_ok());
        assert!(d
            .check_host("10.9.0.1")
            .unwrap_err()
            .0
            .contains("--deny-destinations"));
        assert!(d
            .check_host("8.8.8.8")
            .unwrap_err()
            .0
            .contains("not in --allow"));
        assert!(d.check_host("admin.internal").is_err());
        assert!(d.check_host("pay.internal").is_ok());
        // A name the allow-list's networks may hold waits for its addresses.
        assert!(d.check_host("example.com").is_ok());
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert!(d
            .filter("example.com", vec![a("93.184.216.34:80")])
            .is_err());
        assert_eq!(
            d.filter("x.example", vec![a("10.1.1.1:80"), a("169.254.169.254:80")]),
            Ok(vec![a("10.1.1.1:80")])
        );
        let names_only = Destinations::new(&["pay.example"], &[]).unwrap();
        assert!(names_only.check_host("pay.example").is_ok());
        assert!(names_only.check_host("other.example").is_err());
        assert!(names_only
            .check_addr(Some("pay.example"), "1.2.3.4".parse().unwrap())
            .is_ok());
        assert!(Destinations::new(&["not a rule"], &[]).is_err());
    }

    #[test]
    fn broker_connection_strings_are_read_for_their_hosts() {
        let d = Destinations::default();
        assert!(d
            .check_brokers("amqp://u:p@169.254.169.254:5672/%2f")
            .is_err());
        assert!(d.check_brokers("amqps://rabbit:5671/vhost").is_ok());
        assert!(d.check_brokers("kafka-1:9092,169.254.1.1:9092").is_err());
        assert!(d.check_brokers("kafka-1:9092,[::1]:9092").is_ok());
    }
}
