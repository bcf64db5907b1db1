//! Triggers (beyond Clamp) in Postgres: one row each, its definition as given.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;

use super::PgConn;
use super::Result;

/// A trigger's row.
#[derive(Debug, Clone)]
pub struct Stored {
    pub definition: Value,
    pub paused: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Stored {
    fn of(r: &Row) -> Stored {
        Stored {
            definition: r.get(0),
            paused: r.get(1),
            created_at: r.get(2),
            updated_at: r.get(3),
        }
    }
}

pub(super) const INSERT: &str = "\
INSERT INTO triggers (name, definition, paused) VALUES ($1, $2, $3)
RETURNING definition, paused, created_at, updated_at";

pub(super) const GET: &str =
    "SELECT definition, paused, created_at, updated_at FROM triggers WHERE name = $1";

pub(super) const LIST: &str =
    "SELECT definition, paused, created_at, updated_at FROM triggers ORDER BY name LIMIT $1";

/// `$3` NULL leaves `paused` as it was.
pub(super) const PUT: &str = "\
UPDATE triggers SET definition = $2, paused = coalesce($3, paused), updated_at = now()
WHERE name = $1
RETURNING definition, paused, created_at, updated_at";

pub(super) const DELETE: &str = "DELETE FROM triggers WHERE name = $1";

pub(super) const SET_PAUSED: &str = "\
UPDATE triggers SET paused = $2, updated_at = now() WHERE name = $1
RETURNING definition, paused, created_at, updated_at";

/// Stores a new trigger; `Conflict` when the name is taken.
pub async fn insert(conn: &PgConn, name: &str, definition: &Value, paused: bool) -> Result<Stored> {
    let stmt = conn.stmt(INSERT).await?;
    let row = conn
        .client
        .query_one(&stmt, &[&name, definition, &paused])
        .await?;
    Ok(Stored::of(&row))
}

pub async fn get(conn: &PgConn, name: &str) -> Result<Option<Stored>> {
    let stmt = conn.stmt(GET).await?;
    let row = conn.client.query_opt(&stmt, &[&name]).await?;
    Ok(row.as_ref().map(Stored::of))
}

pub async fn list(conn: &PgConn, limit: i64) -> Result<Vec<Stored>> {
    let stmt = conn.stmt(LIST).await?;
    let rows = conn.client.query(&stmt, &[&limit]).await?;
    Ok(rows.iter().map(Stored::of).collect())
}

/// Replaces a trigger's definition (and `paused`, when given); None for an unknown name.
pub async fn put(
    conn: &PgConn,
    name: &str,
    definition: &Value,
    paused: Option<bool>,
) -> Result<Option<Stored>> {
    let stmt = conn.stmt(PUT).await?;
    let row = conn
        .client
        .query_opt(&stmt, &[&name, definition, &paused])
        .await?;
    Ok(row.as_ref().map(Stored::of))
}

/// Whether it existed.
pub async fn delete(conn: &PgConn, name: &str) -> Result<bool> {
    let stmt = conn.stmt(DELETE).await?;
    Ok(conn.client.execute(&stmt, &[&name]).await? == 1)
}

/// Pauses or resumes a trigger; None for an unknown name.
pub async fn set_paused(conn: &PgConn, name: &str, paused: bool) -> Result<Option<Stored>> {
    let stmt = conn.stmt(SET_PAUSED).await?;
    let row = conn.client.query_opt(&stmt, &[&name, &paused]).await?;
    Ok(row.as_ref().map(Stored::of))
}
