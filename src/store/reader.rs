//! Batched status reads. Clients that poll send many small reads at once, and Postgres's
//! cost is mostly per statement: reads queued while a batch is in flight go together in
//! the next one (`WHERE id = ANY($1)`), as creates do through the write buffer. A read is
//! queued after its request arrived, so its batch's statement sees every write
//! acknowledged before that (read-your-writes across instances holds).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::status::RequestStatus;

use super::pool::{PgConn, Pool};
use super::status::{Head, StepRow};
use super::Result;
use super::StoreError;

/// What a read asks for: the request row alone, or with its step rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Row,
    Whole,
}

/// What a read found.
#[derive(Debug, Clone)]
pub struct Found {
    pub head: Head,
    /// The step rows (empty for `Want::Row`).
    pub steps: Vec<StepRow>,
    /// When the request finished, in ms since the epoch (None while it runs).
    pub finished_ms: Option<f64>,
}

type Answer = Result<Option<Found>>;

struct Pending {
    id: Uuid,
    want: Want,
    ack: oneshot::Sender<Answer>,
}

/// The handler side of a runtime's status reader.
#[derive(Clone)]
pub struct StatusReader {
    tx: mpsc::Sender<Pending>,
}

/// Most reads in one statement.
const MAX_BATCH: usize = 512;

/// Reads waiting for a batch, per runtime (beyond it a read waits for room).
const QUEUE: usize = 4096;

impl StatusReader {
    /// Starts a reader on the current runtime, with `concurrency` batches in flight.
    pub fn start(pool: Pool, concurrency: usize, hard_timeout: Duration) -> StatusReader {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, pool, concurrency.max(1), hard_timeout));
        StatusReader { tx }
    }

    /// Reads one request (None: there is no such request).
    pub async fn read(&self, id: Uuid, want: Want) -> Answer {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Pending { id, want, ack }).await.is_err() {
            return Err(StoreError::Unavailable("shutting down".into()));
        }
        done.await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("read dropped".into())))
    }
}

async fn run(rx: mpsc::Receiver<Pending>, pool: Pool, concurrency: usize, limit: Duration) {
    crate::batches::drain(rx, MAX_BATCH, concurrency, |batch: Vec<Pending>| {
        let pool = pool.clone();
        async move {
            let (rows, whole): (Vec<Pending>, Vec<Pending>) =
                batch.into_iter().partition(|p| p.want == Want::Row);
            let conn = match pool.get().await {
                Ok(c) => c,
                Err(e) => {
                    let e = StoreError::from(e);
                    for p in rows.into_iter().chain(whole) {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                    return;
                }
            };
            for (group, want) in [(rows, Want::Row), (whole, Want::Whole)] {
                if group.is_empty() {
                    continue;
                }
                let ids: Vec<Uuid> = group.iter().map(|p| p.id).collect();
                let found = match tokio::time::timeout(limit, fetch(&conn, &ids, want)).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Unavailable("status read timed out".into())),
                };
                match found {
                    Ok(mut found) => {
                        for p in group {
                            let _ = p.ack.send(Ok(found.remove(&p.id)));
                        }
                    }
                    Err(e) => {
                        for p in group {
                            let _ = p.ack.send(Err(e.clone()));
                        }
                    }
                }
            }
        }
    })
    .await
}

/// The requests of `ids` that exist, by id, in one statement.
async fn fetch(conn: &PgConn, ids: &[Uuid], want: Want) -> Result<HashMap<Uuid, Found>> {
    let sql = match want {
        Want::Row => super::status::GET_HEADS,
        Want::Whole => super::status::GET_WHOLE,
    };
    let mut out: HashMap<Uuid, Found> = HashMap::with_capacity(ids.len());
    // One statement per partition set the ids are in, aimed at its partitions.
    for (set, group) in conn.partitions().group(ids, |id| *id) {
        let rows = super::partitions::on_set(conn, sql, set.as_ref(), |stmt| {
            let group = &group;
            async move { conn.client.query(&stmt, &[group]).await }
        })
        .await?;
        collect(&rows, want, &mut out);
    }
    beyond_the_row(conn, &mut out).await?;
    Ok(out)
}

/// What the row alone does not say, looked up only for the few requests it concerns: a
/// PAUSED request at a fan-out step with a child that can proceed reads IN_PROGRESS, and
/// a request waiting for a slot says how many of its key wait before it.
async fn beyond_the_row(conn: &PgConn, out: &mut HashMap<Uuid, Found>) -> Result<()> {
    let paused: Vec<Uuid> = out
        .iter()
        .filter(|(_, f)| f.head.status == RequestStatus::Paused)
        .map(|(id, _)| *id)
        .collect();
    if !paused.is_empty() {
        let stmt = conn.stmt(super::status::PROCEEDING).await?;
        for r in conn.client.query(&stmt, &[&paused]).await? {
            if let Some(f) = out.get_mut(&r.get::<_, Uuid>(0)) {
                f.head.status = RequestStatus::InProgress;
            }
        }
    }
    for (id, f) in out.iter_mut() {
        let Some(key) = &f.head.concurrency_key else {
            continue;
        };
        let stmt = conn.stmt(super::status::SLOT_AHEAD).await?;
        let row = conn
            .client
            .query_one(
                &stmt,
                &[
                    &&*f.head.workflow_name,
                    key,
                    id,
                    &(f.head.priority.unwrap_or(5) as i32),
                ],
            )
            .await?;
        f.head.slot_ahead = Some(row.get(0));
    }
    Ok(())
}

/// Adds the requests in `rows` (a status statement's result) to `out`.
fn collect(rows: &[tokio_postgres::Row], want: Want, out: &mut HashMap<Uuid, Found>) {
    for r in rows {
        let id: Uuid = r.get("id");
        let f = out.entry(id).or_insert_with(|| Found {
            head: Head {
                workflow_name: r.get::<_, &str>("workflow_name").into(),
                workflow_version: r.get("workflow_version"),
                status: r.get("status"),
                current_step_id: r.get("current_step_id"),
                reason: r.get("reason"),
                created_at: r.get("created_at"),
                step_attempts: r.get("step_attempts"),
                last_error: r.get("last_error"),
                retry_at: r.get("retry_at"),
                start_at: r.get("start_at"),
                retries: r.get("retries"),
                rerun_of: r.get("rerun_of"),
                parent_id: r.get("parent_id"),
                fan_index: r.get("fan_index"),
                wait_event: r.get("wait_event"),
                wait_key: r.get("wait_key"),
                concurrency_key: r.get("concurrency_key"),
                slot_ahead: None,
                deadline: r.get("deadline"),
                priority: r.get("priority"),
            },
            steps: Vec::new(),
            finished_ms: r.get("request_finished_ms"),
        });
        if want == Want::Whole && r.get::<_, Option<i32>>("step_id").is_some() {
            f.steps.push(StepRow {
                step_id: r.get("step_id"),
                name: r.get::<_, &str>("step_name").into(),
                status: r.get("step_status"),
                request: r.get::<_, Option<String>>("request").map(Bytes::from),
                response: r.get::<_, Option<String>>("response").map(Bytes::from),
                time_taken_ms: r.get("time_taken_ms"),
                reason: r.get("step_reason"),
                started_ms: r.get("started_ms"),
                finished_ms: r.get("finished_ms"),
                child_id: r.get("child_id"),
                attempts: r.get("attempts"),
            });
        }
    }
}
