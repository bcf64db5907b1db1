//! Postgres: the connection pool, embedded migrations, the bounded write-behind buffer
//! and its flusher, and the queries the HTTP handlers and the engine run.

pub mod buffer;
pub mod migrate;
pub mod pool;
pub mod queries;
pub mod raw_json;
pub mod retention;

pub use buffer::{AckError, PendingRow, WriteBuffer};
pub use pool::{PgConn, Pool};

/// A failure talking to Postgres, as the request path sees it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Postgres is unreachable, too slow, or refused the work: the client should retry (503).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A unique constraint was violated (409).
    #[error("conflict")]
    Conflict,
    /// The data was refused by Postgres (400).
    #[error("invalid data: {0}")]
    Invalid(String),
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        classify(&e)
    }
}

impl<E: std::fmt::Display + std::fmt::Debug> From<bb8::RunError<E>> for StoreError {
    fn from(e: bb8::RunError<E>) -> Self {
        match e {
            bb8::RunError::User(e) => StoreError::Unavailable(e.to_string()),
            bb8::RunError::TimedOut => {
                StoreError::Unavailable("timed out waiting for a connection".into())
            }
        }
    }
}

/// Maps a driver error to what it means for the client.
pub fn classify(e: &tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    match e.code() {
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => StoreError::Conflict,
        // Class 22 is "data exception": the row itself is bad, retrying will not help.
        Some(c) if c.code().starts_with("22") => StoreError::Invalid(
            e.as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string()),
        ),
        _ => StoreError::Unavailable(e.to_string()),
    }
}
