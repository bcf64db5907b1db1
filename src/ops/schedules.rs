//! Schedules (beyond Clamp): define, list, read, replace, delete, trigger, pause and
//! resume. A definition is read and checked by `workflow::schedule` (a 400 names the
//! field), its workflow (and version) looked up as a create would; fire times are
//! computed against the database's clock. The runner that makes the fires is
//! `engine::timers::schedules`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::access::Op;
use super::audit::{recorded, Told, NOT_CREATED};
use super::{OpError, Result};
use crate::state::Core;
use crate::store::schedules::{self as store, FireRow, Stored, Triggered};
use crate::store::{LoadError, StoreError};
use crate::tokens::Caller;
use crate::workflow::schedule::{self as def, CompiledSchedule};

/// Fire times a schedule is shown with ahead.
const NEXT_FIRES: usize = 5;

/// Fires a schedule read alone is shown with.
const LAST_RUNS: i64 = 10;

/// Most schedules a list holds (by name).
const MAX_LIST: i64 = 1000;

/// A schedule as its readers see it: its row, its next fire times (none while paused) at
/// UTC and on its own wall clock, and its last fires when read with them.
pub struct Schedule {
    pub stored: Stored,
    pub next: Vec<(DateTime<Utc>, String)>,
    pub runs: Option<Vec<FireRow>>,
}

fn view(stored: Stored, runs: Option<Vec<FireRow>>) -> Schedule {
    let next = match (def::validate(&stored.definition), stored.next_fire_at) {
        (Ok(s), Some(first)) if !stored.paused => std::iter::once(first)
            .chain(s.fires_between(first, DateTime::<Utc>::MAX_UTC, NEXT_FIRES - 1))
            .map(|t| (t, s.local(t)))
            .collect(),
        _ => Vec::new(),
    };
    Schedule { stored, next, runs }
}

fn no_schedule(name: &str) -> OpError {
    OpError::NotFound(format!("no schedule named {name:?}"))
}

fn bad(msg: String) -> OpError {
    OpError::BadRequest(msg)
}

/// 400 unless the schedule's workflow (and the version it names) exists, and its payload
/// meets that version's `inputSchema` (the latest's when it names none).
async fn check_workflow(core: &Core, s: &CompiledSchedule) -> Result<()> {
    let (map, name) = (&core.app.workflows, s.def.workflow.as_str());
    let found = |r: std::result::Result<Option<_>, LoadError>| match r {
        Ok(found) => Ok(found),
        Err(LoadError::Invalid { .. }) => Ok(None),
        Err(LoadError::Store(error)) => Err(OpError::Store {
            error,
            doing: "workflow lookup",
        }),
    };
    let Some(mut wf) = found(map.get_or_load(&core.pool, name).await)? else {
        return Err(bad(format!("workflow: no workflow named {name:?}")));
    };
    if let Some(v) = s.def.version {
        wf = found(map.get_or_load_version(&core.pool, name, v).await)?
            .ok_or_else(|| bad(format!("version: workflow {name:?} has no version {v}")))?;
    }
    if let Some(schema) = &wf.input_schema {
        schema
            .check_value(&s.def.payload)
            .map_err(|why| bad(format!("payload: {why}")))?;
    }
    Ok(())
}

/// A stored definition read again; 422 when this server no longer reads it (a time zone
/// its zone database dropped).
fn compiled(row: &Stored) -> Result<CompiledSchedule> {
    def::validate(&row.definition).map_err(|e| {
        OpError::Unprocessable(format!("the stored definition no longer reads: {}", e.0))
    })
}

/// A posted definition (`name` from the path when it has none), checked with its
/// workflow; and the `paused` it asks for.
async fn checked(
    core: &Core,
    mut v: Value,
    path_name: Option<&str>,
) -> Result<(CompiledSchedule, Option<bool>)> {
    if let (Some(name), Value::Object(obj)) = (path_name, &mut v) {
        obj.entry("name")
            .or_insert_with(|| Value::String(name.to_string()));
    }
    let s = def::validate(&v).map_err(|e| bad(e.0))?;
    if let Some(name) = path_name.filter(|n| *n != s.def.name) {
        return Err(bad(format!(
            "name: the definition is named {:?}, the path {name:?}",
            s.def.name
        )));
    }
    check_workflow(core, &s).await?;
    Ok((s, def::paused_in(&v)))
}

/// `POST /schedules`: a new schedule (409 when the name is taken).
/// Recorded in the audit trail as `who`'s.
pub async fn define(core: &Core, who: &Caller, definition: Value) -> Result<Schedule> {
    let r = define_it(core, definition).await;
    let target = match &r {
        Ok(s) => s.stored.definition["name"].as_str().unwrap_or(NOT_CREATED),
        Err(_) => NOT_CREATED,
    }
    .to_string();
    recorded(&core.pool, who, Op::ChangeSchedule, &target, r).await
}

async fn define_it(core: &Core, definition: Value) -> Result<Schedule> {
    let (s, paused) = checked(core, definition, None).await?;
    let doing = "create schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let now = store::now(&conn).await.map_err(OpError::store(doing))?;
    let next = s.first_after(now).map_err(|e| bad(e.0))?;
    match store::insert(&conn, &s, paused.unwrap_or(false), next).await {
        Ok(row) => Ok(view(row, Some(Vec::new()))),
        Err(StoreError::Conflict) => Err(OpError::Conflict(format!(
            "a schedule named {:?} already exists",
            s.def.name
        ))),
        Err(error) => Err(OpError::Store { error, doing }),
    }
}

/// Every schedule (up to `MAX_LIST`, by name), with its latest `runs` fires when asked.
pub async fn list(core: &Core, runs: Option<i64>) -> Result<Vec<Schedule>> {
    let doing = "list schedules";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let rows = store::list(&conn, MAX_LIST)
        .await
        .map_err(OpError::store(doing))?;
    let Some(runs) = runs else {
        return Ok(rows.into_iter().map(|r| view(r, None)).collect());
    };
    let names: Vec<String> = rows
        .iter()
        .map(|r| r.definition["name"].as_str().unwrap_or("").to_string())
        .collect();
    let mut by_name: HashMap<String, Vec<FireRow>> = HashMap::new();
    for (name, f) in store::last_fires_of(&conn, &names, runs)
        .await
        .map_err(OpError::store(doing))?
    {
        by_name.entry(name).or_default().push(f);
    }
    Ok(rows
        .into_iter()
        .zip(&names)
        .map(|(row, name)| view(row, Some(by_name.remove(name).unwrap_or_default())))
        .collect())
}

/// `GET /schedules/{name}`: the schedule, its next fire times and its last runs.
pub async fn read(core: &Core, name: &str) -> Result<Schedule> {
    let doing = "read schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (row, _) = store::get(&conn, name)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(|| no_schedule(name))?;
    let fires = store::last_fires(&conn, name, LAST_RUNS)
        .await
        .map_err(OpError::store(doing))?;
    Ok(view(row, Some(fires)))
}

/// `PUT /schedules/{name}`: replaces the definition; the next fire is the first after
/// now (the old definition's fires that were due are not made). `paused` given sets it;
/// left out, the schedule stays as paused or running as it was.
/// Recorded in the audit trail as `who`'s.
pub async fn replace(core: &Core, who: &Caller, name: &str, definition: Value) -> Result<Schedule> {
    let r = replace_it(core, name, definition).await;
    recorded(&core.pool, who, Op::ChangeSchedule, name, r).await
}

async fn replace_it(core: &Core, name: &str, definition: Value) -> Result<Schedule> {
    let (s, paused) = checked(core, definition, Some(name)).await?;
    let doing = "replace schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let now = store::now(&conn).await.map_err(OpError::store(doing))?;
    let next = s.first_after(now).map_err(|e| bad(e.0))?;
    let row = store::put(&conn, &s, paused, next)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(|| no_schedule(name))?;
    let fires = store::last_fires(&conn, name, LAST_RUNS)
        .await
        .map_err(OpError::store(doing))?;
    Ok(view(row, Some(fires)))
}

/// `DELETE /schedules/{name}`: its fires go with it, the requests they started stay.
/// Recorded in the audit trail as `who`'s.
pub async fn delete(core: &Core, who: &Caller, name: &str) -> Result<()> {
    let r = delete_it(core, name).await;
    recorded(&core.pool, who, Op::ChangeSchedule, name, r).await
}

async fn delete_it(core: &Core, name: &str) -> Result<()> {
    let doing = "delete schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    if store::delete(&conn, name)
        .await
        .map_err(OpError::store(doing))?
    {
        Ok(())
    } else {
        Err(no_schedule(name))
    }
}

impl Told for Schedule {}
impl Told for Run {}

/// A run started by a trigger.
pub struct Run {
    pub id: Uuid,
    pub fire_at: DateTime<Utc>,
}

/// `POST /schedules/{name}/trigger`: one run now, recorded as a fire at this millisecond
/// (a repeat within it answers the same request), whether the schedule is paused or not;
/// `overlap: skip` applies (409 while the previous run is unfinished).
/// Recorded in the audit trail as `who`'s.
pub async fn trigger(core: &Core, who: &Caller, name: &str) -> Result<Run> {
    let r = trigger_it(core, name).await;
    recorded(&core.pool, who, Op::ChangeSchedule, name, r).await
}

async fn trigger_it(core: &Core, name: &str) -> Result<Run> {
    let doing = "trigger schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (row, _) = store::get(&conn, name)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(|| no_schedule(name))?;
    let s = compiled(&row)?;
    let ms = Utc::now().timestamp_millis();
    let at = DateTime::from_timestamp_millis(ms).expect("now is a time");
    let terms = crate::engine::timers::slots::schedule_terms(&core.executor, &s)
        .await
        .map_err(OpError::store(doing))?;
    let id = match store::trigger(&conn, &s, &terms, at)
        .await
        .map_err(OpError::store(doing))?
    {
        Triggered::Started(id) => {
            core.executor.wake();
            if let Some(key) = terms.key {
                // Waits in its key's queue: admitted now if a slot is free.
                let queued = [(id, s.def.workflow.clone(), key)];
                if let Err(e) =
                    crate::engine::timers::slots::admit_queued(&core.executor, &queued).await
                {
                    tracing::debug!(error = %e, "trigger not admitted now; the admitter's next pass does");
                }
            }
            id
        }
        Triggered::Repeated(Some(id)) => id,
        Triggered::Skipped | Triggered::Repeated(None) => {
            return Err(OpError::Conflict(
                "overlap: the schedule's previous run has not finished (overlap is skip)".into(),
            ))
        }
        Triggered::Gone => return Err(no_schedule(name)),
    };
    Ok(Run { id, fire_at: at })
}

/// `POST /schedules/{name}/pause`: no fires until resumed.
/// Recorded in the audit trail as `who`'s.
pub async fn pause(core: &Core, who: &Caller, name: &str) -> Result<Schedule> {
    let r = pause_it(core, name).await;
    recorded(&core.pool, who, Op::ChangeSchedule, name, r).await
}

async fn pause_it(core: &Core, name: &str) -> Result<Schedule> {
    let doing = "pause schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    if !store::pause(&conn, name)
        .await
        .map_err(OpError::store(doing))?
    {
        return Err(no_schedule(name));
    }
    drop(conn);
    read(core, name).await
}

/// `POST /schedules/{name}/resume`: fires again from the first fire time after now; the
/// times that passed while it was paused are not made up. A running schedule is left as
/// it is.
/// Recorded in the audit trail as `who`'s.
pub async fn resume(core: &Core, who: &Caller, name: &str) -> Result<Schedule> {
    let r = resume_it(core, name).await;
    recorded(&core.pool, who, Op::ChangeSchedule, name, r).await
}

async fn resume_it(core: &Core, name: &str) -> Result<Schedule> {
    let doing = "resume schedule";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (row, now) = store::get(&conn, name)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(|| no_schedule(name))?;
    if row.paused {
        let s = compiled(&row)?;
        let next = s.first_after(now).map_err(|e| bad(e.0))?;
        store::resume(&conn, name, next)
            .await
            .map_err(OpError::store(doing))?;
    }
    drop(conn);
    read(core, name).await
}
