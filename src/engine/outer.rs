//! The context a fan-out child's steps (a branch's, an item's, an iteration's) see
//! besides their own: the enclosing requests' steps, read from Postgres level by level.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::Executor;
use crate::store::fan;
use crate::workflow::model::{ITEM_BRANCH, ITERATION, LOOP_BODY};

/// The context a fan-out child's steps see besides their own: its parent's steps, and
/// theirs upwards for a nested one, with a MAP item's `item` and `index`, innermost last
/// (so an inner name hides an outer one).
pub async fn outer_context(
    exec: &Executor,
    id: Uuid,
    workflow: &str,
    payload: &str,
) -> crate::store::Result<Map<String, Value>> {
    let conn = exec.pool.get().await?;
    // (parent, its item and index when the level is a MAP item, its iteration when the
    // level is a LOOP's), innermost first.
    type Level = (Uuid, Option<(Value, i32)>, Option<i32>);
    let mut levels: Vec<Level> = Vec::new();
    let (mut at, mut name, mut payload) = (id, workflow.to_string(), payload.to_string());
    for _ in 0..=crate::workflow::fan::MAX_DEPTH {
        if !name.contains('/') {
            break;
        }
        let Some(place) = fan::place(&conn, at).await? else {
            break;
        };
        let Some(parent) = place.parent else {
            break;
        };
        let item = (name.ends_with(&format!("/{ITEM_BRANCH}"))).then(|| {
            let v = serde_json::from_str(&payload).unwrap_or(Value::Null);
            (v, place.index.unwrap_or(0))
        });
        let iteration = name
            .ends_with(&format!("/{LOOP_BODY}"))
            .then(|| place.index.unwrap_or(0) + 1);
        levels.push((parent, item, iteration));
        (at, name, payload) = (parent, place.parent_workflow, place.parent_payload);
    }
    let mut ctx = Map::new();
    for (parent, item, iteration) in levels.into_iter().rev() {
        for r in crate::store::leases::load_context(&conn, parent).await? {
            ctx.insert(
                crate::workflow::expr::context_name(&r.step_name),
                crate::outbound::doc::context_entry(
                    r.request.unwrap_or_default(),
                    r.response.unwrap_or_default(),
                ),
            );
        }
        if let Some((item, index)) = item {
            ctx.insert(ITEM_BRANCH.into(), item);
            ctx.insert("index".into(), Value::from(index));
        }
        if let Some(iteration) = iteration {
            ctx.insert(ITERATION.into(), Value::from(iteration));
        }
    }
    Ok(ctx)
}
