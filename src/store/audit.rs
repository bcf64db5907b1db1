//! The audit trail (beyond Clamp): one row per change an operator made, written after the
//! change, read newest first (`ops::audit`).

use super::PgConn;
use super::Result;

/// `$1` actor, `$2` action, `$3` target, `$4` outcome.
pub(super) const RECORD: &str =
    "INSERT INTO audit_log (actor, action, target, outcome) VALUES ($1, $2, $3, $4)";

/// `$1` before this id (0: from the newest), `$2` how many.
pub(super) const LIST: &str = "SELECT id, to_json(at) #>> '{}', actor, action, target, outcome \
     FROM audit_log WHERE $1::bigint = 0 OR id < $1 ORDER BY id DESC LIMIT $2";

/// One change, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: i64,
    /// When, as Postgres renders a timestamptz in JSON (UTC).
    pub at: String,
    /// The token's name (`anonymous` with tokens off).
    pub actor: String,
    pub action: String,
    pub target: String,
    /// `ok`, or the status and message it was refused with.
    pub outcome: String,
}

pub async fn record(
    conn: &PgConn,
    actor: &str,
    action: &str,
    target: &str,
    outcome: &str,
) -> Result<()> {
    let stmt = conn.stmt(RECORD).await?;
    conn.client
        .execute(&stmt, &[&actor, &action, &target, &outcome])
        .await?;
    Ok(())
}

pub async fn list(conn: &PgConn, before: i64, limit: i64) -> Result<Vec<Entry>> {
    let stmt = conn.stmt(LIST).await?;
    Ok(conn
        .client
        .query(&stmt, &[&before, &limit])
        .await?
        .iter()
        .map(|r| Entry {
            id: r.get(0),
            at: r.get(1),
            actor: r.get(2),
            action: r.get(3),
            target: r.get(4),
            outcome: r.get(5),
        })
        .collect())
}
