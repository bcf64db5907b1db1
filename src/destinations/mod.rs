//! Where steps may call (beyond Clamp): a destination policy for HTTP, AMQP and Kafka
//! steps. Link-local addresses and the cloud metadata services are always refused (a
//! step that reads 169.254.169.254 would hand the server's cloud credentials to whoever
//! can define a workflow); `--deny-destinations` refuses more, and `--allow-destinations`,
//! when given, refuses everything it does not name. Rules are networks (`10.0.0.0/8`, an
//! address), host names (`payments.internal`) or domains (`.internal`: every name under
//! it). A workflow is checked when it is defined (a literal address, a name), and every
//! call again after name resolution, whose denied addresses are dropped (a name that
//! resolves only to denied ones is refused): each client dials only the addresses that
//! were judged (`resolver`), and Kafka's clients reach every broker, the ones a cluster's
//! metadata names too, through a relay that judges each (`relay`). An address is judged
//! with the address it reaches (`reaches`: `0.0.0.0`, `::`, NAT64 and 6to4 forms), so no
//! spelling of a denied address gets past. Broker connection strings are read by
//! `workflow::brokers`, the one reading the clients are built from.

mod relay;
mod resolver;

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

pub use relay::Relay;
pub use resolver::{DialError, Resolver};

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

/// The address a connection to `ip` reaches, as the policy judges it: the unspecified
/// addresses reach this host (Linux connects `0.0.0.0` and `::` to loopback), and an IPv6
/// address that carries an IPv4 one reaches that (IPv4-mapped and -compatible forms,
/// NAT64's well-known and local-use prefixes, 6to4). None: `ip` is itself the target.
pub fn reaches(ip: IpAddr) -> Option<IpAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr};
    match ip {
        // "This network": connect() on Linux treats 0.0.0.0 as this host.
        IpAddr::V4(v4) if v4.octets()[0] == 0 => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpAddr::V4(_) => None,
        IpAddr::V6(v6) if v6.is_unspecified() => Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let o = v6.octets();
            let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
            if let Some(v4) = v6.to_ipv4_mapped() {
                Some(IpAddr::V4(v4))
            } else if s[..6] == [0; 6] && !v6.is_loopback() {
                // IPv4-compatible (::a.b.c.d, deprecated but still parsed).
                Some(IpAddr::V4(last32))
            } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..3] == [0x64, 0xff9b, 1] {
                // NAT64: 64:ff9b::/96 (RFC 6052) and 64:ff9b:1::/48 (RFC 8215), whose
                // gateways use the last 32 bits as the IPv4 destination.
                Some(IpAddr::V4(last32))
            } else if s[0] == 0x2002 {
                // 6to4 (2002::/16): the IPv4 address follows the prefix.
                Some(IpAddr::V4(Ipv4Addr::new(o[2], o[3], o[4], o[5])))
            } else {
                None
            }
        }
    }
}

/// An address and what it reaches, each of which the rules judge.
fn judged(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
    let mut first = Some(ip);
    let mut next = reaches(ip);
    std::iter::from_fn(move || {
        if let Some(ip) = first.take() {
            return Some(ip);
        }
        let ip = next.take()?;
        // A chain ends at once (`::ffff:0.0.0.0` reaches 0.0.0.0, which reaches 127.0.0.1).
        next = reaches(ip);
        Some(ip)
    })
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
    /// The address is judged with every address it reaches (`reaches`): refused when any
    /// of them is denied; with an allow-list, let through when the one it finally reaches
    /// (or the name) is allowed.
    pub fn check_addr(&self, name: Option<&str>, ip: IpAddr) -> Result<(), Refused> {
        let target = judged(ip).last().unwrap_or(ip);
        let shown = match name {
            Some(n) => format!("{n} ({ip})"),
            None if target != ip => format!("{ip} (which reaches {target})"),
            None => ip.to_string(),
        };
        for at in judged(ip) {
            if let Some(i) = self.deny.iter().position(|r| r.holds(at)) {
                return Err(Refused(format!(
                    "{shown} is in {} ({})",
                    self.deny[i],
                    self.why_denied(i)
                )));
            }
        }
        if self.allow.is_empty()
            || self.allow.iter().any(|r| r.holds(target))
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
    fn every_spelling_of_an_address_is_judged_by_what_it_reaches() {
        let d = Destinations::new::<&str>(&[], &["127.0.0.0/8", "::1", "10.0.0.0/8"]).unwrap();
        for host in [
            "127.0.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "[::]",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "[::ffff:0.0.0.0]",
            "[::127.0.0.1]",
            "[64:ff9b::7f00:1]",
            "[64:ff9b::10.1.2.3]",
            "[64:ff9b:1::a01:203]",
            "[2002:7f00:1::]",
            "[2002:a01:203:1::5]",
        ] {
            let e = d.check_host(host).unwrap_err();
            assert!(e.0.contains("--deny-destinations"), "{host}: {e}");
        }
        for host in [
            "8.8.8.8",
            "[64:ff9b::808:808]",
            "[2002:808:808::]",
            "[2001:db8::1]",
        ] {
            assert_eq!(d.check_host(host), Ok(()), "{host}");
        }
        // A name that resolves to 0.0.0.0 reaches this host too.
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert!(d.filter("sneaky.example", vec![a("0.0.0.0:80")]).is_err());
        // With an allow-list, what a translated address reaches is what must be allowed.
        let allow = Destinations::new::<&str>(&["10.0.0.0/8"], &[]).unwrap();
        assert!(allow.check_host("[64:ff9b::10.1.2.3]").is_ok());
        assert!(allow.check_host("[64:ff9b::808:808]").is_err());
        assert_eq!(reaches("192.0.2.1".parse().unwrap()), None);
    }
}
