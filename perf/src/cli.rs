//! Command-line interface (clap derive): one subcommand per scenario plus
//! the downstream mock.

use crate::duration;
use crate::engine::RuntimeKind;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "clamp-bench",
    version,
    about = "HTTP/1.1 load generator for the clamp workflow server",
    after_help = "Exit status: 0 on a completed run, 1 if no operation succeeded, 2 on a usage or set-up error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// GET /health: the server's ceiling.
    Health {
        #[command(flatten)]
        load: LoadArgs,
        /// Path to GET (lets `health` load any GET route, e.g. on the mock).
        #[arg(long, default_value = "/health", hide = true)]
        path: String,
    },
    /// POST /serviceRequest/<workflow> with a ~300-byte claim payload.
    Create {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        wf: WorkflowArgs,
        /// Send a fresh `Idempotency-Key` with every create (an idempotent create whose
        /// key is new each time: the cost of the key, not of a repeat).
        #[arg(long)]
        idempotency_keys: bool,
    },
    /// Create a service request, then poll it until COMPLETED or FAILED.
    E2e {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        wf: WorkflowArgs,
        /// Pause between status polls.
        #[arg(long, default_value = "10ms", value_parser = duration::parse)]
        poll_interval: Duration,
        /// Give up on a workflow (error `workflow_timeout`) after this long.
        #[arg(long, default_value = "30s", value_parser = duration::parse)]
        workflow_timeout: Duration,
        /// Long-poll instead of polling: each status read asks the server to wait up to
        /// this long for the status to change (`?waitMs=`), with no pause between reads.
        #[arg(long, value_parser = duration::parse)]
        long_poll: Option<Duration>,
    },
    /// Creates mixed with status reads of ids created earlier.
    Mixed {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        wf: WorkflowArgs,
        /// Fraction of operations that are status reads.
        #[arg(long, default_value_t = 0.5)]
        read_ratio: f64,
    },
    /// Answer AMQP step messages from a queue on their `reply_to` (the service behind
    /// an AMQP step, for end-to-end runs of workflows with one).
    AmqpResponder {
        #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
        amqp_url: String,
        /// Queue the workflow's AMQP step publishes to (declared durable).
        #[arg(long)]
        queue: String,
        /// Unacknowledged messages at once.
        #[arg(long, default_value_t = 1000)]
        prefetch: u16,
    },
    /// Run the downstream mock server in the foreground.
    Mock {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 9000)]
        port: u16,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Artificial service time of /api/step1 and /api/step2.
        #[arg(long, default_value = "0ms", value_parser = duration::parse)]
        delay: Duration,
        /// Answer 503 to the first step call of this percentage of distinct
        /// Idempotency-Key values (chosen by a hash of the key); later calls
        /// with the key answer normally.
        #[arg(long, default_value_t = 0, value_name = "PCT",
              value_parser = clap::value_parser!(u8).range(0..=100))]
        fail_first_pct: u8,
        /// Send `Retry-After: SECS` with each injected 503.
        #[arg(long, value_name = "SECS")]
        retry_after: Option<u64>,
        /// Count calls per Idempotency-Key (for /stats `excess_calls`) even
        /// without faults; off by default because it costs a map insert per call.
        #[arg(long)]
        count_keys: bool,
    },
    /// Create a fixed number of service requests, retrying every 503 until
    /// acknowledged, wait until each acknowledged one is final, then read the
    /// downstream mock's /stats: a run under faults, not a speed test.
    Faults {
        /// Base URL of the server under test.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        #[command(flatten)]
        wf: WorkflowArgs,
        /// Service requests to create (each retried until acknowledged).
        #[arg(long, default_value_t = 4000)]
        requests: usize,
        /// Closed-loop keep-alive connections creating at once.
        #[arg(short, long, default_value_t = 16)]
        connections: usize,
        /// Status reads in flight at once while waiting for the outcomes.
        #[arg(long, default_value_t = 16)]
        read_concurrency: usize,
        /// Stop waiting for outcomes (and stop retrying a create) after this long.
        #[arg(long, default_value = "180s", value_parser = duration::parse)]
        settle_timeout: Duration,
        /// Per-request timeout (connect, and each HTTP exchange).
        #[arg(long, default_value = "5s", value_parser = duration::parse)]
        timeout: Duration,
        /// Write the JSON result to FILE ("-" for stdout; the summary then goes to stderr).
        #[arg(long, value_name = "FILE")]
        json: Option<String>,
        /// Exit 1 unless every request was acknowledged and COMPLETED and the
        /// mock saw no excess step call (and the peak bound below held).
        #[arg(long)]
        check: bool,
        /// With --check: the mock's peak_in_flight may not exceed N.
        #[arg(long, value_name = "N")]
        max_in_flight: Option<u64>,
        /// No progress lines while waiting (the summary still prints).
        #[arg(short, long)]
        quiet: bool,
    },
}

/// Options shared by every load scenario.
#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Base URL of the server under test.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Keep-alive connections, one virtual user each.
    #[arg(short, long, default_value_t = 32)]
    pub connections: usize,
    /// Load-generator worker threads.
    #[arg(short, long, default_value_t = 1)]
    pub threads: usize,
    /// How worker threads schedule connections.
    #[arg(long, value_enum, default_value_t = RuntimeKind::PerThread)]
    pub runtime: RuntimeKind,
    /// Open loop at this many operations/s (omit for closed loop).
    #[arg(short, long)]
    pub rate: Option<f64>,
    /// Measured window (per step with --find-max).
    #[arg(short, long, default_value = "15s", value_parser = duration::parse)]
    pub duration: Duration,
    /// Unmeasured load before the window (per step with --find-max).
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    pub warmup: Duration,
    /// Per-request timeout (connect, and each HTTP exchange).
    #[arg(long, default_value = "5s", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Write the JSON report to FILE ("-" for stdout; the table then goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,
    /// Write an SVG chart: latency vs rate for --find-max, else throughput over time.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Search for the highest rate meeting the SLO (open loop, stepped).
    #[arg(long)]
    pub find_max: bool,
    /// find-max: p99 latency objective.
    #[arg(long, default_value = "10ms", value_parser = duration::parse)]
    pub slo_p99: Duration,
    /// find-max: first offered rate.
    #[arg(long, default_value_t = 1000.0)]
    pub start_rate: f64,
    /// find-max: multiplier between geometric steps.
    #[arg(long, default_value_t = 2.0)]
    pub step_factor: f64,
    /// find-max: stop bisecting when pass and fail rates are this close (fraction).
    #[arg(long, default_value_t = 0.05)]
    pub precision: f64,
    /// find-max: achieved may fall this far (fraction) below offered.
    #[arg(long, default_value_t = 0.03)]
    pub tolerance: f64,
    /// find-max: most steps to run.
    #[arg(long, default_value_t = 20)]
    pub max_steps: usize,
    /// find-max: idle pause between steps so queues drain.
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    pub cooldown: Duration,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Workflow set-up for scenarios that create service requests.
#[derive(Debug, Args, Clone)]
pub struct WorkflowArgs {
    /// Use this existing workflow instead of creating a fresh one.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Base URL the workflow's HTTP steps call (default: start the mock in-process).
    #[arg(long)]
    pub downstream: Option<String>,
    /// Worker threads of the in-process mock.
    #[arg(long, default_value_t = 1)]
    pub mock_threads: usize,
    /// Artificial service time of the in-process mock's steps.
    #[arg(long, default_value = "0ms", value_parser = duration::parse)]
    pub mock_delay: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_a_find_max_run() {
        let cli = Cli::try_parse_from([
            "clamp-bench",
            "e2e",
            "--url",
            "http://127.0.0.1:8080",
            "-c",
            "64",
            "--find-max",
            "--slo-p99",
            "5ms",
            "--poll-interval",
            "20ms",
        ])
        .unwrap();
        let Command::E2e {
            load,
            poll_interval,
            ..
        } = cli.command
        else {
            panic!("wrong subcommand")
        };
        assert!(load.find_max);
        assert_eq!(load.connections, 64);
        assert_eq!(load.slo_p99, Duration::from_millis(5));
        assert_eq!(poll_interval, Duration::from_millis(20));
    }

    #[test]
    fn parses_a_faults_run_and_mock_faults() {
        let cli = Cli::try_parse_from([
            "clamp-bench",
            "faults",
            "--downstream",
            "http://127.0.0.1:9000",
            "--requests",
            "300",
            "-c",
            "8",
            "--settle-timeout",
            "1m",
            "--check",
            "--max-in-flight",
            "64",
        ])
        .unwrap();
        let Command::Faults {
            wf,
            requests,
            connections,
            settle_timeout,
            check,
            max_in_flight,
            ..
        } = cli.command
        else {
            panic!("wrong subcommand")
        };
        assert_eq!(wf.downstream.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!((requests, connections), (300, 8));
        assert_eq!(settle_timeout, Duration::from_secs(60));
        assert!(check);
        assert_eq!(max_in_flight, Some(64));

        let cli = Cli::try_parse_from([
            "clamp-bench",
            "mock",
            "--fail-first-pct",
            "25",
            "--retry-after",
            "1",
        ])
        .unwrap();
        let Command::Mock {
            fail_first_pct,
            retry_after,
            count_keys,
            ..
        } = cli.command
        else {
            panic!("wrong subcommand")
        };
        assert_eq!(
            (fail_first_pct, retry_after, count_keys),
            (25, Some(1), false)
        );
        assert!(Cli::try_parse_from(["clamp-bench", "mock", "--fail-first-pct", "101"]).is_err());
    }
}
