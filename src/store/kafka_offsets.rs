//! Where the Kafka response consumer is in each partition: the offset of the next record
//! to apply, advanced only after the responses before it have committed.

use super::PgConn;
use super::Result;

pub(super) const GET: &str =
    "SELECT next_offset FROM kafka_offsets WHERE topic = $1 AND partition = $2";

pub(super) const SET: &str =
    "INSERT INTO kafka_offsets (topic, partition, next_offset) VALUES ($1, $2, $3) \
     ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, \
     updated_at = now()";

/// Takes a partition's lock if it is free (session-scoped: held until released or the
/// connection ends).
pub(super) const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1, $2)";

/// Gives a partition's lock back (another instance takes it at its next look).
pub(super) const UNLOCK: &str = "SELECT pg_advisory_unlock($1, $2)";

/// Says this connection reads the feed: a shared lock on its partition -1, which every
/// reader holds at once.
pub(super) const JOIN: &str = "SELECT pg_advisory_lock_shared($1, -1)";

/// How many connections read the feed (hold its partition -1). A two-key advisory lock
/// shows its first key as `classid` (the int4's bits as an oid) and its second as `objid`.
pub(super) const MEMBERS: &str = "SELECT count(*) FROM pg_locks \
     WHERE locktype = 'advisory' AND classid = ($1::int8 & 4294967295)::oid \
       AND objid = 4294967295::oid AND objsubid = 2 AND granted";

pub async fn get(conn: &PgConn, topic: &str, partition: i32) -> Result<Option<i64>> {
    let stmt = conn.stmt(GET).await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&topic, &partition])
        .await?
        .map(|r| r.get(0)))
}

pub async fn set(conn: &PgConn, topic: &str, partition: i32, next: i64) -> Result<()> {
    let stmt = conn.stmt(SET).await?;
    conn.client
        .execute(&stmt, &[&topic, &partition, &next])
        .await?;
    Ok(())
}

/// Partition locks (Postgres advisory locks) held by a dedicated connection: one instance
/// reads a partition at a time, and the locks go when the connection does.
pub struct PartitionLocks {
    client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl PartitionLocks {
    /// Opens the connection with the pool's session settings (statement_timeout above
    /// all, so a stalled database cannot hold a lock call forever).
    pub async fn connect(
        db: &super::connect::PgConnector,
        guard: std::time::Duration,
    ) -> Result<PartitionLocks> {
        let c = db
            .connect(Some(guard))
            .await
            .map_err(|e| super::StoreError::Unavailable(super::Cause::of(e.to_string(), e)))?;
        Ok(PartitionLocks {
            client: c.client,
            task: c.task,
        })
    }

    /// Takes the lock of (`key`, `partition`) if it is free; true when held now.
    pub async fn try_lock(&self, key: i32, partition: i32) -> Result<bool> {
        Ok(self
            .client
            .query_one(TRY_LOCK, &[&key, &partition])
            .await?
            .get(0))
    }

    /// Gives back the lock of (`key`, `partition`).
    pub async fn unlock(&self, key: i32, partition: i32) -> Result<()> {
        self.client.execute(UNLOCK, &[&key, &partition]).await?;
        Ok(())
    }

    /// Counts this connection among the readers of feed `key`.
    pub async fn join(&self, key: i32) -> Result<()> {
        self.client.execute(JOIN, &[&key]).await?;
        Ok(())
    }

    /// How many connections (instances) read feed `key` now, this one included.
    pub async fn members(&self, key: i32) -> Result<i64> {
        Ok(self
            .client
            .query_one(MEMBERS, &[&(key as i64)])
            .await?
            .get(0))
    }

    /// True once the connection is gone (and with it every lock it held).
    pub fn is_lost(&self) -> bool {
        self.task.is_finished()
    }
}
