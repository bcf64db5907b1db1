//! Schedules (beyond Clamp): `POST /schedules`, `GET /schedules`, `GET|PUT|DELETE
//! /schedules/{name}`, `POST /schedules/{name}/trigger|pause|resume`.
//!
//! The definition is read and checked by `workflow::schedule` (a 400 names the field),
//! its workflow (and version) looked up as a create would; fire times are computed
//! against the database's clock. The runner that makes the fires is `engine::schedules`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{json, Value};

use super::body::Body;
use super::response::{error, json, no_content, store_error, Resp};
use super::rfc3339;
use crate::state::Core;
use crate::store::schedules::{self, FireRow, Stored, Triggered};
use crate::store::{LoadError, StoreError};
use crate::workflow::schedule::{self as def, CompiledSchedule};

/// Fire times `GET /schedules/{name}` shows ahead.
const NEXT_FIRES: usize = 5;

/// Fires `GET /schedules/{name}` shows back.
const LAST_RUNS: i64 = 10;

/// Most schedules `GET /schedules` lists (by name).
const MAX_LIST: i64 = 1000;

fn bad(msg: &str) -> Resp {
    error(StatusCode::BAD_REQUEST, msg)
}

fn no_schedule(name: &str) -> Resp {
    error(
        StatusCode::NOT_FOUND,
        &format!("no schedule named {name:?}"),
    )
}

/// The body as a JSON value; 400 when it is not JSON.
async fn read_json(core: &Core, parts: &Parts, body: &mut Body) -> Result<Value, Resp> {
    let bytes = body.read_request(parts, &core.app.config).await?;
    serde_json::from_slice(&bytes).map_err(|e| bad(&format!("the body is not valid JSON: {e}")))
}

/// 400 unless the schedule's workflow (and the version it names) exists.
async fn check_workflow(core: &Core, s: &CompiledSchedule) -> Result<(), Resp> {
    let (map, name) = (&core.app.workflows, s.def.workflow.as_str());
    let found = |r: Result<Option<_>, LoadError>| match r {
        Ok(Some(_)) => Ok(true),
        Ok(None) | Err(LoadError::Invalid { .. }) => Ok(false),
        Err(LoadError::Store(e)) => Err(store_error(e, "workflow lookup")),
    };
    if !found(map.get_or_load(&core.pool, name).await)? {
        return Err(bad(&format!("workflow: no workflow named {name:?}")));
    }
    if let Some(v) = s.def.version {
        if !found(map.get_or_load_version(&core.pool, name, v).await)? {
            return Err(bad(&format!(
                "version: workflow {name:?} has no version {v}"
            )));
        }
    }
    Ok(())
}

/// A stored definition read again; 422 when this server no longer reads it (a time zone
/// its zone database dropped).
fn compiled(row: &Stored) -> Result<CompiledSchedule, Resp> {
    def::validate(&row.definition).map_err(|e| {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("the stored definition no longer reads: {}", e.0),
        )
    })
}

/// A schedule as the answers show it: its definition, `paused`, the next fire times
/// (none while paused), and its last fires when read with them.
fn view(row: &Stored, fires: Option<&[FireRow]>) -> Value {
    let mut v = row.definition.clone();
    let next: Vec<Value> = match (def::validate(&row.definition), row.next_fire_at) {
        (Ok(s), Some(first)) if !row.paused => std::iter::once(first)
            .chain(s.fires_between(first, DateTime::<Utc>::MAX_UTC, NEXT_FIRES - 1))
            .map(|t| json!({"at": rfc3339(t), "local": s.local(t)}))
            .collect(),
        _ => Vec::new(),
    };
    v["paused"] = json!(row.paused);
    v["nextFires"] = Value::Array(next);
    v["createdAt"] = json!(rfc3339(row.created_at));
    v["updatedAt"] = json!(rfc3339(row.updated_at));
    if let Some(fires) = fires {
        v["lastRuns"] = fires
            .iter()
            .map(|f| {
                json!({
                    "fireAt": rfc3339(f.fire_at),
                    "serviceRequestId": f.service_request_id.map(|id| id.to_string()),
                    "status": f.status,
                    "skipped": f.skipped,
                })
            })
            .collect();
    }
    v
}

/// The schedule `name` with its last fires; 404 when there is none.
async fn read_view(core: &Core, name: &str) -> Result<Value, Resp> {
    let conn = core
        .pool
        .get()
        .await
        .map_err(|e| store_error(e.into(), "read schedule"))?;
    let (row, _) = schedules::get(&conn, name)
        .await
        .map_err(|e| store_error(e, "read schedule"))?
        .ok_or_else(|| no_schedule(name))?;
    let fires = schedules::last_fires(&conn, name, LAST_RUNS)
        .await
        .map_err(|e| store_error(e, "read schedule"))?;
    Ok(view(&row, Some(&fires)))
}

/// Reads a definition (`name` from the path when the body has none), checks it and its
/// workflow; answers it and the `paused` it asks for.
async fn read_def(
    core: &Core,
    parts: &Parts,
    body: &mut Body,
    path_name: Option<&str>,
) -> Result<(CompiledSchedule, Option<bool>), Resp> {
    let mut v = read_json(core, parts, body).await?;
    if let (Some(name), Value::Object(obj)) = (path_name, &mut v) {
        obj.entry("name").or_insert_with(|| json!(name));
    }
    let s = def::validate(&v).map_err(|e| bad(&e.0))?;
    if let Some(name) = path_name.filter(|n| *n != s.def.name) {
        return Err(bad(&format!(
            "name: the definition is named {:?}, the path {name:?}",
            s.def.name
        )));
    }
    check_workflow(core, &s).await?;
    Ok((s, def::paused_in(&v)))
}

/// `POST /schedules`: 201 with the schedule; 409 when the name is taken.
pub async fn create(core: &Core, parts: &Parts, body: &mut Body) -> Resp {
    async {
        let (s, paused) = read_def(core, parts, body, None).await?;
        let fail = |e| store_error(e, "create schedule");
        let conn = core.pool.get().await.map_err(|e| fail(e.into()))?;
        let now = schedules::now(&conn).await.map_err(fail)?;
        let next = s.first_after(now).map_err(|e| bad(&e.0))?;
        match schedules::insert(&conn, &s, paused.unwrap_or(false), next).await {
            Ok(row) => Ok(json(StatusCode::CREATED, &view(&row, Some(&[])))),
            Err(StoreError::Conflict) => Err(error(
                StatusCode::CONFLICT,
                &format!("a schedule named {:?} already exists", s.def.name),
            )),
            Err(e) => Err(fail(e)),
        }
    }
    .await
    .unwrap_or_else(|r| r)
}

/// `GET /schedules`: every schedule (up to `MAX_LIST`, by name), without their fires.
pub async fn list(core: &Core) -> Resp {
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "list schedules"),
    };
    match schedules::list(&conn, MAX_LIST).await {
        Ok(rows) => json(
            StatusCode::OK,
            &json!({"schedules": rows.iter().map(|r| view(r, None)).collect::<Vec<_>>()}),
        ),
        Err(e) => store_error(e, "list schedules"),
    }
}

/// Every schedule (up to `MAX_LIST`, by name) as `GET /schedules/{name}` shows it, with
/// its latest `runs` fires: the console's list.
pub async fn views(core: &Core, runs: i64) -> Result<Vec<Value>, StoreError> {
    let conn = core.pool.get().await?;
    let rows = schedules::list(&conn, MAX_LIST).await?;
    let names: Vec<String> = rows
        .iter()
        .map(|r| r.definition["name"].as_str().unwrap_or("").to_string())
        .collect();
    let mut by_name: HashMap<String, Vec<FireRow>> = HashMap::new();
    for (name, f) in schedules::last_fires_of(&conn, &names, runs).await? {
        by_name.entry(name).or_default().push(f);
    }
    Ok(rows
        .iter()
        .zip(&names)
        .map(|(row, name)| view(row, Some(&by_name.remove(name).unwrap_or_default())))
        .collect())
}

/// `GET /schedules/{name}`: the schedule, its next fire times and its last runs.
pub async fn get(core: &Core, name: &str) -> Resp {
    match read_view(core, name).await {
        Ok(v) => json(StatusCode::OK, &v),
        Err(r) => r,
    }
}

/// `PUT /schedules/{name}`: replaces the definition; the next fire is the first after
/// now (the old definition's fires that were due are not made). `paused` given sets it;
/// left out, the schedule stays as paused or running as it was.
pub async fn put(core: &Core, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    async {
        let (s, paused) = read_def(core, parts, body, Some(name)).await?;
        let fail = |e| store_error(e, "replace schedule");
        let conn = core.pool.get().await.map_err(|e| fail(e.into()))?;
        let now = schedules::now(&conn).await.map_err(fail)?;
        let next = s.first_after(now).map_err(|e| bad(&e.0))?;
        let row = schedules::put(&conn, &s, paused, next)
            .await
            .map_err(fail)?
            .ok_or_else(|| no_schedule(name))?;
        let fires = schedules::last_fires(&conn, name, LAST_RUNS)
            .await
            .map_err(fail)?;
        Ok(json(StatusCode::OK, &view(&row, Some(&fires))))
    }
    .await
    .unwrap_or_else(|r| r)
}

/// `DELETE /schedules/{name}`: 204; its fires go with it, the requests they started stay.
pub async fn delete(core: &Core, name: &str) -> Resp {
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "delete schedule"),
    };
    match schedules::delete(&conn, name).await {
        Ok(true) => no_content(),
        Ok(false) => no_schedule(name),
        Err(e) => store_error(e, "delete schedule"),
    }
}

/// `POST /schedules/{name}/trigger`: one run now, recorded as a fire at this millisecond
/// (a repeat within it answers the same request), whether the schedule is paused or not;
/// `overlap: skip` applies (409 while the previous run is unfinished).
pub async fn trigger(core: &Core, name: &str) -> Resp {
    async {
        let fail = |e| store_error(e, "trigger schedule");
        let conn = core.pool.get().await.map_err(|e| fail(e.into()))?;
        let (row, _) = schedules::get(&conn, name)
            .await
            .map_err(fail)?
            .ok_or_else(|| no_schedule(name))?;
        let s = compiled(&row)?;
        let ms = Utc::now().timestamp_millis();
        let at = DateTime::from_timestamp_millis(ms).expect("now is a time");
        let id = match schedules::trigger(&conn, &s, at).await.map_err(fail)? {
            Triggered::Started(id) => {
                core.executor.wake();
                id
            }
            Triggered::Repeated(Some(id)) => id,
            Triggered::Skipped | Triggered::Repeated(None) => {
                return Err(error(
                    StatusCode::CONFLICT,
                    "overlap: the schedule's previous run has not finished (overlap is skip)",
                ))
            }
            Triggered::Gone => return Err(no_schedule(name)),
        };
        Ok(json(
            StatusCode::OK,
            &json!({
                "pollUrl": format!("/serviceRequest/{id}"),
                "status": "NEW",
                "serviceRequestId": id.to_string(),
                "fireAt": rfc3339(at),
            }),
        ))
    }
    .await
    .unwrap_or_else(|r| r)
}

/// `POST /schedules/{name}/pause`: no fires until resumed; the schedule.
pub async fn pause(core: &Core, name: &str) -> Resp {
    async {
        let fail = |e| store_error(e, "pause schedule");
        let conn = core.pool.get().await.map_err(|e| fail(e.into()))?;
        if !schedules::pause(&conn, name).await.map_err(fail)? {
            return Err(no_schedule(name));
        }
        drop(conn);
        Ok(json(StatusCode::OK, &read_view(core, name).await?))
    }
    .await
    .unwrap_or_else(|r| r)
}

/// `POST /schedules/{name}/resume`: fires again from the first fire time after now; the
/// times that passed while it was paused are not made up. A running schedule is left as
/// it is.
pub async fn resume(core: &Core, name: &str) -> Resp {
    async {
        let fail = |e| store_error(e, "resume schedule");
        let conn = core.pool.get().await.map_err(|e| fail(e.into()))?;
        let (row, now) = schedules::get(&conn, name)
            .await
            .map_err(fail)?
            .ok_or_else(|| no_schedule(name))?;
        if row.paused {
            let s = compiled(&row)?;
            let next = s.first_after(now).map_err(|e| bad(&e.0))?;
            schedules::resume(&conn, name, next).await.map_err(fail)?;
        }
        drop(conn);
        Ok(json(StatusCode::OK, &read_view(core, name).await?))
    }
    .await
    .unwrap_or_else(|r| r)
}
