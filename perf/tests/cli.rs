//! Drives the `clamp-bench` binary as a child process against its own mock,
//! the way the main project's scripts and tests will.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clamp_bench::schedule::Schedule;

const BIN: &str = env!("CARGO_BIN_EXE_clamp-bench");

/// The mock on an ephemeral port; killed when dropped.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    fn start() -> Self {
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["mock", "--port", "0", "--threads", "1"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mock");
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("mock listening on ")
            .unwrap_or_else(|| panic!("unexpected mock banner {line:?}"))
            .to_string();
        Self { child, url }
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(args)
        .args(["--json", "-", "--quiet"])
        .output()
        .expect("run clamp-bench");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[test]
fn closed_open_and_find_max_against_the_mock() {
    let mock = Mock::start();
    let url = mock.url.as_str();

    let closed = run_json(&[
        "health", "--url", url, "-c", "4", "-d", "1s", "--warmup", "0s",
    ]);
    assert_eq!(closed["mode"], "closed");
    // How many fit in the second depends on the machine: only that some did, all answered.
    assert!(closed["ok"].as_u64().unwrap() > 0, "{closed}");
    assert_eq!(closed["ok"], closed["requests"], "{closed}");
    assert_eq!(closed["errors"], serde_json::json!({}));
    assert!(closed["latency_us"]["p99"].as_u64().unwrap() > 0);

    let open = run_json(&[
        "health", "--url", url, "-c", "4", "-r", "500", "-d", "2s", "--warmup", "0s",
    ]);
    assert_eq!(open["mode"], "open");
    assert_eq!(open["offered_rate"], 500.0);
    assert_eq!(open["duration_s"], 2.0);
    // 500/s for 2 s over 4 connections puts 1000 requests on the schedule, one every 2 ms,
    // and none is sent after the window.
    let window = Duration::from_secs(2);
    let mut due: Vec<Duration> = (0..4)
        .flat_map(|i| {
            let s = Schedule::new(500.0, 4, i);
            (0..).map(move |k| s.due(k)).take_while(|d| *d < window)
        })
        .collect();
    due.sort();
    assert_eq!(due.len(), 1000);
    assert!(due
        .iter()
        .enumerate()
        .all(|(n, d)| *d == Duration::from_millis(2 * n as u64)));
    // How many of them this machine manages to send in time is its own business (tests
    // run side by side): never more than the schedule, each one answered, and the rate
    // reported is what was sent over the window, so at most the offered one.
    let requests = open["requests"].as_u64().unwrap();
    assert!((1..=due.len() as u64).contains(&requests), "{open}");
    assert_eq!(open["ok"], requests, "{open}");
    assert_eq!(open["errors"], serde_json::json!({}), "{open}");
    let achieved = open["achieved_rate"].as_f64().unwrap();
    assert_eq!(achieved, requests as f64 / 2.0, "{open}");
    assert!(achieved <= 500.0, "{open}");
    let per_second = open["per_second"].as_array().unwrap();
    assert_eq!(per_second.len(), 2);
    let plotted: u64 = per_second.iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(plotted <= requests, "{open}");

    let fm = run_json(&[
        "health",
        "--url",
        url,
        "-c",
        "4",
        // Two seconds a step, so a few requests falling due after a window closes on a
        // loaded machine stay well inside the 3% tolerance.
        "-d",
        "2s",
        "--warmup",
        "0s",
        "--find-max",
        "--start-rate",
        "200",
        "--max-steps",
        "2",
        "--cooldown",
        "0s",
        "--slo-p99",
        "1s",
    ]);
    // The search, not this machine's speed: it starts at the start rate, doubles after a
    // pass (or halves after a failure), judges each step by its own numbers, and reports
    // the best step that passed.
    let steps = fm["find_max"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{fm}");
    assert_eq!(steps[0]["offered_rate"], 200.0, "{fm}");
    let first_passed = steps[0]["pass"].as_bool().unwrap();
    let second = if first_passed { 400.0 } else { 100.0 };
    assert_eq!(steps[1]["offered_rate"], second, "{fm}");
    let mut best: Option<f64> = None;
    for step in steps {
        let offered = step["offered_rate"].as_f64().unwrap();
        let achieved = step["achieved_rate"].as_f64().unwrap();
        let judged = achieved >= offered * 0.97
            && step["errors"] == 0
            && step["p99_us"].as_u64().unwrap() <= 1_000_000;
        assert_eq!(step["pass"], judged, "{step}");
        assert_eq!(step["reason"] == "", judged, "{step}");
        assert!(achieved <= offered, "{step}");
        if judged {
            best = Some(best.map_or(offered, |b: f64| b.max(offered)));
        }
    }
    assert_eq!(fm["find_max"]["max_rate"], serde_json::json!(best), "{fm}");
}

#[test]
fn unreachable_server_exits_1_with_connect_errors() {
    // Bind then drop a listener to get a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(BIN)
        .args([
            "health", "--url", &url, "-c", "2", "-d", "300ms", "--warmup", "0s",
        ])
        .args(["--json", "-", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["errors"]["connect"].as_u64().unwrap() > 0);
}

/// A real clamp server (in-process, port 0) on a database of its own, and a direct
/// connection to that database to check what the scenarios stored.
struct RealServer {
    rt: tokio::runtime::Runtime,
    server: Option<clamp::Server>,
    url: String,
    db: String,
    client: tokio_postgres::Client,
}

fn pg_base() -> String {
    std::env::var("CLAMP_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

impl RealServer {
    fn start() -> Self {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let db = format!(
            "clamp_bench_it_{}_{}",
            std::process::id(),
            fastrand::u32(..)
        );
        let db_url = format!("{}/{db}", pg_base());
        let server = rt
            .block_on(clamp::start(clamp::config::Config::for_tests(&db_url)))
            .expect("server starts");
        let url = format!("http://{}", server.local_addr());
        let client = rt.block_on(async {
            let (c, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            c
        });
        Self {
            rt,
            server: Some(server),
            url,
            db,
            client,
        }
    }

    fn count(&self, sql: &str) -> i64 {
        self.rt
            .block_on(self.client.query_one(sql, &[]))
            .unwrap()
            .get(0)
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
        let db = self.db.clone();
        self.rt.block_on(async {
            if let Ok((c, conn)) =
                tokio_postgres::connect(&format!("{}/postgres", pg_base()), tokio_postgres::NoTls)
                    .await
            {
                tokio::spawn(conn);
                let _ = c
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
                    .await;
            }
        });
    }
}

#[test]
fn every_scenario_against_the_real_server_adds_up() {
    let s = RealServer::start();
    let mock = Mock::start();
    let url = s.url.as_str();
    // How many requests fit in a window depends on the machine: the counts below are
    // checked against each other and the database, and only asked to be more than none.
    let window = ["-c", "4", "-d", "1s", "--warmup", "0s"];
    let with = |scenario: &str, extra: &[&str]| {
        let mut args = vec![scenario, "--url", url];
        args.extend_from_slice(&window);
        args.extend_from_slice(extra);
        run_json(&args)
    };

    let h = with("health", &[]);
    assert!(h["ok"].as_u64().unwrap() > 0, "{h}");
    assert_eq!(h["ok"], h["requests"]);
    assert_eq!(h["errors"], serde_json::json!({}));

    let before = s.count("SELECT count(*) FROM service_requests");
    let c = with("create", &["--downstream", &mock.url]);
    let stored = s.count("SELECT count(*) FROM service_requests") - before;
    assert_eq!(c["errors"], serde_json::json!({}), "{c}");
    assert!(c["ok"].as_i64().unwrap() > 0, "{c}");
    // Every acknowledged create is a stored row (ack=commit), and nothing else was stored.
    assert_eq!(stored, c["ok"].as_i64().unwrap(), "{c}");

    let before = s.count("SELECT count(*) FROM service_requests");
    let m = with("mixed", &["--downstream", &mock.url, "--read-ratio", "0.5"]);
    let stored = s.count("SELECT count(*) FROM service_requests") - before;
    assert_eq!(m["errors"], serde_json::json!({}), "{m}");
    assert_eq!(stored, m["mixed"]["creates"].as_i64().unwrap(), "{m}");
    assert_eq!(
        m["mixed"]["creates"].as_u64().unwrap() + m["mixed"]["reads"].as_u64().unwrap(),
        m["ok"].as_u64().unwrap(),
        "{m}"
    );

    let before = s.count("SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'");
    let e = with(
        "e2e",
        &["--downstream", &mock.url, "--poll-interval", "5ms"],
    );
    assert_eq!(e["errors"], serde_json::json!({}), "{e}");
    let completed = e["e2e"]["completed"].as_i64().unwrap();
    assert!(completed > 0, "{e}");
    assert_eq!(e["e2e"]["failed"], 0);
    // The server finished at least what the generator saw finish (and the creates and
    // mixed rows above keep completing in the background, so only a lower bound holds).
    let done = s.count("SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'") - before;
    assert!(
        done >= completed,
        "server completed {done}, generator saw {completed}"
    );
    let steps = &e["e2e"]["downstream_calls"];
    if !steps.is_null() {
        assert!(steps["step1"].as_i64().unwrap() >= completed, "{e}");
        assert!(steps["step2"].as_i64().unwrap() >= completed, "{e}");
    }
}

#[test]
fn faults_accounts_for_every_request_and_every_step_call() {
    let s = RealServer::start();
    let mock = Mock::start_with(&["--fail-first-pct", "30"]);
    let v = run_json(&[
        "faults",
        "--url",
        &s.url,
        "--downstream",
        &mock.url,
        "--requests",
        "200",
        "-c",
        "4",
        "--settle-timeout",
        "60s",
    ]);
    assert_eq!(v["scenario"], "faults");
    assert_eq!(v["acknowledged"], 200, "{v}");
    assert_eq!(v["pending"], 0, "{v}");
    let (completed, failed) = (
        v["completed"].as_u64().unwrap(),
        v["failed"].as_u64().unwrap(),
    );
    assert_eq!(completed + failed, 200, "{v}");
    // Whether or not the server retries a faulted step, it must never call one twice
    // without a fault asking for it.
    let m = &v["mock"];
    assert!(m["faults_injected"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(m["excess_calls"], 0, "{v}");
    // A request fails only through a faulted step, so failures are bounded by the faults.
    assert!(failed <= m["faults_injected"].as_u64().unwrap(), "{v}");
    if failed > 0 {
        assert!(
            !v["failed_sample"][0]["reason"].as_str().unwrap().is_empty(),
            "{v}"
        );
    }
    let stored = s.count("SELECT count(*) FROM service_requests");
    assert_eq!(stored, 200, "{v}");
}
