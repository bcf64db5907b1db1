//! The write path every runtime of the process shares: one create buffer, drained by one
//! flusher, and one step writer (`engine::Shared::writer`). A statement that writes the
//! request table costs Postgres about as much as dozens of its rows (its plan, its
//! indexes opened and their predicates and expressions prepared, its commit): with a
//! buffer and a writer per runtime, two runtimes sent twice the statements of half the
//! rows each (docs/decisions.md, "One write path per process"). The runtimes keep their
//! own listeners, executors, pools and reads; the first runtime to start makes the
//! buffer and runs the flusher, the first executor made runs the writer.
//!
//! Shutdown keeps what per-runtime buffers kept: the buffer closes once every runtime
//! has stopped taking requests (a create in flight on any runtime is still written), each
//! runtime stops its executor only once the buffer has drained (the last creates are
//! handed to running executors), and no runtime ends before every executor has stopped,
//! so the flusher, the writer and their connections outlive every job that needs them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use crate::store::WriteBuffer;

/// The process's create buffer and the runtimes' progress through shutdown.
pub struct Writes {
    buffer: OnceLock<WriteBuffer>,
    /// Tells the flusher to stop taking rows (and to drain what is queued).
    close: Mutex<Option<oneshot::Sender<()>>>,
    /// Runtimes still taking requests.
    serving: AtomicUsize,
    /// The flusher has written or answered every row and ended.
    drained: watch::Sender<bool>,
    /// Runtimes whose executor has not stopped yet.
    executing: AtomicUsize,
    stopped: watch::Sender<bool>,
}

impl Writes {
    /// For `runtimes` runtimes, each of which calls `turn` once.
    pub fn new(runtimes: usize) -> Writes {
        Writes {
            buffer: OnceLock::new(),
            close: Mutex::new(None),
            serving: AtomicUsize::new(runtimes),
            drained: watch::Sender::new(false),
            executing: AtomicUsize::new(runtimes),
            stopped: watch::Sender::new(false),
        }
    }

    /// The process's buffer; the first caller makes it with `make`, which gets the
    /// flusher's close signal and returns the buffer (having started the flusher, which
    /// must call `flushed` when it ends).
    pub fn buffer(&self, make: impl FnOnce(oneshot::Receiver<()>) -> WriteBuffer) -> WriteBuffer {
        self.buffer
            .get_or_init(|| {
                let (tx, rx) = oneshot::channel();
                *self.close.lock() = Some(tx);
                make(rx)
            })
            .clone()
    }

    /// The flusher has ended: every row is written or answered.
    pub fn flushed(&self) {
        self.drained.send_replace(true);
    }

    /// A runtime's part in shutdown; dropped early (a runtime that could not serve), it
    /// does what is left of it, so that the others do not wait for it.
    pub fn turn(&self) -> Turn<'_> {
        Turn {
            writes: self,
            served: false,
            executed: false,
        }
    }

    fn done_serving(&self) {
        if self.serving.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(close) = self.close.lock().take() {
                let _ = close.send(());
            }
        }
    }

    fn done_executing(&self) {
        if self.executing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.stopped.send_replace(true);
        }
    }
}

/// One runtime's steps through shutdown, in order: `served`, then `executed`.
pub struct Turn<'a> {
    writes: &'a Writes,
    served: bool,
    executed: bool,
}

impl Turn<'_> {
    /// This runtime takes no more requests and has answered those it had; once every
    /// runtime has, the buffer closes. Returns once the flusher has drained it.
    pub async fn served(&mut self) {
        if !self.served {
            self.served = true;
            self.writes.done_serving();
        }
        let _ = self.writes.drained.subscribe().wait_for(|d| *d).await;
    }

    /// This runtime's executor has stopped. Returns once every runtime's has.
    pub async fn executed(&mut self) {
        if !self.executed {
            self.executed = true;
            self.writes.done_executing();
        }
        let _ = self.writes.stopped.subscribe().wait_for(|s| *s).await;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.writes.done_serving();
        }
        if !self.executed {
            self.writes.done_executing();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn runtime(w: &Arc<Writes>) -> tokio::task::JoinHandle<()> {
        let w = w.clone();
        tokio::spawn(async move {
            let mut t = w.turn();
            t.served().await;
            t.executed().await;
        })
    }

    /// The buffer closes only once every runtime has served, no runtime goes on past
    /// serving before the flusher drained, and one that drops its turn early (it could
    /// not serve) holds no other.
    #[tokio::test]
    async fn each_step_waits_for_every_runtime() {
        let w = Arc::new(Writes::new(3));
        let mut close = None;
        let _ = w.buffer(|rx| {
            close = Some(rx);
            crate::store::buffer::channel(1).0
        });
        let mut close = close.expect("the first caller makes the buffer");
        drop(w.turn());
        let b = runtime(&w);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            close.try_recv().is_err(),
            "closed before every runtime served"
        );
        let c = runtime(&w);
        tokio::time::timeout(Duration::from_secs(1), &mut close)
            .await
            .expect("closed once every runtime served")
            .expect("the sender is kept until then");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !b.is_finished() && !c.is_finished(),
            "went on before the drain"
        );
        w.flushed();
        for r in [b, c] {
            tokio::time::timeout(Duration::from_secs(1), r)
                .await
                .expect("every runtime stopped")
                .unwrap();
        }
    }
}
