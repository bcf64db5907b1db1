//! Cross-site requests, refused while tokens are off (beyond Clamp). With no token to
//! present, a browser is the danger: any page the developer visits can send `text/plain`
//! POSTs to `127.0.0.1:8080` (no CORS preflight is needed for them), and a page whose
//! name is rebound to 127.0.0.1 (DNS rebinding) even reads the answers, as the same
//! origin. Browsers say both: `Origin` on every cross-site POST, and the name the page
//! used in `Host`. So a request is refused when
//!
//! - its `Host` is not a loopback name (`localhost`, `*.localhost`), a loopback address,
//!   the address the client connected to, or a name of `--allowed-hosts` (a compose
//!   service name, an ingress): DNS rebinding;
//! - its `Origin` is not this server's own (`scheme://` and the request's `Host`) nor a
//!   name of `--allowed-hosts`: a page of another site.
//!
//! Clients that send no `Origin` (curl, Clamp's clients, the load generator) are served
//! as before, whatever their `Content-Type`; a request without `Host` (HTTP/1.0) is not a
//! browser's. `/health` and `/ready` are exempt: they tell nothing and change nothing.

use std::net::IpAddr;

use hyper::header::{HeaderMap, HOST, ORIGIN};

/// Why a request is refused as cross-site, if it is.
pub fn refused(headers: &HeaderMap, local: Option<IpAddr>, allowed: &[String]) -> Option<String> {
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host {
        if !host_allowed(name_of(host), local, allowed) {
            return Some(format!(
                "Host {host:?} is not this server's: with no API tokens, requests must \
                 name it by a loopback name, the address they connected to, or a name of \
                 --allowed-hosts (this refuses pages that rebind a name to this server)"
            ));
        }
    }
    let origin = headers.get(ORIGIN)?;
    let text = origin.to_str().unwrap_or("");
    let own = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .is_some_and(|authority| {
            host.is_some_and(|h| authority.eq_ignore_ascii_case(h))
                || listed(name_of(authority), allowed)
        });
    (!own).then(|| {
        format!(
            "Origin {text:?} is not this server's: with no API tokens, only this server's \
             own pages, a name of --allowed-hosts and clients that send no Origin may call it \
             (this refuses requests other sites' pages send)"
        )
    })
}

/// The host of a `Host` value or an origin's authority: without the port, an IPv6
/// address without its brackets.
fn name_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn host_allowed(name: &str, local: Option<IpAddr>, allowed: &[String]) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.eq_ignore_ascii_case("localhost") || ends_with_ignore_case(name, ".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        let plain = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        return plain.is_loopback() || Some(plain) == local || Some(ip) == local;
    }
    listed(name, allowed)
}

/// Whether `--allowed-hosts` names `name`: exactly, or under a `.domain` it gives.
fn listed(name: &str, allowed: &[String]) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    allowed.iter().any(|a| match a.strip_prefix('.') {
        Some(domain) => {
            name.eq_ignore_ascii_case(domain) || ends_with_ignore_case(name, a.as_str())
        }
        None => name.eq_ignore_ascii_case(a),
    })
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pairs: &[(&'static str, &str)], local: &str, allowed: &[&str]) -> bool {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        refused(&h, local.parse().ok(), &allowed).is_none()
    }

    #[test]
    fn hosts_a_browser_may_name() {
        for (host, ok) in [
            ("localhost:8080", true),
            ("LOCALHOST", true),
            ("app.localhost:8080", true),
            ("127.0.0.1:8080", true),
            ("127.9.9.9", true),
            ("[::1]:8080", true),
            ("10.0.0.5:8080", true),
            ("10.0.0.6:8080", false),
            ("attacker.example", false),
            ("attacker.example:8080", false),
            ("localhost.attacker.example", false),
            ("clamp:8080", true),
            ("api.corp.example", true),
            ("corp.example", true),
            ("evilcorp.example", false),
        ] {
            assert_eq!(
                check(&[("host", host)], "10.0.0.5", &["clamp", ".corp.example"]),
                ok,
                "{host}"
            );
        }
        // No Host at all: not a browser.
        assert!(check(&[], "127.0.0.1", &[]));
    }

    #[test]
    fn origins_must_be_the_servers_own() {
        let with = |origin: &str| {
            check(
                &[("host", "localhost:8080"), ("origin", origin)],
                "127.0.0.1",
                &["console.corp.example"],
            )
        };
        assert!(with("http://localhost:8080"));
        assert!(with("https://LOCALHOST:8080"));
        assert!(with("https://console.corp.example"));
        assert!(!with("https://evil.example"));
        assert!(!with("http://localhost:3000"), "another local app's page");
        assert!(!with("null"));
        assert!(!with("file://"));
        // No Origin: curl, Clamp's clients.
        assert!(check(&[("host", "localhost:8080")], "127.0.0.1", &[]));
    }
}
