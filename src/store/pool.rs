//! The per-runtime connection pool: bb8 over bb8-postgres, with the hot statements
//! prepared once per connection (bb8-postgres keeps no statement cache of its own).

use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::{Client, NoTls, Statement};

use crate::config::Config;

/// A pooled connection and the statements prepared on it.
pub struct PgConn {
    pub client: Client,
    /// `INSERT … SELECT * FROM UNNEST(…)` of new service requests.
    pub insert_requests: Statement,
    /// Set when a statement was abandoned midway (a client-side timeout): the session's
    /// state is unknown (it may be inside a transaction), so the pool drops it.
    poisoned: std::sync::atomic::AtomicBool,
    /// Other statements, prepared on first use on this connection.
    cache: parking_lot::Mutex<std::collections::HashMap<&'static str, Statement>>,
}

impl PgConn {
    /// Marks this connection unusable: the pool closes it instead of handing it out.
    pub fn poison(&self) {
        self.poisoned
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `sql` prepared on this connection (once; later calls reuse it).
    pub async fn stmt(&self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.cache.lock().get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        self.cache.lock().insert(sql, s.clone());
        Ok(s)
    }
}

/// Statement texts, kept beside the manager that prepares them.
pub mod sql {
    /// `created_at` comes from the server (its clock made the UUIDv7 id too), so the
    /// executor can render a request's status answer without reading it back. Each row
    /// is pinned to a workflow version: the one it names (`$9` > 0), else the latest as
    /// this statement sees it, whatever this instance's memory says (another instance may
    /// have stored a newer one). The statement answers the latest version of each of the
    /// batch's workflows in the same snapshot, i.e. the versions the rows got.
    pub const INSERT_REQUESTS: &str = concat!(
        "WITH ",
        crate::store::sql::batch_versions!("$2"),
        ", ins AS (INSERT INTO service_requests \
        (id, workflow_name, payload, headers, lease_owner, lease_until, created_at, workflow_version) \
        SELECT t.id, t.wf, t.payload, t.headers, ",
        crate::store::sql::fresh_lease!("$3", "$4"),
        ", t.created, ",
        crate::store::sql::pinned_version!(),
        // One array of rows (migration 15's type), not an array per column; `$2` is
        // their workflows' names, for `v`.
        " FROM UNNEST($1::new_request[]) AS t LEFT JOIN v ON v.name = t.wf) \
        SELECT name, version FROM v"
    );
}

/// Opens connections with the server's session settings and prepares the hot statements.
pub struct PgManager {
    inner: PostgresConnectionManager<NoTls>,
}

impl bb8::ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgConn, Self::Error> {
        let client = self.inner.connect().await?;
        let insert_requests = client.prepare(sql::INSERT_REQUESTS).await?;
        Ok(PgConn {
            client,
            insert_requests,
            poisoned: Default::default(),
            cache: Default::default(),
        })
    }

    /// Run at every checkout, so it makes no round trip: a connection the database or the
    /// network closed is known here already (its task has ended), and only such a one is
    /// refused (querying it fails at once, with the reason). Without this, after an outage
    /// the pool handed out its dead idle connections one by one, each failing a request
    /// (a batch answered 503) after the database was back.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), Self::Error> {
        if conn.client.is_closed() {
            conn.client.simple_query("").await.map(|_| ())
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.client.is_closed() || conn.poisoned.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The pool type every runtime holds.
pub type Pool = bb8::Pool<PgManager>;

/// The driver configuration for `config`: session settings that bound every statement,
/// so a stalled database cannot hold a request (or a batch) forever.
pub fn pg_config(config: &Config) -> tokio_postgres::Config {
    let mut pg: tokio_postgres::Config = config
        .database_url
        .parse()
        .expect("database URL was validated at startup");
    let timeout_ms = config.flush_timeout.as_millis();
    pg.application_name("clamp")
        .connect_timeout(config.db_connect_timeout)
        .keepalives_idle(Duration::from_secs(30))
        // enable_seqscan = off: every statement of ours is a key lookup or an index range,
        // but prepared statements keep a generic plan made while the tables were small,
        // and those joined the batch inputs to whole-table scans: 1,207 sequential scans
        // reading 25M rows in 20 s at 3,000 requests/s, until the next ANALYZE. Off, the
        // planner takes the index whenever there is one (perf/runs/2026-11-30-vm/seqscan.md).
        // timezone=UTC: timestamps render the same whichever server they come from, and
        // the same as the executor renders them from memory (`store::status`).
        .options(format!(
            "-c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={} \
             -c enable_seqscan=off -c timezone=UTC",
            timeout_ms * 2
        ));
    pg
}

/// Builds a pool; connections are opened lazily and re-opened after outages.
/// Must be called inside the runtime that will use it (connection tasks spawn there).
pub fn build(config: &Config, size: u32) -> Pool {
    let manager = PgManager {
        inner: PostgresConnectionManager::new(pg_config(config), NoTls),
    };
    bb8::Pool::builder()
        .max_size(size)
        .min_idle(Some(1))
        // `is_valid` is a local check (no round trip), so every checkout can afford it.
        .test_on_check_out(true)
        .connection_timeout(config.db_connect_timeout)
        .retry_connection(false)
        .build_unchecked(manager)
}

/// True when a connection can be had and the database answers a query now.
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(conn) => conn.client.simple_query("SELECT 1").await.is_ok(),
        Err(_) => false,
    }
}
