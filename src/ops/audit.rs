//! The audit trail (beyond Clamp): every change an operator makes, recorded with the
//! token's name (never the token), the time, its target and outcome, in Postgres (read
//! through `GET /audit`) and as a log line (`clamp::audit`, in the JSON logs a field per
//! part). Recorded by the operation itself once its outcome is known (`recorded`), so
//! the API and the console leave the same trail; a refusal for want of a role is recorded
//! by `refused`. A request its carrier could not read (a malformed id or body) never became
//! an operation and is not recorded. A record that cannot be written is logged and does
//! not undo the change.

use super::access::{self, Op};
use super::{OpError, Result};
use crate::store::audit::{self, Entry};
use crate::store::Pool;
use crate::tokens::Caller;

/// How the trail words a change that was done: `ok`, unless the change has more to say.
pub(super) trait Told {
    fn told(&self) -> String {
        "ok".to_string()
    }
}

impl Told for () {}

/// Records `op`, done by `who` on `target`, with its outcome (`ok`, or the status and
/// message the failure is answered with), when it is a change the trail records; returns
/// the outcome as it was.
pub(super) async fn recorded<T: Told>(
    pool: &Pool,
    who: &Caller,
    op: Op,
    target: &str,
    r: Result<T>,
) -> Result<T> {
    if let Some(action) = access::audited(op) {
        let outcome = match &r {
            Ok(done) => done.told(),
            Err(e) => format!("{}: {}", e.status(), e.message()),
        };
        record(pool, who, action, target, &outcome).await;
    }
    r
}

/// A refusal of `op` to `who` for want of a role (`access::allow`'s error), recorded in
/// the audit trail when `op` is a change it records; returns it. `arg` is what the change
/// was aimed at (a path's argument; empty for one that would have created something).
/// Only a refused request comes here: the check itself is `access::allow`, which costs a
/// request nothing.
pub async fn refused(pool: &Pool, who: &Caller, op: Op, arg: &str, e: OpError) -> OpError {
    let target = match op {
        Op::BulkRetry => MATCHING,
        _ if arg.is_empty() => NOT_CREATED,
        _ => arg,
    };
    match recorded(pool, who, op, target, Err::<(), _>(e)).await {
        Err(e) => e,
        Ok(()) => unreachable!("a refusal stays one"),
    }
}

/// What the trail names as the target of a create that did not create anything.
pub const NOT_CREATED: &str = "(not created)";

/// What the trail names as a bulk retry's target.
pub const MATCHING: &str = "the requests matching its filters";

/// Records one change.
pub(super) async fn record(
    pool: &Pool,
    caller: &Caller,
    action: &str,
    target: &str,
    outcome: &str,
) {
    tracing::info!(target: "clamp::audit", actor = %caller.name, action, target, outcome, "audit");
    let written = async {
        let conn = pool.get().await.map_err(crate::store::StoreError::from)?;
        audit::record(&conn, &caller.name, action, target, outcome).await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(target: "clamp::audit", error = %e, action, target, "an audit record could not be written");
    }
}

/// The most recent changes, newest first, before id `before` (None: from the newest).
pub async fn list(pool: &Pool, before: Option<i64>, limit: i64) -> Result<Vec<Entry>> {
    let conn = pool.get().await.map_err(OpError::pool("audit read"))?;
    audit::list(&conn, before.unwrap_or(0), limit)
        .await
        .map_err(OpError::store("audit read"))
}
