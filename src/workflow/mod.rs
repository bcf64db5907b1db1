//! Workflows as pure data and logic: definitions, validation, `when` conditions and
//! transforms. Nothing here does I/O, so all of it is tested with plain unit tests.

pub mod expr;
pub mod model;
pub mod retry;
pub mod transform;
pub mod validate;

pub use model::{
    AmqpVal, CompiledStep, HttpVal, KafkaVal, Mode, Step, StepType, Val, Workflow, WorkflowDef,
};
pub use retry::{RetryPolicy, RetrySpec};
pub use validate::{compile, set_default_reply_to, ValidationError};
