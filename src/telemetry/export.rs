//! The export side: finished spans go into a bounded queue that never blocks (a full
//! queue drops the span and counts it), and one thread of its own batches them to the
//! OTLP exporter of `opentelemetry-otlp`, over its hyper client, on a runtime of its own.

use std::time::Duration;

use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use super::settings::{Protocol, TraceSettings};
use crate::metrics::TraceCounters as ExportCounters;

/// The handle spans are queued through.
pub struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: Counter,
    stop: parking_lot::Mutex<Option<oneshot::Sender<oneshot::Sender<()>>>>,
}

impl Queue {
    /// Builds the exporter and starts its thread.
    pub fn start(
        s: &TraceSettings,
        resource: Resource,
        c: ExportCounters,
    ) -> Result<Queue, String> {
        let client = super::http_client::ExportClient::new(s.timeout);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(s.endpoint.clone())
            .with_timeout(s.timeout)
            .with_protocol(match s.protocol {
                Protocol::Protobuf => opentelemetry_otlp::Protocol::HttpBinary,
                Protocol::Json => opentelemetry_otlp::Protocol::HttpJson,
            })
            .build()
            .map_err(|e| format!("the OTLP exporter cannot be built: {e}"))?;
        exporter.set_resource(&resource);
        let (tx, rx) = mpsc::channel(s.queue_size);
        let (stop_tx, stop_rx) = oneshot::channel();
        let batch = s.batch_size;
        let delay = s.schedule_delay;
        let counters = c.clone();
        std::thread::Builder::new()
            .name("clamp-otlp".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime starts");
                rt.block_on(run(exporter, rx, stop_rx, batch, delay, counters));
            })
            .map_err(|e| format!("the span export thread cannot start: {e}"))?;
        Ok(Queue {
            tx,
            dropped: c.dropped,
            stop: parking_lot::Mutex::new(Some(stop_tx)),
        })
    }

    /// Queues a finished span; drops it (counted) when the queue is full.
    pub fn push(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    /// Exports what is queued, then stops the thread; waits at most `within`.
    pub async fn shutdown(&self, within: Duration) {
        let Some(stop) = self.stop.lock().take() else {
            return;
        };
        let (done_tx, done_rx) = oneshot::channel();
        if stop.send(done_tx).is_ok() {
            let _ = tokio::time::timeout(within, done_rx).await;
        }
    }
}

async fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<oneshot::Sender<()>>,
    batch: usize,
    delay: Duration,
    c: ExportCounters,
) {
    let mut spans: Vec<SpanData> = Vec::with_capacity(batch);
    let mut warned: Option<tokio::time::Instant> = None;
    // When the oldest span held in `spans` arrived (roughly: seen at a tick).
    let mut oldest: Option<tokio::time::Instant> = None;
    loop {
        // The queue is read on a tick, never awaited: a receiver that awaits is woken by
        // every span sent, a wake-up (a futex call, a context switch) per span on the
        // threads that serve requests
        // (perf/runs/2026-12-02-vm/33713af-traces-on-10/traces-on-10.md).
        while spans.len() < batch {
            match rx.try_recv() {
                Ok(s) => spans.push(s),
                Err(_) => break,
            }
        }
        if !spans.is_empty() && oldest.is_none() {
            oldest = Some(tokio::time::Instant::now());
        }
        // A batch leaves when it is full or `delay` after its first span was seen.
        let due = spans.len() >= batch || oldest.is_some_and(|t| t.elapsed() >= delay);
        if due {
            oldest = None;
            if !export(&exporter, &mut spans, &c).await
                && warned.is_none_or(|w| w.elapsed() >= WARN_EVERY)
            {
                tracing::warn!(
                    "spans could not be exported (clamp_trace_spans_failed_total counts them)"
                );
                warned = Some(tokio::time::Instant::now());
            }
            continue;
        }
        tokio::select! {
            done = &mut stop => {
                drain(&exporter, &mut rx, &mut spans, batch, &c).await;
                if let Ok(done) = done {
                    let _ = done.send(());
                }
                return;
            }
            _ = tokio::time::sleep(TICK.min(delay)) => {}
        }
        if rx.is_closed() && rx.is_empty() && spans.is_empty() {
            return;
        }
    }
}

/// How often the queue is read. At 40,000 spans a second (every request of a busy
/// instance traced) a tick finds 800, well under the default queue of 2,048.
const TICK: Duration = Duration::from_millis(20);

/// A collector that is away is said once in this long, not once per batch.
const WARN_EVERY: Duration = Duration::from_secs(30);

async fn drain(
    exporter: &opentelemetry_otlp::SpanExporter,
    rx: &mut mpsc::Receiver<SpanData>,
    spans: &mut Vec<SpanData>,
    batch: usize,
    c: &ExportCounters,
) {
    rx.close();
    loop {
        while spans.len() < batch {
            match rx.try_recv() {
                Ok(s) => spans.push(s),
                Err(_) => break,
            }
        }
        if spans.is_empty() {
            return;
        }
        export(exporter, spans, c).await;
    }
}

/// Exports `spans` (emptying it); false when the export failed and they were lost.
async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    spans: &mut Vec<SpanData>,
    c: &ExportCounters,
) -> bool {
    let n = spans.len() as u64;
    match exporter.export(std::mem::take(spans)).await {
        Ok(()) => {
            c.exported.inc_by(n);
            true
        }
        Err(e) => {
            c.failed.inc_by(n);
            tracing::debug!(spans = n, error = %e, "spans could not be exported");
            false
        }
    }
}
