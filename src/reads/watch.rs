//! Waiting for a request's next status change, for long polls: whatever commits one in
//! this process (the executor pausing or finishing a request, a step response resuming
//! it, a cancel) wakes whoever waits on that request here. Costs one atomic load per
//! change while nobody waits.
//!
//! A waiter registers first (`watch`), then reads the request, then waits: a change that
//! commits in between bumps the version it registered with, so it is never missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

#[derive(Default)]
struct Entry {
    notify: Notify,
    version: AtomicU64,
}

#[derive(Default)]
pub struct Changes {
    watched: Mutex<HashMap<Uuid, Arc<Entry>>>,
    /// How many watches are registered (skips the lock when none are).
    n_watches: AtomicUsize,
}

/// A registered interest in one request's changes; dropping it unregisters.
pub struct Watch<'a> {
    changes: &'a Changes,
    id: Uuid,
    entry: Arc<Entry>,
    seen: u64,
}

impl Changes {
    /// A change of `id`'s status (as reads show it) committed in this process.
    pub fn notify(&self, id: &Uuid) {
        if self.n_watches.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(e) = self.watched.lock().get(id) {
            e.version.fetch_add(1, Ordering::AcqRel);
            e.notify.notify_waiters();
        }
    }

    /// Registers interest in `id`'s changes from now on.
    pub fn watch(&self, id: Uuid) -> Watch<'_> {
        let entry = self.watched.lock().entry(id).or_default().clone();
        self.n_watches.fetch_add(1, Ordering::AcqRel);
        let seen = entry.version.load(Ordering::Acquire);
        Watch {
            changes: self,
            id,
            entry,
            seen,
        }
    }
}

impl Watch<'_> {
    /// Waits until a change committed since the watch began (or since the last wait), or
    /// until `deadline`; true when there was a change.
    pub async fn changed(&mut self, deadline: Instant) -> bool {
        let notified = self.entry.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = self.entry.version.load(Ordering::Acquire);
        if now != self.seen {
            self.seen = now;
            return true;
        }
        let woken = tokio::select! {
            _ = notified => true,
            _ = tokio::time::sleep_until(deadline) => false,
        };
        self.seen = self.entry.version.load(Ordering::Acquire);
        woken
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.changes.n_watches.fetch_sub(1, Ordering::AcqRel);
        let mut watched = self.changes.watched.lock();
        // The map's reference and this one: the last watch of `id` cleans up.
        if watched
            .get(&self.id)
            .is_some_and(|e| Arc::strong_count(e) == 2)
        {
            watched.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_change_between_watch_and_wait_is_not_missed() {
        let c = Changes::default();
        let id = Uuid::now_v7();
        c.notify(&id); // nobody watches: nothing kept
        let mut w = c.watch(id);
        c.notify(&id);
        assert!(w.changed(Instant::now() + Duration::from_secs(60)).await);
        assert!(!w.changed(Instant::now() + Duration::from_millis(10)).await);
        drop(w);
        assert!(c.watched.lock().is_empty());
    }
}
