//! Connecting to Postgres, for the pools, migrations and the Kafka partition locks.
//!
//! - **One deadline per host** (`--db-connect-timeout-ms`) covers the TCP connect, TLS and
//!   the startup handshake together, then the next host of a multi-host URL is tried. The
//!   driver's own connect timeout bounds only the TCP connect, so a primary that accepts
//!   connections and never answers (a frozen process) held every attempt, and the next
//!   host was never reached. Hosts found silent or unreachable lately are tried last.
//! - **TLS as libpq means it** (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`; see
//!   `config::postgres`), over rustls: `prefer` falls back to plain text when the TLS
//!   attempt fails, `allow` tries plain text first; a Unix socket is never encrypted.
//! - **Guarded connections** (`watchdog`): a statement that hears nothing back for the
//!   guard's time ends its connection, and marks the host so the pool drops the rest.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::{Host as PgHost, SslMode as DriverSsl, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{CancelToken, Client};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::watchdog::{Health, Socket, Watched};
use crate::config::{Database, RootCert, SslMode};
use crate::tls::{self, Verify};

/// The driver configuration for `config`: session settings that bound every statement,
/// so a stalled database cannot hold a request (or a batch) forever.
pub fn session(config: &crate::config::Config) -> tokio_postgres::Config {
    let mut pg = config.database.driver.clone();
    let timeout_ms = config.flush_timeout.as_millis();
    pg.application_name("clamp")
        .keepalives_idle(Duration::from_secs(30))
        // enable_seqscan = off: every statement of ours is a key lookup or an index range,
        // but prepared statements keep a generic plan made while the tables were small,
        // and those joined the batch inputs to whole-table scans: 1,207 sequential scans
        // reading 25M rows in 20 s at 3,000 requests/s, until the next ANALYZE. Off, the
        // planner takes the index whenever there is one
        // (perf/runs/2026-11-30-vm/8f8fe22-seqscan/seqscan.md).
        // timezone=UTC: timestamps render the same whichever server they come from, and
        // the same as the executor renders them from memory (`store::status`).
        // jit=off: with enable_seqscan off, a plan with any sequential scan left in it (a
        // partition or a table with no index for the statement) costs over 10^10, past
        // every JIT threshold, so Postgres compiled it with LLVM, inlined and optimized, at
        // each execution: 14 % of Postgres's CPU in a retention soak once sets came and
        // went, none at its start (perf/runs/2026-12-06-vm/c1c3fb6-soak-retention-profile).
        // No statement of ours runs long enough to gain from JIT.
        .options(format!(
            "-c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={} \
             -c enable_seqscan=off -c jit=off -c timezone=UTC",
            timeout_ms * 2
        ));
    pg
}

/// How long a host that failed stays at the back of the order.
const DEMOTION: Duration = Duration::from_secs(30);

/// Opens connections to the configured database.
pub struct PgConnector {
    hosts: Vec<Host>,
    random_order: bool,
    mode: SslMode,
    tls: MakeRustlsConnect,
    deadline: Duration,
    /// The request tables' partition sets as last seen: the connections of this
    /// connector aim their most frequent statements at them (`partitions::leaf_sql`).
    partitions: Arc<super::partitions::PartitionMap>,
}

/// One host of the URL.
struct Host {
    /// The driver's configuration for this host alone.
    config: tokio_postgres::Config,
    /// `host:port`, as errors name it.
    label: String,
    target: Target,
    health: Arc<Health>,
}

enum Target {
    Tcp {
        /// The name TLS verifies (or the address, when only `hostaddr` was given).
        name: String,
        addr: Option<IpAddr>,
        port: u16,
    },
    Unix(PathBuf),
}

/// An open connection: its client, the task driving it, and where it goes.
pub struct Connected {
    pub client: Client,
    pub task: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    /// The host's index in the URL, for cancelling and health.
    pub host: usize,
    /// When it was opened, on the host's health clock.
    pub opened_ms: u64,
}

/// Why one host could not be connected to.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("no answer within {} ms (TCP connect, TLS and startup)", .0.as_millis())]
    Deadline(Duration),
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("{}", describe(.0))]
    Pg(#[source] tokio_postgres::Error),
    #[error("it is read-only (target_session_attrs=read-write wants a primary)")]
    ReadOnly,
    #[error("it is not read-only (target_session_attrs=read-only wants a standby)")]
    ReadWrite,
}

fn describe(e: &tokio_postgres::Error) -> String {
    match crate::tls::describe(e) {
        Some(tls) => format!("TLS: {tls}"),
        None => crate::error_chain::one_line(e),
    }
}

/// Why no host could be connected to: each host's reason, in the order tried.
#[derive(Debug)]
pub struct ConnectError {
    pub failures: Vec<(String, HostError)>,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (host, e)) in self.failures.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{host}: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConnectError {}

impl ConnectError {
    /// True when no host could be reached at all (nothing listens, or nothing answers),
    /// as opposed to one that answered and refused (TLS, authentication, role).
    pub fn unreachable(&self) -> bool {
        self.failures.iter().all(|(_, e)| {
            matches!(e, HostError::Deadline(_) | HostError::Io(_))
                || matches!(e, HostError::Pg(p) if p.as_db_error().is_none() && crate::tls::find(p).is_none())
        })
    }

    /// The SQLSTATE a host answered with, if one did.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        self.failures.iter().find_map(|(_, e)| match e {
            HostError::Pg(e) => e.code(),
            _ => None,
        })
    }
}

impl HostError {
    /// The server itself said no (authentication, no such database, …).
    fn is_refusal(&self) -> bool {
        matches!(self, HostError::Pg(e) if e.as_db_error().is_some())
    }

    fn is_tls(&self) -> bool {
        matches!(self, HostError::Pg(e) if crate::tls::find(e).is_some())
    }
}

impl PgConnector {
    /// A connector for `db` with the session settings of `session` (the driver's
    /// configuration of every host: user, database, options, timeouts), each host
    /// given `deadline`. Fails when a certificate or key file cannot be used.
    pub fn new(
        db: &Database,
        session: tokio_postgres::Config,
        deadline: Duration,
    ) -> Result<PgConnector, tls::TlsError> {
        let roots = match &db.tls.root_cert {
            None => None,
            Some(RootCert::System) => Some(tls::roots(true, None)?),
            Some(RootCert::File(path)) => Some(tls::roots(false, Some(path))?),
        };
        let verify = match (db.tls.mode, roots) {
            (SslMode::VerifyFull, Some(r)) => Verify::Full(r),
            // libpq checks the chain whenever it has a root certificate.
            (_, Some(r)) => Verify::ChainOnly(r),
            (_, None) => Verify::Nothing,
        };
        let identity = match &db.tls.client_cert {
            Some((cert, key)) => Some(tls::Identity::load(cert, key)?),
            None => None,
        };
        // PostgreSQL 17 checks the ALPN a client offers; earlier servers ignore it.
        let client = tls::client(verify, identity.as_ref(), &[b"postgresql"])?;
        Ok(PgConnector {
            hosts: hosts(&session),
            random_order: session.get_load_balance_hosts()
                == tokio_postgres::config::LoadBalanceHosts::Random,
            mode: db.tls.mode,
            tls: MakeRustlsConnect::new(client),
            deadline,
            partitions: Default::default(),
        })
    }

    /// The partition sets as this process last saw them.
    pub fn partitions(&self) -> &super::partitions::PartitionMap {
        &self.partitions
    }

    /// The connector of `config`'s database, with the server's session settings and one
    /// `--db-connect-timeout-ms` per host.
    pub fn for_config(config: &crate::config::Config) -> Result<PgConnector, tls::TlsError> {
        PgConnector::new(&config.database, session(config), config.db_connect_timeout)
    }

    /// The same connector for another database of the same server (to create ours).
    pub fn for_dbname(&self, dbname: &str) -> PgConnector {
        PgConnector {
            hosts: self
                .hosts
                .iter()
                .map(|h| {
                    let mut config = h.config.clone();
                    config.dbname(dbname);
                    Host {
                        config,
                        label: h.label.clone(),
                        target: h.target.clone(),
                        health: h.health.clone(),
                    }
                })
                .collect(),
            random_order: self.random_order,
            mode: self.mode,
            tls: self.tls.clone(),
            deadline: self.deadline,
            partitions: self.partitions.clone(),
        }
    }

    /// The database's name.
    pub fn dbname(&self) -> Option<&str> {
        self.hosts.first().and_then(|h| h.config.get_dbname())
    }

    /// Connects to the first host that takes us (in the URL's order, hosts that failed
    /// lately last). `guard` bounds the silence after a request (`watchdog`); None for
    /// connections whose statements may legitimately run long (migrations).
    pub async fn connect(&self, guard: Option<Duration>) -> Result<Connected, ConnectError> {
        let mut order: Vec<usize> = (0..self.hosts.len()).collect();
        if self.random_order {
            fastrand::shuffle(&mut order);
        }
        // Stable: among hosts equally well, the URL's order (or the shuffle) stands.
        order.sort_by_key(|&i| self.hosts[i].health.silent_within(DEMOTION));
        let mut failures = Vec::new();
        for i in order {
            let host = &self.hosts[i];
            match tokio::time::timeout(self.deadline, self.connect_host(i, guard)).await {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(e)) => {
                    // A host that refused us (authentication, no database) is up; the
                    // others are demoted for a while.
                    if !e.is_refusal() {
                        host.health.mark_failed();
                    }
                    failures.push((host.label.clone(), e));
                }
                Err(_) => {
                    host.health.mark_failed();
                    failures.push((host.label.clone(), HostError::Deadline(self.deadline)));
                }
            }
        }
        Err(ConnectError { failures })
    }

    /// True when a connection opened at `opened_ms` to `host` has since seen its host
    /// fall silent: the pool does not hand it out again.
    pub fn outlived(&self, host: usize, opened_ms: u64) -> bool {
        self.hosts[host].health.outlived(opened_ms)
    }

    /// libpq's `sslmode` negotiation, one host.
    async fn connect_host(
        &self,
        i: usize,
        guard: Option<Duration>,
    ) -> Result<Connected, HostError> {
        if matches!(self.hosts[i].target, Target::Unix(_)) {
            return self.attempt(i, DriverSsl::Disable, guard).await;
        }
        match self.mode {
            SslMode::Disable => self.attempt(i, DriverSsl::Disable, guard).await,
            SslMode::Allow => match self.attempt(i, DriverSsl::Disable, guard).await {
                Err(e) if e.is_refusal() => self.attempt(i, DriverSsl::Require, guard).await,
                r => r,
            },
            SslMode::Prefer => match self.attempt(i, DriverSsl::Prefer, guard).await {
                Err(e) if e.is_tls() => self.attempt(i, DriverSsl::Disable, guard).await,
                r => r,
            },
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                self.attempt(i, DriverSsl::Require, guard).await
            }
        }
    }

    async fn attempt(
        &self,
        i: usize,
        ssl: DriverSsl,
        guard: Option<Duration>,
    ) -> Result<Connected, HostError> {
        let host = &self.hosts[i];
        let opened_ms = host.health.now_ms();
        let socket = open(&host.target, &host.config).await?;
        let stream = Watched::new(socket, guard, host.health.clone());
        let mut config = host.config.clone();
        config.ssl_mode(ssl);
        let mut make = self.tls.clone();
        let tls =
            match MakeTlsConnect::<Watched>::make_tls_connect(&mut make, host.target.tls_name()) {
                Ok(t) => t,
                Err(never) => match never {},
            };
        let (client, connection) = config
            .connect_raw(stream, tls)
            .await
            .map_err(HostError::Pg)?;
        let task = tokio::spawn(connection);
        let wanted = config.get_target_session_attrs();
        if wanted != TargetSessionAttrs::Any {
            let read_only = read_only(&client).await.map_err(HostError::Pg)?;
            match (wanted, read_only) {
                (TargetSessionAttrs::ReadWrite, true) => return Err(HostError::ReadOnly),
                (TargetSessionAttrs::ReadOnly, false) => return Err(HostError::ReadWrite),
                _ => {}
            }
        }
        Ok(Connected {
            client,
            task,
            host: i,
            opened_ms,
        })
    }

    /// Asks the server to cancel what `token`'s connection (to host `host`) is running.
    /// Best effort, within one deadline.
    pub async fn cancel(&self, token: CancelToken, host: usize) {
        let h = &self.hosts[host];
        let cancel = async {
            let socket = open(&h.target, &h.config).await.ok()?;
            let mut make = self.tls.clone();
            let tls =
                match MakeTlsConnect::<Socket>::make_tls_connect(&mut make, h.target.tls_name()) {
                    Ok(t) => t,
                    Err(never) => match never {},
                };
            token.cancel_query_raw(socket, tls).await.ok()
        };
        let _ = tokio::time::timeout(self.deadline, cancel).await;
    }
}

impl Target {
    fn tls_name(&self) -> &str {
        match self {
            Target::Tcp { name, .. } => name,
            Target::Unix(_) => "localhost",
        }
    }
}

impl Clone for Target {
    fn clone(&self) -> Self {
        match self {
            Target::Tcp { name, addr, port } => Target::Tcp {
                name: name.clone(),
                addr: *addr,
                port: *port,
            },
            Target::Unix(p) => Target::Unix(p.clone()),
        }
    }
}

/// Whether a host takes writes (`target_session_attrs=read-write` skips one that does not).
pub(in crate::store) const READ_ONLY: &str = "SHOW transaction_read_only";

async fn read_only(client: &Client) -> Result<bool, tokio_postgres::Error> {
    let rows = client.simple_query(READ_ONLY).await?;
    Ok(rows.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("on"),
        _ => false,
    }))
}

/// The transport to one host, as the driver would open it: every address of a name
/// in turn, no Nagle, keepalives and the TCP user timeout as configured.
async fn open(target: &Target, config: &tokio_postgres::Config) -> Result<Socket, HostError> {
    match target {
        Target::Unix(path) => UnixStream::connect(path)
            .await
            .map(Socket::Unix)
            .map_err(HostError::Io),
        Target::Tcp { name, addr, port } => {
            let addrs: Vec<SocketAddr> = match addr {
                Some(ip) => vec![SocketAddr::new(*ip, *port)],
                None => tokio::net::lookup_host((name.as_str(), *port))
                    .await
                    .map_err(HostError::Io)?
                    .collect(),
            };
            let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
            for a in addrs {
                match TcpStream::connect(a).await {
                    Ok(s) => {
                        tune(&s, config).map_err(HostError::Io)?;
                        return Ok(Socket::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(HostError::Io(last))
        }
    }
}

fn tune(s: &TcpStream, config: &tokio_postgres::Config) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let sock = socket2::SockRef::from(s);
    if let Some(t) = config.get_tcp_user_timeout() {
        sock.set_tcp_user_timeout(Some(*t))?;
    }
    if config.get_keepalives() {
        let mut ka = socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
        if let Some(i) = config.get_keepalives_interval() {
            ka = ka.with_interval(i);
        }
        if let Some(r) = config.get_keepalives_retries() {
            ka = ka.with_retries(r);
        }
        sock.set_tcp_keepalive(&ka)?;
    }
    Ok(())
}

/// One configuration per host of `session`, each naming that host alone.
fn hosts(session: &tokio_postgres::Config) -> Vec<Host> {
    let names = session.get_hosts();
    let addrs = session.get_hostaddrs();
    let ports = session.get_ports();
    let n = names.len().max(addrs.len()).max(1);
    let port_of = |i: usize| match ports.len() {
        0 => 5432,
        1 => ports[0],
        _ => ports.get(i).copied().unwrap_or(5432),
    };
    (0..n)
        .map(|i| {
            let port = port_of(i);
            let addr = addrs.get(i).copied();
            let target = match names.get(i) {
                Some(PgHost::Unix(dir)) => Target::Unix(dir.join(format!(".s.PGSQL.{port}"))),
                Some(PgHost::Tcp(name)) => Target::Tcp {
                    name: name.clone(),
                    addr,
                    port,
                },
                None => Target::Tcp {
                    name: addr.map_or_else(|| "localhost".into(), |a| a.to_string()),
                    addr,
                    port,
                },
            };
            let label = match &target {
                Target::Tcp { name, port, .. } => format!("{name}:{port}"),
                Target::Unix(p) => p.display().to_string(),
            };
            Host {
                config: single_host(session, i, port),
                label,
                target,
                health: Arc::new(Health::default()),
            }
        })
        .collect()
}

/// `session`'s settings with only its `i`th host (the socket is ours to open, so the
/// driver's copy matters for the settings and for cancel requests).
fn single_host(session: &tokio_postgres::Config, i: usize, port: u16) -> tokio_postgres::Config {
    let s = session;
    let mut c = tokio_postgres::Config::new();
    if let Some(u) = s.get_user() {
        c.user(u);
    }
    if let Some(p) = s.get_password() {
        c.password(p);
    }
    if let Some(d) = s.get_dbname() {
        c.dbname(d);
    }
    if let Some(o) = s.get_options() {
        c.options(o);
    }
    if let Some(a) = s.get_application_name() {
        c.application_name(a);
    }
    match s.get_hosts().get(i) {
        Some(PgHost::Tcp(h)) => {
            c.host(h);
        }
        Some(PgHost::Unix(p)) => {
            c.host_path(p);
        }
        None => {}
    }
    if let Some(a) = s.get_hostaddrs().get(i) {
        c.hostaddr(*a);
    }
    c.port(port)
        .ssl_negotiation(s.get_ssl_negotiation())
        .keepalives(s.get_keepalives())
        .keepalives_idle(s.get_keepalives_idle())
        .target_session_attrs(s.get_target_session_attrs())
        .channel_binding(s.get_channel_binding());
    if let Some(t) = s.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    if let Some(t) = s.get_keepalives_interval() {
        c.keepalives_interval(t);
    }
    if let Some(r) = s.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_gets_its_own_configuration() {
        let session: tokio_postgres::Config =
            "postgres://u:pw@a:5433,b/db?target_session_attrs=read-write&application_name=x"
                .parse()
                .unwrap();
        let hosts = hosts(&session);
        let labels: Vec<_> = hosts.iter().map(|h| h.label.as_str()).collect();
        assert_eq!(labels, ["a:5433", "b:5432"]);
        for h in &hosts {
            assert_eq!(h.config.get_hosts().len(), 1);
            assert_eq!(h.config.get_dbname(), Some("db"));
            assert_eq!(h.config.get_user(), Some("u"));
            assert_eq!(h.config.get_password(), Some(&b"pw"[..]));
            assert_eq!(
                h.config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite
            );
        }
        let session: tokio_postgres::Config = "host=a,b port=1,2 user=u".parse().unwrap();
        let labels: Vec<_> = hosts_labels(&session);
        assert_eq!(labels, ["a:1", "b:2"]);
        let session: tokio_postgres::Config = "host=/run/pg port=5433".parse().unwrap();
        assert_eq!(hosts_labels(&session), ["/run/pg/.s.PGSQL.5433"]);
        let session: tokio_postgres::Config = "hostaddr=10.0.0.1 port=7".parse().unwrap();
        assert_eq!(hosts_labels(&session), ["10.0.0.1:7"]);
    }

    fn hosts_labels(s: &tokio_postgres::Config) -> Vec<String> {
        hosts(s).into_iter().map(|h| h.label).collect()
    }
}
