//! Servers started in-process on port 0, their test configuration, and the requests tests
//! make through them: workflows, service requests, waiting for a request's status, and
//! the step responses brokers carry.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};

use super::http::{send, Resp};
use super::waiting::wait_for_seen;

/// A test configuration for `url`.
pub fn config(url: &str) -> clamp::config::Config {
    clamp::config::Config::for_tests(url)
}

/// A server started in-process, and a client for it.
pub struct TestServer {
    pub server: Option<clamp::Server>,
    pub addr: SocketAddr,
}

impl TestServer {
    pub async fn start(mut config: clamp::config::Config) -> TestServer {
        if config.listen.port() == 0 {
            config.listen.set_port(super::binary::free_port());
        }
        // CLAMP_TEST_LOG=debug shows the servers' logs (off by default: tests print nothing).
        if let Ok(filter) = std::env::var("CLAMP_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let server = clamp::start(config).await.expect("server starts");
        let addr = server.local_addr();
        TestServer {
            server: Some(server),
            addr,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn get(&self, path: &str) -> Resp {
        send(self.addr, Method::GET, path, None, &[]).await
    }

    pub async fn post(&self, path: &str, body: &str) -> Resp {
        send(
            self.addr,
            Method::POST,
            path,
            Some(body.as_bytes().to_vec()),
            &[],
        )
        .await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.post(path, &body.to_string()).await
    }

    /// Creates a workflow and asserts it was accepted.
    pub async fn create_workflow(&self, def: &Value) -> Value {
        let r = self.post_json("/workflow", def).await;
        assert_eq!(r.status, 200, "creating workflow: {}", r.text());
        r.json()
    }

    pub async fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

/// A simple one-step HTTP workflow definition.
pub fn simple_workflow(name: &str) -> Value {
    serde_json::json!({
        "name": name,
        "description": "test",
        "steps": [{"name": "step1", "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/none"}}]
    })
}

/// Creates a service request and returns its id.
pub async fn create_request(s: &TestServer, workflow: &str, payload: &Value) -> String {
    let r = s
        .post_json(&format!("/serviceRequest/{workflow}"), payload)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["serviceRequestId"].as_str().unwrap().to_string()
}

/// Polls `GET /serviceRequest/{id}` until its status is one of `want`, and returns it;
/// panics (with the last answer) when `within` passes first.
pub async fn wait_status(s: &TestServer, id: &str, want: &[&str], within: Duration) -> Value {
    wait_status_at(s.addr, id, want, within, &[]).await
}

/// `wait_status` for any server at `addr` (a spawned binary, say), sending `headers`
/// with each read (a token, say).
pub async fn wait_status_at(
    addr: SocketAddr,
    id: &str,
    want: &[&str],
    within: Duration,
    headers: &[(&str, &str)],
) -> Value {
    let path = format!("/serviceRequest/{id}");
    wait_for_seen(&format!("{id} to be one of {want:?}"), within, || async {
        let v = send(addr, Method::GET, &path, None, headers).await.json();
        if want.contains(&v["status"].as_str().unwrap_or("")) {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

/// A step response as the brokers carry it: `response` answers step 1 of request `id`.
pub fn step_reply(id: &str, response: Value) -> Vec<u8> {
    json!({"serviceRequestId": id, "stepId": 1, "response": response})
        .to_string()
        .into_bytes()
}

/// The last entry of step `name` with `status` in a status answer (panics naming the
/// answer when there is none).
pub fn step_entry(v: &Value, name: &str, status: &str) -> Value {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["name"] == name && e["status"] == status)
        .cloned()
        .unwrap_or_else(|| panic!("no {status} entry of step {name}: {v}"))
}

/// The entries of step `step_id` in a status answer that record an outcome (not the
/// STARTED one of its attempt or wait).
pub fn final_entries(v: &Value, step_id: u32) -> Vec<&Value> {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["id"] == step_id && e["status"] != "STARTED")
        .collect()
}

/// The response a step's last COMPLETED entry holds.
pub fn response_of(v: &Value, name: &str) -> Value {
    step_entry(v, name, "COMPLETED")["payload"]["response"].clone()
}
