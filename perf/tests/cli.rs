//! Drives the `clamp-bench` binary as a child process against its own mock,
//! the way the main project's scripts and tests will.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_clamp-bench");

/// The mock on an ephemeral port; killed when dropped.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    fn start() -> Self {
        let mut child = Command::new(BIN)
            .args(["mock", "--port", "0", "--threads", "1"])
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
    assert!(closed["ok"].as_u64().unwrap() > 100, "{closed}");
    assert_eq!(closed["errors"], serde_json::json!({}));
    assert!(closed["latency_us"]["p99"].as_u64().unwrap() > 0);

    let open = run_json(&[
        "health", "--url", url, "-c", "4", "-r", "500", "-d", "2s", "--warmup", "0s",
    ]);
    assert_eq!(open["mode"], "open");
    assert_eq!(open["requests"], 1000);
    let achieved = open["achieved_rate"].as_f64().unwrap();
    assert!((achieved - 500.0).abs() < 1.0, "{achieved}");
    assert_eq!(open["per_second"].as_array().unwrap().len(), 2);

    let fm = run_json(&[
        "health",
        "--url",
        url,
        "-c",
        "4",
        "-d",
        "1s",
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
    let steps = fm["find_max"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(fm["find_max"]["max_rate"], 400.0);
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
