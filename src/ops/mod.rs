//! The operations of clamp's API, each one function in one module whatever carries it
//! (HTTP, the console, a broker): typed input, a typed result, and each side effect
//! (metrics, spans, notifying waiters, waking the executor) done once, here. HTTP and the
//! console parse, call and render what comes back; the store below returns rows; nothing
//! here builds an answer's JSON or markup.
//!
//! - `access`: which role each operation needs;
//! - `audit`: the record of every change an operator makes;
//! - `create`: create, delayed create, and the workflow a create runs;
//! - `read`: a request's status answer, and the long poll;
//! - `lists`: Clamp's list by workflow, search, counts;
//! - `control`: cancel, retry, bulk retry, rerun;
//! - `respond`: a paused step's answer (`POST /stepResponse`);
//! - `events`: an event delivered to the requests waiting for it (`POST /events/{event}`);
//! - `workflows`: define, replace, read, versions, list;
//! - `schedules`: define, replace, read, list, delete, trigger, pause, resume.

pub mod access;
pub mod audit;
pub mod consumers;
pub mod control;
pub mod create;
pub mod delayed;
pub mod events;
pub mod hooks;
pub mod lists;
pub mod pauses;
pub mod read;
pub mod respond;
pub mod schedules;
pub mod sessions;
pub mod system;
pub mod triggers;
pub mod workflows;

use crate::config::Config;
use crate::engine::EngineError;
use crate::state::Core;
use crate::store::workflow_map::WorkflowMap;
use crate::store::Pool;
pub use crate::store::StoreError;

/// What the operations on definitions (and the audit record of them) use, and no more:
/// the server's configuration, its workflow map and a pool. A server lends its own
/// (`deps`); `clamp workflows apply --database-url` builds one of its own, so a file
/// applied to the database passes the same checks, is stored by the same calls and
/// leaves the same audit record as `POST /workflow`.
pub struct Deps<'a> {
    pub config: &'a Config,
    pub workflows: &'a WorkflowMap,
    pub pool: &'a Pool,
    /// Told of a trigger changed, so this instance's consumers follow at once (None
    /// outside a server: every server reads the triggers every two seconds).
    pub triggers_changed: Option<&'a tokio::sync::Notify>,
}

/// A server's own `Deps`.
pub fn deps(core: &Core) -> Deps<'_> {
    Deps {
        config: &core.app.config,
        workflows: &core.app.workflows,
        pool: &core.pool,
        triggers_changed: Some(&core.app.triggers_changed),
    }
}

/// Why an operation did not happen, in classes its callers answer by (an HTTP status,
/// a console message); the message is for the caller to show.
#[derive(Debug)]
pub enum OpError {
    /// The input is wrong (HTTP 400).
    BadRequest(String),
    /// The caller's role does not allow it (403).
    Forbidden(String),
    /// The caller did not prove who it is: a webhook's signature (401).
    Unauthorized(String),
    /// What it names does not exist (404).
    NotFound(String),
    /// It cannot happen in the state things are in (409).
    Conflict(String),
    /// It can never apply (422).
    Unprocessable(String),
    /// Overload, or the database known to be down: try again soon (503).
    Unavailable(&'static str),
    /// The database failed while `doing` it, as its class says (logged once where it
    /// becomes an answer).
    Store {
        error: StoreError,
        doing: &'static str,
    },
    /// Something that should not happen (500); `detail` is logged, never shown.
    Internal(String),
}

/// What operations return.
pub type Result<T, E = OpError> = std::result::Result<T, E>;

impl OpError {
    /// A database failure while `doing` something.
    pub fn store(doing: &'static str) -> impl Fn(StoreError) -> OpError {
        move |error| OpError::Store { error, doing }
    }

    /// A failure to get a pooled connection while `doing` something.
    pub fn pool<E: std::error::Error + Send + Sync + 'static>(
        doing: &'static str,
    ) -> impl Fn(bb8::RunError<E>) -> OpError {
        move |e| OpError::Store {
            error: e.into(),
            doing,
        }
    }

    /// An engine failure while `doing` something: bad input 400, input that can never
    /// apply (its workflow is gone or no longer validates) 422.
    pub fn engine(doing: &'static str) -> impl Fn(EngineError) -> OpError {
        move |e| match e {
            EngineError::Store(error) => OpError::Store { error, doing },
            EngineError::BadInput(msg) => OpError::BadRequest(msg),
            e @ (EngineError::WorkflowMissing(_) | EngineError::WorkflowInvalid { .. }) => {
                OpError::Unprocessable(format!("this cannot be applied: {e}"))
            }
        }
    }

    /// The HTTP status every carrier (the API, the console) answers this error with: the
    /// one table of them.
    pub fn status(&self) -> u16 {
        match self {
            OpError::BadRequest(_) => 400,
            OpError::Forbidden(_) => 403,
            OpError::Unauthorized(_) => 401,
            OpError::NotFound(_) => 404,
            OpError::Conflict(_) => 409,
            OpError::Unprocessable(_) => 422,
            OpError::Unavailable(_) => 503,
            OpError::Store { error, .. } => match error {
                StoreError::Conflict => 409,
                StoreError::Invalid(_) => 400,
                StoreError::Unavailable(_) => 503,
                StoreError::Internal(_) => 500,
            },
            OpError::Internal(_) => 500,
        }
    }

    /// The message to show for this error, as every caller shows it (a store error's
    /// detail stays out; `http::response` logs it).
    pub fn message(&self) -> String {
        match self {
            OpError::BadRequest(m)
            | OpError::Forbidden(m)
            | OpError::Unauthorized(m)
            | OpError::NotFound(m)
            | OpError::Conflict(m)
            | OpError::Unprocessable(m) => m.clone(),
            OpError::Unavailable(m) => (*m).to_string(),
            OpError::Store { error, .. } => match error {
                StoreError::Conflict => "already exists".into(),
                StoreError::Invalid(_) => "invalid data: the database refused it".into(),
                StoreError::Unavailable(_) => "database unavailable, retry later".into(),
                StoreError::Internal(_) => "internal error".into(),
            },
            OpError::Internal(_) => "internal error".into(),
        }
    }
}

/// "no service request with this id": the one answer for an unknown request.
pub fn no_request() -> OpError {
    OpError::NotFound("no service request with this id".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_carrier_answers_an_error_with_one_status_and_one_message() {
        let store = |error| OpError::Store {
            error,
            doing: "test",
        };
        assert_eq!(store(StoreError::Conflict).status(), 409);
        assert_eq!(store(StoreError::Invalid("x".into())).status(), 400);
        assert_eq!(
            store(StoreError::Invalid("the detail".into())).message(),
            "invalid data: the database refused it"
        );
        assert_eq!(store(StoreError::unavailable("down")).status(), 503);
        assert_eq!(store(StoreError::Internal("x".into())).status(), 500);
        assert_eq!(OpError::Unavailable("busy").status(), 503);
        assert_eq!(OpError::Unprocessable("no".into()).status(), 422);
        assert_eq!(
            OpError::Internal("secret".into()).message(),
            "internal error"
        );
    }
}
