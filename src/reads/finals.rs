//! Final status answers kept in memory. A request whose COMPLETED has committed never
//! changes again, so its answer answers every later read without Postgres: kept as the
//! rows it is rendered from by the executor that finished it (most finished requests are
//! never read), or as the bytes a read rendered. What the answer looks like is not known
//! here: the renderer is given (`App::new`, from the HTTP layer). Bounded (the oldest
//! entries go first), and an entry older than the retention period is dropped as the row
//! it shows is.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use uuid::Uuid;

use crate::store::status::{Head, StepRow};

/// Renders the answer of a request from its row and its step rows.
pub type Render = fn(Uuid, &Head, &[StepRow]) -> Bytes;

/// Shards, so the runtimes rarely contend on one lock.
const SHARDS: usize = 16;

struct Entry {
    answer: Answer,
    /// When the request finished, in milliseconds since the Unix epoch.
    finished_ms: f64,
}

/// An answer, or what it is rendered from (on the first read: most finished requests are
/// never read, and rendering costs a parse and a serialization of every document).
enum Answer {
    Rendered(Bytes),
    Parts(Box<(Head, Vec<StepRow>)>),
}

#[derive(Default)]
struct Shard {
    map: HashMap<Uuid, Entry>,
    /// Insertion order, for evicting the oldest.
    order: VecDeque<Uuid>,
}

pub struct FinalAnswers {
    render: Render,
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    /// Rows are deleted this long after they finished (None: kept forever).
    retention: Option<Duration>,
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

impl FinalAnswers {
    /// A cache of at most `capacity` answers (0: none kept), rendered by `render`.
    pub fn new(capacity: usize, retention: Option<Duration>, render: Render) -> FinalAnswers {
        FinalAnswers {
            render,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            retention,
        }
    }

    fn shard(&self, id: &Uuid) -> &Mutex<Shard> {
        // The low bits of a UUIDv7 are random.
        &self.shards[id.as_u128() as usize % SHARDS]
    }

    /// The answer for `id`, if kept (and its row is not past the retention period).
    pub fn get(&self, id: &Uuid) -> Option<Bytes> {
        let parts = {
            let mut shard = self.shard(id).lock();
            let e = shard.map.get(id)?;
            if let Some(keep) = self.retention {
                if now_ms() - e.finished_ms > keep.as_secs_f64() * 1000.0 {
                    shard.map.remove(id);
                    return None;
                }
            }
            match &e.answer {
                Answer::Rendered(b) => return Some(b.clone()),
                Answer::Parts(p) => (p.0.clone(), p.1.clone()),
            }
        };
        // Rendered outside the lock; whoever renders first keeps the bytes.
        let body = (self.render)(*id, &parts.0, &parts.1);
        if let Some(e) = self.shard(id).lock().map.get_mut(id) {
            e.answer = Answer::Rendered(body.clone());
        }
        Some(body)
    }

    /// Keeps the final answer of `id`, which finished at `finished_ms` (ms since the epoch;
    /// None: now).
    pub fn insert(&self, id: Uuid, body: Bytes, finished_ms: Option<f64>) {
        self.keep(id, Answer::Rendered(body), finished_ms);
    }

    /// Keeps what the final answer of `id`, finished now, renders from.
    pub fn insert_parts(&self, id: Uuid, head: Head, steps: Vec<StepRow>) {
        self.keep(id, Answer::Parts(Box::new((head, steps))), None);
    }

    fn keep(&self, id: Uuid, answer: Answer, finished_ms: Option<f64>) {
        if self.per_shard == 0 {
            return;
        }
        let finished_ms = finished_ms.unwrap_or_else(now_ms);
        let mut shard = self.shard(&id).lock();
        if shard
            .map
            .insert(
                id,
                Entry {
                    answer,
                    finished_ms,
                },
            )
            .is_none()
        {
            shard.order.push_back(id);
        }
        while shard.map.len() > self.per_shard {
            match shard.order.pop_front() {
                Some(old) => {
                    shard.map.remove(&old);
                }
                None => break,
            }
        }
        // An id `get` dropped (past retention) leaves a stale place in the order: once they
        // add up, the order is rebuilt (rarely, and linear).
        if shard.order.len() > 2 * self.per_shard {
            let Shard { map, order } = &mut *shard;
            order.retain(|id| map.contains_key(id));
        }
    }

    /// The answer of `id` from these rows, as the cache renders it.
    pub fn render(&self, id: Uuid, head: &Head, steps: &[StepRow]) -> Bytes {
        (self.render)(id, head, steps)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(_: Uuid, _: &Head, _: &[StepRow]) -> Bytes {
        Bytes::from_static(b"{}")
    }

    #[test]
    fn keeps_answers_bounded_and_drops_those_past_retention() {
        let c = FinalAnswers::new(32, None, render);
        let ids: Vec<Uuid> = (0..200).map(|_| Uuid::now_v7()).collect();
        for id in &ids {
            c.insert(*id, Bytes::from_static(b"{}"), None);
        }
        assert!(c.len() <= 32 + SHARDS, "{}", c.len());
        assert!(c.get(ids.last().unwrap()).is_some());
        let kept = FinalAnswers::new(10, Some(Duration::from_secs(3600)), render);
        let id = Uuid::now_v7();
        kept.insert(id, Bytes::from_static(b"{}"), Some(now_ms() - 7_200_000.0));
        assert!(kept.get(&id).is_none(), "past the retention period");
        kept.insert(id, Bytes::from_static(b"{}"), None);
        assert_eq!(kept.get(&id).unwrap(), Bytes::from_static(b"{}"));
        assert!(FinalAnswers::new(0, None, render).is_empty());
    }
}
