//! `POST /stepResponse`: resumes a service request paused at an ASYNC step.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::response::{error, Resp};
use crate::state::Core;

/// Resuming needs the execution engine; until it runs, nothing is ever PAUSED.
pub async fn post(_core: &Core, _req: Request<Incoming>) -> Resp {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "step responses are not supported yet",
    )
}
