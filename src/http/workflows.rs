//! `POST /workflow`, `GET /workflow/{name}` and `GET /workflows`.

use std::sync::Arc;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{error, json, json_bytes, store_error, Resp};
use super::service_requests::{page_param, MAX_PAGE_SIZE};
use crate::state::Core;
use crate::store::queries::{self, Versioned, WorkflowSort};
use crate::store::workflow_map::LoadError;
use crate::store::StoreError;
use crate::workflow::validate::includes;
use crate::workflow::{compile, set_default_reply_to, Workflow, WorkflowDef};

/// A definition from a request body; the error is the 400 to answer.
fn parse_def(body: &[u8]) -> Result<WorkflowDef, Resp> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v @ serde_json::Value::Object(_)) => serde_json::from_value(v).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("invalid workflow definition: {e}"),
            )
        }),
        Ok(_) => Err(error(
            StatusCode::BAD_REQUEST,
            "the workflow definition must be a JSON object",
        )),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("the body is not valid JSON: {e}"),
        )),
    }
}

/// Reads, parses and validates a posted definition (its version left to the server).
async fn read_def(core: &Core, parts: &Parts, body: &mut Body) -> Result<Workflow, Resp> {
    let app = &core.app;
    let body = body.read_request(parts, &app.config).await?;
    let mut def = parse_def(&body)?;
    def.version = 1;
    let b = &app.config.brokers;
    set_default_reply_to(&mut def, &b.amqp_response_queue, &b.kafka_response_topic);
    compile(def).map_err(|e| error(StatusCode::BAD_REQUEST, &e.0))
}

/// A workflow still to look at while checking includes.
type Pending = (Vec<String>, String, Option<u32>, Option<String>);

/// Refuses (400) a workflow whose WORKFLOW steps start an unknown workflow (or version),
/// or that would include itself, directly or through others (the message names the
/// circle). Any new circle passes through the workflow being stored, so only paths from
/// it are followed.
async fn check_includes(core: &Core, wf: &Workflow) -> Result<(), Resp> {
    let root = wf.def.name.clone();
    let bad = |m: String| error(StatusCode::BAD_REQUEST, &m);
    // (the path to it, a workflow, its version, where the root names it)
    let mut todo: Vec<Pending> = includes(wf)
        .into_iter()
        .map(|(name, v, at)| (vec![root.clone()], name, v, Some(at)))
        .collect();
    let mut seen: Vec<(String, Option<u32>)> = Vec::new();
    while let Some((path, name, version, at)) = todo.pop() {
        let mut path = path;
        path.push(name.clone());
        if name == root {
            return Err(bad(format!(
                "the workflow would include itself: {}",
                path.join(" → ")
            )));
        }
        if seen.contains(&(name.clone(), version)) {
            continue;
        }
        seen.push((name.clone(), version));
        let map = &core.app.workflows;
        let found = match version {
            Some(v) => map.get_or_load_version(&core.pool, &name, v).await,
            None => map.get_or_load(&core.pool, &name).await,
        };
        let child = match found {
            Ok(Some(c)) => c,
            Ok(None) | Err(LoadError::Invalid { .. }) => {
                let what = version.map_or(String::new(), |v| format!(" version {v}"));
                return Err(bad(match at {
                    Some(at) => format!("{at}.val.workflow: no workflow {name}{what}"),
                    None => format!(
                        "{} includes {name}{what}, which is not known",
                        path.join(" → ")
                    ),
                }));
            }
            Err(LoadError::Store(e)) => return Err(store_error(e, "workflow lookup")),
        };
        for (n, v, _) in includes(&child) {
            todo.push((path.clone(), n, v, None));
        }
    }
    Ok(())
}

/// `POST /workflow`: validate, compile, store (as version 1), cache.
pub async fn create(core: &Core, parts: &Parts, body: &mut Body) -> Resp {
    let app = &core.app;
    let mut wf = match read_def(core, parts, body).await {
        Ok(wf) => wf,
        Err(r) => return r,
    };
    if let Err(r) = check_includes(core, &wf).await {
        return r;
    }
    let id = crate::ids::new_v7();
    wf.def.id = id.to_string();
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "create workflow"),
    };
    match queries::insert_workflow(&conn, &wf.def, id).await {
        Ok(created_at) => {
            wf.def.created_at = created_at.clone();
            wf.def.updated_at = created_at;
            wf.json =
                Bytes::from(serde_json::to_vec(&wf.def).expect("a workflow always serializes"));
            let body = wf.json.clone();
            app.workflows.insert(Arc::new(wf));
            json_bytes(StatusCode::OK, body)
        }
        Err(StoreError::Conflict) => error(
            StatusCode::CONFLICT,
            &format!("a workflow named '{}' already exists", wf.def.name),
        ),
        Err(e) => store_error(e, "create workflow"),
    }
}

/// `PUT /workflow/{name}` (beyond Clamp): the definition becomes the workflow's next
/// version, validated as `POST /workflow` validates; the same definition as the latest
/// stores nothing and answers the latest. Requests already created keep their version.
pub async fn put(core: &Core, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    let wf = match read_def(core, parts, body).await {
        Ok(wf) => wf,
        Err(r) => return r,
    };
    if wf.def.name != name {
        return error(
            StatusCode::BAD_REQUEST,
            &format!(
                "name: the definition is named {:?}, the path {name:?}",
                wf.def.name
            ),
        );
    }
    if let Err(r) = check_includes(core, &wf).await {
        return r;
    }
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "version workflow"),
    };
    let stored = match queries::put_workflow(&conn, &wf.def).await {
        Ok(Versioned::New(v) | Versioned::Unchanged(v)) => v,
        Ok(Versioned::Unknown) => {
            return error(
                StatusCode::NOT_FOUND,
                &format!("No record exists with workflow name : {name}"),
            )
        }
        Err(e) => return store_error(e, "version workflow"),
    };
    drop(conn);
    match cached(core, stored) {
        Ok(wf) => json_bytes(StatusCode::OK, wf.json.clone()),
        Err(r) => r,
    }
}

/// A stored definition compiled and cached (as served: `json` is it, stamps included).
fn cached(core: &Core, stored: serde_json::Value) -> Result<Arc<Workflow>, Resp> {
    let internal = |why: String| {
        tracing::error!(%why, "a stored workflow does not load");
        error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    };
    let def: WorkflowDef = serde_json::from_value(stored).map_err(|e| internal(e.to_string()))?;
    let mut wf = compile(def).map_err(|e| internal(e.0))?;
    wf.json = Bytes::from(serde_json::to_vec(&wf.def).expect("a workflow always serializes"));
    let wf = Arc::new(wf);
    core.app.workflows.insert(wf.clone());
    Ok(wf)
}

fn no_workflow(name: &str) -> Resp {
    error(
        StatusCode::NOT_FOUND,
        &format!("No record exists with workflow name : {name}"),
    )
}

/// `GET /workflow/{name}`: the latest version as Postgres has it (another instance may
/// have stored it), or beyond Clamp `?version=N`.
pub async fn get(core: &Core, name: &str, query: Option<&str>) -> Resp {
    if let Some(v) = super::query_param(query, "version") {
        let Some(version) = v.parse::<u32>().ok().filter(|v| *v > 0) else {
            return error(
                StatusCode::BAD_REQUEST,
                "version: must be a whole number from 1",
            );
        };
        return match core
            .app
            .workflows
            .get_or_load_version(&core.pool, name, version)
            .await
        {
            Ok(Some(wf)) => json_bytes(StatusCode::OK, wf.json.clone()),
            Ok(None) => error(
                StatusCode::NOT_FOUND,
                &format!("workflow {name} has no version {version}"),
            ),
            Err(LoadError::Invalid { reason, .. }) => error(
                StatusCode::CONFLICT,
                &format!("that version no longer validates: {reason}"),
            ),
            Err(LoadError::Store(e)) => store_error(e, "workflow lookup"),
        };
    }
    if crate::workflow::validate::check_name(name).is_err() {
        return no_workflow(name);
    }
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "workflow lookup"),
    };
    let stored = match queries::latest_definition(&conn, name).await {
        Ok(Some(v)) => v,
        Ok(None) => return no_workflow(name),
        Err(e) => return store_error(e, "workflow lookup"),
    };
    drop(conn);
    match core.app.workflows.get(name) {
        // Known here already: served as cached (the same bytes as the version's).
        Some(wf) if Some(wf.def.version as u64) == stored["version"].as_u64() => {
            json_bytes(StatusCode::OK, wf.json.clone())
        }
        _ => match cached(core, stored) {
            Ok(wf) => json_bytes(StatusCode::OK, wf.json.clone()),
            Err(r) => r,
        },
    }
}

/// `GET /workflow/{name}/versions` (beyond Clamp): every version, oldest first.
pub async fn versions(core: &Core, name: &str) -> Resp {
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "workflow versions"),
    };
    match queries::workflow_versions(&conn, name).await {
        Ok(v) if v.is_empty() => no_workflow(name),
        Ok(v) => json(
            StatusCode::OK,
            &serde_json::json!({
                "name": name,
                "versions": v.iter().map(|(n, at, d)| serde_json::json!({
                    "version": n, "created_at": at, "description": d,
                })).collect::<Vec<_>>(),
            }),
        ),
        Err(e) => store_error(e, "workflow versions"),
    }
}

/// A `sortBy` value outside Clamp's grammar.
#[derive(Debug, PartialEq, Eq)]
pub struct UnsupportedSort;

/// Parses Clamp's `sortBy` (`name:asc,created_at:desc`; keys id, name, created_at).
pub fn parse_sort(raw: &str) -> Result<Vec<(WorkflowSort, bool)>, UnsupportedSort> {
    let lower = raw.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix(',').unwrap_or(&lower);
    if lower.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for pair in lower.split(',') {
        let (key, order) = pair.split_once(':').ok_or(UnsupportedSort)?;
        let key = match key.trim() {
            "id" => WorkflowSort::Id,
            "name" => WorkflowSort::Name,
            "created_at" => WorkflowSort::CreatedAt,
            _ => return Err(UnsupportedSort),
        };
        let desc = match order.trim() {
            "asc" => false,
            "desc" => true,
            _ => return Err(UnsupportedSort),
        };
        if out.iter().any(|(k, _)| *k == key) {
            return Err(UnsupportedSort);
        }
        out.push((key, desc));
    }
    Ok(out)
}

/// `GET /workflows?pageNumber=1&pageSize=10&sortBy=name:asc` (1-based, as Clamp).
pub async fn list(core: &Core, query: Option<&str>) -> Resp {
    let page_number = match page_param(query, "pageNumber", 1, i64::from(i32::MAX)) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let page_size = match page_param(query, "pageSize", 1, MAX_PAGE_SIZE) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let sort = match super::query_param(query, "sortBy") {
        None => Vec::new(),
        Some(raw) => match parse_sort(&raw) {
            Ok(s) => s,
            Err(UnsupportedSort) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unsupported value provided for sortBy query",
                )
            }
        },
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "list workflows"),
    };
    match queries::workflows_page(&conn, page_size, page_size * (page_number - 1), &sort).await {
        Ok((workflows, total)) => json(
            StatusCode::OK,
            &serde_json::json!({
                "workflows": workflows,
                "pageNumber": page_number,
                "pageSize": page_size,
                "totalWorkflowsCount": total,
            }),
        ),
        Err(e) => store_error(e, "list workflows"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sort_specs() {
        use WorkflowSort::*;
        assert_eq!(
            parse_sort("name:asc,created_at:desc"),
            Ok(vec![(Name, false), (CreatedAt, true)])
        );
        assert_eq!(parse_sort("NAME:DESC,"), Ok(vec![(Name, true)]));
        assert_eq!(parse_sort("id:asc"), Ok(vec![(Id, false)]));
        assert_eq!(parse_sort(""), Ok(vec![]));
        assert!(parse_sort("name").is_err());
        assert!(parse_sort("name:up").is_err());
        assert!(parse_sort("description:asc").is_err());
        assert!(parse_sort("name:asc,name:desc").is_err());
        assert!(parse_sort("name:asc;drop table").is_err());
    }
}
