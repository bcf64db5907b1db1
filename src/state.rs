//! The composition root: `App`, what every runtime of this process shares (the engine's
//! part, `engine::Shared`, and what only the carriers use), and `Core`, one runtime's own
//! resources as the handlers and consumers of that runtime see them.

use std::ops::Deref;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::engine::Shared;
use crate::store::{Pool, WriteBuffer};

/// What every runtime of this process shares. Reads of the engine's part go through
/// `Deref` (`core.app.config`): one process has one of each, wherever it is kept.
pub struct App {
    /// The engine's part: executors hold it, without what is above them.
    pub engine: Arc<Shared>,
    /// Console sign-in attempts per client address, for the whole process.
    pub sign_ins: crate::tokens::SignInLimiter,
    /// When the timers were last counted for /metrics (seconds since the Unix epoch), so
    /// that scrapes count them at most once per period per process (`ops::system`).
    pub timers_counted: AtomicU64,
    /// A trigger was changed here: the triggers' supervisor (`broker::triggers`) looks at
    /// once instead of at its next pass.
    pub triggers_changed: tokio::sync::Notify,
    /// The create buffer every runtime shares, and the runtimes' progress through
    /// shutdown around it and the step writer.
    pub writes: crate::writes::Writes,
}

impl Deref for App {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.engine
    }
}

impl App {
    /// The process's shared state: the engine's part, and the carriers' beside it.
    pub fn new(engine: Shared) -> App {
        App {
            sign_ins: crate::tokens::SignInLimiter::new(engine.config.sign_in_per_minute),
            writes: crate::writes::Writes::new(engine.config.threads),
            engine: Arc::new(engine),
            timers_counted: AtomicU64::new(0),
            triggers_changed: tokio::sync::Notify::new(),
        }
    }
}

/// One runtime's own resources: the hot path touches nothing shared but `App`'s map and
/// counters, and the process's create buffer (a bounded queue) it hands creates to.
pub struct Core {
    pub app: Arc<App>,
    pub pool: Pool,
    pub buffer: WriteBuffer,
    /// Status reads, batched.
    pub reader: crate::store::reader::StatusReader,
    pub executor: Arc<crate::engine::Executor>,
}
