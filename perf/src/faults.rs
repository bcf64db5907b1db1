//! The `faults` scenario: a fixed number of service requests created while
//! faults are injected elsewhere (a downstream answering 503 to first calls,
//! Postgres stopped for a while), each create retried until acknowledged,
//! then every acknowledged request followed until it is final, and the
//! downstream mock's `/stats` read at the end. It answers "was anything lost
//! or done twice", not "how fast": rates are reported, but only as context.

use crate::cli::WorkflowArgs;
use crate::client::{Client, Endpoint, Response};
use crate::recorder::ErrorKind;
use crate::runner::{self, WorkflowSetup};
use crate::scenario::CLAIM_PAYLOAD;
use crate::status::{self, Outcome};
use crate::target::Target;
use anyhow::{bail, Context};
use futures_util::future::join_all;
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause before retrying a create the server did not answer with a
/// `Retry-After` (a refused connection, a timeout).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// `Retry-After` is honoured up to this: clamp says 1 s, and a run under a
/// short outage should not idle longer than the outage.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Floor for `Retry-After: 0`, so a refusing server is not hammered.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Between rounds of status reads over the still-pending ids.
const ROUND_PAUSE: Duration = Duration::from_millis(250);
/// How often the wait phase says how many ids are still pending.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Failed ids shown with their reason.
const FAILED_SAMPLE: usize = 5;

pub struct FaultsConfig {
    pub url: String,
    pub wf: WorkflowArgs,
    pub requests: usize,
    pub connections: usize,
    pub read_concurrency: usize,
    pub settle_timeout: Duration,
    pub timeout: Duration,
    pub json: Option<String>,
    pub check: bool,
    pub max_in_flight: Option<u64>,
    pub quiet: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedSample {
    pub id: String,
    pub reason: String,
}

/// The JSON document `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct FaultsReport {
    pub scenario: &'static str,
    pub workflow: String,
    pub connections: usize,
    /// Service requests asked for.
    pub requests: usize,
    /// Creates answered 200 with an id.
    pub acknowledged: usize,
    /// Create attempts that were retried, by kind (`status_503`, `connect`, ...).
    pub create_retries: BTreeMap<String, u64>,
    /// Creates given up: answered something not worth retrying (a 4xx, a
    /// 200 without an id), or still refused after `--settle-timeout`.
    pub create_rejected: BTreeMap<String, u64>,
    pub completed: usize,
    pub failed: usize,
    /// Acknowledged but not final when `--settle-timeout` ran out.
    pub pending: usize,
    /// Of `pending`, those whose last status read answered 404: acknowledged
    /// but unknown to the server, i.e. lost.
    pub missing: usize,
    /// Status reads that failed and were tried again next round, by kind.
    pub read_errors: BTreeMap<String, u64>,
    pub failed_sample: Vec<FailedSample>,
    pub create_s: f64,
    /// Acknowledged creates per second of the create phase.
    pub create_rate: f64,
    /// From the first create until every acknowledged request was final;
    /// null if some were still pending at the timeout.
    pub all_final_s: Option<f64>,
    /// Completed requests per second, first create to the end of the wait.
    pub completed_rate: f64,
    /// The mock's `GET /stats` at the end, verbatim (null if unknown).
    pub mock: Option<serde_json::Value>,
    /// What `--check` found wrong (empty: passed); null without `--check`.
    pub check_problems: Option<Vec<String>>,
}

/// Create-phase tallies, shared by the connections of one thread.
#[derive(Default)]
struct Created {
    ids: Vec<String>,
    retries: BTreeMap<String, u64>,
    rejected: BTreeMap<String, u64>,
}

/// Whether a failed create is worth another try: the server said so (503,
/// 429), a proxy did (502, 504), or the transport broke before an answer.
fn retriable(e: ErrorKind) -> bool {
    match e {
        ErrorKind::Status(code) => matches!(code, 429 | 502 | 503 | 504),
        ErrorKind::Timeout | ErrorKind::Connect | ErrorKind::Io => true,
        _ => false,
    }
}

fn retry_pause(retry_after: Option<u64>) -> Duration {
    retry_after.map_or(RETRY_PAUSE, |s| {
        Duration::from_secs(s).clamp(MIN_RETRY_PAUSE, MAX_RETRY_PAUSE)
    })
}

/// One create: its id, or why not (with the `Retry-After` of the answer).
fn created(result: Result<Response, ErrorKind>) -> Result<String, (ErrorKind, Option<u64>)> {
    let r = result.map_err(|e| (e, None))?;
    if r.status != 200 {
        return Err((ErrorKind::Status(r.status), r.retry_after));
    }
    status::created_id(&r.body).ok_or((ErrorKind::BadResponse, None))
}

/// One closed-loop connection: takes the next request number until all
/// are taken, and retries each until it is acknowledged or given up.
async fn creator(
    ep: Arc<Endpoint>,
    path: &str,
    next: &Cell<usize>,
    total: usize,
    give_up: Duration,
    out: &RefCell<Created>,
) {
    let mut client = Client::new(ep);
    while next.get() < total {
        next.set(next.get() + 1);
        let started = Instant::now();
        loop {
            let answer = created(client.post(path, CLAIM_PAYLOAD.as_bytes()).await);
            let (kind, retry_after) = match answer {
                Ok(id) => {
                    out.borrow_mut().ids.push(id);
                    break;
                }
                Err(e) => e,
            };
            if !retriable(kind) || started.elapsed() >= give_up {
                *out.borrow_mut().rejected.entry(kind.key()).or_default() += 1;
                break;
            }
            *out.borrow_mut().retries.entry(kind.key()).or_default() += 1;
            tokio::time::sleep(retry_pause(retry_after)).await;
        }
    }
}

/// An acknowledged id not yet seen final.
struct Pending {
    id: String,
    /// The last read answered 404.
    not_found: bool,
}

#[derive(Default)]
struct Round {
    still: Vec<Pending>,
    completed: usize,
    failed: Vec<FailedSample>,
    errors: BTreeMap<String, u64>,
}

/// One pass of status reads over `pending`, `clients.len()` at a time.
async fn read_round(clients: &mut [Client], prefix: &str, pending: Vec<Pending>) -> Round {
    let queue = RefCell::new(pending.into_iter());
    let round = RefCell::new(Round::default());
    join_all(clients.iter_mut().map(|client| {
        let (queue, round) = (&queue, &round);
        async move {
            loop {
                let Some(mut p) = queue.borrow_mut().next() else {
                    return;
                };
                let answer = client.get(&format!("{prefix}{}", p.id)).await;
                let outcome = answer.and_then(|r| match r.status {
                    200 => status::outcome(&r.body).ok_or(ErrorKind::BadResponse),
                    code => Err(ErrorKind::Status(code)),
                });
                let mut round = round.borrow_mut();
                match outcome {
                    Ok(Outcome::Completed) => round.completed += 1,
                    Ok(Outcome::Failed { reason }) => {
                        round.failed.push(FailedSample { id: p.id, reason })
                    }
                    Ok(Outcome::Running) => {
                        p.not_found = false;
                        round.still.push(p);
                    }
                    Err(e) => {
                        // 503 or a broken connection: ask again next round.
                        p.not_found = e == ErrorKind::Status(404);
                        *round.errors.entry(e.key()).or_default() += 1;
                        round.still.push(p);
                    }
                }
            }
        }
    }))
    .await;
    round.into_inner()
}

fn endpoint(url: &str, timeout: Duration) -> anyhow::Result<(Target, Arc<Endpoint>)> {
    let target = Target::parse(url).map_err(anyhow::Error::msg)?;
    let ep = Arc::new(Endpoint {
        addr: target.resolve().map_err(anyhow::Error::msg)?,
        host: target.authority.clone(),
        timeout,
    });
    Ok((target, ep))
}

/// The downstream's `/stats` (after `POST /stats/reset` when `reset`).
async fn mock_stats(
    url: &str,
    timeout: Duration,
    reset: bool,
) -> anyhow::Result<serde_json::Value> {
    let (target, ep) = endpoint(url, timeout)?;
    let mut client = Client::new(ep);
    let (method, route) = if reset {
        ("POST", "/stats/reset")
    } else {
        ("GET", "/stats")
    };
    let r = client
        .call(method, &target.path(route), b"")
        .await
        .map_err(|e| anyhow::anyhow!("{method} {url}{route}: {}", e.key()))?;
    if r.status != 200 {
        bail!("{method} {url}{route} answered {}", r.status);
    }
    serde_json::from_slice(&r.body).with_context(|| format!("{url}{route} is not JSON"))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn per_second(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// What `--check` requires, as a list of what is wrong (empty: passed).
pub fn problems(r: &FaultsReport, max_in_flight: Option<u64>) -> Vec<String> {
    let mut out = Vec::new();
    if r.acknowledged < r.requests {
        out.push(format!(
            "{} of {} creates never acknowledged",
            r.requests - r.acknowledged,
            r.requests
        ));
    }
    if r.completed < r.acknowledged {
        out.push(format!(
            "{} of {} acknowledged not COMPLETED ({} FAILED, {} pending, {} missing)",
            r.acknowledged - r.completed,
            r.acknowledged,
            r.failed,
            r.pending,
            r.missing
        ));
    }
    let field = |name: &str| r.mock.as_ref().and_then(|m| m[name].as_u64());
    match field("excess_calls") {
        Some(0) => {}
        Some(n) => out.push(format!(
            "{n} excess step call(s) on {} key(s)",
            field("keys_called_more_than_needed").unwrap_or(0)
        )),
        None => out.push(
            "the mock reports no excess_calls (needs --downstream pointing at \
             `clamp-bench mock --count-keys` or `--fail-first-pct`)"
                .into(),
        ),
    }
    if let Some(limit) = max_in_flight {
        match field("peak_in_flight") {
            Some(peak) if peak <= limit => {}
            Some(peak) => out.push(format!("peak_in_flight {peak} > {limit}")),
            None => out.push("the mock reports no peak_in_flight".into()),
        }
    }
    out
}

fn kinds(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human summary.
pub fn print_summary(out: &mut dyn Write, r: &FaultsReport) -> std::io::Result<()> {
    writeln!(
        out,
        "faults: {} requests over {} connections (workflow {})",
        r.requests, r.connections, r.workflow
    )?;
    writeln!(
        out,
        "  create    {} acknowledged in {:.2} s ({:.0}/s); retried: {}; given up: {}",
        r.acknowledged,
        r.create_s,
        r.create_rate,
        kinds(&r.create_retries),
        kinds(&r.create_rejected)
    )?;
    let final_at = r.all_final_s.map_or("not all final".to_string(), |s| {
        format!("all final after {s:.2} s")
    });
    writeln!(
        out,
        "  outcome   {} COMPLETED, {} FAILED, {} pending ({} missing); {final_at}, {:.0} completed/s",
        r.completed, r.failed, r.pending, r.missing, r.completed_rate
    )?;
    if !r.read_errors.is_empty() {
        writeln!(out, "  reads     retried: {}", kinds(&r.read_errors))?;
    }
    for f in &r.failed_sample {
        writeln!(out, "  failed    {}: {}", f.id, f.reason)?;
    }
    match &r.mock {
        Some(m) => writeln!(out, "  mock      {m}")?,
        None => writeln!(
            out,
            "  mock      (no stats: downstream unknown or unreachable)"
        )?,
    }
    match &r.check_problems {
        None => {}
        Some(p) if p.is_empty() => writeln!(out, "  check     PASS")?,
        Some(p) => writeln!(out, "  check     FAIL: {}", p.join("; "))?,
    }
    Ok(())
}

pub fn run(cfg: FaultsConfig) -> anyhow::Result<ExitCode> {
    if cfg.requests == 0 || cfg.connections == 0 || cfg.read_concurrency == 0 {
        bail!("--requests, --connections and --read-concurrency must be at least 1");
    }
    let (target, ep) = endpoint(&cfg.url, cfg.timeout)?;
    let WorkflowSetup {
        name,
        downstream,
        mock,
    } = runner::setup_workflow(&target, &ep, &cfg.wf)?;
    let mut log: Box<dyn Write> = if cfg.json.as_deref() == Some("-") {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    // One thread: a few thousand creates and reads need little CPU, and
    // whatever this takes is taken from the server on a small machine.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = rt.block_on(async {
        // Count this run only, whatever the mock saw before.
        if let Some(url) = &downstream {
            if let Err(e) = mock_stats(url, cfg.timeout, true).await {
                eprintln!("clamp-bench: could not reset the mock's stats: {e:#}");
            }
        }
        if let Some(stats) = &mock {
            stats.reset();
        }
        let create_path = target.path(&format!("/serviceRequest/{name}"));
        let read_prefix = target.path("/serviceRequest/");
        let started = Instant::now();
        let next = Cell::new(0);
        let tally = RefCell::new(Created::default());
        join_all((0..cfg.connections).map(|_| {
            creator(
                ep.clone(),
                &create_path,
                &next,
                cfg.requests,
                cfg.settle_timeout,
                &tally,
            )
        }))
        .await;
        let create_time = started.elapsed();
        let tally = tally.into_inner();
        let acknowledged = tally.ids.len();
        if !cfg.quiet {
            let _ = writeln!(
                log,
                "created {acknowledged} of {} in {:.2} s; waiting for outcomes",
                cfg.requests,
                secs(create_time)
            );
        }

        let mut pending: Vec<Pending> = tally
            .ids
            .into_iter()
            .map(|id| Pending {
                id,
                not_found: false,
            })
            .collect();
        let mut clients: Vec<Client> = (0..cfg.read_concurrency)
            .map(|_| Client::new(ep.clone()))
            .collect();
        let (mut completed, mut failed) = (0, Vec::new());
        let mut read_errors = BTreeMap::new();
        let wait_start = Instant::now();
        let mut last_note = wait_start;
        let mut all_final = None;
        loop {
            let round = read_round(&mut clients, &read_prefix, pending).await;
            pending = round.still;
            completed += round.completed;
            failed.extend(round.failed);
            for (k, v) in round.errors {
                *read_errors.entry(k).or_default() += v;
            }
            if pending.is_empty() {
                all_final = Some(started.elapsed());
                break;
            }
            if wait_start.elapsed() >= cfg.settle_timeout {
                break;
            }
            if !cfg.quiet && last_note.elapsed() >= PROGRESS_EVERY {
                last_note = Instant::now();
                let _ = writeln!(
                    log,
                    "  {:.0} s: {} pending, {completed} completed, {} failed",
                    secs(started.elapsed()),
                    pending.len(),
                    failed.len()
                );
            }
            tokio::time::sleep(ROUND_PAUSE).await;
        }
        let elapsed = all_final.unwrap_or_else(|| started.elapsed());
        let mock_stats = match (&downstream, &mock) {
            (_, Some(stats)) => Some(stats.snapshot()),
            (Some(url), None) => match mock_stats(url, cfg.timeout, false).await {
                Ok(v) => Some(v),
                Err(e) => {
                    eprintln!("clamp-bench: could not read the mock's stats: {e:#}");
                    None
                }
            },
            (None, None) => None,
        };
        FaultsReport {
            scenario: "faults",
            workflow: name.clone(),
            connections: cfg.connections,
            requests: cfg.requests,
            acknowledged,
            create_retries: tally.retries,
            create_rejected: tally.rejected,
            completed,
            failed: failed.len(),
            pending: pending.len(),
            missing: pending.iter().filter(|p| p.not_found).count(),
            read_errors,
            failed_sample: failed.into_iter().take(FAILED_SAMPLE).collect(),
            create_s: secs(create_time),
            create_rate: per_second(acknowledged, create_time),
            all_final_s: all_final.map(secs),
            completed_rate: per_second(completed, elapsed),
            mock: mock_stats,
            check_problems: None,
        }
    });
    if cfg.check {
        report.check_problems = Some(problems(&report, cfg.max_in_flight));
    }
    print_summary(&mut log, &report)?;
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report)?;
        if path == "-" {
            println!("{text}");
        } else {
            std::fs::write(path, text + "\n").with_context(|| format!("writing {path}"))?;
        }
    }
    let passed = match &report.check_problems {
        Some(p) => p.is_empty(),
        None => report.acknowledged > 0,
    };
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FaultsReport {
        FaultsReport {
            scenario: "faults",
            workflow: "wf".into(),
            connections: 4,
            requests: 10,
            acknowledged: 10,
            create_retries: BTreeMap::new(),
            create_rejected: BTreeMap::new(),
            completed: 10,
            failed: 0,
            pending: 0,
            missing: 0,
            read_errors: BTreeMap::new(),
            failed_sample: Vec::new(),
            create_s: 1.0,
            create_rate: 10.0,
            all_final_s: Some(2.0),
            completed_rate: 5.0,
            mock: Some(serde_json::json!({"excess_calls": 0, "peak_in_flight": 8})),
            check_problems: None,
        }
    }

    #[test]
    fn check_passes_a_clean_run_and_names_each_problem() {
        assert!(problems(&report(), Some(8)).is_empty());
        assert_eq!(problems(&report(), Some(7)), ["peak_in_flight 8 > 7"]);

        let mut r = report();
        r.acknowledged = 9;
        r.completed = 7;
        r.failed = 1;
        r.pending = 1;
        r.mock = Some(serde_json::json!({"excess_calls": 3, "keys_called_more_than_needed": 2}));
        let p = problems(&r, None);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("1 of 10 creates"));
        assert!(p[1].starts_with("2 of 9 acknowledged"));
        assert_eq!(p[2], "3 excess step call(s) on 2 key(s)");

        let mut r = report();
        r.mock = Some(serde_json::json!({"step1": 10}));
        assert_eq!(problems(&r, None).len(), 1);
        r.mock = None;
        assert_eq!(problems(&r, Some(1)).len(), 2);
    }

    #[test]
    fn retries_only_what_may_succeed_later() {
        assert!(retriable(ErrorKind::Status(503)));
        assert!(retriable(ErrorKind::Connect));
        assert!(retriable(ErrorKind::Timeout));
        assert!(!retriable(ErrorKind::Status(404)));
        assert!(!retriable(ErrorKind::Status(400)));
        assert!(!retriable(ErrorKind::BadResponse));
        assert_eq!(retry_pause(None), RETRY_PAUSE);
        assert_eq!(retry_pause(Some(1)), Duration::from_secs(1));
        assert_eq!(retry_pause(Some(30)), MAX_RETRY_PAUSE);
        assert_eq!(retry_pause(Some(0)), MIN_RETRY_PAUSE);
    }

    #[test]
    fn summary_mentions_the_outcome() {
        let mut r = report();
        r.check_problems = Some(Vec::new());
        let mut out = Vec::new();
        print_summary(&mut out, &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("10 COMPLETED, 0 FAILED"), "{text}");
        assert!(text.contains("check     PASS"), "{text}");
    }
}
