//! Postgres: the connection pool, embedded migrations, the bounded write-behind buffer
//! and its flusher, and the queries the HTTP handlers and the engine run.
//!
//! Each statement is a named const of the file that runs it; `statements.rs` lists them
//! all, and `statements.sql` holds them expanded (kept current by a unit test), beside
//! `schema.sql`, the schema the migrations build (kept current by `tests/it/schema.rs`).

pub(crate) mod audit;
pub(crate) mod cancel;
pub(crate) mod children;
pub(crate) mod compensations;
pub mod conn;
pub(crate) mod dead_letters;
pub(crate) mod deadlines;
pub(crate) mod events;
pub(crate) mod fan;
pub mod housekeeping;
pub(crate) mod intake;
pub(crate) mod kafka_offsets;
pub mod keeper;
pub(crate) mod lanes;
pub(crate) mod leases;
pub(crate) mod notifications;
pub mod partitions;
pub(crate) mod pauses;
pub(crate) mod queries;
pub(crate) mod raw_json;
pub(crate) mod reader;
pub(crate) mod rerun;
pub mod retention;
pub(crate) mod retry;
pub(crate) mod schedules;
pub(crate) mod search;
pub(crate) mod sessions;
pub(crate) mod slots;
mod sql;
pub mod statements;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod step_responses;
pub(crate) mod transitions;
pub(crate) mod triggers;
pub mod workflow_map;

use std::sync::Arc;

pub(crate) use conn::pool;
pub use conn::{connect, migrate};
pub(crate) use intake::{budget, buffer, delayed, idempotency};

pub use buffer::{AckError, Created, PendingRow, WriteBuffer};
pub use pool::{PgConn, Pool};
pub use workflow_map::{LoadError, WorkflowMap};

/// What the store's functions return.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A failure talking to Postgres, as the request path and the engine see it. Every
/// variant has a class: `Unavailable` is transient (the same work can succeed later);
/// the others are permanent (trying again changes nothing). Each keeps the error it came
/// from, when there was one, as its `source` (shared, so a batch's failure can be handed
/// to each of its rows).
#[derive(Debug, Clone)]
pub enum StoreError {
    /// Postgres is unreachable, too slow, restarting, or gave up on the statement for a
    /// reason of its own (timeout, serialization failure, deadlock): retry (503).
    Unavailable(Cause),
    /// A unique constraint was violated (409).
    Conflict,
    /// The data was refused by Postgres (400).
    Invalid(Cause),
    /// Postgres refused the statement itself (a missing table, a bug): retrying the same
    /// statement cannot help (500).
    Internal(Cause),
}

/// What a `StoreError` says, and the error it came from.
#[derive(Debug, Clone)]
pub struct Cause {
    text: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// A cause with the error it came from (its text is `text`).
    pub fn of(text: String, source: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause {
            text,
            source: Some(Arc::new(source)),
        }
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Cause {
        Cause { text, source: None }
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Cause {
        text.to_string().into()
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(c) => write!(f, "database unavailable: {c}"),
            StoreError::Conflict => f.write_str("conflict"),
            StoreError::Invalid(c) => write!(f, "invalid data: {c}"),
            StoreError::Internal(c) => write!(f, "database error: {c}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unavailable(c) | StoreError::Invalid(c) | StoreError::Internal(c) => c
                .source
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            StoreError::Conflict => None,
        }
    }
}

impl StoreError {
    /// True when the same work may succeed if tried again later.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// A transient failure that no other error caused (a timeout of our own, a shutdown).
    pub fn unavailable(text: impl Into<Cause>) -> StoreError {
        StoreError::Unavailable(text.into())
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        classify(e)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<bb8::RunError<E>> for StoreError {
    fn from(e: bb8::RunError<E>) -> Self {
        match e {
            bb8::RunError::User(e) => StoreError::Unavailable(Cause::of(e.to_string(), e)),
            bb8::RunError::TimedOut => {
                StoreError::unavailable("timed out waiting for a connection")
            }
        }
    }
}

/// SQLSTATE classes that mean "not now" rather than "never": connection exceptions (08),
/// transaction rollbacks such as serialization failures and deadlocks (40), insufficient
/// resources (53), operator intervention such as a cancelled or timed-out statement or a
/// server shutting down or starting up (57), and system errors (58).
const TRANSIENT_CLASSES: [&str; 5] = ["08", "40", "53", "57", "58"];

/// SQLSTATEs outside those classes that are transient too: a lock not available (55P03),
/// an idle transaction that timed out (25P03), an object in use (55006).
const TRANSIENT_CODES: [&str; 3] = ["55P03", "25P03", "55006"];

/// Maps a driver error to what it means: errors without a SQLSTATE are the connection's
/// (closed, reset, timed out) and transient; the rest by their SQLSTATE.
pub fn classify(e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    let Some(code) = e.code().cloned() else {
        // No SQLSTATE: the connection's trouble (closed, reset, timed out: transient), or
        // the client's own (a parameter that does not serialize: a bug, permanent).
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        let text = e.to_string();
        let transient =
            e.is_closed() || io || text.contains("timeout") || text.contains("timed out");
        let cause = Cause::of(text, e);
        return if transient {
            StoreError::Unavailable(cause)
        } else {
            StoreError::Internal(cause)
        };
    };
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string());
    let c = code.code();
    if code == SqlState::UNIQUE_VIOLATION {
        StoreError::Conflict
    } else if TRANSIENT_CLASSES.iter().any(|k| c.starts_with(k)) || TRANSIENT_CODES.contains(&c) {
        StoreError::Unavailable(Cause::of(e.to_string(), e))
    } else if c.starts_with("22") || c.starts_with("23") {
        // Data exceptions and integrity violations: the row itself is bad.
        StoreError::Invalid(Cause::of(message, e))
    } else {
        StoreError::Internal(Cause::of(format!("{c}: {message}"), e))
    }
}
