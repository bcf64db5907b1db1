//! The queries behind the read endpoints and workflow creation. The hot insert lives
//! in `buffer.rs`; statements used per request are prepared once per connection
//! (see `pool.rs`), the rest are rare enough to be prepared on use.

use serde_json::{json, Value};
use uuid::Uuid;

use super::pool::PgConn;
use super::Result;
use super::StoreError;
use crate::workflow::WorkflowDef;

/// Inserts a workflow, stamping `created_at`/`updated_at` into the stored definition;
/// returns that timestamp (RFC 3339). A taken name is `Conflict`.
pub async fn insert_workflow(conn: &PgConn, def: &WorkflowDef, id: Uuid) -> Result<String> {
    let definition = serde_json::to_value(def).expect("a workflow always serializes");
    let row = conn
        .client
        .query_one(
            "INSERT INTO workflows (id, name, description, enabled, definition) \
             VALUES ($1, $2, $3, $4, $5::jsonb || jsonb_build_object('created_at', now(), 'updated_at', now())) \
             RETURNING definition ->> 'created_at'",
            &[&id, &def.name, &def.description, &def.enabled, &definition],
        )
        .await?;
    Ok(row.get(0))
}

/// One workflow's stored definition, or None.
pub async fn workflow_by_name(conn: &PgConn, name: &str) -> Result<Option<WorkflowDef>> {
    let row = conn
        .client
        .query_opt("SELECT definition FROM workflows WHERE name = $1", &[&name])
        .await?;
    Ok(row.and_then(|r| serde_json::from_value(r.get::<_, Value>(0)).ok()))
}

/// Every workflow, for warming the in-memory map at startup.
pub async fn all_workflows(client: &tokio_postgres::Client) -> Result<Vec<WorkflowDef>> {
    let rows = client
        .query("SELECT definition FROM workflows ORDER BY created_at", &[])
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| serde_json::from_value(r.get::<_, Value>(0)).ok())
        .collect())
}

/// A sort key of `GET /workflows`, already whitelisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkflowSort {
    Id,
    Name,
    CreatedAt,
}

/// A page of workflows (definitions as stored) and the total count.
pub async fn workflows_page(
    conn: &PgConn,
    page_size: i64,
    offset: i64,
    sort: &[(WorkflowSort, bool)],
) -> Result<(Vec<Value>, i64), StoreError> {
    let mut order = String::new();
    for (key, desc) in sort {
        let col = match key {
            WorkflowSort::Id => "id",
            WorkflowSort::Name => "name",
            WorkflowSort::CreatedAt => "created_at",
        };
        order.push_str(col);
        order.push_str(if *desc { " DESC, " } else { " ASC, " });
    }
    // A stable tie-breaker so pages never overlap.
    order.push_str("name ASC");
    let page_sql = format!("SELECT definition FROM workflows ORDER BY {order} LIMIT $1 OFFSET $2");
    let (rows, count) = futures_util::future::try_join(
        conn.client.query(&page_sql, &[&page_size, &offset]),
        conn.client.query_one("SELECT count(*) FROM workflows", &[]),
    )
    .await?;
    Ok((
        rows.into_iter().map(|r| r.get::<_, Value>(0)).collect(),
        count.get(0),
    ))
}

/// `GET /serviceRequests/{workflow}`: a page of requests, newest first.
pub async fn service_requests_page(
    conn: &PgConn,
    workflow: &str,
    page_size: i64,
    offset: i64,
) -> Result<Vec<Value>> {
    let rows = conn
        .client
        .query(
            concat!(
                "SELECT s.id, s.workflow_name, ",
                crate::store::sql::derived_status!("s"),
                " AS status, \
                    to_json(s.created_at) #>> '{}' AS created_at, s.payload, \
                    s.current_step_id, s.reason \
             FROM service_requests s WHERE s.workflow_name = $1 \
             ORDER BY s.id DESC LIMIT $2 OFFSET $3"
            ),
            &[&workflow, &page_size, &offset],
        )
        .await?;
    Ok(rows.iter().map(list_item).collect())
}

/// One request as lists show it (`GET /serviceRequests/{workflow}` and search alike).
pub(crate) fn list_item(r: &tokio_postgres::Row) -> Value {
    json!({
        "id": r.get::<_, Uuid>("id").to_string(),
        "workflow_name": r.get::<_, &str>("workflow_name"),
        "status": r.get::<_, &str>("status"),
        "created_at": r.get::<_, &str>("created_at"),
        "payload": parse_opt(r.get("payload")).unwrap_or(Value::Null),
        "current_step_id": r.get::<_, i32>("current_step_id"),
        "reason": r.get::<_, Option<&str>>("reason").unwrap_or(""),
    })
}

/// Parses stored JSON text (validated before it was written); unparsable text is returned
/// as a string rather than failing the whole read.
pub fn parse_opt(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string())))
}
