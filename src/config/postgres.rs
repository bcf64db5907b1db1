//! The database to connect to: its URL (or Clamp's connection string), and what it says
//! about TLS, with the meanings libpq documents for `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey` (and their `PGSSL…` environment variables). The driver parses the rest
//! of the URL; these four clamp applies itself (`store::connect`), since the driver
//! knows neither `verify-ca` nor `verify-full` nor any certificate file.

use std::collections::HashMap;
use std::path::PathBuf;

use super::ConfigError;

/// libpq's `sslmode`: how much TLS a connection insists on and what it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Plain first; TLS only if the server refuses a plain connection.
    Allow,
    /// TLS if the server offers it, else plain (libpq's default).
    Prefer,
    /// TLS or nothing; the certificate is checked only when a root certificate is set.
    Require,
    /// TLS, with the chain checked against the root certificate.
    VerifyCa,
    /// TLS, with the chain and the host name checked.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, ConfigError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConfigError(format!(
                    "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the server's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// The system's trusted roots (`sslrootcert=system`).
    System,
}

/// The TLS settings of the database connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    pub mode: SslMode,
    /// None: the certificate is not checked (allowed for `require` and weaker).
    pub root_cert: Option<RootCert>,
    /// A client certificate and its key, presented when the server asks.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The database as configured.
#[derive(Clone)]
pub struct Database {
    /// As given; printed only through `redacted`.
    pub url: String,
    /// The driver's view of `url` without the TLS parameters.
    pub driver: tokio_postgres::Config,
    pub tls: PgTls,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("url", &redact_url(&self.url))
            .field("tls", &self.tls)
            .finish()
    }
}

/// The parameters clamp takes out of the URL before the driver sees it.
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl Database {
    /// Parses `url` (a `postgres://` URL or libpq's `key=value` form); `env` reads the
    /// environment (`PGSSLMODE` and friends apply where the URL says nothing, and
    /// `HOME` locates libpq's default files under `~/.postgresql/`).
    pub fn parse(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Database, ConfigError> {
        let (rest, mut taken) = split_tls_params(url)?;
        let driver: tokio_postgres::Config = rest
            .parse()
            .map_err(|e| ConfigError(format!("invalid database URL {}: {e}", redact_url(url))))?;
        for (key, var) in
            TLS_KEYS
                .iter()
                .zip(["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"])
        {
            if !taken.contains_key(*key) {
                if let Some(v) = env(var).filter(|v| !v.is_empty()) {
                    taken.insert(key.to_string(), v);
                }
            }
        }
        let tls = tls_settings(&taken, env)?;
        Ok(Database {
            url: url.to_string(),
            driver,
            tls,
        })
    }

    /// The URL with its password hidden, for logs and errors.
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }
}

/// libpq's rules: `sslrootcert=system` means verify-full and allows nothing weaker; the
/// verify modes need a root certificate; `~/.postgresql/root.crt` (and the client
/// certificate beside it) apply when they exist and nothing else is named.
fn tls_settings(
    taken: &HashMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PgTls, ConfigError> {
    let home_file = |name: &str| {
        env("HOME")
            .map(|h| PathBuf::from(h).join(".postgresql").join(name))
            .filter(|p| p.is_file())
    };
    let root_cert = match taken.get("sslrootcert").map(String::as_str) {
        Some("system") => Some(RootCert::System),
        Some(path) => Some(RootCert::File(PathBuf::from(path))),
        None => home_file("root.crt").map(RootCert::File),
    };
    let mode = match taken.get("sslmode") {
        Some(m) => SslMode::parse(m)?,
        None if root_cert == Some(RootCert::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if root_cert == Some(RootCert::System) && mode != SslMode::VerifyFull {
        return Err(ConfigError(format!(
            "weak sslmode {:?} may not be used with sslrootcert=system (use \"verify-full\")",
            mode.as_str()
        )));
    }
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        return Err(ConfigError(format!(
            "sslmode={} needs a root certificate to verify the server against: set \
             sslrootcert=<CA file> (or sslrootcert=system for the system's roots)",
            mode.as_str()
        )));
    }
    let client_cert = match (taken.get("sslcert"), taken.get("sslkey")) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (Some(_), None) | (None, Some(_)) => {
            return Err(ConfigError(
                "sslcert and sslkey go together: set both or neither".into(),
            ))
        }
        (None, None) => home_file("postgresql.crt").zip(home_file("postgresql.key")),
    };
    Ok(PgTls {
        mode,
        root_cert: root_cert.filter(|_| mode != SslMode::Disable),
        client_cert: client_cert.filter(|_| mode != SslMode::Disable),
    })
}

/// Takes the TLS parameters out of a URL's query, or out of a `key=value` string, and
/// returns the rest (in the same form) and what was taken.
fn split_tls_params(url: &str) -> Result<(String, HashMap<String, String>), ConfigError> {
    let mut taken = HashMap::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), taken));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(k);
            if TLS_KEYS.contains(&key.as_str()) {
                taken.insert(key, decode(v));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, taken));
    }
    let mut kept = String::new();
    for (k, v) in key_values(url)? {
        if TLS_KEYS.contains(&k.as_str()) {
            taken.insert(k, v);
        } else {
            if !kept.is_empty() {
                kept.push(' ');
            }
            kept.push_str(&k);
            kept.push_str("='");
            kept.push_str(&v.replace('\\', "\\\\").replace('\'', "\\'"));
            kept.push('\'');
        }
    }
    Ok((kept, taken))
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// libpq's `key=value` pairs: spaces around `=` allowed, values quoted with `'` and
/// escaped with `\` where they hold spaces or quotes.
fn key_values(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let bad = || ConfigError("invalid database connection string".into());
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') || key.is_empty() {
            return Err(bad());
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next().ok_or_else(bad)? {
                    '\'' => break,
                    '\\' => value.push(chars.next().ok_or_else(bad)?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next().ok_or_else(bad)?);
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// Converts Clamp's `host=h:p user=u dbname=d password=p` into a postgres URL; its
/// `sslmode`, `sslrootcert`, `sslcert` and `sslkey` go along as URL parameters.
pub fn clamp_conn_str_to_url(s: &str) -> Result<String, ConfigError> {
    let (mut host, mut port, mut user, mut db, mut password) =
        (None, None, None, None, None::<String>);
    let mut params = Vec::new();
    for part in s.split_whitespace() {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            ConfigError(format!(
                "CLAMP_DB_CONNECTION_STR: expected key=value, got {part:?}"
            ))
        })?;
        match k {
            "host" => match v.rsplit_once(':') {
                Some((h, p)) => {
                    host = Some(h.to_string());
                    port = Some(p.parse::<u16>().map_err(|_| {
                        ConfigError(format!("CLAMP_DB_CONNECTION_STR: bad port {p:?}"))
                    })?);
                }
                None => host = Some(v.to_string()),
            },
            "port" => {
                port =
                    Some(v.parse::<u16>().map_err(|_| {
                        ConfigError(format!("CLAMP_DB_CONNECTION_STR: bad port {v:?}"))
                    })?)
            }
            "user" => user = Some(v.to_string()),
            "dbname" => db = Some(v.to_string()),
            "password" => password = Some(v.to_string()),
            k if TLS_KEYS.contains(&k) => params.push(format!("{k}={}", pct(v))),
            // Other settings are Clamp's driver's own; the defaults stand in for them.
            _ => {}
        }
    }
    let mut url = String::from("postgres://");
    url.push_str(&pct(user.as_deref().unwrap_or("postgres")));
    if let Some(p) = password {
        url.push(':');
        url.push_str(&pct(&p));
    }
    url.push('@');
    url.push_str(host.as_deref().unwrap_or("127.0.0.1"));
    url.push(':');
    url.push_str(&port.unwrap_or(5432).to_string());
    url.push('/');
    url.push_str(&pct(db.as_deref().unwrap_or("clamp")));
    if !params.is_empty() {
        url.push('?');
        url.push_str(&params.join("&"));
    }
    Ok(url)
}

/// Percent-encodes what is not unreserved in a URL component.
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Hides the password of a postgres URL (or of a `password=` pair), for logs and errors.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.find('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &rest[at..]
                );
            }
        }
        return url.to_string();
    }
    match key_values(url) {
        Ok(pairs) => pairs
            .iter()
            .map(|(k, v)| {
                if k == "password" {
                    format!("{k}=***")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => "(unparsable connection string)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn tls(url: &str) -> Result<PgTls, String> {
        Database::parse(url, &no_env)
            .map(|d| d.tls)
            .map_err(|e| e.0)
    }

    #[test]
    fn libpq_defaults_and_modes() {
        let t = tls("postgres://u@h/d").unwrap();
        assert_eq!(
            (t.mode, t.root_cert, t.client_cert),
            (SslMode::Prefer, None, None)
        );
        for m in ["disable", "allow", "prefer", "require"] {
            assert_eq!(
                tls(&format!("postgres://h/d?sslmode={m}"))
                    .unwrap()
                    .mode
                    .as_str(),
                m
            );
        }
        let t = tls("postgres://h/d?sslmode=verify-full&sslrootcert=/etc/ca%20s.pem").unwrap();
        assert_eq!(t.mode, SslMode::VerifyFull);
        assert_eq!(t.root_cert, Some(RootCert::File("/etc/ca s.pem".into())));
        // sslrootcert=system implies verify-full and refuses anything weaker.
        assert_eq!(
            tls("postgres://h/d?sslrootcert=system").unwrap().mode,
            SslMode::VerifyFull
        );
        assert!(tls("postgres://h/d?sslrootcert=system&sslmode=require")
            .unwrap_err()
            .contains("weak sslmode"));
        assert!(tls("postgres://h/d?sslmode=verify-ca")
            .unwrap_err()
            .contains("sslrootcert"));
        assert!(tls("postgres://h/d?sslmode=bogus")
            .unwrap_err()
            .contains("bogus"));
        assert!(tls("postgres://h/d?sslcert=/c.pem")
            .unwrap_err()
            .contains("together"));
        let t = tls("postgres://h/d?sslmode=require&sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(t.client_cert, Some(("/c.pem".into(), "/k.pem".into())));
        // Under disable, certificates mean nothing.
        let t = tls("postgres://h/d?sslmode=disable&sslrootcert=/ca.pem").unwrap();
        assert_eq!(t.root_cert, None);
    }

    #[test]
    fn the_driver_gets_the_rest() {
        let d = Database::parse(
            "postgres://u:p@a:1,b:2/db?target_session_attrs=read-write&sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
            &no_env,
        )
        .unwrap();
        assert_eq!(d.driver.get_hosts().len(), 2);
        assert_eq!(
            d.driver.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(d.driver.get_dbname(), Some("db"));
        let d = Database::parse(
            "host=h port=5433 user=u sslmode=verify-ca sslrootcert='/my ca.pem' dbname = 'x y'",
            &no_env,
        )
        .unwrap();
        assert_eq!(d.driver.get_dbname(), Some("x y"));
        assert_eq!(d.tls.mode, SslMode::VerifyCa);
        assert_eq!(d.tls.root_cert, Some(RootCert::File("/my ca.pem".into())));
        let e = Database::parse("postgres://h/d?sslcrl=/x", &no_env).unwrap_err();
        assert!(e.0.contains("sslcrl"), "{}", e.0);
    }

    #[test]
    fn the_environment_fills_in() {
        let env = |k: &str| match k {
            "PGSSLMODE" => Some("require".to_string()),
            "PGSSLROOTCERT" => Some("/env-ca.pem".to_string()),
            _ => None,
        };
        let d = Database::parse("postgres://h/d", &env).unwrap();
        assert_eq!(d.tls.mode, SslMode::Require);
        assert_eq!(d.tls.root_cert, Some(RootCert::File("/env-ca.pem".into())));
        // The URL wins.
        let d = Database::parse("postgres://h/d?sslmode=disable", &env).unwrap();
        assert_eq!(d.tls.mode, SslMode::Disable);
    }

    #[test]
    fn clamp_connection_string() {
        let check = |input: &str, expected: &str| {
            assert_eq!(clamp_conn_str_to_url(input).unwrap(), expected, "{input}");
        };
        check(
            "host=db:5433 user=clamp dbname=clampdev password=p@ss",
            "postgres://clamp:p%40ss@db:5433/clampdev",
        );
        check("host=localhost", "postgres://postgres@localhost:5432/clamp");
        check("host=h port=6000 user=u dbname=d", "postgres://u@h:6000/d");
        check(
            "host=h sslmode=verify-full sslrootcert=/ca.pem",
            "postgres://postgres@h:5432/clamp?sslmode=verify-full&sslrootcert=%2Fca.pem",
        );
        let url = clamp_conn_str_to_url("host=h sslmode=verify-full sslrootcert=/ca.pem").unwrap();
        let d = Database::parse(&url, &no_env).unwrap();
        assert_eq!(d.tls.root_cert, Some(RootCert::File("/ca.pem".into())));
        assert!(clamp_conn_str_to_url("host=h:notaport").is_err());
        assert!(clamp_conn_str_to_url("garbage").is_err());
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:1/d"),
            "postgres://u:***@h:1/d"
        );
        assert_eq!(redact_url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact_url("host=h password='a b'"), "host=h password=***");
    }
}
