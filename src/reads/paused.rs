//! The requests this process paused at a step, with their workflow: a hint that lets a
//! step response for one of them skip reading the request's row for its workflow (one
//! statement and one round trip fewer). A hint only: a request's workflow and version
//! never change, and the resume statement applies only while the request is paused at
//! the answered step, so an entry that outlived its pause (answered elsewhere,
//! cancelled, retried) misleads nothing; a response that the resume does not apply is
//! looked at again the long way. Bounded: an entry whose answer went to another
//! instance (or never came) is never taken out here, so a full map is emptied and
//! starts again (the hints lost cost their answers one read each).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use uuid::Uuid;

use crate::workflow::Workflow;

/// Most pauses kept (about 60 bytes each).
const CAPACITY: usize = 100_000;

#[derive(Default)]
pub struct PausedHere {
    ids: Mutex<HashMap<Uuid, Arc<Workflow>>>,
}

impl PausedHere {
    /// Keeps `id`'s workflow (emptying the map first when it is full).
    pub fn insert(&self, id: Uuid, wf: &Arc<Workflow>) {
        let mut ids = self.ids.lock();
        if ids.len() >= CAPACITY {
            ids.clear();
        }
        ids.insert(id, wf.clone());
    }

    /// Takes `id`'s workflow out, if this process paused it.
    pub fn take(&self, id: &Uuid) -> Option<Arc<Workflow>> {
        self.ids.lock().remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_takes_and_starts_again_when_full() {
        let p = PausedHere::default();
        let def = serde_json::from_value(serde_json::json!({"name": "w", "steps": [
            {"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}}]}))
        .unwrap();
        let wf = Arc::new(crate::workflow::validate::compile(def).unwrap());
        let id = Uuid::now_v7();
        p.insert(id, &wf);
        assert_eq!(
            p.take(&id).map(|w| w.name.to_string()).as_deref(),
            Some("w")
        );
        assert!(p.take(&id).is_none());
        for _ in 0..CAPACITY + 10 {
            p.insert(Uuid::now_v7(), &wf);
        }
        assert_eq!(p.ids.lock().len(), 10);
    }
}
