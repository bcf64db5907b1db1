//! The batching loop the step writer and the status reader share: whenever one of
//! `concurrency` slots is free, take whatever is queued (up to `max_batch`) and handle it
//! in a task of its own, so batches grow with load and no timer delays the first item.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

/// Drains `rx` batch by batch until every sender is gone, then waits for the batches
/// still being handled.
pub async fn drain<T, F, Fut>(
    mut rx: mpsc::Receiver<T>,
    max_batch: usize,
    concurrency: usize,
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
        let mut batch = Vec::with_capacity(max_batch.min(64));
        if rx.recv_many(&mut batch, max_batch).await == 0 {
            break;
        }
        let work = handle(batch);
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
    }
    let _ = slots.acquire_many(concurrency as u32).await;
}
