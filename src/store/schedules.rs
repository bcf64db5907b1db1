//! Schedules (beyond Clamp) in Postgres: their rows, their fires, and the runner's pass.
//!
//! A fire is one row of `schedule_fires`, keyed by schedule and fire time, and the
//! service request it starts is inserted by the same statement, only when the fire's row
//! was (`ON CONFLICT DO NOTHING`): however many instances run the pass, and however often
//! a pass is repeated after a crash, a fire time starts at most one request. The request
//! is stored unleased and runnable now (`lease_until = '-infinity'`), so the claim of any
//! instance takes it, as it takes a delayed create (`store::delayed`). A fire of a
//! workflow with a concurrency limit or a rate is stored waiting in its key's queue
//! (`store::slots`) instead, and admitted from there like any waiting create.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::{GenericClient, Row, Statement};
use uuid::Uuid;

use super::sql::derived_status;
use super::PgConn;
use super::Result;
use crate::workflow::schedule::{self, CompiledSchedule, Overlap};

/// A schedule's row.
#[derive(Debug)]
pub struct Stored {
    pub definition: Value,
    pub paused: bool,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One fire, as the reads show it.
#[derive(Debug)]
pub struct FireRow {
    pub fire_at: DateTime<Utc>,
    pub service_request_id: Option<Uuid>,
    /// The request's status as reads show it (None: no request, or retention deleted it).
    pub status: Option<crate::status::RequestStatus>,
    pub skipped: Option<String>,
}

/// What a fire did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// Its request was stored.
    Started,
    /// The schedule's previous run had not finished (`overlap: skip`): recorded, nothing started.
    Skipped,
    /// This fire time was made before (by another instance, or before a restart).
    Already,
}

pub(super) const INSERT: &str = "\
INSERT INTO schedules (name, definition, paused, next_fire_at)
VALUES ($1, $2, $3, CASE WHEN $3 THEN NULL ELSE $4::timestamptz END)
RETURNING definition, paused, next_fire_at, created_at, updated_at";

pub(super) const NOW: &str = "SELECT now()";

pub(super) const GET: &str = "\
SELECT definition, paused, next_fire_at, created_at, updated_at, now()
FROM schedules WHERE name = $1";

pub(super) const LIST: &str = "\
SELECT definition, paused, next_fire_at, created_at, updated_at
FROM schedules ORDER BY name LIMIT $1";

/// `$2` the definition, `$3` paused (NULL: as it is), `$4` the next fire time if it runs.
pub(super) const PUT: &str = "\
UPDATE schedules SET definition = $2, paused = coalesce($3, paused),
       next_fire_at = CASE WHEN coalesce($3, paused) THEN NULL ELSE $4::timestamptz END,
       updated_at = now()
WHERE name = $1
RETURNING definition, paused, next_fire_at, created_at, updated_at";

pub(super) const DELETE: &str = "DELETE FROM schedules WHERE name = $1";

pub(super) const PAUSE: &str =
    "UPDATE schedules SET paused = true, next_fire_at = NULL WHERE name = $1";

/// Only a paused schedule is resumed: resuming a running one changes nothing (it keeps
/// the fire time it waits for).
pub(super) const RESUME: &str =
    "UPDATE schedules SET paused = false, next_fire_at = $2 WHERE name = $1 AND paused";

pub(super) const LAST_FIRES: &str = concat!(
    "SELECT f.fire_at, f.service_request_id, ",
    derived_status!("r"),
    ", f.skipped
FROM schedule_fires f LEFT JOIN service_requests r ON r.id = f.service_request_id
WHERE f.schedule = $1 ORDER BY f.fire_at DESC LIMIT $2"
);

/// The latest `$2` fires of each of the schedules `$1`, with their requests' statuses.
pub(super) const LAST_FIRES_OF: &str = concat!(
    "SELECT f.schedule, f.fire_at, f.service_request_id, ",
    derived_status!("r"),
    ", f.skipped
FROM unnest($1::text[]) AS n(name)
CROSS JOIN LATERAL (SELECT * FROM schedule_fires
                    WHERE schedule = n.name ORDER BY fire_at DESC LIMIT $2) f
LEFT JOIN service_requests r ON r.id = f.service_request_id
ORDER BY f.schedule, f.fire_at DESC"
);

/// The schedules due now, locked for this pass; others' passes skip them.
pub(super) const DUE: &str = "\
SELECT name, definition, next_fire_at, now() FROM schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT $1
FOR UPDATE SKIP LOCKED";

pub(super) const SET_NEXT: &str = "UPDATE schedules SET next_fire_at = $2 WHERE name = $1";

/// One fire: `$1` schedule, `$2` fire time, `$3` the new request's id, `$4` workflow,
/// `$5` payload, `$6` created, `$7` the version named (0: the latest, stored as NULL when
/// it is 1, as `pinned_version!`), `$8` skip when the previous run is unfinished, `$9` the
/// concurrency key the request waits under (NULL: none; it is runnable at once), `$10` its
/// priority (NULL: the default), `$11` the final statuses its workflow tells of (NULL: none).
///
/// The schedule's row is locked first (`FOR KEY SHARE`, which a runner holding it `FOR
/// UPDATE` already covers), so a trigger and a pass meet on the row, not on the fire's key.
/// The previous run is the latest fire that started one; a request retention deleted is
/// finished. Answers (fire rows inserted, requests inserted).
pub(super) const FIRE: &str = concat!(
    "\
WITH s AS (
    SELECT name FROM schedules WHERE name = $1 FOR KEY SHARE
), prev AS (
    SELECT r.status FROM (
        SELECT f.service_request_id AS id FROM schedule_fires f
        WHERE f.schedule = $1 AND f.service_request_id IS NOT NULL
        ORDER BY f.fire_at DESC LIMIT 1) l
    LEFT JOIN service_requests r ON r.id = l.id
), busy AS (
    SELECT $8::bool AND EXISTS (
        SELECT 1 FROM prev WHERE status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")) AS b
), fire AS (
    INSERT INTO schedule_fires (schedule, fire_at, service_request_id, skipped)
    SELECT s.name, $2, CASE WHEN busy.b THEN NULL ELSE $3::uuid END,
           CASE WHEN busy.b THEN 'overlap' END
    FROM s, busy
    ON CONFLICT DO NOTHING
    RETURNING service_request_id
), req AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner,
                                  lease_until, created_at, workflow_version,
                                  concurrency_key, priority, notify)
    SELECT fire.service_request_id, $4, $5, '[]', NULL,
           CASE WHEN $9::text IS NULL THEN '-infinity'::timestamptz
                ELSE 'infinity'::timestamptz END, $6, ",
    crate::store::sql::pinned_version!(
        "$7::int",
        "(SELECT w.version FROM workflows w WHERE w.name = $4)"
    ),
    ", $9, $10, $11::smallint
    FROM fire WHERE fire.service_request_id IS NOT NULL
    RETURNING ",
    crate::store::slots::follows!(),
    "
), ",
    // With a key, its slot row, in its key's queue (no trigger writes it, migration 36).
    crate::store::slots::follow!("req"),
    "
SELECT (SELECT count(*) FROM fire), (SELECT count(*) FROM req)"
);

pub(super) const FIRE_AT: &str =
    "SELECT service_request_id FROM schedule_fires WHERE schedule = $1 AND fire_at = $2";

/// Fires kept per schedule (the newest; older ones are deleted by `prune`). Only recent
/// fire rows matter to a fire happening once: a pass never goes back before the time its
/// schedule waits for.
pub const KEEP_FIRES: i64 = 1000;

/// Deletes each schedule's fires beyond its newest `KEEP_FIRES`, none of the last hour.
pub(super) const PRUNE: &str = "\
DELETE FROM schedule_fires f
USING schedules s,
      LATERAL (SELECT fire_at FROM schedule_fires
               WHERE schedule = s.name ORDER BY fire_at DESC OFFSET $1 LIMIT 1) cut
WHERE f.schedule = s.name AND f.fire_at <= cut.fire_at
  AND f.fire_at < now() - interval '1 hour'";

fn stored(r: &Row) -> Stored {
    Stored {
        definition: r.get(0),
        paused: r.get(1),
        next_fire_at: r.get(2),
        created_at: r.get(3),
        updated_at: r.get(4),
    }
}

/// The database's clock: every fire time is computed against it, whichever instance asks.
pub async fn now(conn: &PgConn) -> Result<DateTime<Utc>> {
    let stmt = conn.stmt(NOW).await?;
    Ok(conn.client.query_one(&stmt, &[]).await?.get(0))
}

/// Stores a new schedule (a taken name is `Conflict`); `next` is its first fire time.
pub async fn insert(
    conn: &PgConn,
    s: &CompiledSchedule,
    paused: bool,
    next: DateTime<Utc>,
) -> Result<Stored> {
    let stmt = conn.stmt(INSERT).await?;
    let def = serde_json::to_value(&s.def).expect("a schedule serializes");
    let row = conn
        .client
        .query_one(&stmt, &[&s.def.name, &def, &paused, &next])
        .await?;
    Ok(stored(&row))
}

/// A schedule and the database's clock now.
pub async fn get(conn: &PgConn, name: &str) -> Result<Option<(Stored, DateTime<Utc>)>> {
    let stmt = conn.stmt(GET).await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&name])
        .await?
        .map(|r| (stored(&r), r.get(5))))
}

/// Up to `limit` schedules, by name.
pub async fn list(conn: &PgConn, limit: i64) -> Result<Vec<Stored>> {
    let stmt = conn.stmt(LIST).await?;
    let rows = conn.client.query(&stmt, &[&limit]).await?;
    Ok(rows.iter().map(stored).collect())
}

/// Replaces a schedule's definition (`paused` None: left as it is); None when there is
/// no such schedule.
pub async fn put(
    conn: &PgConn,
    s: &CompiledSchedule,
    paused: Option<bool>,
    next: DateTime<Utc>,
) -> Result<Option<Stored>> {
    let stmt = conn.stmt(PUT).await?;
    let def = serde_json::to_value(&s.def).expect("a schedule serializes");
    let row = conn
        .client
        .query_opt(&stmt, &[&s.def.name, &def, &paused, &next])
        .await?;
    Ok(row.as_ref().map(stored))
}

/// Deletes a schedule and its fires (their requests stay); false when there was none.
pub async fn delete(conn: &PgConn, name: &str) -> Result<bool> {
    let stmt = conn.stmt(DELETE).await?;
    Ok(conn.client.execute(&stmt, &[&name]).await? > 0)
}

/// Pauses a schedule; false when there is none.
pub async fn pause(conn: &PgConn, name: &str) -> Result<bool> {
    let stmt = conn.stmt(PAUSE).await?;
    Ok(conn.client.execute(&stmt, &[&name]).await? > 0)
}

/// Resumes a paused schedule at `next` (no catch-up for the paused time).
pub async fn resume(conn: &PgConn, name: &str, next: DateTime<Utc>) -> Result<()> {
    let stmt = conn.stmt(RESUME).await?;
    conn.client.execute(&stmt, &[&name, &next]).await?;
    Ok(())
}

/// A schedule's latest `limit` fires, newest first, with their requests' statuses.
pub async fn last_fires(conn: &PgConn, name: &str, limit: i64) -> Result<Vec<FireRow>> {
    let stmt = conn.stmt(LAST_FIRES).await?;
    let rows = conn.client.query(&stmt, &[&name, &limit]).await?;
    Ok(rows
        .iter()
        .map(|r| FireRow {
            fire_at: r.get(0),
            service_request_id: r.get(1),
            status: r.get(2),
            skipped: r.get(3),
        })
        .collect())
}

/// The latest `limit` fires of each schedule named, newest first, by schedule name.
pub async fn last_fires_of(
    conn: &PgConn,
    names: &[String],
    limit: i64,
) -> Result<Vec<(String, FireRow)>> {
    let stmt = conn.stmt(LAST_FIRES_OF).await?;
    let rows = conn.client.query(&stmt, &[&names, &limit]).await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                FireRow {
                    fire_at: r.get(1),
                    service_request_id: r.get(2),
                    status: r.get(3),
                    skipped: r.get(4),
                },
            )
        })
        .collect())
}

/// What a schedule's requests are stored with, from the workflow version they run.
#[derive(Debug, Default, Clone)]
pub struct Terms {
    /// The concurrency key they wait under (None: the workflow has no limit).
    pub key: Option<String>,
    /// The final statuses their workflow tells of (None: none).
    pub notify: Option<i16>,
}

/// Makes the fire of `s` at `at` (with the prepared `FIRE` statement), starting request
/// `id` unless the fire was made before or the overlap policy skips it.
async fn fire_with(
    client: &impl GenericClient,
    stmt: &Statement,
    s: &CompiledSchedule,
    payload: &str,
    terms: &Terms,
    at: DateTime<Utc>,
    id: Uuid,
) -> Result<Fired> {
    let version = s.def.version.map_or(0, |v| v as i32);
    let row = client
        .query_one(
            stmt,
            &[
                &s.def.name,
                &at,
                &id,
                &s.def.workflow,
                &payload,
                &SystemTime::now(),
                &version,
                &(s.def.overlap == Overlap::Skip),
                &terms.key,
                &s.def.priority,
                &terms.notify,
            ],
        )
        .await?;
    let (fires, requests): (i64, i64) = (row.get(0), row.get(1));
    Ok(match (fires, requests) {
        (0, _) => Fired::Already,
        (_, 0) => Fired::Skipped,
        _ => Fired::Started,
    })
}

/// What a trigger did.
#[derive(Debug, PartialEq, Eq)]
pub enum Triggered {
    Started(Uuid),
    Skipped,
    /// Triggered in the same millisecond before: that fire's request, if it started one.
    Repeated(Option<Uuid>),
    /// The schedule was deleted meanwhile.
    Gone,
}

/// Fires `s` now (`at`, a key to the millisecond), outside its times; its request is
/// stored with `terms`.
pub async fn trigger(
    conn: &PgConn,
    s: &CompiledSchedule,
    terms: &Terms,
    at: DateTime<Utc>,
) -> Result<Triggered> {
    let stmt = conn.stmt(FIRE).await?;
    let payload = serde_json::to_string(&s.def.payload).expect("a payload serializes");
    let id = crate::ids::new_v7();
    match fire_with(&conn.client, &stmt, s, &payload, terms, at, id).await? {
        Fired::Started => Ok(Triggered::Started(id)),
        Fired::Skipped => Ok(Triggered::Skipped),
        Fired::Already => {
            let stmt = conn.stmt(FIRE_AT).await?;
            Ok(
                match conn.client.query_opt(&stmt, &[&s.def.name, &at]).await? {
                    Some(r) => Triggered::Repeated(r.get(0)),
                    None => Triggered::Gone,
                },
            )
        }
    }
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct Pass {
    /// Due schedules handled.
    pub handled: usize,
    /// How late each started fire was (the database's now minus its fire time).
    pub started: Vec<chrono::Duration>,
    pub skipped: usize,
    /// The (id, workflow, key) of each request started waiting in a key's queue.
    pub queued: Vec<(Uuid, String, String)>,
    /// Schedules whose stored definition no longer reads (they fire no more), and why.
    pub broken: Vec<(String, String)>,
}

/// One pass of the runner, in one transaction: up to `limit` due schedules locked, the
/// fires their `catchUp` policy asks for made, and each one's next fire time stored. Run
/// by every instance at once, it makes each fire once: a locked schedule is skipped by the
/// others, and a fire made before is not made again (its key). `terms_of` gives what a
/// schedule's requests are stored with.
pub async fn pass<K, F>(conn: &mut PgConn, limit: i64, terms_of: K) -> Result<Pass>
where
    K: Fn(CompiledSchedule) -> F,
    F: std::future::Future<Output = Result<Terms>>,
{
    let due = conn.stmt(DUE).await?;
    let fire = conn.stmt(FIRE).await?;
    let set_next = conn.stmt(SET_NEXT).await?;
    let tx = conn.client.transaction().await?;
    let rows = tx.query(&due, &[&limit]).await?;
    let mut out = Pass {
        handled: rows.len(),
        ..Pass::default()
    };
    for r in &rows {
        let name: String = r.get(0);
        let from: DateTime<Utc> = r.get(2);
        let now: DateTime<Utc> = r.get(3);
        let s = match schedule::validate(&r.get::<_, Value>(1)) {
            Ok(s) => s,
            Err(e) => {
                tx.execute(&set_next, &[&name, &None::<DateTime<Utc>>])
                    .await?;
                out.broken.push((name, e.0));
                continue;
            }
        };
        let plan = s.due(from, now);
        let payload = serde_json::to_string(&s.def.payload).expect("a payload serializes");
        let terms = match plan.fires.is_empty() {
            true => Terms::default(),
            false => terms_of(s.clone()).await?,
        };
        for at in plan.fires {
            let id = crate::ids::new_v7();
            match fire_with(&tx, &fire, &s, &payload, &terms, at, id).await? {
                Fired::Started => {
                    out.started.push(now - at);
                    if let Some(k) = &terms.key {
                        out.queued.push((id, s.def.workflow.clone(), k.clone()));
                    }
                }
                Fired::Skipped => out.skipped += 1,
                Fired::Already => {}
            }
        }
        tx.execute(&set_next, &[&name, &plan.next]).await?;
    }
    tx.commit().await?;
    Ok(out)
}

/// Deletes old fires (`KEEP_FIRES`); returns how many.
pub async fn prune(conn: &PgConn) -> Result<u64> {
    let stmt = conn.stmt(PRUNE).await?;
    Ok(conn.client.execute(&stmt, &[&KEEP_FIRES]).await?)
}
