//! `clamp-bench`: an HTTP/1.1 keep-alive load generator for the clamp
//! workflow server, plus a fast downstream mock for end-to-end runs.
//!
//! The pure logic (open-loop schedule, coordinated-omission correction,
//! histogram summaries, the `--find-max` search, SVG charts) lives in modules
//! with unit tests beside them; the binary only wires them to the network.
//!
//! # JSON output (`--json FILE` or `--json -`)
//!
//! One object per run; for `--find-max` the top-level fields describe the
//! step at `max_rate` (or the last step if none passed):
//!
//! ```text
//! {
//!   "scenario": "health" | "create" | "e2e" | "mixed",
//!   "mode": "closed" | "open",
//!   "connections": 64, "threads": 1,
//!   "offered_rate": 2000.0 | null,      // req/s, open loop only
//!   "duration_s": 15.0, "warmup_s": 2.0,
//!   "requests": 30000,                  // operations due (open) or started (closed) in the window
//!   "ok": 29990,                        // operations that succeeded
//!   "http_requests": 30000,             // HTTP exchanges, incl. e2e polls
//!   "errors": {"status_503": 7, "timeout": 3, "connect": 0, "io": 0,
//!              "bad_response": 0, "workflow_failed": 0, "workflow_timeout": 0},
//!                                       // only kinds that occurred appear
//!   "achieved_rate": 1999.3,            // requests / duration_s
//!   "latency_us": {"p50": 210, "p90": 400, "p99": 900, "p999": 2100,
//!                  "max": 5100, "mean": 250.4},   // successful operations
//!   "per_second": [2001, 1998, ...],    // successful operations finished in each second
//!   "mixed": {"creates": n, "reads": n},           // mixed only
//!   "e2e": {"created": n, "completed": n, "failed": n,
//!           "created_rate": r, "completed_rate": r,
//!           "overhead_ms": {"p50", "p90", "p99", "p999", "max", "mean"},
//!           "negative_overhead": n,     // samples clamped to 0
//!           "downstream_calls": {"step1", "step2", "health", "other",
//!                                "in_flight", "peak_in_flight"} | null},
//!                                       // e2e only; calls seen by the in-process mock
//!   "find_max": {"slo_p99_us": 10000, "max_rate": 12000.0 | null,
//!                "steps": [{"offered_rate", "achieved_rate", "errors",
//!                           "p50_us", "p99_us", "p999_us", "pass", "reason"}]}
//! }
//! ```
//!
//! For `e2e` one operation is a whole workflow run (create, then poll until
//! COMPLETED/FAILED); `latency_us` is then the end-to-end latency.
//!
//! `faults` is not a timed load run and writes its own object
//! (`faults::FaultsReport`):
//!
//! ```text
//! {
//!   "scenario": "faults", "workflow": "bench_...", "connections": 16,
//!   "requests": 4000, "acknowledged": 4000,
//!   "create_retries": {"status_503": 120, "connect": 3},  // attempts retried, by kind
//!   "create_rejected": {},              // creates given up, by kind
//!   "completed": 4000, "failed": 0, "pending": 0,
//!   "missing": 0,                       // pending whose last read was 404
//!   "read_errors": {"status_503": 40},  // status reads retried next round
//!   "failed_sample": [{"id", "reason"}],           // up to 5
//!   "create_s": 2.1, "create_rate": 1904.8,
//!   "all_final_s": 3.4 | null,          // first create to all final
//!   "completed_rate": 1176.5,
//!   "mock": {...} | null,               // the mock's GET /stats, verbatim
//!   "check_problems": [] | null         // --check only; empty = passed
//! }
//! ```

pub mod cli;
pub mod client;
pub mod duration;
pub mod engine;
pub mod faults;
pub mod findmax;
pub mod histogram;
pub mod http1;
pub mod keys;
pub mod mock;
pub mod progress;
pub mod recorder;
pub mod report;
pub mod responder;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod status;
pub mod svg;
pub mod target;
