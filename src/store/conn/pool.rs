//! The per-runtime connection pool: bb8 over `connect::PgConnector` (one deadline per
//! host, TLS as libpq means it, guarded connections), with the hot statements prepared
//! once per connection.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::connect::PgConnector;
use crate::config::Config;

/// Statements aimed at single partition sets kept per connection, at most.
const LEAF_STATEMENTS: usize = 256;

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
    /// Statements aimed at one partition set (`stmt_in`), by statement and set.
    leaf_cache:
        parking_lot::Mutex<std::collections::HashMap<(usize, std::sync::Arc<str>), Statement>>,
    /// Which host of the URL it is connected to, and when it was opened (on that
    /// host's clock): a connection older than the host's last silence is dropped.
    host: usize,
    opened_ms: u64,
    connector: Arc<PgConnector>,
}

impl PgConn {
    /// Marks this connection unusable: the pool closes it instead of handing it out.
    pub fn poison(&self) {
        self.poisoned
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Asks the server to cancel what this connection is running (after a client-side
    /// timeout), on a connection of its own; run it on a task of its own.
    pub fn cancel(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (token, host, connector) = (
            self.client.cancel_token(),
            self.host,
            self.connector.clone(),
        );
        async move { connector.cancel(token, host).await }
    }

    /// One transaction in one round trip: BEGIN, `setup` (simple statements said first,
    /// such as a `SET LOCAL`), `lock` (a statement with its parameters), `stmt` with
    /// `params`, COMMIT, sent together. Postgres runs them in order, so `stmt`'s snapshot
    /// is taken once the lock is held. Should anything fail, the transaction is aborted
    /// and the COMMIT already sent ends it as a rollback; the connection is left outside
    /// a transaction. `stmt`'s rows.
    pub async fn in_one_trip(
        &self,
        setup: &[&str],
        lock: Option<(&Statement, &[&(dyn ToSql + Sync)])>,
        stmt: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let c = &self.client;
        // Each future sends its message when first polled, and `try_join!` polls them in
        // order (the setup's, in theirs, as `try_join_all` polls its futures).
        let setup =
            futures_util::future::try_join_all(setup.iter().map(|sql| c.batch_execute(sql)));
        let lock = async {
            match lock {
                Some((lock, params)) => c.execute(lock, params).await.map(drop),
                None => Ok(()),
            }
        };
        let (_, _, _, rows, _) = futures_util::try_join!(
            c.batch_execute(sql::BEGIN),
            setup,
            lock,
            c.query(stmt, params),
            c.batch_execute(sql::COMMIT),
        )?;
        Ok(rows)
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

    /// The request tables' partition sets as this process last saw them.
    pub fn partitions(&self) -> &super::partitions::PartitionMap {
        self.connector.partitions()
    }

    /// `sql` aimed at the partitions of set `suffix` (`partitions::leaf_sql`), prepared
    /// once per set on this connection; `sql` itself when no set is given.
    pub async fn stmt_in(
        &self,
        sql: &'static str,
        suffix: Option<&std::sync::Arc<str>>,
    ) -> Result<Statement, tokio_postgres::Error> {
        let Some(suffix) = suffix else {
            return self.stmt(sql).await;
        };
        let key = (sql.as_ptr() as usize, suffix.clone());
        if let Some(s) = self.leaf_cache.lock().get(&key) {
            return Ok(s.clone());
        }
        let s = self
            .client
            .prepare(&super::partitions::leaf_sql(sql, suffix))
            .await?;
        let mut cache = self.leaf_cache.lock();
        // Sets come and go: the statements of those gone are let go with the rest.
        if cache.len() >= LEAF_STATEMENTS {
            cache.clear();
        }
        cache.insert(key, s.clone());
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
        (id, workflow_name, payload, headers, lease_owner, lease_until, created_at, workflow_version, \
        deadline, priority, labels, notify) \
        SELECT t.id, t.wf, t.payload, t.headers, ",
        crate::store::sql::fresh_lease!("$3", "$4"),
        ", t.created, ",
        crate::store::sql::pinned_version!(),
        ", ",
        crate::store::sql::new_deadline!(),
        ", t.priority, t.labels, t.notify",
        // One array of rows (migration 15's type), not an array per column; `$2` is
        // their workflows' names, for `v`.
        " FROM UNNEST($1::new_request[]) AS t LEFT JOIN v ON v.name = t.wf) \
        SELECT name, version FROM v"
    );

    /// An empty query: on a connection whose task has ended it fails at once, with the
    /// reason, and it is sent on no other.
    pub const EMPTY: &str = "";

    /// Whether the database answers now (readiness).
    pub const PING: &str = "SELECT 1";

    /// The session setting of the looks' connections (`build_looks`).
    pub const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

    /// A transaction sent with its statements (`PgConn::in_one_trip`).
    pub const BEGIN: &str = "BEGIN";
    pub const COMMIT: &str = "COMMIT";
}

/// Opens connections with the server's session settings and prepares the hot statements.
pub struct PgManager {
    connector: Arc<PgConnector>,
    /// How long a connection may hear nothing after sending a statement (`watchdog`).
    guard: Duration,
    /// Generic plans only (`build_looks`).
    generic: bool,
}

/// Why a pooled connection could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Connect(#[from] super::connect::ConnectError),
    #[error(transparent)]
    Pg(#[from] tokio_postgres::Error),
    #[error("its host fell silent after it was opened")]
    Outlived,
}

impl bb8::ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = PoolError;

    async fn connect(&self) -> Result<PgConn, Self::Error> {
        let c = self.connector.connect(Some(self.guard)).await?;
        if self.generic {
            c.client.simple_query(sql::GENERIC_PLANS).await?;
        }
        let insert_requests = c.client.prepare(sql::INSERT_REQUESTS).await?;
        Ok(PgConn {
            client: c.client,
            insert_requests,
            poisoned: Default::default(),
            cache: Default::default(),
            leaf_cache: Default::default(),
            host: c.host,
            opened_ms: c.opened_ms,
            connector: self.connector.clone(),
        })
    }

    /// Run at every checkout, so it makes no round trip: a connection the database or the
    /// network closed is known here already (its task has ended), and only such a one is
    /// refused (querying it fails at once, with the reason). Without this, after an outage
    /// the pool handed out its dead idle connections one by one, each failing a request
    /// (a batch answered 503) after the database was back.
    /// A connection to a host that has since been found silent (a frozen server) is
    /// refused too, so one timeout clears them all rather than one timeout each.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), Self::Error> {
        if conn.client.is_closed() {
            conn.client.simple_query(sql::EMPTY).await?;
        }
        if self.connector.outlived(conn.host, conn.opened_ms) {
            conn.poison();
            return Err(PoolError::Outlived);
        }
        Ok(())
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.client.is_closed()
            || conn.poisoned.load(std::sync::atomic::Ordering::Relaxed)
            || self.connector.outlived(conn.host, conn.opened_ms)
    }
}

/// The pool type every runtime holds.
pub type Pool = bb8::Pool<PgManager>;

/// How long a pooled connection may hear nothing back after sending a statement:
/// past the statement timeout, which a live server enforces itself.
pub fn guard(config: &Config) -> Duration {
    config.flush_timeout + Duration::from_secs(1)
}

/// Builds a pool; connections are opened lazily and re-opened after outages.
/// Must be called inside the runtime that will use it (connection tasks spawn there).
pub fn build(connector: Arc<PgConnector>, config: &Config, size: u32) -> Pool {
    builder(connector, config, size, false)
}

/// Connections of a runtime's sweeper and timers for their looks: the statements that
/// read every partition for what is due (the claim, overdue answers and deadlines, untold
/// children, due joins, the outbox, waiting keys). Nothing prunes such a statement when it
/// is planned, so Postgres's default (a custom plan for each of its first five runs on a
/// connection, and for every run after while the generic plan's estimate stays dearer,
/// as a `LIMIT $n` makes it) plans it over every partition and each of their indexes,
/// again and again: 13 ms a plan of the claim with seven sets, 1.6 s of Postgres's CPU in
/// the first 14 s of a server's life under load (`perf/runs/2026-12-07-vm/`). Here each
/// is planned once per connection, generically, and the few connections keep those plans.
pub fn build_looks(connector: Arc<PgConnector>, config: &Config) -> Pool {
    builder(connector, config, LOOKS_SIZE, true)
}

/// Connections of a runtime's looks: its sweeper's claims and the timers' looks take
/// turns on them (each look is one short statement).
const LOOKS_SIZE: u32 = 2;

fn builder(connector: Arc<PgConnector>, config: &Config, size: u32, generic: bool) -> Pool {
    let manager = PgManager {
        connector,
        guard: guard(config),
        generic,
    };
    bb8::Pool::builder()
        .max_size(size)
        .min_idle(Some(1))
        // `is_valid` makes no round trip for a live connection, so every checkout can afford it.
        .test_on_check_out(true)
        .connection_timeout(config.db_connect_timeout)
        .retry_connection(false)
        .build_unchecked(manager)
}

/// True when a connection can be had and the database answers a query now.
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(conn) => conn.client.simple_query(sql::PING).await.is_ok(),
        Err(_) => false,
    }
}
