//! Triggers as files, beside workflows: a definition file whose object has a `source` is
//! a trigger's (`POST /triggers`' body). `apply` checks each as the server reads one
//! (and that its workflow is a file here or known), applies them after the workflows
//! they start, and replaces a stored trigger only when its definition (or the `paused`
//! the file gives) differs; `export` writes each as `triggers/<name>.json` without the
//! server's stamps and without `paused`, so applying an export changes nothing, and a
//! trigger paused during an incident stays paused.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use serde_json::Value;

use super::{segment, Backend};
use crate::ops::triggers::Applied;

/// Whether a definition file holds a trigger (rather than a workflow).
pub fn is_trigger(v: &Value) -> bool {
    v.get("source").is_some() && v.get("steps").is_none()
}

/// A trigger's file checked as the server reads a definition; its name and workflow.
pub fn check(v: &Value) -> anyhow::Result<(String, String)> {
    let t = crate::workflow::trigger::validate(v).map_err(|e| anyhow!(e.0))?;
    Ok((t.name, t.workflow))
}

/// The stored trigger `name` as its file would hold it (no stamps), and whether it is
/// paused.
async fn current(backend: &Backend, name: &str) -> anyhow::Result<Option<(Value, bool)>> {
    match backend {
        Backend::Http { .. } => {
            let path = format!("/triggers/{}", segment(name));
            let (status, v) = backend.call(hyper::Method::GET, &path, None).await?;
            let paused = v["paused"].as_bool().unwrap_or(false);
            Ok((status == 200).then(|| (unstamped(v), paused)))
        }
        Backend::Db(db) => {
            let conn = db.pool.get().await?;
            Ok(crate::store::triggers::get(&conn, name)
                .await?
                .map(|s| (s.definition, s.paused)))
        }
    }
}

/// A trigger as a file keeps it: its definition without the server's stamps or `paused`.
pub fn unstamped(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        for k in ["paused", "createdAt", "updatedAt"] {
            o.remove(k);
        }
    }
    v
}

/// Applies one trigger's file; what it did, as `apply` prints it.
pub async fn apply_one(backend: &Backend, def: &Value, dry_run: bool) -> anyhow::Result<String> {
    let t = crate::workflow::trigger::validate(def).map_err(|e| anyhow!(e.0))?;
    let paused = crate::workflow::trigger::paused_in(def);
    if let (Backend::Db(db), false) = (backend, dry_run) {
        let done = crate::ops::triggers::apply(&db.deps(), &db.who, def.clone())
            .await
            .map_err(|e| anyhow!(e.message()))?;
        return Ok(said(&done).into());
    }
    let done = match current(backend, &t.name).await? {
        None => Applied::Created,
        Some((stored, was)) if crate::workflow::trigger::unchanged(&stored, was, &t, paused) => {
            Applied::Unchanged
        }
        Some(_) => Applied::Replaced,
    };
    if dry_run {
        return Ok(match done {
            Applied::Created => "trigger would be created",
            Applied::Replaced => "trigger would be replaced",
            Applied::Unchanged => "trigger unchanged",
        }
        .into());
    }
    let (method, path) = match done {
        Applied::Unchanged => return Ok(said(&done).into()),
        Applied::Created => (hyper::Method::POST, "/triggers".to_string()),
        Applied::Replaced => (
            hyper::Method::PUT,
            format!("/triggers/{}", segment(&t.name)),
        ),
    };
    let (status, _) = backend.call(method, &path, Some(def.clone())).await?;
    if status == 404 {
        bail!("the server has no {path} (or the trigger was deleted meanwhile)");
    }
    Ok(said(&done).into())
}

fn said(done: &Applied) -> &'static str {
    match done {
        Applied::Created => "trigger created",
        Applied::Replaced => "trigger replaced",
        Applied::Unchanged => "trigger unchanged",
    }
}

/// Every stored trigger, as files keep them.
pub async fn all(backend: &Backend) -> anyhow::Result<Vec<Value>> {
    match backend {
        Backend::Http { .. } => {
            let (_, v) = backend.call(hyper::Method::GET, "/triggers", None).await?;
            Ok(v["triggers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(unstamped)
                .collect())
        }
        Backend::Db(db) => {
            let conn = db.pool.get().await?;
            Ok(crate::store::triggers::list(&conn, 1000)
                .await?
                .into_iter()
                .map(|s| s.definition)
                .collect())
        }
    }
}

/// Writes every stored trigger as `dir/triggers/<name>.json`.
pub async fn export(backend: &Backend, dir: &std::path::Path) -> anyhow::Result<()> {
    let all = all(backend).await?;
    if all.is_empty() {
        return Ok(());
    }
    let dir = dir.join("triggers");
    std::fs::create_dir_all(&dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    for def in all {
        let name = def["name"].as_str().unwrap_or_default();
        let path: PathBuf = dir.join(format!("{name}.json"));
        let mut text = serde_json::to_string_pretty(&def).expect("a definition serializes");
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        println!("{}: exported", path.display());
    }
    Ok(())
}
