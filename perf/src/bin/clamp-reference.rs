//! The speed of light for the create path: the least a durable `POST /serviceRequest`
//! can do, built the obvious way, to measure the product against on the same machine in
//! the same run (`scripts/bench-reference.sh`).
//!
//! Per-core hyper (one current-thread runtime and one SO_REUSEPORT listener per thread),
//! one table with only a primary key, the body stored as text (as the product stores it)
//! with a UUIDv7 id (the product's id scheme), rows batched per thread into one `INSERT … SELECT * FROM UNNEST`
//! that commits on its own (up to `--flushers` batches in flight, each on its own
//! connection), 200 after the commit. No metrics, no logging, no workflow lookup, no
//! validation beyond what Postgres does, no headers kept, no back-pressure beyond a
//! bounded channel. It is not a product: a failed batch answers 503 and nothing retries.
//!
//!   clamp-reference --port 18500 --database-url postgres://postgres@127.0.0.1:5432/ref

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::{Client, NoTls, Statement};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "The bare reference server for the create path")]
struct Args {
    #[arg(long, default_value_t = 18500)]
    port: u16,
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/clamp_reference"
    )]
    database_url: String,
    /// Threads, each with its own runtime, listener and batcher (default: the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Batches each thread may have in flight at once.
    #[arg(long, default_value_t = 2)]
    flushers: usize,
    /// Most rows in one INSERT.
    #[arg(long, default_value_t = 1024)]
    max_batch: usize,
    /// SQL run once after the table is created (e.g. columns with defaults and indexes
    /// like the product's), to measure what each costs Postgres on this insert.
    #[arg(long, default_value = "")]
    ddl: String,
    /// Store each batch as one row (`id, ids[], payloads[]`) instead of a row per request:
    /// what Postgres's work per commit is when it writes one tuple per flush.
    #[arg(long)]
    batch_rows: bool,
}

const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS reference_requests (id uuid PRIMARY KEY, payload text NOT NULL)";
const INSERT: &str = "INSERT INTO reference_requests (id, payload) \
    SELECT * FROM UNNEST($1::uuid[], $2::text[]) AS t(id, p)";
const BATCH_TABLE: &str = "CREATE TABLE IF NOT EXISTS reference_batches \
    (id uuid PRIMARY KEY, ids uuid[] NOT NULL, payloads text[] NOT NULL)";
const INSERT_BATCH: &str = "INSERT INTO reference_batches (id, ids, payloads) VALUES ($1, $2, $3)";

type Row = (uuid::Uuid, String, oneshot::Sender<bool>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    setup.block_on(async {
        let db = create_database(&args.database_url).await?;
        db.batch_execute(if args.batch_rows { BATCH_TABLE } else { TABLE })
            .await?;
        db.batch_execute(&args.ddl).await
    })?;
    let addr: SocketAddr = ([127, 0, 0, 1], args.port).into();
    let args = Arc::new(args);
    let mut handles = Vec::new();
    for _ in 0..threads {
        let listener = bind(addr)?;
        let args = args.clone();
        handles.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(listener, args));
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Creates the database named in `url` if it is missing; returns a client on it.
async fn create_database(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (base, name) = url
        .rsplit_once('/')
        .expect("a database url ends in /<name>");
    let (admin, conn) = tokio_postgres::connect(&format!("{base}/postgres"), NoTls).await?;
    tokio::spawn(conn);
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await?;
    }
    connect(url).await
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nodelay(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

async fn serve(listener: std::net::TcpListener, args: Arc<Args>) {
    let (tx, rx) = mpsc::channel::<Row>(8192);
    let mut clients = Vec::new();
    for _ in 0..args.flushers {
        let c = connect(&args.database_url).await.expect("connect");
        let sql = if args.batch_rows {
            INSERT_BATCH
        } else {
            INSERT
        };
        let stmt = c.prepare(sql).await.expect("prepare");
        clients.push((Arc::new(c), stmt));
    }
    tokio::spawn(batcher(rx, clients, args.max_batch, args.batch_rows));
    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, tx.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    tx: mpsc::Sender<Row>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let answer = |status: StatusCode, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        Ok(r)
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => {
            answer(StatusCode::OK, Bytes::from_static(b"{\"status\":\"UP\"}"))
        }
        (&Method::POST, p) if p.starts_with("/serviceRequest/") => {
            let Ok(body) = req.into_body().collect().await else {
                return answer(StatusCode::BAD_REQUEST, Bytes::new());
            };
            let Ok(payload) = String::from_utf8(body.to_bytes().to_vec()) else {
                return answer(StatusCode::BAD_REQUEST, Bytes::new());
            };
            let id = uuid::Uuid::now_v7();
            let (ack, done) = oneshot::channel();
            if tx.send((id, payload, ack)).await.is_err() {
                return answer(StatusCode::SERVICE_UNAVAILABLE, Bytes::new());
            }
            match done.await {
                Ok(true) => answer(
                    StatusCode::OK,
                    Bytes::from(format!("{{\"serviceRequestId\":\"{id}\"}}")),
                ),
                _ => answer(StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
            }
        }
        _ => answer(StatusCode::NOT_FOUND, Bytes::new()),
    }
}

/// Takes whatever is queued (up to `max_batch`) whenever a connection is free, and
/// inserts it; answers each row after the statement (and so its commit) returned.
async fn batcher(
    mut rx: mpsc::Receiver<Row>,
    clients: Vec<(Arc<Client>, Statement)>,
    max_batch: usize,
    batch_rows: bool,
) {
    let free = Arc::new(Semaphore::new(clients.len()));
    let (back, mut returned) = mpsc::channel(clients.len());
    for c in clients {
        let _ = back.send(c).await;
    }
    loop {
        let permit = free.clone().acquire_owned().await.expect("semaphore");
        let mut rows = Vec::with_capacity(max_batch);
        if rx.recv_many(&mut rows, max_batch).await == 0 {
            return;
        }
        let (client, stmt) = returned.recv().await.expect("a free connection");
        let back = back.clone();
        tokio::spawn(async move {
            let mut ids = Vec::with_capacity(rows.len());
            let mut payloads = Vec::with_capacity(rows.len());
            let mut acks = Vec::with_capacity(rows.len());
            for (id, p, ack) in rows {
                ids.push(id);
                payloads.push(p);
                acks.push(ack);
            }
            let ok = if batch_rows {
                let batch = uuid::Uuid::now_v7();
                client.execute(&stmt, &[&batch, &ids, &payloads]).await
            } else {
                client.execute(&stmt, &[&ids, &payloads]).await
            }
            .is_ok();
            for a in acks {
                let _ = a.send(ok);
            }
            let _ = back.send((client, stmt)).await;
            drop(permit);
        });
    }
}
