//! Console sessions (beyond Clamp): a random id per sign-in, stored as its SHA-256 with
//! the digest of the token it was signed in with, so every instance knows a session and
//! reading the table signs no one in. A session is good while it has been seen within the
//! idle expiry and is younger than the absolute one; each use moves its idle expiry on.

use std::time::Duration;

use super::{PgConn, Result};

/// `$1` id hash, `$2` token digest.
pub(super) const CREATE: &str =
    "INSERT INTO console_sessions (id_hash, token_digest) VALUES ($1, $2)";

/// `$1` id hash, `$2` idle (ms), `$3` absolute (ms): a live session seen now, and the
/// digest of its token; no row when it expired or never was.
pub(super) const TOUCH: &str = "UPDATE console_sessions SET seen_at = now() \
     WHERE id_hash = $1 AND seen_at > now() - $2::float8 * interval '1 millisecond' \
       AND created_at > now() - $3::float8 * interval '1 millisecond' \
     RETURNING token_digest";

/// `$1` id hash.
pub(super) const END: &str = "DELETE FROM console_sessions WHERE id_hash = $1";

/// Stores a new session.
pub async fn create(conn: &PgConn, id_hash: &[u8], token_digest: &[u8]) -> Result<()> {
    let stmt = conn.stmt(CREATE).await?;
    conn.client
        .execute(&stmt, &[&id_hash, &token_digest])
        .await?;
    Ok(())
}

/// The token digest of a live session (and its idle expiry moved on), if it is one.
pub async fn touch(
    conn: &PgConn,
    id_hash: &[u8],
    idle: Duration,
    max: Duration,
) -> Result<Option<Vec<u8>>> {
    let stmt = conn.stmt(TOUCH).await?;
    let (idle, max) = (idle.as_secs_f64() * 1000.0, max.as_secs_f64() * 1000.0);
    Ok(conn
        .client
        .query_opt(&stmt, &[&id_hash, &idle, &max])
        .await?
        .map(|r| r.get(0)))
}

/// Ends a session.
pub async fn end(conn: &PgConn, id_hash: &[u8]) -> Result<()> {
    let stmt = conn.stmt(END).await?;
    conn.client.execute(&stmt, &[&id_hash]).await?;
    Ok(())
}
