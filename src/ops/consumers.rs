//! What the broker consumers keep in Postgres: the Kafka response consumer's place in
//! each partition (the offset of the next record to apply, moved only after the
//! responses before it committed), the locks that give each partition to one instance,
//! and the dead letters of responses that can never apply. The consumers reach it here,
//! as every carrier reaches the store: through ops.

use crate::state::App;
pub use crate::store::dead_letters::Origin;
pub use crate::store::kafka_offsets::PartitionLocks;
use crate::store::{dead_letters, kafka_offsets, Pool, StoreError};

/// The offset of the next record of `partition` to apply (None: never read).
pub async fn offset(pool: &Pool, topic: &str, partition: i32) -> Result<Option<i64>, StoreError> {
    let conn = pool.get().await.map_err(StoreError::from)?;
    kafka_offsets::get(&conn, topic, partition).await
}

/// Records that the records of `partition` before `next` are applied.
pub async fn set_offset(
    pool: &Pool,
    topic: &str,
    partition: i32,
    next: i64,
) -> Result<(), StoreError> {
    let conn = pool.get().await.map_err(StoreError::from)?;
    kafka_offsets::set(&conn, topic, partition, next).await
}

/// A connection of its own for the partition locks, with the pool's session guard.
pub async fn partition_locks(app: &App) -> Result<PartitionLocks, StoreError> {
    PartitionLocks::connect(&app.db, crate::store::pool::guard(&app.config)).await
}

/// Keeps a message that can never apply, with why, for an operator.
pub async fn dead_letter(
    pool: &Pool,
    origin: &Origin<'_>,
    body: &[u8],
    why: &str,
) -> Result<(), StoreError> {
    let conn = pool.get().await.map_err(StoreError::from)?;
    dead_letters::insert(&conn, origin, body, why).await
}
