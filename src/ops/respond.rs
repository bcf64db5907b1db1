//! A paused step's answer (`POST /stepResponse`, and the same answer from a broker):
//! applied by the engine (`engine::resume`) in one fenced statement, which resumes the
//! request at its next step. A repeat of an applied answer changes nothing.

use std::time::Duration;

use super::{no_request, OpError, Result};
pub use crate::engine::resume::parse;
use crate::engine::resume::{Answer, Applied};
use crate::state::Core;

/// What an answer did.
#[derive(Debug, PartialEq, Eq)]
pub enum Responded {
    /// The request resumed; the resume is committed.
    Resumed,
    /// The same answer was applied before: nothing changed.
    Duplicate,
}

/// Applies `answer`, waiting up to `patience` for a pause still being written (a fast
/// service can answer before its step's pause commits). 404 for an unknown request, 409
/// when it does not wait on that step, 422 when its workflow is gone or no longer
/// validates.
pub async fn respond(core: &Core, answer: &Answer, patience: Duration) -> Result<Responded> {
    match core
        .executor
        .apply_response(answer, patience)
        .await
        .map_err(OpError::engine("step response"))?
    {
        Applied::Resumed => Ok(Responded::Resumed),
        Applied::Duplicate => Ok(Responded::Duplicate),
        Applied::NotWaiting(msg) | Applied::NotYet(msg) => Err(OpError::Conflict(msg)),
        Applied::Unknown => Err(no_request()),
    }
}
