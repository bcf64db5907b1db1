//! `Core`: one runtime's own resources, as the handlers and consumers of that runtime see
//! them (the shared part is `engine::App`).

use std::sync::Arc;

use crate::engine::App;
use crate::store::{Pool, WriteBuffer};

/// One runtime's own resources: the hot path touches nothing shared but `App`'s map and counters.
pub struct Core {
    pub app: Arc<App>,
    pub pool: Pool,
    pub buffer: WriteBuffer,
    /// Status reads, batched.
    pub reader: crate::store::reader::StatusReader,
    pub executor: Arc<crate::engine::Executor>,
}
