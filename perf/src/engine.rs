//! Runs one load phase: virtual users (one per connection) spread over
//! worker threads, each issuing operations closed-loop or on an open-loop
//! schedule, recording into one shard per worker.

use crate::client::Endpoint;
use crate::progress::Progress;
use crate::recorder::{ErrorKind, Live, Recorder};
use crate::scenario::{Vu, Workload};
use crate::schedule::{corrected_latency, Schedule};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How worker threads run their tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// One current-thread runtime per worker thread, connections split
    /// evenly: no work stealing, no cross-thread wake-ups.
    PerThread,
    /// One multi-thread (work-stealing) runtime with `threads` workers.
    Multi,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub label: String,
    pub connections: usize,
    pub threads: usize,
    pub runtime: RuntimeKind,
    /// Open-loop rate (operations/s); `None` for closed loop.
    pub rate: Option<f64>,
    pub warmup: Duration,
    pub duration: Duration,
    pub progress: bool,
}

#[derive(Clone, Copy)]
struct Timing {
    start: Instant,
    measure: Instant,
    end: Instant,
    rate: Option<f64>,
    connections: usize,
}

/// Back-off after a failed connect so a dead server is not spun on.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

async fn virtual_user(
    index: usize,
    t: Timing,
    workload: Arc<Workload>,
    ep: Arc<Endpoint>,
    shard: Arc<Mutex<Recorder>>,
    live: Arc<Live>,
) {
    let mut vu = Vu::new(ep, index as u64 + 1);
    // Connect before the clock starts; a failure is retried by the first op.
    let _ = vu.client.warm().await;
    tokio::time::sleep_until(t.start.into()).await;
    let schedule = t.rate.map(|r| Schedule::new(r, t.connections, index));
    let mut k = 0u64;
    loop {
        let due = match schedule {
            Some(s) => {
                let due = t.start + s.due(k);
                k += 1;
                if due >= t.end {
                    break;
                }
                let wake = Schedule::wake_time(due);
                if wake > Instant::now() {
                    tokio::time::sleep_until(wake.into()).await;
                }
                due
            }
            None => Instant::now(),
        };
        let sent = Instant::now();
        // Hard stop: a connection that fell behind does not keep sending
        // its backlog after the window (wrk2 behaves the same).
        if sent >= t.end {
            break;
        }
        let op = workload.run(&mut vu).await;
        let done = Instant::now();
        live.count(&op);
        if due >= t.measure {
            let latency = corrected_latency(due, sent, done);
            let at = done.saturating_duration_since(t.measure);
            shard.lock().expect("shard lock").record(&op, latency, at);
        }
        if op.outcome == Err(ErrorKind::Connect) {
            tokio::time::sleep(CONNECT_BACKOFF).await;
        }
    }
}

/// Runs the plan to completion (warm-up, window, drain of in-flight
/// operations) and returns the merged measurements of the window.
pub fn run(plan: &Plan, workload: Arc<Workload>, ep: Arc<Endpoint>) -> Recorder {
    let threads = plan.threads.clamp(1, plan.connections.max(1));
    let seconds = plan.duration.as_secs_f64().ceil() as usize;
    let shards: Vec<_> = (0..threads)
        .map(|_| Arc::new(Mutex::new(Recorder::new(seconds))))
        .collect();
    let live = Arc::new(Live::default());
    // Lead time for every connection to be opened before the clock starts.
    let lead = Duration::from_millis(100) + Duration::from_micros(200) * plan.connections as u32;
    let start = Instant::now() + lead;
    let t = Timing {
        start,
        measure: start + plan.warmup,
        end: start + plan.warmup + plan.duration,
        rate: plan.rate,
        connections: plan.connections,
    };
    let spawn_user = |i: usize, shard: usize| {
        let (w, e, s, l) = (
            workload.clone(),
            ep.clone(),
            shards[shard].clone(),
            live.clone(),
        );
        virtual_user(i, t, w, e, s, l)
    };
    let handles: Vec<JoinHandle<()>> = match plan.runtime {
        RuntimeKind::PerThread => (0..threads)
            .map(|th| {
                let users: Vec<_> = (th..plan.connections)
                    .step_by(threads)
                    .map(|i| spawn_user(i, th))
                    .collect();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("tokio runtime");
                    rt.block_on(join_all(users));
                })
            })
            .collect(),
        RuntimeKind::Multi => {
            let users: Vec<_> = (0..plan.connections)
                .map(|i| spawn_user(i, i % threads))
                .collect();
            vec![std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(join_all(users));
            })]
        }
    };
    let mut progress = Progress::new(plan.progress, &plan.label, start, t.measure, t.end);
    while !handles.iter().all(JoinHandle::is_finished) {
        std::thread::sleep(Duration::from_millis(100));
        progress.tick(&live);
    }
    progress.finish();
    for h in handles {
        h.join().expect("load worker panicked");
    }
    let mut total = Recorder::new(seconds);
    for s in &shards {
        total.merge(&s.lock().expect("shard lock"));
    }
    total
}

async fn join_all<F>(users: Vec<F>)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let handles: Vec<_> = users.into_iter().map(tokio::spawn).collect();
    for h in handles {
        // A panicking user loses only its own remaining operations.
        let _ = h.await;
    }
}
