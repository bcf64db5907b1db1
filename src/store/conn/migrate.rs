//! Embedded migrations, applied at startup: idempotently, and under an advisory lock so
//! several instances starting at once serialize instead of racing. Also creates the
//! database itself when it does not exist yet.

use tokio_postgres::Client;

use super::connect::{ConnectError, PgConnector};

/// Every migration, in order. A version is never edited once released; add a new one.
/// (Version 5 was made a no-op when version 6 undid it: a database that applied 5 is
/// converted by 6, and a new one has nothing to undo.)
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../migrations/0001_init.sql")),
    (2, include_str!("../migrations/0002_kafka_offsets.sql")),
    (3, include_str!("../migrations/0003_step_attempts.sql")),
    (4, include_str!("../migrations/0004_idempotency_keys.sql")),
    (5, include_str!("../migrations/0005_superseded.sql")),
    (
        6,
        include_str!("../migrations/0006_one_row_per_request.sql"),
    ),
    (7, include_str!("../migrations/0007_fillfactor_50.sql")),
    (8, include_str!("../migrations/0008_retries.sql")),
    (
        9,
        include_str!("../migrations/0009_failed_and_cancelled.sql"),
    ),
    (10, include_str!("../migrations/0010_reruns.sql")),
    (11, include_str!("../migrations/0011_workflow_versions.sql")),
    (12, include_str!("../migrations/0012_child_workflows.sql")),
    (13, include_str!("../migrations/0013_delayed_start.sql")),
    (14, include_str!("../migrations/0014_schedules.sql")),
    (15, include_str!("../migrations/0015_row_types.sql")),
    (16, include_str!("../migrations/0016_index_room.sql")),
    (17, include_str!("../migrations/0017_fan_out.sql")),
    (18, include_str!("../migrations/0018_answer_due.sql")),
    (19, include_str!("../migrations/0019_events.sql")),
    (20, include_str!("../migrations/0020_request_deadlines.sql")),
    (21, include_str!("../migrations/0021_audit.sql")),
    (22, include_str!("../migrations/0022_concurrency.sql")),
    (23, include_str!("../migrations/0023_priorities.sql")),
    (
        24,
        include_str!("../migrations/0024_sessions_and_event_takes.sql"),
    ),
    (25, include_str!("../migrations/0025_partitions.sql")),
    (26, include_str!("../migrations/0026_labels.sql")),
    (27, include_str!("../migrations/0027_triggers.sql")),
    (28, include_str!("../migrations/0028_notifications.sql")),
    (29, include_str!("../migrations/0029_workflow_pauses.sql")),
    (30, include_str!("../migrations/0030_switch.sql")),
    (31, include_str!("../migrations/0031_loop.sql")),
    (
        32,
        include_str!("../migrations/0032_one_order_for_every_wait.sql"),
    ),
    (
        33,
        include_str!("../migrations/0033_fan_held_has_a_parent.sql"),
    ),
    (
        34,
        include_str!("../migrations/0034_slots_of_their_own.sql"),
    ),
    (
        35,
        include_str!("../migrations/0035_finishes_free_their_slots.sql"),
    ),
    (
        36,
        include_str!("../migrations/0036_statements_keep_their_slots.sql"),
    ),
];

/// An arbitrary constant identifying this server's migration lock.
const MIGRATION_LOCK_KEY: i64 = 0x636c_616d_7000_0001;

/// Why startup could not prepare the database.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot connect to Postgres: {0}")]
    Connect(#[source] ConnectError),
    #[error("cannot create database {db}: {source}")]
    CreateDb {
        db: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("migration {version} failed: {source}")]
    Apply {
        version: i32,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A connection without a guard: a migration's statement may take long on a big table.
async fn connect(db: &PgConnector) -> Result<Client, ConnectError> {
    db.connect(None).await.map(|c| c.client)
}

/// Connects to the configured database, creating it first if Postgres says it does not exist.
pub async fn connect_or_create(db: &PgConnector) -> Result<Client, MigrateError> {
    match connect(db).await {
        Ok(c) => Ok(c),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_CATALOG_NAME) => {
            let name = db.dbname().unwrap_or("clamp").to_string();
            let admin = db.for_dbname("postgres");
            let client = connect(&admin).await.map_err(MigrateError::Connect)?;
            let stmt = create_database(name.replace('"', "\"\""));
            match client.batch_execute(&stmt).await {
                Ok(()) => {}
                // Another instance created it first.
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {}
                Err(source) => return Err(MigrateError::CreateDb { db: name, source }),
            }
            tracing::info!(database = %name, "created database");
            connect(db).await.map_err(MigrateError::Connect)
        }
        Err(e) => Err(MigrateError::Connect(e)),
    }
}

/// The migrations' lock, taken by the transaction that applies them.
pub(in crate::store) const LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// The ledger of applied migrations.
pub(in crate::store) const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now())";

/// The statement timeout of the migration transaction (bounded, so a hung database
/// still fails startup).
pub(in crate::store) const MIGRATION_TIMEOUT: &str = "SET LOCAL statement_timeout = '15min'";

pub(in crate::store) const APPLIED: &str = "SELECT version FROM schema_migrations";

pub(in crate::store) const RECORD: &str = "INSERT INTO schema_migrations (version) VALUES ($1)";

/// Creates the configured database: the one statement with a name in its text (quoted,
/// its quotes doubled by the caller), so it is a template in `statements.sql`.
pub(in crate::store) fn create_database(quoted_name: impl std::fmt::Display) -> String {
    format!("CREATE DATABASE \"{quoted_name}\"")
}

/// Applies every migration not applied yet; returns how many were applied now.
pub async fn run(client: &mut Client) -> Result<usize, MigrateError> {
    run_to(client, i32::MAX).await
}

/// Applies the migrations not applied yet up to `last` (a database as an earlier release
/// left it, for the tests of upgrades); returns how many were applied now.
pub async fn run_to(client: &mut Client, last: i32) -> Result<usize, MigrateError> {
    let apply = |version: i32| move |source| MigrateError::Apply { version, source };
    let tx = client.transaction().await.map_err(apply(0))?;
    // A migration is not a request: building an index of a large table, or waiting for
    // another instance's migration, takes longer than the session's statement timeout
    // (the flush timeout, seconds), which would fail startup on a busy or large database.
    tx.batch_execute(MIGRATION_TIMEOUT)
        .await
        .map_err(apply(0))?;
    // Transaction-scoped: released at commit or rollback, even if this process dies.
    tx.execute(LOCK, &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(apply(0))?;
    tx.batch_execute(CREATE_LEDGER).await.map_err(apply(0))?;
    let done: Vec<i32> = tx
        .query(APPLIED, &[])
        .await
        .map_err(apply(0))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut n_applied = 0;
    for (version, sql) in MIGRATIONS {
        if done.contains(version) || *version > last {
            continue;
        }
        tx.batch_execute(sql).await.map_err(apply(*version))?;
        tx.execute(RECORD, &[version])
            .await
            .map_err(apply(*version))?;
        n_applied += 1;
    }
    tx.commit().await.map_err(apply(0))?;
    Ok(n_applied)
}
