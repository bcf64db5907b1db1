//! Triggers (beyond Clamp): define, list, read, replace, delete, pause and resume. A
//! definition is read and checked by `workflow::trigger` (a 400 names the field), its
//! workflow (and version) looked up as a create would, and its secret must be set. What
//! a trigger does with a message is `ops::hooks`.

use serde_json::Value;

use super::access::Op;
use super::audit::{recorded, Told, NOT_CREATED};
use super::{Deps, OpError, Result};
use crate::state::Core;
use crate::store::triggers::{self as store, Stored};
use crate::store::StoreError;
use crate::tokens::Caller;
use crate::workflow::trigger::{self as def, CompiledTrigger, Source};

/// Most triggers a list holds (by name).
const MAX_LIST: i64 = 1000;

/// A trigger as its readers see it.
pub struct Trigger {
    pub stored: Stored,
}

impl Told for Trigger {}

fn no_trigger(name: &str) -> OpError {
    OpError::NotFound(format!("no trigger named {name:?}"))
}

fn bad(msg: String) -> OpError {
    OpError::BadRequest(msg)
}

/// A posted definition (`name` from the path when it has none), checked with its
/// workflow and its secret; and the `paused` it asks for.
async fn checked(
    d: &Deps<'_>,
    mut v: Value,
    path_name: Option<&str>,
) -> Result<(CompiledTrigger, Option<bool>)> {
    if let (Some(name), Value::Object(obj)) = (path_name, &mut v) {
        obj.entry("name")
            .or_insert_with(|| Value::String(name.to_string()));
    }
    let t = def::validate(&v).map_err(|e| bad(e.0))?;
    if let Some(name) = path_name.filter(|n| *n != t.name) {
        return Err(bad(format!(
            "name: the definition is named {:?}, the path {name:?}",
            t.name
        )));
    }
    super::create::workflow_in(d, &t.workflow, t.version)
        .await
        .map_err(|e| match e {
            OpError::NotFound(m) => bad(format!("workflow: {m}")),
            other => other,
        })?;
    let secrets = &d.config.secrets;
    match &t.source {
        Source::Webhook { secret, .. } => secrets
            .check(secret)
            .map_err(|e| bad(format!("source.webhook.secret: {e}")))?,
        Source::Amqp { url, endpoint, .. } => {
            secrets
                .check(url)
                .map_err(|e| bad(format!("source.amqp.url: {e}")))?;
            d.config
                .destinations
                .check_host(&endpoint.host.as_str())
                .map_err(|e| bad(format!("source.amqp.url: {e}")))?;
        }
        Source::Kafka {
            connection,
            brokers,
            ..
        } => {
            secrets
                .check(connection)
                .map_err(|e| bad(format!("source.kafka.connection: {e}")))?;
            for b in brokers {
                d.config
                    .destinations
                    .check_host(&b.host.as_str())
                    .map_err(|e| bad(format!("source.kafka.connection: {e}")))?;
            }
        }
    }
    Ok((t, def::paused_in(&v)))
}

/// `POST /triggers`: a new trigger (409 when the name is taken).
/// Recorded in the audit trail as `who`'s.
pub async fn define(d: &Deps<'_>, who: &Caller, definition: Value) -> Result<Trigger> {
    let r = define_it(d, definition).await;
    let target = match &r {
        Ok(t) => t.stored.definition["name"].as_str().unwrap_or(NOT_CREATED),
        Err(_) => NOT_CREATED,
    }
    .to_string();
    changed(
        d,
        recorded(d.pool, who, Op::ChangeTrigger, &target, r).await,
    )
}

/// Passes `r` on, telling this instance's triggers' supervisor when it is a change made.
fn changed<T>(d: &Deps<'_>, r: Result<T>) -> Result<T> {
    if let (Ok(_), Some(n)) = (&r, d.triggers_changed) {
        n.notify_one();
    }
    r
}

async fn define_it(d: &Deps<'_>, definition: Value) -> Result<Trigger> {
    let (t, paused) = checked(d, definition, None).await?;
    let doing = "create trigger";
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    match store::insert(&conn, &t.name, &t.definition, paused.unwrap_or(false)).await {
        Ok(stored) => Ok(Trigger { stored }),
        Err(StoreError::Conflict) => Err(OpError::Conflict(format!(
            "a trigger named {:?} already exists",
            t.name
        ))),
        Err(error) => Err(OpError::Store { error, doing }),
    }
}

/// Every trigger (up to `MAX_LIST`, by name).
pub async fn list(core: &Core) -> Result<Vec<Trigger>> {
    let doing = "list triggers";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let rows = store::list(&conn, MAX_LIST)
        .await
        .map_err(OpError::store(doing))?;
    Ok(rows.into_iter().map(|stored| Trigger { stored }).collect())
}

/// `GET /triggers/{name}`.
pub async fn read(core: &Core, name: &str) -> Result<Trigger> {
    let doing = "read trigger";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    store::get(&conn, name)
        .await
        .map_err(OpError::store(doing))?
        .map(|stored| Trigger { stored })
        .ok_or_else(|| no_trigger(name))
}

/// `PUT /triggers/{name}`: replaces the definition; `paused` given sets it, left out the
/// trigger stays as it was. Recorded in the audit trail as `who`'s.
pub async fn replace(d: &Deps<'_>, who: &Caller, name: &str, definition: Value) -> Result<Trigger> {
    let r = async {
        let (t, paused) = checked(d, definition, Some(name)).await?;
        let doing = "replace trigger";
        let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
        store::put(&conn, name, &t.definition, paused)
            .await
            .map_err(OpError::store(doing))?
            .map(|stored| Trigger { stored })
            .ok_or_else(|| no_trigger(name))
    }
    .await;
    changed(d, recorded(d.pool, who, Op::ChangeTrigger, name, r).await)
}

/// What applying a trigger's definition from a file did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Replaced,
    /// The stored definition is the same (and `paused`, when the file gives it).
    Unchanged,
}

/// `clamp workflows apply` of a trigger's file: defined when new, replaced when its
/// definition (or the `paused` it gives) differs from the stored one, else left as it is
/// (nothing stored, nothing in the audit trail).
pub async fn apply(d: &Deps<'_>, who: &Caller, definition: Value) -> Result<Applied> {
    let t = def::validate(&definition).map_err(|e| bad(e.0))?;
    let doing = "read trigger";
    let stored = {
        let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
        store::get(&conn, &t.name)
            .await
            .map_err(OpError::store(doing))?
    };
    match stored {
        None => define(d, who, definition).await.map(|_| Applied::Created),
        Some(s) if def::unchanged(&s.definition, s.paused, &t, def::paused_in(&definition)) => {
            Ok(Applied::Unchanged)
        }
        Some(_) => {
            let name = t.name;
            replace(d, who, &name, definition)
                .await
                .map(|_| Applied::Replaced)
        }
    }
}

/// `DELETE /triggers/{name}`: the requests it started stay.
/// Recorded in the audit trail as `who`'s.
pub async fn delete(core: &Core, who: &Caller, name: &str) -> Result<()> {
    let r = async {
        let doing = "delete trigger";
        let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
        match store::delete(&conn, name).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(no_trigger(name)),
            Err(error) => Err(OpError::Store { error, doing }),
        }
    }
    .await;
    changed(
        &super::deps(core),
        recorded(&core.pool, who, Op::ChangeTrigger, name, r).await,
    )
}

/// `POST /triggers/{name}/pause` (`paused`) and `/resume`: a paused webhook answers 503
/// with `Retry-After`, so its sender delivers again later.
/// Recorded in the audit trail as `who`'s.
pub async fn set_paused(core: &Core, who: &Caller, name: &str, paused: bool) -> Result<Trigger> {
    let r = async {
        let doing = if paused {
            "pause trigger"
        } else {
            "resume trigger"
        };
        let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
        store::set_paused(&conn, name, paused)
            .await
            .map_err(OpError::store(doing))?
            .map(|stored| Trigger { stored })
            .ok_or_else(|| no_trigger(name))
    }
    .await;
    changed(
        &super::deps(core),
        recorded(&core.pool, who, Op::ChangeTrigger, name, r).await,
    )
}
