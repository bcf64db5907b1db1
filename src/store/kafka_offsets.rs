//! Where the Kafka response consumer is in each partition: the offset of the next record
//! to apply, advanced only after the responses before it have committed.

use super::{PgConn, StoreError};

pub async fn get(conn: &PgConn, topic: &str, partition: i32) -> Result<Option<i64>, StoreError> {
    let stmt = conn
        .stmt("SELECT next_offset FROM kafka_offsets WHERE topic = $1 AND partition = $2")
        .await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&topic, &partition])
        .await?
        .map(|r| r.get(0)))
}

pub async fn set(conn: &PgConn, topic: &str, partition: i32, next: i64) -> Result<(), StoreError> {
    let stmt = conn
        .stmt(
            "INSERT INTO kafka_offsets (topic, partition, next_offset) VALUES ($1, $2, $3) \
             ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, \
             updated_at = now()",
        )
        .await?;
    conn.client
        .execute(&stmt, &[&topic, &partition, &next])
        .await?;
    Ok(())
}
