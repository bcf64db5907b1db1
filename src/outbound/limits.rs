//! Downstream limits: at most N step calls in flight to one downstream host (scheme, host,
//! port) per instance, so a small service is not buried under every running request at
//! once. Calls beyond the limit wait their turn in memory (the wait does not count
//! against the call's own timeout); a wait longer than its bound fails the attempt as a
//! timeout, which the step's retry policy tries again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::call::{CallError, CallErrorKind};
use crate::metrics::Metrics;

/// One semaphore per downstream host, shared by every runtime of the process.
pub struct HostLimits {
    per_host: usize,
    max_wait: Duration,
    hosts: RwLock<HashMap<Arc<str>, Arc<Semaphore>>>,
    metrics: Arc<Metrics>,
}

/// A call's turn at its host; the slot is given back when this is dropped.
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.metrics.downstream_in_flight.dec();
    }
}

/// Keeps the waiting gauge true however the wait ends (granted, timed out, cancelled).
struct Waiting<'a>(&'a Metrics);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.downstream_waiting.dec();
    }
}

impl HostLimits {
    pub fn new(per_host: usize, max_wait: Duration, metrics: Arc<Metrics>) -> HostLimits {
        HostLimits {
            per_host: per_host.max(1),
            max_wait,
            hosts: RwLock::new(HashMap::new()),
            metrics,
        }
    }

    fn semaphore(&self, host: &Arc<str>) -> Arc<Semaphore> {
        if let Some(s) = self.hosts.read().get(host) {
            return s.clone();
        }
        self.hosts
            .write()
            .entry(host.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
            .clone()
    }

    /// Waits for a turn at `host` (at once when one is free).
    pub async fn acquire(&self, host: &Arc<str>) -> Result<Turn, CallError> {
        let sem = self.semaphore(host);
        let permit = match sem.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.metrics.downstream_waiting.inc();
                let _waiting = Waiting(&self.metrics);
                match tokio::time::timeout(self.max_wait, sem.acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    // The semaphore is never closed; treat it like a full wait.
                    Ok(Err(_)) | Err(_) => {
                        return Err(CallError::new(
                            CallErrorKind::Queued,
                            format!(
                                "waited {} ms for one of the {} call slots to {host}",
                                self.max_wait.as_millis(),
                                self.per_host
                            ),
                        ))
                    }
                }
            }
        };
        self.metrics.downstream_in_flight.inc();
        Ok(Turn {
            _permit: permit,
            metrics: self.metrics.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_beyond_the_limit_wait_and_a_long_wait_times_out() {
        let m = Arc::new(Metrics::new());
        let limits = HostLimits::new(2, Duration::from_secs(60), m.clone());
        let host: Arc<str> = "http://h:80".into();
        let other: Arc<str> = "http://o:80".into();
        let a = limits.acquire(&host).await.unwrap();
        let _b = limits.acquire(&host).await.unwrap();
        // Another host has its own slots.
        let _c = limits.acquire(&other).await.unwrap();
        assert_eq!(m.downstream_in_flight.get(), 3);
        let waiter = {
            let limits = &limits;
            let host = host.clone();
            async move { limits.acquire(&host).await }
        };
        tokio::pin!(waiter);
        // The third call to `host` waits until a turn is given back.
        assert!(tokio::time::timeout(Duration::from_secs(1), &mut waiter)
            .await
            .is_err());
        assert_eq!(m.downstream_waiting.get(), 1);
        drop(a);
        let _d = waiter.await.unwrap();
        assert_eq!(m.downstream_waiting.get(), 0);
        // With every slot taken, a wait past the bound is a timeout of that attempt.
        let e = match limits.acquire(&host).await {
            Err(e) => e,
            Ok(_) => panic!("got a slot beyond the limit"),
        };
        assert_eq!(e.kind, CallErrorKind::Queued);
        assert_eq!(m.downstream_waiting.get(), 0);
    }
}
