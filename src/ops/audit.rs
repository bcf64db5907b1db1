//! The audit trail (beyond Clamp): every change an operator makes, recorded with the
//! token's name (never the token), the time, its target and outcome, in Postgres (read
//! through `GET /audit`) and as a log line (`clamp::audit`, in the JSON logs a field per
//! part). Recorded after the change, by whichever carrier made it (the API's dispatch,
//! the console); a record that cannot be written is logged and does not undo the change.

use super::{OpError, Result};
use crate::state::Core;
use crate::store::audit::{self, Entry};
use crate::tokens::Caller;

/// Records one change.
pub async fn record(core: &Core, caller: &Caller, action: &str, target: &str, outcome: &str) {
    tracing::info!(target: "clamp::audit", actor = %caller.name, action, target, outcome, "audit");
    let written = async {
        let conn = core
            .pool
            .get()
            .await
            .map_err(crate::store::StoreError::from)?;
        audit::record(&conn, &caller.name, action, target, outcome).await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(target: "clamp::audit", error = %e, action, target, "an audit record could not be written");
    }
}

/// The most recent changes, newest first, before id `before` (None: from the newest).
pub async fn list(core: &Core, before: Option<i64>, limit: i64) -> Result<Vec<Entry>> {
    let conn = core.pool.get().await.map_err(OpError::pool("audit read"))?;
    audit::list(&conn, before.unwrap_or(0), limit)
        .await
        .map_err(OpError::store("audit read"))
}
