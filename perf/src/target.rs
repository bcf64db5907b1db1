//! The server under test: `http://host:port[/prefix]` parsed once up front.

use std::net::{SocketAddr, ToSocketAddrs};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host:port` as sent in the Host header.
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for the root).
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("only http:// URLs are supported: {url:?}"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!("missing host in {url:?}"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p.parse().map_err(|_| format!("invalid port in {url:?}"))?;
                (h.to_string(), port)
            }
            _ => (authority.to_string(), 80),
        };
        if host.is_empty() {
            return Err(format!("missing host in {url:?}"));
        }
        Ok(Self {
            authority: authority.to_string(),
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// Resolves the address once so that no request pays for DNS.
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        (host, self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.authority))?
            .next()
            .ok_or_else(|| format!("no address for {}", self.authority))
    }

    /// Full path of an API route under the prefix.
    pub fn path(&self, route: &str) -> String {
        format!("{}{}", self.prefix, route)
    }

    /// Absolute URL of a route, for configuring the server (workflow steps).
    pub fn url(&self, route: &str) -> String {
        format!("http://{}{}", self.authority, self.path(route))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_prefix() {
        let t = Target::parse("http://127.0.0.1:8080/base/").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 8080);
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert_eq!(t.path("/health"), "/base/health");
        assert_eq!(t.url("/api/step1"), "http://127.0.0.1:8080/base/api/step1");
    }

    #[test]
    fn default_port_and_ipv6() {
        let t = Target::parse("http://localhost").unwrap();
        assert_eq!((t.port, t.prefix.as_str()), (80, ""));
        let t = Target::parse("http://[::1]:9000").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("[::1]", 9000));
        assert!(t.resolve().is_ok());
    }

    #[test]
    fn rejects_other_schemes() {
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://:80").is_err());
        assert!(Target::parse("http://").is_err());
    }
}
