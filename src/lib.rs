//! clamp: a workflow orchestrator that speaks Clamp's REST API, built for throughput and
//! for never losing an acknowledged request.
//!
//! [`start`] is the whole server: it prepares the database, loads workflows and starts
//! the runtimes; the binary only parses configuration and waits for a signal, and tests
//! start it in-process on port 0.

pub(crate) mod backoff;
pub(crate) mod batches;
pub(crate) mod broker;
pub mod config;
pub mod destinations;
pub(crate) mod engine;
pub(crate) mod error_chain;
pub(crate) mod http;
pub(crate) mod ids;
pub(crate) mod labels;
pub(crate) mod metrics;
pub(crate) mod ops;
pub(crate) mod outbound;
pub(crate) mod reads;
pub(crate) mod routes;
pub mod runtime;
pub mod secrets;
pub(crate) mod state;
pub(crate) mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod tokens;
pub(crate) mod workflow;
pub mod workflow_files;
pub(crate) mod writes;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use config::Config;
use metrics::Metrics;
use state::App;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "cannot reach Postgres at {url}: {reason}. Start one with `scripts/dev-postgres.sh` \
         (it prints a DATABASE_URL to use), or `docker compose -f docker/compose.yml up -d postgres`"
    )]
    Database { url: String, reason: String },
    #[error("cannot connect to Postgres at {url}: {reason}")]
    Refused { url: String, reason: String },
    #[error("cannot prepare the database at {url}: {reason}")]
    Migrate { url: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start tracing: {0}")]
    Tracing(String),
    #[error("TLS: {0}")]
    Tls(#[source] tls::TlsError),
    #[error("cannot start runtimes: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A running server.
pub struct Server {
    local_addr: SocketAddr,
    app: Arc<App>,
    shutdown: watch::Sender<bool>,
    done: Vec<oneshot::Receiver<()>>,
}

impl Server {
    /// The address the listeners are bound to (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Shared state, for tests and diagnostics.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Graceful shutdown: stop accepting, answer in-flight requests, flush the buffers.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for d in self.done {
            let _ = d.await;
        }
        if let Some(t) = &self.app.tracing {
            t.shutdown(self.app.config.shutdown_timeout).await;
        }
    }
}

/// Reads the tokens file again on every SIGHUP; a file that does not parse leaves the
/// tokens in force, and says why.
fn reload_tokens_on_hangup(tokens: Arc<tokens::ApiTokens>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!("no SIGHUP handler: the tokens file is read at start only");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match tokens.reload() {
                Ok(n) => tracing::info!(tokens = n, "tokens file read again"),
                Err(e) => {
                    tracing::error!(error = %e, "tokens file not read again; the tokens in force stay")
                }
            }
        }
    });
}

/// Prepares the database (creating it and applying migrations), loads the workflows and
/// starts serving. Returns once every listener is bound.
pub async fn start(config: Config) -> Result<Server, StartError> {
    tls::install_default_provider();
    let url = config.database.redacted();
    let db = Arc::new(store::connect::PgConnector::for_config(&config).map_err(StartError::Tls)?);
    let outbound = outbound::tls::Outbound::load(&config).map_err(StartError::Tls)?;
    let listener_tls = listener_tls(&config)?;
    let metrics = Arc::new(Metrics::new());
    let client = prepare_database(&db, &config, &metrics, &url).await?;
    let tracing = match &config.trace {
        Some(t) => Some(
            telemetry::Tracing::start(t, metrics.trace_spans.clone())
                .map_err(StartError::Tracing)?,
        ),
        None => None,
    };
    let app = Arc::new(App::new(engine::Shared::new(
        config,
        db,
        outbound,
        metrics,
        tracing,
        http::answers::status,
    )));
    load_workflows(&app, &client, &url).await?;
    drop(client);
    let n = app.config.threads;
    let (local_addr, listeners) =
        runtime::bind_all(app.config.listen, n).map_err(|source| StartError::Bind {
            addr: app.config.listen,
            source,
        })?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let https = listener_tls.is_some();
    let done = runtime::spawn(app.clone(), listeners, listener_tls, shutdown_rx)
        .map_err(StartError::Runtime)?;
    tracing::info!(
        addr = %local_addr,
        scheme = if https { "https" } else { "http" },
        threads = n,
        runtime = ?app.config.runtime,
        ack = ?app.config.ack,
        workflows = app.workflows.len(),
        database = %url,
        "listening"
    );
    if !app.config.api_tokens.is_on() {
        tracing::warn!(
            addr = %local_addr,
            "no API tokens are set: anyone who can reach this address may do anything; \
             set CLAMP_API_TOKENS or CLAMP_TOKENS_FILE (other hosts are refused unless \
             CLAMP_ALLOW_UNAUTHENTICATED=true)"
        );
    }
    if app.config.api_tokens.file().is_some() {
        reload_tokens_on_hangup(app.config.api_tokens.clone());
    }
    Ok(Server {
        local_addr,
        app,
        shutdown,
        done,
    })
}

/// HTTPS when given a certificate: HTTP/1.1 only, like the plain listener.
fn listener_tls(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>, StartError> {
    let Some((cert, key)) = &config.tls.server else {
        return Ok(None);
    };
    let server = tls::Identity::load(cert, key)
        .and_then(|id| tls::server(id, &[b"http/1.1"]))
        .map_err(StartError::Tls)?;
    Ok(Some(Arc::new(server)))
}

/// Connects (creating the database if it is missing), applies the migrations, and makes
/// the partition sets a first create needs, before anything is served; returns the
/// connection, for the workflows' load.
async fn prepare_database(
    db: &store::connect::PgConnector,
    config: &Config,
    metrics: &Arc<Metrics>,
    url: &str,
) -> Result<tokio_postgres::Client, StartError> {
    let migrate = |reason: String| StartError::Migrate {
        url: url.to_string(),
        reason,
    };
    let mut client = store::migrate::connect_or_create(db)
        .await
        .map_err(|e| match e {
            store::migrate::MigrateError::Connect(source) if source.unreachable() => {
                StartError::Database {
                    url: url.to_string(),
                    reason: source.to_string(),
                }
            }
            store::migrate::MigrateError::Connect(source) => StartError::Refused {
                url: url.to_string(),
                reason: source.to_string(),
            },
            other => migrate(error_chain::one_line(&other)),
        })?;
    let n_applied = store::migrate::run(&mut client)
        .await
        .map_err(|e| migrate(error_chain::one_line(&e)))?;
    if n_applied > 0 {
        tracing::info!(n_applied, "applied migrations");
    }
    let keep_client = store::migrate::connect_or_create(db)
        .await
        .map_err(|e| migrate(error_chain::one_line(&e)))?;
    store::keeper::prepare(
        db,
        keep_client,
        store::keeper::Keeping::from_config(config),
        metrics.clone(),
    )
    .await
    .map_err(|e| migrate(format!("partitions: {}", error_chain::one_line(&e))))?;
    Ok(client)
}

/// Every stored workflow version into the in-memory map; one that no longer validates is
/// skipped and logged.
async fn load_workflows(
    app: &App,
    client: &tokio_postgres::Client,
    url: &str,
) -> Result<(), StartError> {
    let defs = store::queries::all_workflows(client)
        .await
        .map_err(|e| StartError::Migrate {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    for def in defs {
        let name = def.name.clone();
        match workflow::compile(def) {
            Ok(wf) => app.workflows.insert(Arc::new(wf)),
            Err(e) => {
                tracing::error!(workflow = %name, error = %e, "stored workflow does not validate; skipped")
            }
        }
    }
    Ok(())
}
