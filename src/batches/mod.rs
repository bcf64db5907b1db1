//! The batching loop the step writer, the status reader and the limited creates share:
//! whenever one of `concurrency` slots is free, take whatever is queued (up to
//! `max_batch`) and handle it in a task of its own, so batches grow with load and no timer
//! delays the first item; and when the next batch may leave (`flights`), for the loops
//! that send theirs in turn (the creates' flusher, the limited creates).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

pub(crate) mod flights;

pub(crate) use flights::Flights;

/// Drains `rx` batch by batch until every sender is gone, then waits for the batches
/// still being handled.
pub async fn drain<T, F, Fut>(
    rx: mpsc::Receiver<T>,
    max_batch: usize,
    concurrency: usize,
    handle: F,
) where
    T: Send + 'static,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    run(rx, max_batch, concurrency, None, handle).await
}

/// As `drain`, but in turn, as the creates' flusher sends its batches (`Flights`): one
/// batch in flight and the next filling behind it, a further one (up to `concurrency`)
/// only beside one slower than usual. For statements whose price is mostly per call, so
/// that rows in hand are not split between concurrent batches.
pub async fn drain_in_turn<T, F, Fut>(
    rx: mpsc::Receiver<T>,
    max_batch: usize,
    concurrency: usize,
    handle: F,
) where
    T: Send + 'static,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let flights = Arc::new(Flights::default());
    run(rx, max_batch, concurrency, Some(flights), handle).await
}

async fn run<T, F, Fut>(
    mut rx: mpsc::Receiver<T>,
    max_batch: usize,
    concurrency: usize,
    flights: Option<Arc<Flights>>,
    mut handle: F,
) where
    T: Send + 'static,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let concurrency = concurrency.max(1);
    let slots = Arc::new(Semaphore::new(concurrency));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        if let Some(f) = &flights {
            f.clearance().await;
        }
        let mut batch = Vec::with_capacity(max_batch.min(64));
        if rx.recv_many(&mut batch, max_batch).await == 0 {
            break;
        }
        let work = handle(batch);
        let landing = flights.as_ref().map(|f| (f.clone(), f.depart()));
        tokio::spawn(async move {
            work.await;
            if let Some((f, departed)) = landing {
                f.land(departed);
            }
            drop(permit);
        });
    }
    let _ = slots.acquire_many(concurrency as u32).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What each batch held, in order, with a handler that takes 5 ms: one item sent,
    /// then, while its batch is in flight, nine more one at a time (the loop gets a turn
    /// after each), then the sender dropped.
    async fn batches_of(in_turn: bool) -> Vec<usize> {
        let (tx, rx) = mpsc::channel(64);
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let handle = {
            let seen = seen.clone();
            move |batch: Vec<u32>| {
                let seen = seen.clone();
                async move {
                    seen.lock().push(batch.len());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let run = tokio::spawn(async move {
            if in_turn {
                drain_in_turn(rx, 256, 2, handle).await
            } else {
                drain(rx, 256, 2, handle).await
            }
        });
        tx.send(0).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        for i in 1..10 {
            tx.send(i).await.unwrap();
            tokio::task::yield_now().await;
        }
        drop(tx);
        run.await.unwrap();
        let v = seen.lock().clone();
        v
    }

    #[tokio::test(start_paused = true)]
    async fn in_turn_the_next_batch_fills_behind_the_one_in_flight() {
        assert_eq!(batches_of(true).await, vec![1, 9]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_turns_a_free_slot_takes_what_is_there() {
        // The second slot leaves with the first item to arrive behind the first batch.
        assert_eq!(batches_of(false).await, vec![1, 1, 8]);
    }
}
