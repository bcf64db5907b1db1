//! The requests running in this process, and a way to wait for one to stop running.
//!
//! Every runtime's sweeper claims with the same lease owner, so one runtime may re-claim a
//! request whose lease ran out while another still runs it; this set is how it knows not
//! to start it. A step response for a request still running here (its pause not written
//! yet) waits on the request's notification instead of asking Postgres again and again.
//! A request run here from its first step also has its committed step rows here, so a
//! status read needs only its row from Postgres.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::store::status::Live;

/// What this process knows of one request it runs.
#[derive(Default)]
struct Entry {
    /// Who waits for it to stop running (made only when someone waits, so a request
    /// nobody waits on costs no allocation).
    gone: Option<Arc<Notify>>,
    /// Its committed step rows, when this process wrote them all.
    live: Option<Arc<Live>>,
    /// Who waits for `live` to change (made only when someone waits).
    live_changed: Option<Arc<Notify>>,
}

/// Request id → what this process knows of it while it runs here.
#[derive(Default)]
pub struct Running {
    ids: Mutex<HashMap<Uuid, Entry>>,
}

impl Running {
    pub fn insert(&self, id: Uuid) {
        self.ids.lock().insert(id, Entry::default());
    }

    /// Forgets `id` and wakes whoever waits for it.
    pub fn remove(&self, id: &Uuid) {
        if let Some(e) = self.ids.lock().remove(id) {
            for n in [e.gone, e.live_changed].into_iter().flatten() {
                n.notify_waiters();
            }
        }
    }

    /// Gives `f` the committed step rows of `id` to change (None: it does not run here),
    /// and wakes whoever waits for them to change.
    pub fn with_live<R>(
        &self,
        id: &Uuid,
        f: impl FnOnce(&mut Option<Arc<Live>>) -> R,
    ) -> Option<R> {
        let mut ids = self.ids.lock();
        let e = ids.get_mut(id)?;
        let r = f(&mut e.live);
        if let Some(n) = &e.live_changed {
            n.notify_waiters();
        }
        Some(r)
    }

    /// Waits until the committed step rows of `id` change, it stops running here, or
    /// `deadline` passes.
    pub async fn live_changed(&self, id: Uuid, deadline: Instant) {
        let notify = {
            let mut ids = self.ids.lock();
            match ids.get_mut(&id) {
                None => return,
                Some(e) => e
                    .live_changed
                    .get_or_insert_with(|| Arc::new(Notify::new()))
                    .clone(),
            }
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = self.wait_gone(id, deadline) => {}
        }
    }

    /// The committed step rows of `id`, if it runs here and this process wrote them all.
    pub fn live(&self, id: &Uuid) -> Option<Arc<Live>> {
        self.ids.lock().get(id)?.live.clone()
    }

    pub fn contains(&self, id: &Uuid) -> bool {
        self.ids.lock().contains_key(id)
    }

    /// Waits until `id` is not running here, or until `deadline`; true when it is not.
    pub async fn wait_gone(&self, id: Uuid, deadline: Instant) -> bool {
        let notify = {
            let mut ids = self.ids.lock();
            match ids.get_mut(&id) {
                None => return true,
                Some(e) => e
                    .gone
                    .get_or_insert_with(|| Arc::new(Notify::new()))
                    .clone(),
            }
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        // Registered before looking again, so a removal in between is not missed.
        notified.as_mut().enable();
        if !self.contains(&id) {
            return true;
        }
        tokio::select! {
            _ = notified => true,
            _ = tokio::time::sleep_until(deadline) => !self.contains(&id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_the_request_stops_running() {
        let r = Arc::new(Running::default());
        let id = Uuid::now_v7();
        assert!(r.wait_gone(id, Instant::now()).await);
        r.insert(id);
        assert!(
            !r.wait_gone(id, Instant::now() + Duration::from_millis(50))
                .await
        );
        let waiter = tokio::spawn({
            let r = r.clone();
            async move {
                r.wait_gone(id, Instant::now() + Duration::from_secs(3600))
                    .await
            }
        });
        tokio::task::yield_now().await;
        r.remove(&id);
        assert!(waiter.await.unwrap());
    }
}
