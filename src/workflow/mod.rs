//! Workflows as pure data and logic: definitions, validation, `when` conditions and
//! transforms. Nothing here does I/O, so all of it is tested with plain unit tests.

pub(crate) mod brokers;
pub(crate) mod expr;
pub(crate) mod fan;
pub(crate) mod input_schema;
pub(crate) mod loops;
pub(crate) mod model;
pub(crate) mod notify;
pub(crate) mod pick;
pub(crate) mod retention;
pub(crate) mod retry;
pub(crate) mod schedule;
pub(crate) mod switch;
pub(crate) mod transform;
pub(crate) mod trigger;
pub(crate) mod validate;
pub(crate) mod wait;

pub use model::{
    AmqpVal, CompiledStep, HttpVal, KafkaVal, Mode, StepType, Val, Workflow, WorkflowDef,
};
pub use retry::{RetryPolicy, RetrySpec};
pub use validate::{compile, header_pairs, set_default_reply_to, ValidationError};
