//! Runtimes and listeners: one current-thread tokio runtime per thread, each with its own
//! SO_REUSEPORT listener, Postgres pool and write buffer (the kernel spreads connections
//! over the listeners), or, for comparison, the same cores on one work-stealing runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;

use crate::http::conn::{ConnIo, ConnState, Timeouts};
use crate::state::App;
use crate::state::Core;
use crate::store::buffer::{self, FlusherConfig};
use crate::store::pool;

/// Pending connections the kernel queues per listener.
const LISTEN_BACKLOG: i32 = 4096;

/// Status-read batches in flight per runtime (each on its own connection).
const READ_CONCURRENCY: usize = 2;

/// How long background tasks (broker consumers, retention) get to stop at shutdown.
const CONSUMER_STOP_TIMEOUT: Duration = Duration::from_secs(6);

/// How long the accept loop pauses when the process is out of file descriptors.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Binds a listener with SO_REUSEPORT so every runtime can own one on the same port.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Binds `n` listeners on one port (resolving port 0 once, for tests). A port another
/// server already listens on is refused (EADDRINUSE), not shared: SO_REUSEPORT would let
/// any process of the same user bind it too, and the kernel would split the port's
/// connections between two servers (a second instance started on it by mistake, with
/// other tokens or another database). A socket without SO_REUSEPORT cannot bind beside a
/// listener, so one such bind, dropped at once, tells.
pub fn bind_all(
    addr: SocketAddr,
    n: usize,
) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    if addr.port() != 0 {
        let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        // A previous run's connections in TIME_WAIT do not count.
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into())?;
    }
    let first = bind(addr)?;
    let local = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n {
        all.push(bind(local)?);
    }
    Ok((local, all))
}

/// True for accept errors that mean "out of resources", which pass if we wait.
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// Serves one core until `shutdown` turns true, then drains it: stop accepting, finish
/// in-flight requests (bounded by the shutdown timeout), then flush the write buffer.
/// With `tls`, every connection is HTTPS.
pub async fn serve_core(
    index: usize,
    app: Arc<App>,
    listener: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let cfg = &app.config;
    let mut turn = app.writes.turn();
    let pool = pool::build(app.db.clone(), cfg, cfg.pool_size);
    let looks = pool::build_looks(app.db.clone(), cfg);
    let executor = crate::engine::Executor::new(app.engine.clone(), pool.clone(), looks);
    app.engine.spread.register(executor.clone());
    let (stop_engine, engine_stop) = watch::channel(false);
    let sweeper = tokio::spawn(executor.clone().sweep(engine_stop.clone()));
    let renewer = tokio::spawn(executor.clone().renew(engine_stop));
    // The process's one buffer: the first runtime here makes it and runs its flusher.
    let buffer = app.writes.buffer(|close| start_flusher(&app, &pool, close));
    let reader = crate::store::reader::StatusReader::start(
        pool.clone(),
        READ_CONCURRENCY,
        cfg.flush_timeout + Duration::from_secs(2),
    );
    let core = Arc::new(Core {
        app: app.clone(),
        pool,
        buffer,
        reader,
        executor: executor.clone(),
    });
    let (stop_background, background_stop) = watch::channel(false);
    let background = start_background(index, &core, background_stop);
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register listener");
            return;
        }
    };
    let graceful = GracefulShutdown::new();
    accept_loop(&listener, &core, tls.as_ref(), &mut shutdown, &graceful).await;
    drop(listener);
    if tokio::time::timeout(cfg.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown timeout: closing connections with requests still in flight");
    }
    stop_background_tasks(stop_background, background).await;
    drop(core);
    // The buffer closes when every runtime is here; its last rows go to running executors.
    turn.served().await;
    // Running steps may finish within the shutdown timeout; the rest are released.
    let _ = stop_engine.send(true);
    let _ = sweeper.await;
    executor.shutdown(cfg.shutdown_timeout).await;
    let _ = renewer.await;
    // The flusher and the step writer run on one runtime's tasks: none ends before
    // every executor has stopped writing.
    turn.executed().await;
}

/// Makes the process's create buffer (`--buffer-rows` for each runtime) and starts its
/// flusher on this runtime, with this runtime's pool, handing rows to every runtime's
/// executor (`engine::spread`).
fn start_flusher(
    app: &Arc<App>,
    pool: &pool::Pool,
    close: oneshot::Receiver<()>,
) -> buffer::WriteBuffer {
    let cfg = &app.config;
    let (buffer, rx) = buffer::channel(cfg.buffer_rows.saturating_mul(cfg.threads));
    {
        let buffer = buffer.clone();
        app.metrics.watch_buffer(move || buffer.depth());
    }
    let flusher = buffer::run_flusher(
        buffer.clone(),
        rx,
        pool.clone(),
        FlusherConfig {
            ack: cfg.ack,
            max_batch: cfg.max_batch,
            concurrency: cfg.flush_concurrency,
            hard_timeout: cfg.flush_timeout + Duration::from_secs(2),
            budget: crate::store::budget::Budget {
                flush_timeout: cfg.flush_timeout,
            },
            key_window: cfg.idempotency_window,
        },
        app.metrics.clone(),
        Some(app.engine.spread.clone() as Arc<dyn buffer::Handoff>),
        close,
    );
    let app = app.clone();
    tokio::spawn(async move {
        flusher.await;
        app.writes.flushed();
    });
    buffer
}

/// The tasks beside the request path: the broker consumers of step responses (AMQP on
/// every runtime, since the broker spreads deliveries), and on the first runtime the
/// tasks an instance runs once (`instance_tasks`).
fn start_background(
    index: usize,
    core: &Arc<Core>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut background = Vec::new();
    if core.app.config.brokers.amqp_enabled {
        background.push(tokio::spawn(crate::broker::amqp::consume(
            core.clone(),
            stop.clone(),
        )));
    }
    if index == 0 {
        background.extend(instance_tasks(core, stop));
    }
    background
}

/// One task each per instance; instances share their work safely: the Kafka consumer of
/// step responses (an instance reads its partitions with one consumer), the triggers'
/// broker sources, the partitions' keeper (one at work at a time across instances), the
/// housekeeping of what clamp keeps besides requests, the cleanup of expired idempotency
/// keys, the limited creates' writer and admitter, and the schedules' runner.
fn instance_tasks(
    core: &Arc<Core>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let cfg = &core.app.config;
    let mut tasks = vec![
        tokio::spawn(crate::broker::triggers::run(core.clone(), stop.clone())),
        tokio::spawn(crate::store::keeper::run(
            core.app.db.clone(),
            crate::store::keeper::Keeping::from_config(cfg),
            core.app.metrics.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::store::housekeeping::run(
            core.pool.clone(),
            crate::store::housekeeping::Ages {
                kept: cfg.housekeeping,
                session_idle: cfg.session_idle,
                session_max: cfg.session_max,
            },
            cfg.retention_interval,
            core.app.metrics.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::store::idempotency::run_cleanup(
            core.pool.clone(),
            cfg.idempotency_window,
            cfg.retention_interval,
            stop.clone(),
        )),
        tokio::spawn({
            let (core, stop) = (core.clone(), stop.clone());
            async move {
                let (owner, lease) = (core.app.instance_id, core.app.config.lease);
                core.app
                    .limited
                    .run(core.pool.clone(), owner, lease, stop)
                    .await
            }
        }),
        tokio::spawn(crate::engine::timers::slots::run(
            core.executor.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::engine::timers::schedules::run(
            core.executor.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::engine::notify::run(
            core.executor.clone(),
            stop.clone(),
        )),
        tokio::spawn(crate::store::pauses::run(
            core.pool.clone(),
            core.app.pauses.clone(),
            stop.clone(),
        )),
    ];
    if cfg.brokers.kafka_enabled {
        tasks.push(tokio::spawn(crate::broker::kafka::consume(
            core.clone(),
            stop,
        )));
    }
    tasks
}

/// Accepts connections and serves each on its own task until `shutdown` fires. Over
/// TLS, the handshake runs on the connection's task, bounded by the header timeout (it
/// is the first thing the client sends), below `ConnIo`'s timeouts and lingering close.
async fn accept_loop(
    listener: &TcpListener,
    core: &Arc<Core>,
    tls: Option<&TlsAcceptor>,
    shutdown: &mut watch::Receiver<bool>,
    graceful: &GracefulShutdown,
) {
    let cfg = &core.app.config;
    let mut builder = http1::Builder::new();
    // The header-read and idle timeouts are `ConnIo`'s, apart from each other; hyper's
    // own header timer would also close idle keep-alive connections.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true);
    let timeouts = Timeouts {
        header: cfg.header_timeout,
        idle: cfg.keep_alive_timeout,
        body_limit: cfg.body_limit,
    };
    // hyper keeps up to 100 headers on the stack; setting any limit moves them to the heap.
    if cfg.max_headers != 100 {
        builder.max_headers(cfg.max_headers);
    }
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let core = core.clone();
                    let local = stream.local_addr().ok().map(|a| a.ip());
                    let state = Arc::new(ConnState::at(local, Some(peer.ip())));
                    let io = ConnIo::new(stream, state.clone(), timeouts);
                    let service = service_fn(move |req| {
                        let (core, state) = (core.clone(), state.clone());
                        async move { Ok::<_, std::convert::Infallible>(crate::http::handle(core, state, req).await) }
                    });
                    match tls {
                        None => {
                            let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
                            tokio::spawn(async move {
                                let _ = conn.await;
                            });
                        }
                        Some(acceptor) => {
                            let (accept, watcher) = (acceptor.accept(io), graceful.watcher());
                            let (builder, handshake) = (builder.clone(), timeouts.header);
                            tokio::spawn(async move {
                                // A client that does not finish its handshake in time, or fails
                                // it, is closed; there is no HTTP to answer it with.
                                let Ok(Ok(stream)) = tokio::time::timeout(handshake, accept).await else {
                                    return;
                                };
                                let _ = watcher
                                    .watch(builder.serve_connection(TokioIo::new(stream), service))
                                    .await;
                            });
                        }
                    }
                }
                Err(e) if is_resource_exhaustion(&e) => {
                    tracing::warn!(error = %e, "accept failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
                // A connection that died before it was accepted, and the like: keep going.
                Err(_) => {}
            }
        }
    }
}

/// Stops the broker consumers and the retention task. A consumer stuck connecting to a
/// broker that does not answer must not hold up shutdown: what it had not acknowledged
/// is redelivered anyway.
async fn stop_background_tasks(
    stop: watch::Sender<bool>,
    background: Vec<tokio::task::JoinHandle<()>>,
) {
    let _ = stop.send(true);
    for c in background {
        let abort = c.abort_handle();
        if tokio::time::timeout(CONSUMER_STOP_TIMEOUT, c)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// Starts the runtimes; returns one receiver per thread that fires when it has finished.
pub fn spawn(
    app: Arc<App>,
    listeners: Vec<std::net::TcpListener>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<Vec<oneshot::Receiver<()>>> {
    let tls = tls.map(TlsAcceptor::from);
    let mut done = Vec::new();
    match app.config.runtime {
        crate::config::RuntimeMode::PerCore => {
            for (i, listener) in listeners.into_iter().enumerate() {
                let (tx, rx) = oneshot::channel();
                let app = app.clone();
                let shutdown = shutdown.clone();
                let tls = tls.clone();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                std::thread::Builder::new()
                    .name(format!("clamp-core-{i}"))
                    .spawn(move || {
                        rt.block_on(serve_core(i, app, listener, tls, shutdown));
                        let _ = tx.send(());
                    })?;
                done.push(rx);
            }
        }
        crate::config::RuntimeMode::MultiThread => {
            let (tx, rx) = oneshot::channel();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(app.config.threads)
                .thread_name("clamp-worker")
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name("clamp-main".into())
                .spawn(move || {
                    rt.block_on(async move {
                        let tasks: Vec<_> = listeners
                            .into_iter()
                            .enumerate()
                            .map(|(i, l)| {
                                tokio::spawn(serve_core(
                                    i,
                                    app.clone(),
                                    l,
                                    tls.clone(),
                                    shutdown.clone(),
                                ))
                            })
                            .collect();
                        for t in tasks {
                            let _ = t.await;
                        }
                    });
                    let _ = tx.send(());
                })?;
            done.push(rx);
        }
    }
    Ok(done)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns (old soft, new soft).
pub fn raise_nofile_limit() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let old = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((old, lim.rlim_cur))
}
