//! The executors of every runtime as the one create flusher's hand-off: each batch goes
//! to the executor with the most room (the first of equals after the last one chosen),
//! and the calls that follow about its rows name that executor (`Taken::by`). Its jobs
//! run on its own runtime, whichever runtime the flusher runs on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::Executor;
use crate::store::buffer::{Handoff, Inserted, Taken};

/// The executors of this process's runtimes, in the order they were made.
pub struct Spread {
    execs: parking_lot::RwLock<Vec<Arc<Executor>>>,
    /// Where the next look for the most room starts, so equals take turns.
    next: AtomicUsize,
    /// The instance's lease owner id and a fresh lease's length (every executor's).
    owner: Uuid,
    lease: Duration,
}

impl Spread {
    pub fn new(owner: Uuid, lease: Duration) -> Spread {
        Spread {
            execs: Default::default(),
            next: AtomicUsize::new(0),
            owner,
            lease,
        }
    }

    /// Adds a runtime's executor; batches may go to it from now on.
    pub fn register(&self, e: Arc<Executor>) {
        self.execs.write().push(e);
    }

    fn get(&self, i: usize) -> Option<Arc<Executor>> {
        self.execs.read().get(i).cloned()
    }

    /// The executor with the most room, starting after the last one chosen.
    fn roomiest(&self) -> Option<(usize, Arc<Executor>)> {
        let execs = self.execs.read();
        let n = execs.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, usize)> = None;
        for i in (0..n).map(|k| (start + k) % n) {
            let free = execs[i].free();
            if best.is_none_or(|(_, most)| free > most) {
                best = Some((i, free));
            }
        }
        best.map(|(i, _)| (i, execs[i].clone()))
    }
}

impl Handoff for Spread {
    fn reserve(&self, n: usize) -> Taken {
        match self.roomiest() {
            Some((i, e)) => Taken {
                n: e.take_room(n),
                by: i,
            },
            None => Taken::default(),
        }
    }

    fn release(&self, taken: Taken, n: usize) {
        if let Some(e) = self.get(taken.by) {
            e.unreserve(n);
        }
    }

    fn stored_unleased(&self) {
        // Any runtime's sweeper may claim them: each is told.
        for e in self.execs.read().iter() {
            e.stored_unleased();
        }
    }

    fn start(self: Arc<Self>, taken: Taken, rows: Vec<Inserted>) {
        if let Some(e) = self.get(taken.by) {
            e.start_fresh(rows);
        }
    }

    fn owner(&self) -> Uuid {
        self.owner
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}
