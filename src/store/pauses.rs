//! Paused workflows (beyond Clamp) in Postgres: `workflow_pauses` says which workflows
//! are paused, for every instance (each reads it every second, `run`, into its `Pauses`);
//! an executor about to start a step of a paused workflow parks the request (`park`),
//! and a resume (`resume`) makes the parked requests claimable again (migration 29).
//!
//! A parked request's lease owner is the nil id (no instance has it), until a far time.
//!
//! A park and a resume meet on the pause's row: the park shares it (`FOR KEY SHARE`) and
//! parks only while it exists; the resume deletes it (waiting for every park that holds
//! it) and only then, in a second statement that sees those parks, frees the parked
//! requests. So a park that raced a resume either saw no pause (the step runs) or is
//! freed by it: none stays parked with its workflow resumed.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::watch;
use uuid::Uuid;

use super::{PgConn, Pool, Result};

/// How often each instance reads which workflows are paused.
const READ_EVERY: Duration = Duration::from_secs(1);

/// The workflows paused, as this process last read them (or changed them itself).
#[derive(Default)]
pub struct Pauses {
    /// Any workflow paused: the step loop's check is one atomic load while none is.
    any: AtomicBool,
    names: RwLock<Arc<HashSet<String>>>,
}

impl Pauses {
    /// Whether `workflow` is paused.
    #[inline]
    pub fn is(&self, workflow: &str) -> bool {
        self.any.load(Ordering::Relaxed) && self.names.read().contains(workflow)
    }

    /// Whether any workflow is paused.
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The paused workflows.
    pub fn names(&self) -> Arc<HashSet<String>> {
        self.names.read().clone()
    }

    fn set(&self, names: HashSet<String>) {
        let mut held = self.names.write();
        self.any.store(!names.is_empty(), Ordering::Relaxed);
        *held = Arc::new(names);
    }

    /// This process paused (`true`) or resumed `workflow`: known here at once.
    pub fn mark(&self, workflow: &str, paused: bool) {
        let mut names = (*self.names()).clone();
        if paused {
            names.insert(workflow.to_string());
        } else {
            names.remove(workflow);
        }
        self.set(names);
    }
}

/// A workflow's pause as stored.
#[derive(Debug, Clone)]
pub struct Pause {
    pub workflow: String,
    pub paused_at: String,
    pub paused_by: String,
}

pub(super) const LIST: &str = "\
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
ORDER BY workflow_name";

pub(super) const GET: &str = "\
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
WHERE workflow_name = $1";

/// `$1` workflow, `$2` who: the pause, new or as it was.
pub(super) const PAUSE: &str = "\
WITH made AS (
    INSERT INTO workflow_pauses (workflow_name, paused_by) VALUES ($1, $2)
    ON CONFLICT (workflow_name) DO NOTHING
    RETURNING workflow_name, paused_at, paused_by
)
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM made
UNION ALL
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
WHERE workflow_name = $1 AND NOT EXISTS (SELECT 1 FROM made)";

/// `$1` workflow: its pause deleted (waiting for the parks that hold it).
pub(super) const UNPAUSE: &str = "DELETE FROM workflow_pauses WHERE workflow_name = $1";

/// `$1` workflow: its parked requests claimable, at once and in creation order (the
/// claim's order), each where it was (a request under a concurrency limit keeps its slot).
/// The parked rows are the claim order's parked band (migration 32).
pub(super) const FREE: &str = concat!(
    "UPDATE service_requests SET lease_owner = NULL, lease_until = '-infinity'
WHERE workflow_name = $1 AND ",
    crate::store::sql::parked_rows!()
);

/// `$1` request, `$2` its lease owner, `$3` its workflow: parked, if it is still this
/// owner's and its workflow still paused. Answers (paused, parked).
pub(super) const PARK: &str = "\
WITH p AS (
    SELECT 1 FROM workflow_pauses WHERE workflow_name = $3 FOR KEY SHARE
), parked AS (
    UPDATE service_requests SET lease_owner = '00000000-0000-0000-0000-000000000000'::uuid,
                                lease_until = '9999-12-31 00:00:00+00'
    WHERE id = $1 AND lease_owner = $2 AND EXISTS (SELECT 1 FROM p)
    RETURNING 1
)
SELECT (SELECT count(*) FROM p), (SELECT count(*) FROM parked)";

/// Parked requests by workflow, for the gauge (the claim order's parked band).
pub(super) const PARKED_COUNTS: &str = concat!(
    "SELECT workflow_name, count(*) FROM service_requests WHERE ",
    crate::store::sql::parked_rows!(),
    " GROUP BY workflow_name"
);

fn pause_of(r: &tokio_postgres::Row) -> Pause {
    Pause {
        workflow: r.get(0),
        paused_at: r.get(1),
        paused_by: r.get(2),
    }
}

/// Every paused workflow.
pub async fn list(conn: &PgConn) -> Result<Vec<Pause>> {
    let stmt = conn.stmt(LIST).await?;
    Ok(conn
        .client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(pause_of)
        .collect())
}

/// The pause of `workflow`, if it is paused.
pub async fn get(conn: &PgConn, workflow: &str) -> Result<Option<Pause>> {
    let stmt = conn.stmt(GET).await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&workflow])
        .await?
        .as_ref()
        .map(pause_of))
}

/// Pauses `workflow` (a pause already made stays as it was); the pause.
pub async fn pause(conn: &PgConn, workflow: &str, who: &str) -> Result<Pause> {
    let stmt = conn.stmt(PAUSE).await?;
    Ok(pause_of(
        &conn.client.query_one(&stmt, &[&workflow, &who]).await?,
    ))
}

/// Resumes `workflow`: whether it was paused, and how many parked requests were freed.
pub async fn resume(conn: &mut PgConn, workflow: &str) -> Result<(bool, u64)> {
    let unpause = conn.stmt(UNPAUSE).await?;
    let free = conn.stmt(FREE).await?;
    let tx = conn.client.transaction().await?;
    let was = tx.execute(&unpause, &[&workflow]).await? > 0;
    // A second statement: its snapshot sees the parks the delete waited for.
    let freed = tx.execute(&free, &[&workflow]).await?;
    tx.commit().await?;
    Ok((was, freed))
}

/// How a park went.
#[derive(Debug, PartialEq, Eq)]
pub enum Parked {
    /// Parked: the request waits for its workflow's resume.
    Yes,
    /// The workflow is not paused (any more): the step runs.
    NotPaused,
    /// The request is no longer this owner's.
    Lost,
}

/// Parks request `id` (leased to `owner`) if `workflow` is still paused.
pub async fn park(conn: &PgConn, id: Uuid, owner: Uuid, workflow: &str) -> Result<Parked> {
    let stmt = conn.stmt(PARK).await?;
    let row = conn
        .client
        .query_one(&stmt, &[&id, &owner, &workflow])
        .await?;
    let (paused, parked): (i64, i64) = (row.get(0), row.get(1));
    Ok(match (paused, parked) {
        (0, _) => Parked::NotPaused,
        (_, 0) => Parked::Lost,
        _ => Parked::Yes,
    })
}

/// Parked requests by workflow.
pub async fn parked_counts(conn: &PgConn) -> Result<Vec<(String, i64)>> {
    let stmt = conn.stmt(PARKED_COUNTS).await?;
    Ok(conn
        .client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Reads the paused workflows into `pauses` every second until `stop` (a read that
/// fails leaves them as they were: the next one tries again).
pub async fn run(pool: Pool, pauses: Arc<Pauses>, mut stop: watch::Receiver<bool>) {
    loop {
        let read = async {
            let conn = pool.get().await.map_err(super::StoreError::from)?;
            list(&conn).await
        }
        .await;
        if let Ok(all) = read {
            pauses.set(all.into_iter().map(|p| p.workflow).collect());
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(READ_EVERY) => {}
        }
    }
}
