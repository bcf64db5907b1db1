//! Step responses consumed from Kafka that can never apply, kept with the reason so the
//! consumer can move past them without losing them (AMQP parks them on `<queue>.dead`).

use super::PgConn;
use super::Result;

/// Where a dead letter came from.
pub struct Origin<'a> {
    pub source: &'static str,
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

pub(super) const INSERT: &str =
    "INSERT INTO dead_letters (source, topic, partition, record_offset, body, reason) \
     VALUES ($1, $2, $3, $4, $5, $6)";

pub async fn insert(conn: &PgConn, origin: &Origin<'_>, body: &[u8], reason: &str) -> Result<()> {
    let stmt = conn.stmt(INSERT).await?;
    conn.client
        .execute(
            &stmt,
            &[
                &origin.source,
                &origin.topic,
                &origin.partition,
                &origin.offset,
                &body,
                &reason,
            ],
        )
        .await?;
    Ok(())
}
