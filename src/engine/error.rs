//! The engine's errors, each with a class: transient (the same work can succeed later, so
//! the request is set aside and continued) or permanent (the request cannot go on).
//!
//! Errors of a step's own call (HTTP, AMQP, Kafka) are not here: they are the step's
//! outcome and follow its retry policy (`call::CallError`).

use crate::store::{LoadError, StoreError};

/// Why the engine could not do something with a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// Postgres or the pool: transient unless the store says otherwise.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request's workflow does not exist (permanent).
    #[error("workflow {0} does not exist")]
    WorkflowMissing(String),
    /// The stored workflow no longer validates (permanent).
    #[error("workflow {name} no longer validates: {reason}")]
    WorkflowInvalid { name: String, reason: String },
    /// Input that can never apply: a malformed step response (permanent).
    #[error("{0}")]
    BadInput(String),
}

/// The engine's `Result`.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// True when the same work may succeed later (here or on another instance).
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Store(e) => e.is_transient(),
            EngineError::WorkflowMissing(_)
            | EngineError::WorkflowInvalid { .. }
            | EngineError::BadInput(_) => false,
        }
    }
}

impl From<LoadError> for EngineError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Store(e) => EngineError::Store(e),
            LoadError::Invalid { name, reason } => EngineError::WorkflowInvalid { name, reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_a_class() {
        let transient = [EngineError::Store(StoreError::Unavailable(
            "pool timed out".into(),
        ))];
        let permanent = [
            EngineError::Store(StoreError::Invalid("bad".into())),
            EngineError::Store(StoreError::Internal("42P01".into())),
            EngineError::WorkflowMissing("w".into()),
            EngineError::WorkflowInvalid {
                name: "w".into(),
                reason: "r".into(),
            },
            EngineError::BadInput("x".into()),
        ];
        assert!(transient.iter().all(EngineError::is_transient));
        assert!(!permanent.iter().any(EngineError::is_transient));
    }
}
