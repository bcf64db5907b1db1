//! The database host dies: a primary with a synchronous standby is killed (SIGKILL, every
//! process at once) and the standby promoted, while the real binary runs on a two-host URL
//! with `target_session_attrs=read-write`. Nothing acknowledged is lost, the outage is
//! answered 503, creates are acknowledged again soon after the promotion, and the work in
//! flight resumes on the new primary, as do the requests asleep at a WAIT or paused at
//! an EVENT step.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::RETRY_AFTER;
use hyper::Request;
use parking_lot::Mutex;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

/// The longest a promotion may take to be followed by an acknowledged create.
const COME_BACK_BOUND: Duration = Duration::from_secs(10);

/// A cluster of `scripts/pg-replica.sh`, stopped and removed on drop.
struct Node {
    dir: String,
    port: u16,
    /// Stopped with SIGSTOP (continued before it is stopped for good).
    frozen: AtomicBool,
}

impl Node {
    fn run(args: &[&str]) -> String {
        let script = format!("{}/scripts/pg-replica.sh", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(&script)
            .args(args)
            .output()
            .expect("pg-replica.sh runs");
        assert!(
            out.status.success(),
            "pg-replica.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn new(role: &str) -> Node {
        let port = free_port();
        let dir = format!(
            "/tmp/clamp-it-failover-{}-{port}-{role}",
            std::process::id()
        );
        let _ = std::fs::remove_dir_all(&dir);
        Node {
            dir,
            port,
            frozen: AtomicBool::new(false),
        }
    }

    fn primary() -> Node {
        let n = Node::new("primary");
        Node::run(&["primary", &n.dir, &n.port.to_string()]);
        n
    }

    fn standby_of(primary: &Node) -> Node {
        let n = Node::new("standby");
        Node::run(&[
            "standby",
            &n.dir,
            &n.port.to_string(),
            &primary.port.to_string(),
        ]);
        n
    }

    /// Every process of this cluster dies at once (SIGKILL), as when its host goes away.
    fn kill(&self) {
        tokio::task::block_in_place(|| Node::run(&["kill", &self.dir]));
    }

    /// Every process of this cluster stops (SIGSTOP): a hung host, whose kernel still
    /// accepts connections and acknowledges what is sent, and which answers nothing.
    fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
        tokio::task::block_in_place(|| Node::run(&["freeze", &self.dir]));
    }

    /// The standby becomes a primary (returns once it accepts writes).
    fn promote(&self) {
        tokio::task::block_in_place(|| Node::run(&["promote", &self.dir]));
    }

    async fn client(&self, db: &str) -> tokio_postgres::Client {
        let url = format!("postgres://postgres@127.0.0.1:{}/{db}", self.port);
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        tokio::spawn(conn);
        client
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.frozen.load(Ordering::Relaxed) {
            Node::run(&["thaw", &self.dir]);
        }
        Node::run(&["stop", &self.dir]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary and its synchronous standby, with the database `clamp` (created on the
/// primary, replicated).
struct Pair {
    primary: Node,
    standby: Node,
}

impl Pair {
    async fn start() -> Pair {
        let primary = Node::primary();
        let standby = Node::standby_of(&primary);
        let c = primary.client("postgres").await;
        wait_for(
            "the standby to replicate synchronously",
            Duration::from_secs(30),
            || async {
                let row = c
                    .query_opt(
                        "SELECT sync_state FROM pg_stat_replication \
                         WHERE application_name = 'clamp_standby'",
                        &[],
                    )
                    .await
                    .unwrap();
                (row?.get::<_, String>(0) == "sync").then_some(())
            },
        )
        .await;
        // A commit now waits for the standby: this one returns once it has the database too.
        c.batch_execute("CREATE DATABASE clamp").await.unwrap();
        Pair { primary, standby }
    }

    /// Both hosts; the driver takes the first that accepts writes.
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/clamp?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }
}

/// How one create was answered.
#[derive(Debug, Clone)]
enum Outcome {
    Acked(Uuid),
    /// 503; whether it said when to retry.
    Unavailable {
        retry_after: bool,
    },
    /// Any other status, with the body.
    Other(u16, String),
    /// No answer: the connection failed, or nothing came back in time.
    NoAnswer(String),
}

#[derive(Debug, Clone)]
struct Answer {
    sent: Instant,
    got: Instant,
    outcome: Outcome,
}

/// One POST on a fresh connection; an error says why there was no answer.
async fn try_post(addr: SocketAddr, path: &str, body: &str) -> Result<Resp, String> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let req = Request::post(path)
            .header("host", addr.to_string())
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(Resp {
            status,
            headers,
            body,
        })
    };
    // Far above the server's own bounds (a flush times out after 3 s): a hang is a failure.
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 20 s".into()))
}

async fn create(addr: SocketAddr, workflow: &str, body: &str) -> Answer {
    let sent = Instant::now();
    let outcome = match try_post(addr, &format!("/serviceRequest/{workflow}"), body).await {
        Ok(r) if r.status == 200 => {
            Outcome::Acked(Uuid::parse_str(r.json()["serviceRequestId"].as_str().unwrap()).unwrap())
        }
        Ok(r) if r.status == 503 => Outcome::Unavailable {
            retry_after: r.headers.contains_key(RETRY_AFTER),
        },
        Ok(r) => Outcome::Other(r.status.as_u16(), r.text()),
        Err(e) => Outcome::NoAnswer(e),
    };
    Answer {
        sent,
        got: Instant::now(),
        outcome,
    }
}

/// Clients creating requests continuously, each answer recorded.
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, workflow: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
        let tasks = (0..clients)
            .map(|c| {
                let (stop, answers, workflow) =
                    (stop.clone(), answers.clone(), workflow.to_string());
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let a = create(addr, &workflow, &format!("{{\"c\":{c},\"i\":{i}}}")).await;
                        let acked = matches!(a.outcome, Outcome::Acked(_));
                        answers.lock().push(a);
                        i += 1;
                        if !acked {
                            // Not a hot loop against an outage; short, to see the recovery soon.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            answers,
            tasks,
        }
    }

    /// The first answer (in arrival order) that `f` accepts.
    fn find(&self, f: impl Fn(&Answer) -> bool) -> Option<Answer> {
        let answers = self.answers.lock();
        answers
            .iter()
            .filter(|a| f(a))
            .min_by_key(|a| a.got)
            .cloned()
    }

    fn count(&self, f: impl Fn(&Answer) -> bool) -> usize {
        self.answers.lock().iter().filter(|a| f(a)).count()
    }

    async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a load client panicked");
        }
        Arc::try_unwrap(self.answers).unwrap().into_inner()
    }
}

fn acked(a: &Answer) -> Option<Uuid> {
    match a.outcome {
        Outcome::Acked(id) => Some(id),
        _ => None,
    }
}

fn is_503(a: &Answer) -> bool {
    matches!(a.outcome, Outcome::Unavailable { .. })
}

async fn create_workflow(addr: SocketAddr, def: &Value) {
    let r = try_post(addr, "/workflow", &def.to_string()).await.unwrap();
    assert_eq!(r.status, 200, "creating workflow: {}", r.text());
}

fn http_step(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// Waits until every one of `ids` is COMPLETED on `node` (all of them are stored there).
async fn wait_completed(node: &Node, ids: &[Uuid]) {
    let c = node.client("clamp").await;
    let stored: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored as usize,
        ids.len(),
        "acknowledged requests are missing on the promoted standby"
    );
    wait_for(
        "every acknowledged request to complete on the new primary",
        Duration::from_secs(60),
        || async {
            let done: i64 = c
                .query_one(
                    "SELECT count(*) FROM service_requests WHERE id = ANY($1) AND status = 'COMPLETED'",
                    &[&ids],
                )
                .await
                .unwrap()
                .get(0);
            (done as usize == ids.len()).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_loses_no_acknowledged_request_and_the_standby_takes_over() {
    let pair = Pair::start().await;
    let d = Downstream::start().await;
    let port = free_port();
    let _clamp = spawn_binary_with(&pair.url(), port, &[]);
    wait_healthy(port).await;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    create_workflow(
        addr,
        &json!({"name": "failover", "steps": [
            http_step("first", d.url("/api/step1")),
            http_step("second", d.url("/api/echo"))]}),
    )
    .await;

    let started = Instant::now();
    let load = Load::start(addr, "failover", 6);
    wait_for("load before the kill", Duration::from_secs(30), || async {
        (started.elapsed() >= Duration::from_millis(1500)
            && load.count(|a| acked(a).is_some()) >= 50
            && !d.received("/api/echo").is_empty())
        .then_some(())
    })
    .await;

    let killed = Instant::now();
    pair.primary.kill();
    // Every process of the primary is gone from here on (the kill began at `killed`).
    let dead = Instant::now();
    // The outage is seen (before the standby is promoted): creates are answered 503.
    wait_for(
        "a create answered 503 after the kill",
        Duration::from_secs(20),
        || async { load.find(|a| a.sent >= killed && is_503(a)).map(|_| ()) },
    )
    .await;
    let promoting = Instant::now();
    pair.standby.promote();
    let promoted = Instant::now();
    let back = wait_for(
        "a create acknowledged after the promotion",
        Duration::from_secs(30),
        || async { load.find(|a| a.got >= promoting && acked(a).is_some()) },
    )
    .await;
    // And the load goes on against the new primary.
    wait_for(
        "creates acknowledged after the promotion",
        Duration::from_secs(30),
        || async { (load.count(|a| a.sent >= back.got && acked(a).is_some()) >= 50).then_some(()) },
    )
    .await;
    let answers = load.stop().await;

    let come_back = back.got - promoting;
    let outage = back.got - killed;
    let during: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.got >= killed && a.sent <= back.got)
        .collect();
    let n_503 = during.iter().filter(|a| is_503(a)).count();
    let slowest_503 = during
        .iter()
        .filter(|a| is_503(a))
        .map(|a| a.got - a.sent)
        .max()
        .unwrap_or_default();
    let n_no_answer = during
        .iter()
        .filter(|a| matches!(a.outcome, Outcome::NoAnswer(_)))
        .count();
    let ids: Vec<Uuid> = answers.iter().filter_map(acked).collect();
    eprintln!(
        "failover: promotion took {:?}; first create acknowledged {:?} after the promotion \
         began ({:?} after the kill); {} acknowledged in all; during the outage {} answered 503 \
         (the slowest in {:?}), {} without an answer",
        promoted - promoting,
        come_back,
        outage,
        ids.len(),
        n_503,
        slowest_503,
        n_no_answer
    );

    // Only 200 and 503 (with Retry-After), or no answer at all while the database is gone.
    for a in &answers {
        match &a.outcome {
            Outcome::Acked(_) => {}
            Outcome::Unavailable { retry_after } => {
                assert!(retry_after, "a 503 without Retry-After")
            }
            Outcome::Other(status, body) => panic!("a create was answered {status}: {body}"),
            Outcome::NoAnswer(why) => assert!(
                a.got >= killed && a.sent <= back.got,
                "no answer outside the outage: {why}"
            ),
        }
    }
    // Nothing could be written between the kill and the promotion: the standby refused to
    // be the read-write host while it was one.
    assert!(
        answers
            .iter()
            .filter(|a| a.sent >= dead && a.got < promoting)
            .all(|a| acked(a).is_none()),
        "a create sent after the kill was acknowledged before the promotion"
    );
    assert!(
        come_back < COME_BACK_BOUND,
        "creates came back {come_back:?} after the promotion (bound {COME_BACK_BOUND:?})"
    );

    // Every acknowledged request is on the promoted standby, and completes there.
    wait_completed(&pair.standby, &ids).await;
    let mut repeated = 0;
    for id in &ids {
        for step in [1, 2] {
            let n = d.calls_for_key(&format!("{id}:{step}"));
            assert!(n >= 1, "step {step} of {id} was never called");
            if n > 1 {
                repeated += 1;
            }
        }
    }
    eprintln!(
        "failover: {} of {} steps were called more than once",
        repeated,
        ids.len() * 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_in_flight_at_the_failover_completes_on_the_new_primary() {
    let pair = Pair::start().await;
    let d = Downstream::start().await;
    let port = free_port();
    // The held step waits for the whole failover: it must not time out meanwhile.
    let _clamp = spawn_binary_with(&pair.url(), port, &["--step-timeout-ms", "60000"]);
    wait_healthy(port).await;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    create_workflow(
        addr,
        &json!({"name": "held", "steps": [
            http_step("held", d.url("/held")),
            http_step("after", d.url("/api/echo"))]}),
    )
    .await;

    let mut ids = Vec::new();
    for i in 0..4 {
        let a = create(addr, "held", &format!("{{\"i\":{i}}}")).await;
        ids.push(acked(&a).unwrap_or_else(|| panic!("create {i}: {:?}", a.outcome)));
    }
    // Every one of them is in its first step, held by the downstream.
    wait_for(
        "the held steps to be called",
        Duration::from_secs(20),
        || async {
            ids.iter()
                .all(|id| d.calls_for_key(&format!("{id}:1")) == 1)
                .then_some(())
        },
    )
    .await;

    let killed = Instant::now();
    pair.primary.kill();
    let probe = wait_for(
        "a create answered 503 after the kill",
        Duration::from_secs(20),
        || async {
            let a = create(addr, "held", "{}").await;
            assert!(acked(&a).is_none(), "acknowledged with no primary: {a:?}");
            is_503(&a).then_some(a)
        },
    )
    .await;
    if let Outcome::Unavailable { retry_after } = probe.outcome {
        assert!(retry_after, "a 503 without Retry-After");
    }
    // The failover outlasts the leases: the standby (readable while it is one) has them
    // expired, as the database will know them once promoted.
    let reader = pair.standby.client("clamp").await;
    wait_for(
        "the held requests' leases to expire",
        Duration::from_secs(20),
        || async {
            let expired: i64 = reader
                .query_one(
                    "SELECT count(*) FROM service_requests \
                     WHERE id = ANY($1) AND lease_until < now()",
                    &[&ids],
                )
                .await
                .unwrap()
                .get(0);
            (expired as usize == ids.len()).then_some(())
        },
    )
    .await;
    drop(reader);
    let promoting = Instant::now();
    pair.standby.promote();
    let back = wait_for(
        "a create acknowledged after the promotion",
        Duration::from_secs(30),
        || async {
            let a = create(addr, "held", "{}").await;
            match &a.outcome {
                Outcome::Acked(_) | Outcome::Unavailable { .. } | Outcome::NoAnswer(_) => {}
                Outcome::Other(status, body) => panic!("a create was answered {status}: {body}"),
            }
            acked(&a).map(|id| (id, a.got))
        },
    )
    .await;
    ids.push(back.0);
    let come_back = back.1 - promoting;
    assert!(
        come_back < COME_BACK_BOUND,
        "creates came back {come_back:?} after the promotion (bound {COME_BACK_BOUND:?})"
    );

    // The steps answer only now, after the failover: their results go to the new primary.
    d.release();
    let released = Instant::now();
    wait_completed(&pair.standby, &ids).await;
    let calls: Vec<usize> = ids[..4]
        .iter()
        .map(|id| d.calls_for_key(&format!("{id}:1")))
        .collect();
    eprintln!(
        "failover with steps in flight: first create acknowledged {:?} after the promotion \
         began; the held steps answered {:?} after the kill; calls of each held step: {:?}",
        come_back,
        released - killed,
        calls
    );
    for id in &ids {
        assert_eq!(
            d.calls_for_key(&format!("{id}:2")),
            1,
            "the step after the held one, of {id}"
        );
    }
    // At-least-once across the failover: a held step may have been called again, not more.
    assert!(calls.iter().all(|&n| (1..=2).contains(&n)), "{calls:?}");
}

/// The primary hangs instead of dying (SIGSTOP: connections are still accepted, nothing
/// is answered). The pool's connections to it give up after the guard (the statement
/// timeout and a second), the rest are dropped with them, and new connections try it for
/// one deadline (`--db-connect-timeout-ms`) and then take the next host: once the standby
/// is promoted, creates are acknowledged again, and every acknowledged request completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_is_passed_by_and_the_standby_takes_over() {
    let pair = Pair::start().await;
    let d = Downstream::start().await;
    let port = free_port();
    let _clamp = spawn_binary_with(&pair.url(), port, &[]);
    wait_healthy(port).await;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    create_workflow(
        addr,
        &json!({"name": "frozen", "steps": [
            http_step("first", d.url("/api/step1")),
            http_step("second", d.url("/api/echo"))]}),
    )
    .await;
    let started = Instant::now();
    let load = Load::start(addr, "frozen", 6);
    wait_for(
        "load before the freeze",
        Duration::from_secs(30),
        || async {
            (started.elapsed() >= Duration::from_millis(1500)
                && load.count(|a| acked(a).is_some()) >= 50
                && !d.received("/api/echo").is_empty())
            .then_some(())
        },
    )
    .await;

    let frozen = Instant::now();
    pair.primary.freeze();
    wait_for(
        "a create answered 503 after the freeze",
        Duration::from_secs(20),
        || async { load.find(|a| a.sent >= frozen && is_503(a)).map(|_| ()) },
    )
    .await;
    let promoting = Instant::now();
    pair.standby.promote();
    let back = wait_for(
        "a create acknowledged after the promotion",
        Duration::from_secs(30),
        || async { load.find(|a| a.got >= promoting && acked(a).is_some()) },
    )
    .await;
    wait_for(
        "creates acknowledged after the promotion",
        Duration::from_secs(30),
        || async { (load.count(|a| a.sent >= back.got && acked(a).is_some()) >= 50).then_some(()) },
    )
    .await;
    let answers = load.stop().await;
    let come_back = back.got - promoting;
    let slowest = answers
        .iter()
        .filter(|a| a.got >= frozen)
        .map(|a| a.got - a.sent)
        .max()
        .unwrap_or_default();
    let ids: Vec<Uuid> = answers.iter().filter_map(acked).collect();
    eprintln!(
        "frozen primary: first 503 {:?} after the freeze; first create acknowledged {:?} \
         after the promotion began ({:?} after the freeze); slowest answer {:?}; {} acknowledged",
        load_first_503(&answers, frozen),
        come_back,
        back.got - frozen,
        slowest,
        ids.len()
    );
    for a in &answers {
        match &a.outcome {
            Outcome::Acked(_) => {}
            Outcome::Unavailable { retry_after } => {
                assert!(retry_after, "a 503 without Retry-After")
            }
            Outcome::Other(status, body) => panic!("a create was answered {status}: {body}"),
            Outcome::NoAnswer(why) => panic!("a create got no answer: {why}"),
        }
    }
    assert!(
        come_back < COME_BACK_BOUND,
        "creates came back {come_back:?} after the promotion (bound {COME_BACK_BOUND:?})"
    );
    // Acknowledged on the frozen primary means replicated (synchronous standby): every one
    // is on the new primary, and completes there.
    wait_completed(&pair.standby, &ids).await;
}

fn load_first_503(answers: &[Answer], after: Instant) -> Option<Duration> {
    answers
        .iter()
        .filter(|a| a.sent >= after && is_503(a))
        .map(|a| a.got - after)
        .min()
}

/// Timers and event waits outlive the database host: requests asleep at a WAIT step and
/// paused at an EVENT step when the primary is killed are all on the promoted standby
/// (their sleeps and pauses were acknowledged there); each WAIT fires once, no earlier
/// than its time, events delivered after the promotion resume each waiting request
/// once, and every step after them is called exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_and_event_waits_outlive_a_failover() {
    let pair = Pair::start().await;
    let d = Downstream::start().await;
    let port = free_port();
    let _clamp = spawn_binary(&pair.url(), port);
    wait_healthy(port).await;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    create_workflow(
        addr,
        &json!({"name": "nap", "steps": [
            {"name": "sleep", "mode": "WAIT", "val": {"duration": "PT6S"}},
            http_step("woke", d.url("/api/echo"))]}),
    )
    .await;
    create_workflow(
        addr,
        &json!({"name": "approval", "steps": [
            {"name": "wait", "mode": "EVENT", "val": {"event": "ok", "key": "wait.request.k"}},
            http_step("approved", d.url("/api/echo"))]}),
    )
    .await;
    let (mut naps, mut waits) = (Vec::new(), Vec::new());
    let created = Instant::now();
    for i in 0..10 {
        let a = create(addr, "nap", &format!("{{\"i\":{i}}}")).await;
        naps.push(acked(&a).unwrap_or_else(|| panic!("nap {i}: {:?}", a.outcome)));
        let a = create(addr, "approval", &format!("{{\"k\":\"k{i}\"}}")).await;
        waits.push(acked(&a).unwrap_or_else(|| panic!("approval {i}: {:?}", a.outcome)));
    }
    // Every nap asleep and every approval paused, as the standby knows them.
    let reader = pair.standby.client("clamp").await;
    wait_for(
        "the waits to be written on the standby",
        Duration::from_secs(20),
        || async {
            let n: i64 = reader
                .query_one(
                    "SELECT count(*) FROM steps_status WHERE service_request_id = ANY($1) \
                     AND step_id = 1 AND status = 'STARTED'",
                    &[&[naps.clone(), waits.clone()].concat()],
                )
                .await
                .unwrap()
                .get(0);
            (n == 20).then_some(())
        },
    )
    .await;
    drop(reader);
    pair.primary.kill();
    pair.standby.promote();
    let back = wait_for(
        "a create acknowledged after the promotion",
        Duration::from_secs(30),
        || async { acked(&create(addr, "nap", "{\"i\":99}").await) },
    )
    .await;
    naps.push(back);
    for i in 0..10 {
        // Its id makes a delivery retried after a lost answer count once.
        let body = format!("{{\"key\":\"k{i}\",\"id\":\"e{i}\",\"payload\":{{\"approved\":{i}}}}}");
        let r = wait_for("an event delivered", Duration::from_secs(20), || async {
            try_post(addr, "/events/ok", &body)
                .await
                .ok()
                .filter(|r| r.status == 200)
        })
        .await;
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        assert!(
            v["matched"] == 1 || v["duplicate"] == true,
            "event k{i}: {v}"
        );
    }
    let all = [naps.clone(), waits.clone()].concat();
    wait_completed(&pair.standby, &all).await;
    assert!(created.elapsed() >= Duration::from_secs(6));
    for id in &all {
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "step 2 of {id}");
    }
    // No WAIT ended before its time (its COMPLETED record against its STARTED one).
    let c = pair.standby.client("clamp").await;
    let early: i64 = c
        .query_one(
            "SELECT count(*) FROM steps_status s JOIN steps_status e \
               ON e.service_request_id = s.service_request_id AND e.step_id = 1 \
              AND e.status = 'COMPLETED' \
             WHERE s.service_request_id = ANY($1) AND s.step_id = 1 AND s.status = 'STARTED' \
               AND e.finished_at < s.started_at + interval '6 seconds'",
            &[&naps],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(early, 0, "a WAIT ended before its time");
}
