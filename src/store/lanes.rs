//! The step records of a PARALLEL step's lanes (`engine::lanes`): read back when the step
//! runs again after a crash, a lost lease or a retry of its request, so that only the
//! branch steps without a final record are called again.

use uuid::Uuid;

use super::pool::PgConn;
use super::Result;
use crate::status::StepStatus;

/// The lanes' records of one fan-out step, in the order they were written (their ids
/// are `workflow::fan::lane_range`'s, so the read stays within the request's records).
pub(super) const RECORDS: &str = concat!(
    "SELECT st.step_id, st.status, ",
    crate::store::sql::step_request!("st", "r.payload"),
    ", st.response FROM steps_status st \
     JOIN service_requests r ON r.id = st.service_request_id \
     WHERE st.service_request_id = $1 AND st.step_id BETWEEN $2 AND $3 ORDER BY st.id"
);

/// One lane step's record.
pub struct LaneRecord {
    /// Its `steps_status.step_id` (`workflow::fan::lane_of` reads it).
    pub step_id: i32,
    pub status: StepStatus,
    pub request: Option<String>,
    pub response: Option<String>,
}

/// Every record of fan-out step `fan`'s lanes of request `id`, oldest first.
pub async fn records(conn: &PgConn, id: Uuid, fan: u32) -> Result<Vec<LaneRecord>> {
    let (low, high) = crate::workflow::fan::lane_range(fan);
    let stmt = conn.stmt(RECORDS).await?;
    let rows = conn.client.query(&stmt, &[&id, &low, &high]).await?;
    Ok(rows
        .iter()
        .map(|r| LaneRecord {
            step_id: r.get(0),
            status: r.get(1),
            request: r.get(2),
            response: r.get(3),
        })
        .collect())
}
