//! What each virtual user does per operation, and the one-off set-up
//! (creating the workflow) each scenario needs before load starts.

use crate::client::{Client, Endpoint};
use crate::recorder::{ErrorKind, Finished, Op};
use crate::status::{self, Progress};
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A realistic ~300-byte service-request payload: an insurance claim with
/// nested objects and an array, like the requests clamp is built to route.
pub const CLAIM_PAYLOAD: &str = r#"{"claim":{"id":"CLM-2024-000123","type":"AUTO","amount":{"value":1250.75,"currency":"EUR"},"incident":{"date":"2024-03-14","location":{"city":"Lyon","country":"FR","postcode":"69003"}}},"policy":{"number":"POL-88-4411","holder":{"name":"Jane Doe","email":"jane.doe@example.com"},"coverage":["collision","theft"]},"channel":"mobile","priority":2}"#;

/// Ids a virtual user remembers for `mixed` reads; bounded so long runs do
/// not grow memory, recent ids are what a real client would ask about.
const ID_RING: usize = 1024;

pub enum Workload {
    /// GET a fixed path (health: the server's ceiling).
    Get { path: String },
    /// POST a service request (with a fresh `Idempotency-Key` each when `keyed`).
    Create {
        path: String,
        body: Bytes,
        keyed: bool,
    },
    /// Creates and status reads of ids created earlier.
    Mixed {
        create: String,
        body: Bytes,
        read_prefix: String,
        read_ratio: f64,
    },
    /// Create, then poll until the workflow ends (or long-poll: `?waitMs=`, no pauses).
    E2e {
        create: String,
        body: Bytes,
        read_prefix: String,
        poll_interval: Duration,
        workflow_timeout: Duration,
        long_poll: Option<Duration>,
    },
}

/// Per-virtual-user state: its connection, ids it created, its RNG.
pub struct Vu {
    pub client: Client,
    ids: Vec<String>,
    next_id: usize,
    rng: u64,
    /// This user's prefix for Idempotency-Keys (unique per run), and how many it sent.
    key_prefix: u64,
    keys_sent: u64,
}

impl Vu {
    pub fn new(ep: Arc<Endpoint>, seed: u64) -> Self {
        Self {
            client: Client::new(ep),
            ids: Vec::new(),
            next_id: 0,
            // splitmix-style scramble so neighbouring seeds diverge at once
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            key_prefix: seed
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
            keys_sent: 0,
        }
    }

    /// xorshift64: plenty for choosing reads vs creates, and free.
    fn random(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    fn remember(&mut self, id: String) {
        if self.ids.len() < ID_RING {
            self.ids.push(id);
        } else {
            self.ids[self.next_id] = id;
            self.next_id = (self.next_id + 1) % ID_RING;
        }
    }
}

fn expect_2xx(status: u16) -> Result<(), ErrorKind> {
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(ErrorKind::Status(status))
    }
}

impl Workload {
    pub async fn run(&self, vu: &mut Vu) -> Op {
        match self {
            Self::Get { path } => {
                let r = vu.client.get(path).await;
                Op::new(r.and_then(|r| expect_2xx(r.status)))
            }
            Self::Create { path, body, keyed } => {
                let r = if *keyed {
                    vu.keys_sent += 1;
                    let key = format!("{:x}-{}", vu.key_prefix, vu.keys_sent);
                    vu.client
                        .call_with("POST", path, Some(("Idempotency-Key", &key)), body)
                        .await
                } else {
                    vu.client.post(path, body).await
                };
                let mut op = Op::new(r.and_then(|r| expect_2xx(r.status)));
                op.created = op.outcome.is_ok();
                op
            }
            Self::Mixed {
                create,
                body,
                read_prefix,
                read_ratio,
            } => {
                if !vu.ids.is_empty() && vu.random() < *read_ratio {
                    let pick = (vu.random() * vu.ids.len() as f64) as usize;
                    let path = format!("{read_prefix}{}", vu.ids[pick.min(vu.ids.len() - 1)]);
                    let r = vu.client.get(&path).await;
                    let mut op = Op::new(r.and_then(|r| expect_2xx(r.status)));
                    op.read = true;
                    op
                } else {
                    let (op, id) = create_one(vu, create, body).await;
                    if let Some(id) = id {
                        vu.remember(id);
                    }
                    op
                }
            }
            Self::E2e {
                create,
                body,
                read_prefix,
                poll_interval,
                workflow_timeout,
                long_poll,
            } => {
                e2e(
                    vu,
                    create,
                    body,
                    read_prefix,
                    *poll_interval,
                    *workflow_timeout,
                    *long_poll,
                )
                .await
            }
        }
    }
}

async fn create_one(vu: &mut Vu, path: &str, body: &[u8]) -> (Op, Option<String>) {
    let result = vu.client.post(path, body).await;
    let parsed = result.and_then(|r| {
        expect_2xx(r.status)?;
        status::created_id(&r.body).ok_or(ErrorKind::BadResponse)
    });
    match parsed {
        Ok(id) => {
            let mut op = Op::new(Ok(()));
            op.created = true;
            (op, Some(id))
        }
        Err(e) => (Op::new(Err(e)), None),
    }
}

async fn e2e(
    vu: &mut Vu,
    create: &str,
    body: &[u8],
    read_prefix: &str,
    poll_interval: Duration,
    workflow_timeout: Duration,
    long_poll: Option<Duration>,
) -> Op {
    let started = Instant::now();
    let (mut op, id) = create_one(vu, create, body).await;
    let Some(id) = id else { return op };
    let path = match long_poll {
        Some(w) => format!("{read_prefix}{id}?waitMs={}", w.as_millis()),
        None => format!("{read_prefix}{id}"),
    };
    loop {
        if long_poll.is_none() {
            tokio::time::sleep(poll_interval).await;
        }
        if started.elapsed() > workflow_timeout {
            op.outcome = Err(ErrorKind::WorkflowTimeout);
            return op;
        }
        op.http_requests += 1;
        let answer = vu.client.get(&path).await.and_then(|r| {
            expect_2xx(r.status)?;
            status::progress(&r.body).ok_or(ErrorKind::BadResponse)
        });
        let (completed, overhead_ms) = match answer {
            Ok(Progress::Running) => continue,
            Ok(Progress::Completed { overhead_ms }) => (true, overhead_ms),
            Ok(Progress::Failed { overhead_ms }) => (false, overhead_ms),
            Err(e) => {
                op.outcome = Err(e);
                return op;
            }
        };
        if !completed {
            op.outcome = Err(ErrorKind::WorkflowFailed);
        }
        op.finished = Some(Finished {
            completed,
            overhead_ms,
        });
        return op;
    }
}

/// Body of `POST /workflow` for the e2e scenario: two HTTP steps against
/// the downstream mock.
pub fn two_step_workflow(name: &str, downstream: &str) -> String {
    let base = downstream.trim_end_matches('/');
    serde_json::json!({
        "name": name,
        "description": "clamp-bench end-to-end workflow",
        "steps": [
            {"name": "step1", "mode": "HTTP",
             "val": {"method": "GET", "url": format!("{base}/api/step1")}},
            {"name": "step2", "mode": "HTTP",
             "val": {"method": "POST", "url": format!("{base}/api/step2")}},
        ]
    })
    .to_string()
}

/// A workflow name unique to this run, so runs never collide on the server.
pub fn unique_workflow_name() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("bench_{}_{millis}", std::process::id())
}

/// Creates a workflow on the server (before load starts).
pub async fn create_workflow(client: &mut Client, path: &str, body: String) -> anyhow::Result<()> {
    let resp = client
        .post(path, body.as_bytes())
        .await
        .map_err(|e| anyhow::anyhow!("POST {path} failed: {}", e.key()))?;
    if !(200..300).contains(&resp.status) {
        anyhow::bail!(
            "POST {path} answered {}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_realistic_json() {
        let v: serde_json::Value = serde_json::from_str(CLAIM_PAYLOAD).unwrap();
        assert!(v["claim"]["incident"]["location"]["city"].is_string());
        assert!((250..400).contains(&CLAIM_PAYLOAD.len()));
    }

    #[test]
    fn workflow_body_has_two_http_steps() {
        let v: serde_json::Value =
            serde_json::from_str(&two_step_workflow("wf", "http://127.0.0.1:9000/")).unwrap();
        assert_eq!(
            v["steps"][0]["val"]["url"],
            "http://127.0.0.1:9000/api/step1"
        );
        assert_eq!(v["steps"][1]["val"]["method"], "POST");
        assert_eq!(v["steps"][1]["mode"], "HTTP");
    }

    #[test]
    fn id_ring_is_bounded_and_rng_in_range() {
        let ep = Arc::new(Endpoint {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: "x".into(),
            timeout: Duration::from_secs(1),
        });
        let mut vu = Vu::new(ep, 7);
        for i in 0..(ID_RING + 10) {
            vu.remember(i.to_string());
        }
        assert_eq!(vu.ids.len(), ID_RING);
        assert_eq!(vu.ids[0], ID_RING.to_string());
        let mean: f64 = (0..10_000).map(|_| vu.random()).sum::<f64>() / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }

    #[test]
    fn unique_names_look_right() {
        let n = unique_workflow_name();
        assert!(n.starts_with("bench_"));
        assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }
}
