//! New service requests written with binary `COPY`, the create path's statement for
//! batches without idempotency keys.
//!
//! Postgres inserts `COPY` rows in multi-row heap batches (one WAL record per page of
//! rows, not one per row) and parses nothing: every value arrives in its binary form.
//! `INSERT … SELECT * FROM UNNEST(…)` builds and unpacks one array per column and inserts
//! row by row. COPY cannot evaluate expressions per row, so a fresh lease is stamped here
//! (`created_at` + the lease, both from this instance's clock, the clock that also made
//! the UUIDv7 id); leases are later renewed and compared on Postgres's clock, and the
//! lease is many seconds long, so only a clock off by as much matters.
//!
//! A `COPY` outside a transaction reports completion before its implicit commit, so the
//! batch runs as `BEGIN; COPY …; COMMIT`, sent without waiting between them, and answers
//! only after `COMMIT` returned.

use bytes::BytesMut;
use futures_util::pin_mut;
use postgres_types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use uuid::Uuid;

use super::buffer::PendingRow;
use super::pool::PgConn;
use super::raw_json::RawJson;
use super::Result;

/// The columns `copy_requests` writes, in order.
pub const COPY_REQUESTS: &str = "COPY service_requests \
    (id, workflow_name, payload, headers, lease_owner, lease_until, created_at) \
    FROM STDIN (FORMAT binary)";

const TYPES: [Type; 7] = [
    Type::UUID,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::UUID,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
];

/// Writes `rows` in one transaction; the first `n_leased` leased to `owner` for `lease_us`.
/// Returns once the transaction committed.
pub async fn copy_requests(
    conn: &PgConn,
    rows: &[PendingRow],
    n_leased: usize,
    owner: Option<Uuid>,
    lease_us: i64,
) -> Result<()> {
    let stmt = conn.stmt(COPY_REQUESTS).await?;
    // Sent in this order on the connection: BEGIN, then the COPY.
    let (begun, sink) = tokio::join!(
        conn.client.batch_execute("BEGIN"),
        conn.client.copy_in::<_, bytes::Bytes>(&stmt)
    );
    begun?;
    let copied = async {
        let writer = BinaryCopyInWriter::new(sink?, &TYPES);
        pin_mut!(writer);
        for (i, r) in rows.iter().enumerate() {
            let (lease_owner, lease_until) = match owner {
                Some(o) if i < n_leased => (Some(o), Timestamp(r.created_us + lease_us)),
                _ => (None, Timestamp::NEG_INFINITY),
            };
            writer
                .as_mut()
                .write(&[
                    &r.id,
                    &r.workflow.def.name.as_str(),
                    &RawJson(&r.payload),
                    &RawJson(&r.headers),
                    &lease_owner,
                    &lease_until,
                    &Timestamp(r.created_us),
                ])
                .await?;
        }
        // COMMIT follows the end of the COPY at once. After a failed COPY it only rolls
        // back (Postgres answers COMMIT in a failed transaction with ROLLBACK, not an
        // error), so the COPY's own result decides.
        let (copied, committed) = tokio::join!(
            writer.as_mut().finish(),
            conn.client.batch_execute("COMMIT")
        );
        copied?;
        committed
    }
    .await;
    if copied.is_err() && !conn.client.is_closed() {
        // A COPY abandoned before its end (the writer dropped) is failed by the driver;
        // end its transaction so the connection goes back to the pool idle. (After the
        // COMMIT above this is a no-op with a warning.)
        if conn.client.batch_execute("ROLLBACK").await.is_err() {
            conn.poison();
        }
    }
    copied.map_err(Into::into)
}

/// A `timestamptz` in microseconds since the Unix epoch, sent in its binary form.
#[derive(Debug, Clone, Copy)]
struct Timestamp(i64);

impl Timestamp {
    const NEG_INFINITY: Timestamp = Timestamp(i64::MIN);
    /// Microseconds from the Unix epoch to Postgres's (2000-01-01).
    const PG_EPOCH_US: i64 = 946_684_800_000_000;
}

impl ToSql for Timestamp {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let v = if self.0 == i64::MIN {
            i64::MIN
        } else {
            self.0 - Self::PG_EPOCH_US
        };
        out.extend_from_slice(&v.to_be_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }

    to_sql_checked!();
}
