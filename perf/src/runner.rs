//! Turns parsed command-line options into runs: scenario set-up, a single
//! run or a `--find-max` search, and the outputs (table, JSON, SVG).

use crate::cli::{Command, LoadArgs, WorkflowArgs};
use crate::client::{Client, Endpoint};
use crate::engine::{self, Plan};
use crate::faults;
use crate::findmax::{FindMax, SearchConfig, StepResult};
use crate::mock::{self, MockConfig, MockStats};
use crate::report::{self, FindMaxReport, Report};
use crate::scenario::{self, Workload, CLAIM_PAYLOAD};
use crate::svg;
use crate::target::Target;
use anyhow::{bail, Context};
use bytes::Bytes;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

/// Entry point shared by the binary: returns the process exit status.
pub fn execute(cmd: Command) -> anyhow::Result<ExitCode> {
    let (name, load, setup) = match cmd {
        Command::AmqpResponder {
            amqp_url,
            queue,
            prefetch,
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(crate::responder::run(&amqp_url, &queue, prefetch))?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Mock {
            host,
            port,
            threads,
            delay,
            fail_first_pct,
            retry_after,
            count_keys,
        } => {
            let addr = format!("{host}:{port}")
                .parse()
                .with_context(|| format!("bad mock address {host}:{port}"))?;
            let threads = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            mock::run(MockConfig {
                fail_first_pct,
                retry_after,
                count_keys,
                ..MockConfig::plain(addr, threads, delay)
            })?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Faults {
            url,
            wf,
            requests,
            connections,
            read_concurrency,
            settle_timeout,
            timeout,
            json,
            check,
            max_in_flight,
            quiet,
        } => {
            return faults::run(faults::FaultsConfig {
                url,
                wf,
                requests,
                connections,
                read_concurrency,
                settle_timeout,
                timeout,
                json,
                check,
                max_in_flight,
                quiet,
            });
        }
        Command::Health { load, path } => ("health", load, Setup::Get(path)),
        Command::Create {
            load,
            wf,
            idempotency_keys,
        } => ("create", load, Setup::Create(wf, idempotency_keys)),
        Command::Mixed {
            load,
            wf,
            read_ratio,
        } => {
            if !(0.0..=1.0).contains(&read_ratio) {
                bail!("--read-ratio must be within 0..=1");
            }
            ("mixed", load, Setup::Mixed(wf, read_ratio))
        }
        Command::E2e {
            load,
            wf,
            poll_interval,
            workflow_timeout,
            long_poll,
        } => (
            "e2e",
            load,
            Setup::E2e(wf, poll_interval, workflow_timeout, long_poll),
        ),
    };
    validate(&load)?;
    let target = Target::parse(&load.url).map_err(anyhow::Error::msg)?;
    let ep = Arc::new(Endpoint {
        addr: target.resolve().map_err(anyhow::Error::msg)?,
        host: target.authority.clone(),
        timeout: load.timeout,
    });
    let (workload, downstream) = prepare(&target, &ep, setup)?;
    let mut report = if load.find_max {
        find_max(name, &load, workload, ep)?
    } else {
        let plan = plan(name, &load, load.rate);
        let rec = engine::run(&plan, workload, ep);
        Report::new(name, &plan, &rec)
    };
    if let (Some(e2e), Some(stats)) = (report.e2e.as_mut(), downstream.as_ref()) {
        e2e.downstream_calls = Some(stats.snapshot());
    }
    emit(&load, &report)?;
    Ok(if report.ok == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

enum Setup {
    Get(String),
    /// The workflow, and whether every create carries a fresh Idempotency-Key.
    Create(WorkflowArgs, bool),
    Mixed(WorkflowArgs, f64),
    /// The workflow, the poll interval, the workflow timeout, and the long-poll wait.
    E2e(
        WorkflowArgs,
        std::time::Duration,
        std::time::Duration,
        Option<std::time::Duration>,
    ),
}

fn validate(load: &LoadArgs) -> anyhow::Result<()> {
    if load.connections == 0 || load.threads == 0 {
        bail!("--connections and --threads must be at least 1");
    }
    if load.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        bail!("--rate must be a positive number");
    }
    if load.duration.is_zero() {
        bail!("--duration must be positive");
    }
    if load.find_max && !(load.step_factor > 1.0 && load.start_rate > 0.0) {
        bail!("--find-max needs --step-factor > 1 and a positive --start-rate");
    }
    Ok(())
}

/// The workflow a scenario creates service requests of.
pub struct WorkflowSetup {
    pub name: String,
    /// Base URL its steps call; unknown when `--workflow` named an existing
    /// one without `--downstream`.
    pub downstream: Option<String>,
    /// Counters of the in-process mock, when one was started.
    pub mock: Option<Arc<MockStats>>,
}

/// Creates the two-step workflow (starting the in-process mock as its
/// downstream when none is given), or takes the one `--workflow` names.
pub fn setup_workflow(
    target: &Target,
    ep: &Arc<Endpoint>,
    wf: &WorkflowArgs,
) -> anyhow::Result<WorkflowSetup> {
    if let Some(name) = &wf.workflow {
        return Ok(WorkflowSetup {
            name: name.clone(),
            downstream: wf.downstream.clone(),
            mock: None,
        });
    }
    let (downstream, mock) = match &wf.downstream {
        Some(url) => (url.clone(), None),
        None => {
            let bg = mock::spawn(MockConfig::plain(
                "127.0.0.1:0".parse()?,
                wf.mock_threads,
                wf.mock_delay,
            ))?;
            (format!("http://{}", bg.addr), Some(bg.stats))
        }
    };
    let name = scenario::unique_workflow_name();
    let body = scenario::two_step_workflow(&name, &downstream);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut client = Client::new(ep.clone());
        scenario::create_workflow(&mut client, &target.path("/workflow"), body).await
    })?;
    Ok(WorkflowSetup {
        name,
        downstream: Some(downstream),
        mock,
    })
}

/// Creates the workflow a scenario needs and builds the per-operation work.
fn prepare(
    target: &Target,
    ep: &Arc<Endpoint>,
    setup: Setup,
) -> anyhow::Result<(Arc<Workload>, Option<Arc<MockStats>>)> {
    let wf = match &setup {
        Setup::Get(path) => {
            let path = target.path(path);
            return Ok((Arc::new(Workload::Get { path }), None));
        }
        Setup::Create(wf, _) | Setup::Mixed(wf, _) | Setup::E2e(wf, ..) => wf,
    };
    let WorkflowSetup { name, mock, .. } = setup_workflow(target, ep, wf)?;
    let create = target.path(&format!("/serviceRequest/{name}"));
    let body = Bytes::from_static(CLAIM_PAYLOAD.as_bytes());
    let read_prefix = target.path("/serviceRequest/");
    let workload = match setup {
        Setup::Get(_) => unreachable!("returned above"),
        Setup::Create(_, keyed) => Workload::Create {
            path: create,
            body,
            keyed,
        },
        Setup::Mixed(_, read_ratio) => Workload::Mixed {
            create,
            body,
            read_prefix,
            read_ratio,
        },
        Setup::E2e(_, poll_interval, workflow_timeout, long_poll) => Workload::E2e {
            long_poll,
            create,
            body,
            read_prefix,
            poll_interval,
            workflow_timeout,
        },
    };
    Ok((Arc::new(workload), mock))
}

fn plan(name: &str, load: &LoadArgs, rate: Option<f64>) -> Plan {
    Plan {
        label: match rate {
            Some(r) => format!("{name} @{r:.0}/s"),
            None => name.to_string(),
        },
        connections: load.connections,
        threads: load.threads,
        runtime: load.runtime,
        rate,
        warmup: load.warmup,
        duration: load.duration,
        progress: !load.quiet,
    }
}

fn find_max(
    name: &str,
    load: &LoadArgs,
    workload: Arc<Workload>,
    ep: Arc<Endpoint>,
) -> anyhow::Result<Report> {
    let slo_p99_us = u64::try_from(load.slo_p99.as_micros()).unwrap_or(u64::MAX);
    let mut search = FindMax::new(SearchConfig {
        start_rate: load.start_rate,
        factor: load.step_factor,
        precision: load.precision,
        tolerance: load.tolerance,
        slo_p99_us,
        max_steps: load.max_steps,
        min_rate: 1.0,
    });
    let mut best: Option<Report> = None;
    let mut last: Option<Report> = None;
    let mut log = log_stream(load);
    while let Some(rate) = search.next_rate() {
        if last.is_some() {
            std::thread::sleep(load.cooldown);
        }
        let plan = plan(name, load, Some(rate));
        let rec = engine::run(&plan, workload.clone(), ep.clone());
        let r = Report::new(name, &plan, &rec);
        let step = search.record(StepResult {
            offered_rate: rate,
            achieved_rate: r.achieved_rate,
            errors: r.error_total(),
            p50_us: r.latency_us.p50,
            p99_us: r.latency_us.p99,
            p999_us: r.latency_us.p999,
        });
        writeln!(log, "{}", report::step_line(step))?;
        if step.pass && search.max_rate() == Some(rate) {
            best = Some(r.clone());
        }
        last = Some(r);
    }
    let mut report = best.or(last).context("find-max ran no step")?;
    report.find_max = Some(FindMaxReport {
        slo_p99_us,
        max_rate: search.max_rate(),
        steps: search.steps().to_vec(),
    });
    Ok(report)
}

/// Human-readable output goes to stdout unless stdout carries the JSON.
fn log_stream(load: &LoadArgs) -> Box<dyn Write> {
    if load.json.as_deref() == Some("-") {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

fn emit(load: &LoadArgs, report: &Report) -> anyhow::Result<()> {
    report.print_table(&mut log_stream(load))?;
    if let Some(path) = &load.json {
        let text = serde_json::to_string_pretty(report)?;
        if path == "-" {
            println!("{text}");
        } else {
            std::fs::write(path, text + "\n").with_context(|| format!("writing {path}"))?;
        }
    }
    if let Some(path) = &load.plot {
        let title = format!(
            "clamp-bench {} ({} connections)",
            report.scenario, report.connections
        );
        let svg = match &report.find_max {
            Some(f) => svg::latency_vs_rate(&title, &f.steps, f.slo_p99_us, f.max_rate),
            None => svg::throughput_over_time(&title, &report.per_second, report.offered_rate),
        };
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
