//! The queries behind the read endpoints and workflow creation. The hot insert lives
//! in `buffer.rs`; statements used per request are prepared once per connection
//! (see `pool.rs`), the rest are rare enough to be prepared on use.

use crate::status::RequestStatus;
use serde_json::Value;
use uuid::Uuid;

use super::pool::PgConn;
use super::Result;
use super::StoreError;
use crate::workflow::WorkflowDef;

pub(super) const INSERT_WORKFLOW: &str = "WITH w AS (
                INSERT INTO workflows (id, name, description, enabled, definition, version)
                VALUES ($1, $2, $3, $4, $5::jsonb || jsonb_build_object('created_at', now(), 'updated_at', now()), 1)
                RETURNING name, description, definition, created_at)
             INSERT INTO workflow_versions (name, version, description, definition, created_at)
             SELECT name, 1, description, definition, created_at FROM w
             RETURNING definition ->> 'created_at'";

/// Inserts a workflow as its version 1 (kept in `workflow_versions` too, in the same
/// statement), stamping `created_at`/`updated_at` into the stored definition; returns
/// that timestamp (RFC 3339). A taken name is `Conflict`.
pub async fn insert_workflow(conn: &PgConn, def: &WorkflowDef, id: Uuid) -> Result<String> {
    let mut def = def.clone();
    def.version = 1;
    let definition = serde_json::to_value(&def).expect("a workflow always serializes");
    let row = conn
        .client
        .query_one(
            INSERT_WORKFLOW,
            &[&id, &def.name, &def.description, &def.enabled, &definition],
        )
        .await?;
    Ok(row.get(0))
}

/// What storing a new version did.
#[derive(Debug)]
pub enum Versioned {
    /// Stored as this version: the definition as stored.
    New(Value),
    /// The latest version is this definition already (nothing stored): it, as stored.
    Unchanged(Value),
    /// No workflow has this name.
    Unknown,
}

/// `$1` name, `$2` description, `$3` enabled, `$4` the definition. The keys of a stored
/// definition that the server sets (`'id', 'version', 'created_at', 'updated_at'`) are
/// left out when two definitions are compared, and set anew on the version stored.
pub(super) const PUT_WORKFLOW: &str = "WITH cur AS (
            SELECT name, version, definition FROM workflows WHERE name = $1 FOR UPDATE
        ), next AS (
            UPDATE workflows w SET version = w.version + 1, description = $2, enabled = $3,
                   updated_at = now(),
                   definition = $4::jsonb - ARRAY['id', 'version', 'created_at', 'updated_at']
                       || jsonb_build_object('id', w.id, 'version', w.version + 1,
                                             'created_at', w.created_at, 'updated_at', now())
            FROM cur
            WHERE w.name = cur.name
              AND (cur.definition - ARRAY['id', 'version', 'created_at', 'updated_at']) IS DISTINCT FROM ($4::jsonb - ARRAY['id', 'version', 'created_at', 'updated_at'])
            RETURNING w.name, w.version, w.description, w.definition
        ), kept AS (
            INSERT INTO workflow_versions (name, version, description, definition)
            SELECT name, version, description, definition FROM next
        )
        SELECT (SELECT definition FROM next), (SELECT definition FROM cur)";

/// Stores `def` as the next version of its workflow, unless the latest is the same
/// definition. One statement: the row lock on the workflow numbers concurrent versions
/// one after another, without gaps or duplicates.
pub async fn put_workflow(conn: &PgConn, def: &WorkflowDef) -> Result<Versioned> {
    let definition = serde_json::to_value(def).expect("a workflow always serializes");
    let row = conn
        .client
        .query_one(
            PUT_WORKFLOW,
            &[&def.name, &def.description, &def.enabled, &definition],
        )
        .await?;
    Ok(
        match (
            row.get::<_, Option<Value>>(0),
            row.get::<_, Option<Value>>(1),
        ) {
            (Some(new), _) => Versioned::New(new),
            (None, Some(cur)) => Versioned::Unchanged(cur),
            (None, None) => Versioned::Unknown,
        },
    )
}

pub(super) const WORKFLOW_VERSION: &str =
    "SELECT definition || jsonb_build_object('version', version) FROM workflow_versions \
     WHERE name = $1 AND version = $2";

/// One version's stored definition, or None.
pub async fn workflow_version(
    conn: &PgConn,
    name: &str,
    version: u32,
) -> Result<Option<WorkflowDef>> {
    let row = conn
        .client
        .query_opt(WORKFLOW_VERSION, &[&name, &(version as i32)])
        .await?;
    Ok(row.and_then(|r| serde_json::from_value(r.get::<_, Value>(0)).ok()))
}

pub(super) const WORKFLOW_VERSIONS: &str =
    "SELECT version, to_json(created_at) #>> '{}', description FROM workflow_versions \
     WHERE name = $1 ORDER BY version";

/// A workflow's versions, oldest first: (number, created_at, description).
pub async fn workflow_versions(conn: &PgConn, name: &str) -> Result<Vec<(i32, String, String)>> {
    let rows = conn.client.query(WORKFLOW_VERSIONS, &[&name]).await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

pub(super) const DEFINITION: &str = "SELECT definition FROM workflows WHERE name = $1";

/// One workflow's stored definition, or None.
pub async fn workflow_by_name(conn: &PgConn, name: &str) -> Result<Option<WorkflowDef>> {
    let row = conn.client.query_opt(DEFINITION, &[&name]).await?;
    Ok(row.and_then(|r| serde_json::from_value(r.get::<_, Value>(0)).ok()))
}

/// The latest stored definition of a workflow (as served), or None.
pub async fn latest_definition(conn: &PgConn, name: &str) -> Result<Option<Value>> {
    let row = conn.client.query_opt(DEFINITION, &[&name]).await?;
    Ok(row.map(|r| r.get(0)))
}

pub(super) const ALL_WORKFLOWS: &str = "SELECT definition FROM workflows ORDER BY created_at";

/// Every workflow, for warming the in-memory map at startup.
pub async fn all_workflows(client: &tokio_postgres::Client) -> Result<Vec<WorkflowDef>> {
    let rows = client.query(ALL_WORKFLOWS, &[]).await?;
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

/// A page of workflows in the order asked for: the one statement of the store built per
/// call (its ORDER BY from whitelisted keys), so it is a template in `statements.sql`.
pub(super) fn workflows_page_sql(order: impl std::fmt::Display) -> String {
    format!("SELECT definition FROM workflows ORDER BY {order} LIMIT $1 OFFSET $2")
}

pub(super) const COUNT_WORKFLOWS: &str = "SELECT count(*) FROM workflows";

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
    let page_sql = workflows_page_sql(order);
    let (rows, count) = futures_util::future::try_join(
        conn.client.query(&page_sql, &[&page_size, &offset]),
        conn.client.query_one(COUNT_WORKFLOWS, &[]),
    )
    .await?;
    Ok((
        rows.into_iter().map(|r| r.get::<_, Value>(0)).collect(),
        count.get(0),
    ))
}

/// A request as lists show it (Clamp's list by workflow and search alike).
#[derive(Debug, Clone)]
pub struct RequestRow {
    pub id: Uuid,
    pub workflow_name: String,
    /// As reads show it (`IN_PROGRESS` derived).
    pub status: RequestStatus,
    /// As Postgres renders a timestamptz in JSON (the session is in UTC).
    pub created_at: String,
    /// JSON text, as stored.
    pub payload: Option<String>,
    pub current_step_id: i32,
    pub reason: Option<String>,
    /// Its labels (beyond Clamp; empty: none).
    pub labels: Vec<String>,
}

impl RequestRow {
    pub(crate) fn of(r: &tokio_postgres::Row) -> RequestRow {
        RequestRow {
            id: r.get("id"),
            workflow_name: r.get("workflow_name"),
            status: r.get("status"),
            created_at: r.get("created_at"),
            payload: r.get("payload"),
            current_step_id: r.get("current_step_id"),
            reason: r.get("reason"),
            labels: r
                .get::<_, Option<Vec<String>>>("labels")
                .unwrap_or_default(),
        }
    }
}

pub(super) const REQUESTS_PAGE: &str = concat!(
    "SELECT s.id, s.workflow_name, ",
    crate::store::sql::derived_status!("s"),
    " AS status, \
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, \
        s.current_step_id, s.reason, s.labels \
     FROM service_requests s WHERE s.workflow_name = $1 \
     ORDER BY s.id DESC LIMIT $2 OFFSET $3"
);

/// `GET /serviceRequests/{workflow}`: a page of requests, newest first.
pub async fn service_requests_page(
    conn: &PgConn,
    workflow: &str,
    page_size: i64,
    offset: i64,
) -> Result<Vec<RequestRow>> {
    let rows = conn
        .client
        .query(REQUESTS_PAGE, &[&workflow, &page_size, &offset])
        .await?;
    Ok(rows.iter().map(RequestRow::of).collect())
}

/// Parses stored JSON text (validated before it was written); unparsable text is returned
/// as a string rather than failing the whole read.
pub fn parse_opt(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string())))
}
