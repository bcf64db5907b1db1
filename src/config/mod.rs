//! Configuration: one `Config` struct parsed once from flags and environment.
//!
//! Raw input (`Args`, what clap parsed) is kept apart from the derived, validated
//! `Config` that the rest of the server reads. [`env`] names the environment keys that
//! code elsewhere reads too; the others stand beside their flag. A unit test checks that
//! the guide's table (`docs/configuration.md`) lists every flag and key, so the two cannot
//! drift apart silently.

pub mod postgres;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use postgres::{clamp_conn_str_to_url, redact_url, Database, PgTls, RootCert, SslMode};

/// Environment variable names, in one place.
pub mod env {
    pub const APP_PORT: &str = "APP_PORT";
    pub const DATABASE_URL: &str = "DATABASE_URL";
    pub const CLAMP_DB_CONNECTION_STR: &str = "CLAMP_DB_CONNECTION_STR";
    pub const LOG_LEVEL: &str = "LOG_LEVEL";
    pub const CLAMP_THREADS: &str = "CLAMP_THREADS";
    pub const CLAMP_ACK: &str = "CLAMP_ACK";
    pub const CLAMP_RUNTIME: &str = "CLAMP_RUNTIME";
    pub const ENABLE_AMQP_INTEGRATION: &str = "ENABLE_AMQP_INTEGRATION";
    pub const CLAMP_QUEUE_CONNECTION_STR: &str = "CLAMP_QUEUE_CONNECTION_STR";
    pub const CLAMP_QUEUE_NAME: &str = "CLAMP_QUEUE_NAME";
    pub const ENABLE_KAFKA_INTEGRATION: &str = "ENABLE_KAFKA_INTEGRATION";
    pub const CLAMP_KAFKA_CONNECTION_STR: &str = "CLAMP_KAFKA_CONNECTION_STR";
    pub const CLAMP_KAFKA_TOPIC_NAME: &str = "CLAMP_KAFKA_TOPIC_NAME";
}

/// When a `POST /serviceRequest` is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AckMode {
    /// After the batch holding the row has committed: nothing acknowledged is lost.
    Commit,
    /// As soon as the row is in the write buffer: faster, but a crash loses the buffer.
    Accept,
}

/// How the HTTP front end is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeMode {
    /// One current-thread runtime per thread, each with its own listener, pool and buffer.
    PerCore,
    /// The same per-thread listeners, pools and buffers, scheduled by one work-stealing runtime.
    MultiThread,
}

/// Command-line flags and their environment fallbacks, as parsed.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "clamp",
    version,
    about = "A fast, durable workflow orchestrator speaking Clamp's REST API"
)]
pub struct Args {
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = env::APP_PORT, default_value_t = 8080)]
    pub port: u16,

    /// Address to bind. Default: every interface when API tokens are set (or
    /// --allow-unauthenticated), else 127.0.0.1 only. An address other hosts can reach,
    /// with no tokens, needs --allow-unauthenticated.
    #[arg(long, env = "CLAMP_BIND")]
    pub bind: Option<IpAddr>,

    /// Serve other hosts with no API tokens: anyone who reaches the port may do anything.
    #[arg(long, env = "CLAMP_ALLOW_UNAUTHENTICATED", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_unauthenticated: bool,

    /// With no API tokens, host names besides loopback names and the server's own
    /// addresses that requests may give in `Host` and pages may send them from (`Origin`):
    /// a compose service name, an ingress. `.corp.example` names every name under it.
    #[arg(long, env = "CLAMP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// Postgres URL. Wins over CLAMP_DB_CONNECTION_STR when both are set.
    #[arg(long, env = env::DATABASE_URL)]
    pub database_url: Option<String>,

    /// Clamp's connection string format: `host=h:p user=u dbname=d password=p`.
    #[arg(long, env = env::CLAMP_DB_CONNECTION_STR, hide = true)]
    pub clamp_db_connection_str: Option<String>,

    /// Worker threads (each runs its own runtime, listener, pool and executor; the write
    /// buffer and the step writer are the process's). 0 = number of cores.
    #[arg(long, env = env::CLAMP_THREADS, default_value_t = 0)]
    pub threads: usize,

    /// Runtime layout.
    #[arg(long, env = env::CLAMP_RUNTIME, value_enum, default_value_t = RuntimeMode::PerCore)]
    pub runtime: RuntimeMode,

    /// When service-request creation is acknowledged.
    #[arg(long, env = env::CLAMP_ACK, value_enum, default_value_t = AckMode::Commit)]
    pub ack: AckMode,

    /// Rows the write buffer holds per thread before new requests wait (the process has
    /// one buffer, shared by its threads, of this times `--threads`).
    #[arg(long, env = "CLAMP_BUFFER_ROWS", default_value_t = 8192)]
    pub buffer_rows: usize,

    /// Most rows written by one INSERT.
    #[arg(long, env = "CLAMP_MAX_BATCH", default_value_t = 1024)]
    pub max_batch: usize,

    /// Most create batches in flight at once (each on its own connection; one flusher for
    /// the process): one, and more only beside one that is slow (`batches::flights`).
    #[arg(long, env = "CLAMP_FLUSH_CONCURRENCY", default_value_t = 2)]
    pub flush_concurrency: usize,

    /// Ignored (a request is always stored as one row); accepted for one release so that
    /// deployments that set it still start, with a warning.
    #[arg(long, env = "CLAMP_INTAKE_BATCHES", hide = true)]
    pub intake_batches: Option<String>,

    /// How long a request waits for room in a full buffer before it gets 503, in milliseconds.
    #[arg(long, env = "CLAMP_ENQUEUE_WAIT_MS", default_value_t = 200)]
    pub enqueue_wait_ms: u64,

    /// Server-side bound on one batch write, in milliseconds (statement_timeout).
    #[arg(long, env = "CLAMP_FLUSH_TIMEOUT_MS", default_value_t = 3000)]
    pub flush_timeout_ms: u64,

    /// Largest request body accepted, in bytes (413 beyond).
    #[arg(long, env = "CLAMP_BODY_LIMIT", default_value_t = 1 << 20)]
    pub body_limit: usize,

    /// Most request headers accepted (431 beyond).
    #[arg(long, env = "CLAMP_MAX_HEADERS", default_value_t = 100)]
    pub max_headers: usize,

    /// Time allowed to send a request's headers once they have started, and a request body, in milliseconds.
    #[arg(long, env = "CLAMP_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_timeout_ms: u64,

    /// How long a keep-alive connection may sit idle between requests, in milliseconds.
    #[arg(long, env = "CLAMP_KEEP_ALIVE_TIMEOUT_MS", default_value_t = 75_000)]
    pub keep_alive_timeout_ms: u64,

    /// Bearer tokens, comma-separated (several, so they can be rotated). When set, every
    /// route but /health and /ready (and /metrics with --metrics-open) needs one.
    #[arg(
        long,
        env = "CLAMP_API_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_tokens: Vec<String>,

    /// A file of tokens with names and roles: `name:role:token` or
    /// `name:role:sha256:<hex digest>` per line, role one of read, operate, admin; read
    /// again on SIGHUP. Its tokens are accepted beside --api-tokens (which are admin).
    #[arg(long, env = "CLAMP_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,

    /// Where steps may call, beyond the built-in refusal of link-local and cloud metadata
    /// addresses: when set, only these networks (10.0.0.0/8), addresses, host names and
    /// domains (.internal), comma-separated.
    #[arg(long, env = "CLAMP_ALLOW_DESTINATIONS", value_delimiter = ',')]
    pub allow_destinations: Vec<String>,

    /// Networks, addresses, host names and domains steps may not call, comma-separated
    /// (besides link-local and cloud metadata, always refused).
    #[arg(long, env = "CLAMP_DENY_DESTINATIONS", value_delimiter = ',')]
    pub deny_destinations: Vec<String>,

    /// A directory of secret files (`{{secret:NAME}}` in a step reads the file NAME, at
    /// each call); without one, or without the file, `CLAMP_SECRET_NAME` is read.
    #[arg(long, env = "CLAMP_SECRETS_DIR")]
    pub secrets_dir: Option<std::path::PathBuf>,

    /// Serve /metrics without a token when tokens are on.
    #[arg(long, env = "CLAMP_METRICS_OPEN", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub metrics_open: bool,

    /// Final status answers kept in memory for reads (0: none).
    #[arg(long, env = "CLAMP_STATUS_CACHE_ENTRIES", default_value_t = 32_768)]
    pub status_cache_entries: usize,

    /// Longest `waitMs` a status read may ask for (a long poll), in milliseconds.
    #[arg(long, env = "CLAMP_MAX_WAIT_MS", default_value_t = 30_000)]
    pub max_wait_ms: u64,

    /// How long an Idempotency-Key of POST /serviceRequest/{workflow} is remembered, in hours.
    #[arg(long, env = "CLAMP_IDEMPOTENCY_WINDOW_HOURS", default_value_t = 24.0)]
    pub idempotency_window_hours: f64,

    /// Postgres connections per thread.
    #[arg(long, env = "CLAMP_POOL_SIZE", default_value_t = 8)]
    pub pool_size: u32,

    /// How long to wait for a Postgres connection before answering 503, in milliseconds.
    #[arg(long, env = "CLAMP_DB_CONNECT_TIMEOUT_MS", default_value_t = 1000)]
    pub db_connect_timeout_ms: u64,

    /// How long graceful shutdown waits for in-flight work, in milliseconds.
    #[arg(long, env = "CLAMP_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Service requests each thread executes at once. 0: this instance only serves the
    /// API and executes nothing (other instances on the same database do).
    #[arg(long, env = "CLAMP_MAX_RUNNING", default_value_t = 4096)]
    pub max_running: usize,

    /// How long a claim on a service request lasts without renewal, in milliseconds.
    /// After a crash, another instance (or this one restarted) continues the request
    /// once its lease has expired.
    #[arg(long, env = "CLAMP_LEASE_MS", default_value_t = 10_000)]
    pub lease_ms: u64,

    /// How often the sweeper looks for runnable requests, in milliseconds.
    #[arg(long, env = "CLAMP_SWEEP_INTERVAL_MS", default_value_t = 250)]
    pub sweep_interval_ms: u64,

    /// Most requests one sweep claims.
    #[arg(long, env = "CLAMP_CLAIM_BATCH", default_value_t = 512)]
    pub claim_batch: usize,

    /// Connect timeout of HTTP steps, in milliseconds.
    #[arg(long, env = "CLAMP_STEP_CONNECT_TIMEOUT_MS", default_value_t = 10_000)]
    pub step_connect_timeout_ms: u64,

    /// Total timeout of one HTTP step call, in milliseconds (a step's `val.timeout_ms` overrides it).
    #[arg(long, env = "CLAMP_STEP_TIMEOUT_MS", default_value_t = 10_000)]
    pub step_timeout_ms: u64,

    /// Largest step response read, in bytes (the step fails beyond it).
    #[arg(long, env = "CLAMP_STEP_MAX_RESPONSE", default_value_t = 4 << 20)]
    pub step_max_response: usize,

    /// A PEM file of CA certificates HTTPS steps trust besides the system's roots.
    #[arg(long, env = "CLAMP_STEP_CA_FILE")]
    pub step_ca_file: Option<PathBuf>,

    /// A PEM certificate chain HTTPS steps present when a server asks for one (mutual TLS).
    #[arg(long, env = "CLAMP_STEP_CLIENT_CERT", requires = "step_client_key")]
    pub step_client_cert: Option<PathBuf>,

    /// The private key of `--step-client-cert` (PEM).
    #[arg(long, env = "CLAMP_STEP_CLIENT_KEY", requires = "step_client_cert")]
    pub step_client_key: Option<PathBuf>,

    /// Serve HTTPS with this PEM certificate chain (with `--tls-key`); plain HTTP without.
    #[arg(long, env = "CLAMP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of `--tls-cert` (PEM).
    #[arg(long, env = "CLAMP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Attempts a step's call gets in all, unless its `retry` says otherwise (1: none retried).
    #[arg(long, env = "CLAMP_STEP_RETRY_MAX_ATTEMPTS", default_value_t = 3)]
    pub step_retry_max_attempts: u32,

    /// Wait before a step's second attempt, in milliseconds (unless its `retry` says otherwise).
    #[arg(
        long,
        env = "CLAMP_STEP_RETRY_INITIAL_INTERVAL_MS",
        default_value_t = 200
    )]
    pub step_retry_initial_interval_ms: u64,

    /// Factor each further wait between attempts grows by.
    #[arg(
        long,
        env = "CLAMP_STEP_RETRY_BACKOFF_COEFFICIENT",
        default_value_t = 2.0
    )]
    pub step_retry_backoff_coefficient: f64,

    /// Longest wait between attempts, in milliseconds; also the most a `Retry-After` is honoured for.
    #[arg(long, env = "CLAMP_STEP_RETRY_MAX_INTERVAL_MS", default_value_t = 2000)]
    pub step_retry_max_interval_ms: u64,

    /// Step calls in flight at once to one downstream host (scheme, host, port), per instance.
    #[arg(long, env = "CLAMP_DOWNSTREAM_MAX_IN_FLIGHT", default_value_t = 256)]
    pub downstream_max_in_flight: usize,

    /// How long a step call may wait for a free slot to its host before the attempt counts
    /// as timed out (and is retried by the step's policy), in milliseconds.
    #[arg(
        long,
        env = "CLAMP_DOWNSTREAM_QUEUE_TIMEOUT_MS",
        default_value_t = 60_000
    )]
    pub downstream_queue_timeout_ms: u64,

    /// Request headers to persist and forward beyond the default set, comma-separated
    /// (e.g. `authorization,cookie`, which are never forwarded otherwise).
    #[arg(long, env = "CLAMP_FORWARD_HEADERS", value_delimiter = ',')]
    pub forward_headers: Vec<String>,

    /// Step-transition batches in flight (one writer for the process; fewer means larger
    /// batches and fewer commits; more means lower latency when the database is idle). One: a completed
    /// two-step request cost Postgres 0.91× the CPU of two, polling clients no slower
    /// (docs/decisions.md).
    #[arg(long, env = "CLAMP_STEP_WRITE_CONCURRENCY", default_value_t = 1)]
    pub step_write_concurrency: usize,

    /// Drop finished service requests (and their step records) this many days after they
    /// finished: COMPLETED ones, and FAILED and CANCELLED ones unless their own settings
    /// say otherwise; 0 keeps them forever. Requests go by whole partition sets.
    #[arg(long, env = "CLAMP_RETENTION_DAYS", default_value_t = 0.0)]
    pub retention_days: f64,

    /// FAILED requests' age instead of --retention-days (0 keeps them forever).
    #[arg(long, env = "CLAMP_RETENTION_FAILED_DAYS")]
    pub retention_failed_days: Option<f64>,

    /// CANCELLED requests' age instead of --retention-days (0 keeps them forever).
    #[arg(long, env = "CLAMP_RETENTION_CANCELLED_DAYS")]
    pub retention_cancelled_days: Option<f64>,

    /// Before a partition set is dropped, write its requests (with their steps) to
    /// `<dir>/service_requests_p<range start>.jsonl`, one JSON line each, synced.
    #[arg(long, env = "CLAMP_RETENTION_EXPORT_DIR")]
    pub retention_export_dir: Option<std::path::PathBuf>,

    /// Requests a partition set is sized to hold at the current rate.
    #[arg(long, env = "CLAMP_PARTITION_ROWS", default_value_t = 2_000_000)]
    pub partition_rows: u64,

    /// The narrowest a partition set's range of time may be, in seconds.
    #[arg(long, env = "CLAMP_PARTITION_MIN_SECONDS", default_value_t = 60.0)]
    pub partition_min_seconds: f64,

    /// The widest a partition set's range of time may be, in seconds.
    #[arg(long, env = "CLAMP_PARTITION_MAX_SECONDS", default_value_t = 86_400.0)]
    pub partition_max_seconds: f64,

    /// How far ahead of the database's clock partition sets exist (two sets at least).
    #[arg(long, env = "CLAMP_PARTITION_AHEAD_SECONDS", default_value_t = 300.0)]
    pub partition_ahead_seconds: f64,

    /// How far behind the database's clock an instance's clock may be: no partition set
    /// whose range ended less than this long ago is dropped (it may still get requests).
    #[arg(
        long,
        env = "CLAMP_PARTITION_SKEW_SECONDS",
        default_value_t = 300.0,
        hide = true
    )]
    pub partition_skew_seconds: f64,

    /// How often the partitions' keeper works (creating sets, dropping them).
    #[arg(
        long,
        env = "CLAMP_PARTITION_INTERVAL_MS",
        default_value_t = 10_000,
        hide = true
    )]
    pub partition_interval_ms: u64,

    /// The least time between choosing the bound of an upgraded database's first partition
    /// and that bound (validating it must end before).
    #[arg(
        long,
        env = "CLAMP_PARTITION_CONVERT_SECONDS",
        default_value_t = 120.0,
        hide = true
    )]
    pub partition_convert_seconds: f64,

    /// Delete audit records this many days after they were written; 0 keeps them forever.
    #[arg(long, env = "CLAMP_AUDIT_RETENTION_DAYS", default_value_t = 365.0)]
    pub audit_retention_days: f64,

    /// Delete dead-lettered broker messages this many days after they were set aside; 0
    /// keeps them forever.
    #[arg(long, env = "CLAMP_DEAD_LETTER_RETENTION_DAYS", default_value_t = 30.0)]
    pub dead_letter_retention_days: f64,

    /// Delete delivered events this many days after their keep window ended (until then
    /// a redelivery with the same id still counts once).
    #[arg(long, env = "CLAMP_EVENT_RETENTION_DAYS", default_value_t = 1.0)]
    pub event_retention_days: f64,

    /// A console session ends after this many minutes without a page or action.
    #[arg(long, env = "CLAMP_CONSOLE_SESSION_IDLE_MINUTES", default_value_t = 60)]
    pub console_session_idle_minutes: u64,

    /// A console session ends this many hours after sign-in, however busy.
    #[arg(long, env = "CLAMP_CONSOLE_SESSION_MAX_HOURS", default_value_t = 12)]
    pub console_session_max_hours: u64,

    /// Console sign-in attempts allowed per client address and minute (instance-wide);
    /// beyond it an attempt is answered 429 without looking at its token.
    #[arg(long, env = "CLAMP_SIGN_IN_ATTEMPTS_PER_MINUTE", default_value_t = 10)]
    pub sign_in_attempts_per_minute: u32,

    /// Consume step responses from the AMQP queue `--amqp-response-queue`.
    #[arg(long, env = env::ENABLE_AMQP_INTEGRATION, default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub enable_amqp: bool,

    /// The broker step responses are consumed from.
    #[arg(long, env = env::CLAMP_QUEUE_CONNECTION_STR, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,

    /// The queue step responses arrive on; also every AMQP step's default `reply_to`.
    #[arg(long, env = env::CLAMP_QUEUE_NAME, default_value = "clamp_steps_response")]
    pub amqp_response_queue: String,

    /// Responses applied concurrently per runtime (the consumer's prefetch).
    #[arg(long, env = "CLAMP_AMQP_PREFETCH", default_value_t = 256)]
    pub amqp_prefetch: u16,

    /// A PEM file of CA certificates `amqps://` connections (the consumer's and AMQP
    /// steps') trust besides the system's roots.
    #[arg(long, env = "CLAMP_AMQP_CA_FILE")]
    pub amqp_ca_file: Option<PathBuf>,

    /// Consume step responses from the Kafka topic `--kafka-response-topic`.
    #[arg(long, env = env::ENABLE_KAFKA_INTEGRATION, default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub enable_kafka: bool,

    /// Kafka bootstrap brokers (`host:port`, comma-separated) responses are consumed from.
    #[arg(long, env = env::CLAMP_KAFKA_CONNECTION_STR, default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// The topic step responses arrive on; also every Kafka step's default `reply_to`.
    #[arg(long, env = env::CLAMP_KAFKA_TOPIC_NAME, default_value = "clamp_steps_response")]
    pub kafka_response_topic: String,

    /// How Kafka connections (the consumer's and Kafka steps') are secured, in Kafka's
    /// words: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, env = "CLAMP_KAFKA_SECURITY_PROTOCOL", value_enum, ignore_case = true, default_value_t = KafkaProtocol::Plaintext)]
    pub kafka_security_protocol: KafkaProtocol,

    /// The SASL mechanism of SASL_PLAINTEXT and SASL_SSL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, env = "CLAMP_KAFKA_SASL_MECHANISM", value_enum, ignore_case = true, default_value_t = SaslMechanism::Plain)]
    pub kafka_sasl_mechanism: SaslMechanism,

    /// The SASL user name.
    #[arg(long, env = "CLAMP_KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,

    /// The SASL password (best given in the environment).
    #[arg(long, env = "CLAMP_KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,

    /// A PEM file of CA certificates SSL and SASL_SSL connections trust besides the system's roots.
    #[arg(long, env = "CLAMP_KAFKA_CA_FILE")]
    pub kafka_ca_file: Option<PathBuf>,

    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, env = env::LOG_LEVEL, default_value = "info")]
    pub log_level: String,

    #[command(flatten)]
    pub trace: crate::telemetry::TraceArgs,
}

/// Where step responses are consumed from, and the default `reply_to` of broker steps.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub amqp_enabled: bool,
    pub amqp_url: String,
    pub amqp_response_queue: String,
    pub amqp_prefetch: u16,
    /// Trusted besides the system's roots by `amqps://` connections.
    pub amqp_ca_file: Option<PathBuf>,
    pub kafka_enabled: bool,
    pub kafka_brokers: String,
    pub kafka_response_topic: String,
    pub kafka_security: KafkaSecurity,
}

/// Kafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KafkaProtocol {
    #[value(name = "PLAINTEXT")]
    Plaintext,
    #[value(name = "SSL")]
    Ssl,
    #[value(name = "SASL_PLAINTEXT")]
    SaslPlaintext,
    #[value(name = "SASL_SSL")]
    SaslSsl,
}

/// Kafka's `sasl.mechanism`, those clamp speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SaslMechanism {
    #[value(name = "PLAIN")]
    Plain,
    #[value(name = "SCRAM-SHA-256")]
    ScramSha256,
    #[value(name = "SCRAM-SHA-512")]
    ScramSha512,
}

/// How every Kafka connection is secured: TLS (with an extra CA) and SASL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSecurity {
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
    pub sasl: Option<KafkaSasl>,
}

/// SASL credentials; the password is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaSasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for KafkaSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KafkaSasl({:?}, {}, password hidden)",
            self.mechanism, self.username
        )
    }
}

/// Certificate files the server reads at startup, beside the database's (`Database`).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The listener's chain and key: HTTPS instead of plain HTTP.
    pub server: Option<(PathBuf, PathBuf)>,
    /// Trusted by HTTPS steps besides the system's roots.
    pub step_ca: Option<PathBuf>,
    /// Presented by HTTPS steps when a server asks for a client certificate.
    pub step_client: Option<(PathBuf, PathBuf)>,
}

/// A configuration error: printed as one line and exits non-zero.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Settings for step HTTP calls.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub connect_timeout: Duration,
    /// Total time for one call, unless the step overrides it.
    pub timeout: Duration,
    pub max_response_bytes: usize,
    pub max_idle_per_host: usize,
}
/// Headers that are never persisted with a service request nor forwarded to steps:
/// hop-by-hop headers, framing, and credentials (unless configured otherwise).
pub const DEFAULT_HEADER_DENYLIST: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "accept-encoding",
    "expect",
    "authorization",
    "cookie",
    // The client's key for an idempotent create; steps get their own.
    "idempotency-key",
    // The create's labels: kept with the request, not a header of its calls.
    "clamp-labels",
];

/// The validated configuration every part of the server reads.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub database: Database,
    pub tls: TlsFiles,
    pub threads: usize,
    pub runtime: RuntimeMode,
    pub ack: AckMode,
    pub buffer_rows: usize,
    pub max_batch: usize,
    pub flush_concurrency: usize,
    /// Settings that were accepted but do nothing any more: logged once at startup.
    pub ignored: Vec<&'static str>,
    pub enqueue_wait: Duration,
    pub flush_timeout: Duration,
    pub body_limit: usize,
    pub max_headers: usize,
    pub header_timeout: Duration,
    pub keep_alive_timeout: Duration,
    /// Accepted bearer tokens and their roles (none: authentication off), reloadable.
    /// Never printed.
    pub api_tokens: std::sync::Arc<crate::tokens::ApiTokens>,
    pub metrics_open: bool,
    /// Where steps may call (beyond Clamp).
    pub destinations: std::sync::Arc<crate::destinations::Destinations>,
    /// Where the secrets steps refer to come from (beyond Clamp).
    pub secrets: std::sync::Arc<crate::secrets::Secrets>,
    pub idempotency_window: Duration,
    pub status_cache_entries: usize,
    pub max_wait: Duration,
    pub pool_size: u32,
    pub db_connect_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub max_running: usize,
    pub lease: Duration,
    pub sweep_interval: Duration,
    pub claim_batch: usize,
    pub http: HttpSettings,
    /// The retry policy of steps that do not give their own (and what theirs leave out).
    pub retry: crate::workflow::RetryPolicy,
    /// Step calls in flight at once to one downstream host, per instance.
    pub downstream_limit: usize,
    /// Longest wait for a free slot to a downstream host.
    pub downstream_wait: Duration,
    /// Header names (lower case) never persisted with a request nor forwarded to steps:
    /// `DEFAULT_HEADER_DENYLIST` less those `--forward-headers` names.
    pub header_denylist: Vec<&'static str>,
    pub brokers: BrokerConfig,
    pub step_write_concurrency: usize,
    /// How long finished requests are kept, by status, and where dropped ones are written.
    pub retention: Retention,
    /// How the request tables' partition sets are sized and kept.
    pub partitioning: Partitioning,
    pub retention_interval: Duration,
    /// How long what clamp keeps besides requests is kept (None: forever).
    pub housekeeping: Housekeeping,
    /// With tokens off, the extra names `Host` and `Origin` may give (lower case; a
    /// leading `.` names a domain).
    pub allowed_hosts: Vec<String>,
    /// Console sessions: idle and absolute expiry.
    pub session_idle: Duration,
    pub session_max: Duration,
    /// Console sign-in attempts per client address and minute.
    pub sign_in_per_minute: u32,
    pub log_level: String,
    pub log_format: crate::telemetry::LogFormat,
    /// Spans exported over OTLP (None: tracing off; `traceparent` is still passed on).
    pub trace: Option<crate::telemetry::TraceSettings>,
}

/// The default database when nothing is configured.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/clamp";

impl Config {
    /// Parses the process arguments and environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        match Args::try_parse() {
            Ok(args) => Config::from_args(args),
            Err(e) if e.use_stderr() => Err(ConfigError(first_line(&e.to_string()))),
            // --help and --version print and exit 0.
            Err(e) => e.exit(),
        }
    }

    /// Validates raw arguments into a `Config`.
    pub fn from_args(a: Args) -> Result<Config, ConfigError> {
        let database = database(&a)?;
        let kafka_security = kafka_security(&a)?;
        check_sizes(&a)?;
        check_timeouts(&a)?;
        check_brokers(&a)?;
        let tokens = api_tokens(&a)?;
        let listen = SocketAddr::new(bind(&a, tokens.is_on())?, a.port);
        let retry = default_retry(&a)?;
        let trace = a.trace.settings().map_err(ConfigError)?;
        let threads = if a.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            a.threads
        };
        Ok(Config {
            listen,
            database,
            tls: TlsFiles::of(&a),
            threads,
            runtime: a.runtime,
            ack: a.ack,
            buffer_rows: a.buffer_rows,
            max_batch: a.max_batch.min(a.buffer_rows),
            flush_concurrency: a.flush_concurrency,
            ignored: a
                .intake_batches
                .iter()
                .map(|_| {
                    "--intake-batches (CLAMP_INTAKE_BATCHES) is ignored: every request is \
                     stored as one row; the setting will be refused in a later release"
                })
                .collect(),
            enqueue_wait: Duration::from_millis(a.enqueue_wait_ms),
            flush_timeout: Duration::from_millis(a.flush_timeout_ms),
            body_limit: a.body_limit,
            max_headers: a.max_headers,
            header_timeout: Duration::from_millis(a.header_timeout_ms),
            keep_alive_timeout: Duration::from_millis(a.keep_alive_timeout_ms),
            api_tokens: std::sync::Arc::new(tokens),
            secrets: std::sync::Arc::new(crate::secrets::Secrets::new(a.secrets_dir.clone())),
            destinations: std::sync::Arc::new(destinations(&a)?),
            metrics_open: a.metrics_open,
            idempotency_window: Duration::from_secs_f64(a.idempotency_window_hours * 3600.0),
            status_cache_entries: a.status_cache_entries,
            max_wait: Duration::from_millis(a.max_wait_ms),
            pool_size: a.pool_size,
            db_connect_timeout: Duration::from_millis(a.db_connect_timeout_ms.max(1)),
            shutdown_timeout: Duration::from_millis(a.shutdown_timeout_ms),
            max_running: a.max_running,
            lease: Duration::from_millis(a.lease_ms),
            sweep_interval: Duration::from_millis(a.sweep_interval_ms.max(1)),
            claim_batch: a.claim_batch,
            http: HttpSettings::of(&a),
            retry,
            downstream_limit: a.downstream_max_in_flight,
            downstream_wait: Duration::from_millis(a.downstream_queue_timeout_ms.max(1)),
            header_denylist: header_denylist(&a.forward_headers),
            brokers: BrokerConfig::of(&a, kafka_security),
            step_write_concurrency: a.step_write_concurrency,
            retention: Retention::of(&a),
            partitioning: Partitioning::of(&a),
            retention_interval: Duration::from_secs(60),
            housekeeping: Housekeeping::of(&a),
            allowed_hosts: allowed_hosts(&a.allowed_hosts)?,
            session_idle: Duration::from_secs(a.console_session_idle_minutes * 60),
            session_max: Duration::from_secs(a.console_session_max_hours * 3600),
            sign_in_per_minute: a.sign_in_attempts_per_minute,
            log_level: a.log_level,
            log_format: a.trace.log_format,
            trace,
        })
    }

    /// A configuration for tests: port 0 on loopback, small buffers, the given database.
    pub fn for_tests(database_url: &str) -> Config {
        let mut args = Args::parse_from(["clamp"]);
        args.port = 0;
        args.bind = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        args.database_url = Some(database_url.to_string());
        args.threads = 2;
        // Tests run many servers side by side on one Postgres.
        args.pool_size = 6;
        let mut c = Config::from_args(args).expect("test config is valid");
        c.header_denylist = DEFAULT_HEADER_DENYLIST.to_vec();
        c.brokers.amqp_enabled = false;
        c.brokers.kafka_enabled = false;
        c
    }
}

/// How long finished requests are kept (None: forever), by status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Retention {
    pub completed: Option<Duration>,
    pub failed: Option<Duration>,
    pub cancelled: Option<Duration>,
    /// Where dropped partition sets are written first, if anywhere.
    pub export_dir: Option<std::path::PathBuf>,
}

impl Retention {
    /// Whether any finished request is ever dropped.
    pub fn is_on(&self) -> bool {
        self.completed.is_some() || self.failed.is_some() || self.cancelled.is_some()
    }
}

/// How the request tables' partition sets are sized and kept (`store::partitions`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Partitioning {
    /// Requests a set is sized to hold at the current rate.
    pub rows: u64,
    pub min: Duration,
    pub max: Duration,
    /// How far ahead of now sets exist.
    pub ahead: Duration,
    /// How often the keeper works.
    pub every: Duration,
    /// How far behind an instance's clock may be (no younger set is dropped).
    pub skew: Duration,
    /// The least time an upgraded database's conversion gets to validate its bound.
    pub convert: Duration,
}

/// How long what clamp keeps besides requests is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Housekeeping {
    /// Audit records (None: forever).
    pub audit: Option<Duration>,
    /// Dead-lettered messages (None: forever).
    pub dead_letters: Option<Duration>,
    /// Delivered events, past their keep window.
    pub events_after_keep: Duration,
}

/// The destination policy: where steps may call.
fn destinations(a: &Args) -> Result<crate::destinations::Destinations, ConfigError> {
    crate::destinations::Destinations::new(&a.allow_destinations, &a.deny_destinations).map_err(
        |why| {
            ConfigError(format!(
                "CLAMP_ALLOW_DESTINATIONS / CLAMP_DENY_DESTINATIONS: {why}"
            ))
        },
    )
}

impl HttpSettings {
    fn of(a: &Args) -> HttpSettings {
        HttpSettings {
            connect_timeout: Duration::from_millis(a.step_connect_timeout_ms.max(1)),
            timeout: Duration::from_millis(a.step_timeout_ms),
            max_response_bytes: a.step_max_response.max(1),
            // Idle connections kept per host: as many as may be busy at once.
            max_idle_per_host: a.downstream_max_in_flight,
        }
    }
}

impl BrokerConfig {
    fn of(a: &Args, kafka_security: KafkaSecurity) -> BrokerConfig {
        BrokerConfig {
            amqp_enabled: a.enable_amqp,
            amqp_url: a.amqp_url.clone(),
            amqp_response_queue: a.amqp_response_queue.clone(),
            amqp_prefetch: a.amqp_prefetch,
            amqp_ca_file: a.amqp_ca_file.clone(),
            kafka_enabled: a.enable_kafka,
            kafka_brokers: a.kafka_brokers.clone(),
            kafka_response_topic: a.kafka_response_topic.clone(),
            kafka_security,
        }
    }
}

impl TlsFiles {
    fn of(a: &Args) -> TlsFiles {
        TlsFiles {
            server: a.tls_cert.clone().zip(a.tls_key.clone()),
            step_ca: a.step_ca_file.clone(),
            step_client: a.step_client_cert.clone().zip(a.step_client_key.clone()),
        }
    }
}

impl Retention {
    fn of(a: &Args) -> Retention {
        Retention {
            completed: days(a.retention_days),
            failed: days(a.retention_failed_days.unwrap_or(a.retention_days)),
            cancelled: days(a.retention_cancelled_days.unwrap_or(a.retention_days)),
            export_dir: a.retention_export_dir.clone(),
        }
    }
}

impl Partitioning {
    fn of(a: &Args) -> Partitioning {
        Partitioning {
            rows: a.partition_rows.max(1),
            min: Duration::from_secs_f64(a.partition_min_seconds),
            max: Duration::from_secs_f64(a.partition_max_seconds),
            ahead: Duration::from_secs_f64(a.partition_ahead_seconds),
            every: Duration::from_millis(a.partition_interval_ms.max(100)),
            skew: Duration::from_secs_f64(a.partition_skew_seconds.max(0.0)),
            convert: Duration::from_secs_f64(a.partition_convert_seconds),
        }
    }
}

impl Housekeeping {
    fn of(a: &Args) -> Housekeeping {
        Housekeeping {
            audit: days(a.audit_retention_days),
            dead_letters: days(a.dead_letter_retention_days),
            events_after_keep: Duration::from_secs_f64(a.event_retention_days * 86_400.0),
        }
    }
}

/// A number of days as a retention age (0: forever).
fn days(d: f64) -> Option<Duration> {
    (d > 0.0).then(|| Duration::from_secs_f64(d * 86_400.0))
}

/// `--allowed-hosts`: host names or `.domains`, lower case.
fn allowed_hosts(list: &[String]) -> Result<Vec<String>, ConfigError> {
    list.iter()
        .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .map(|h| {
            let name = h.strip_prefix('.').unwrap_or(&h);
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if ok {
                Ok(h)
            } else {
                Err(ConfigError(format!(
                    "CLAMP_ALLOWED_HOSTS: {h:?} is not a host name or a .domain"
                )))
            }
        })
        .collect()
}

/// The database: `--database-url`, else Clamp's connection string, else the default.
fn database(a: &Args) -> Result<Database, ConfigError> {
    let url = match (&a.database_url, &a.clamp_db_connection_str) {
        (Some(url), _) => url.clone(),
        (None, Some(clamp)) => clamp_conn_str_to_url(clamp)?,
        (None, None) => DEFAULT_DATABASE_URL.to_string(),
    };
    Database::parse(&url, &|k| std::env::var(k).ok())
}

/// Kafka's security settings, consistent with each other.
fn kafka_security(a: &Args) -> Result<KafkaSecurity, ConfigError> {
    let (tls, sasl) = match a.kafka_security_protocol {
        KafkaProtocol::Plaintext => (false, false),
        KafkaProtocol::Ssl => (true, false),
        KafkaProtocol::SaslPlaintext => (false, true),
        KafkaProtocol::SaslSsl => (true, true),
    };
    let sasl = match (sasl, &a.kafka_sasl_username, &a.kafka_sasl_password) {
        (true, Some(u), Some(p)) => Some(KafkaSasl {
            mechanism: a.kafka_sasl_mechanism,
            username: u.clone(),
            password: p.clone(),
        }),
        (true, _, _) => {
            return Err(ConfigError(
                "--kafka-security-protocol SASL_… needs --kafka-sasl-username and --kafka-sasl-password"
                    .into(),
            ))
        }
        (false, None, None) => None,
        (false, _, _) => {
            return Err(ConfigError(
                "Kafka SASL credentials are set but --kafka-security-protocol is not SASL_PLAINTEXT or SASL_SSL"
                    .into(),
            ))
        }
    };
    if a.kafka_ca_file.is_some() && !tls {
        return Err(ConfigError(
            "--kafka-ca-file is set but --kafka-security-protocol is not SSL or SASL_SSL".into(),
        ));
    }
    Ok(KafkaSecurity {
        tls,
        ca_file: a.kafka_ca_file.clone(),
        sasl,
    })
}

fn positive(v: usize, name: &str) -> Result<usize, ConfigError> {
    if v == 0 {
        Err(ConfigError(format!("{name} must be at least 1")))
    } else {
        Ok(v)
    }
}

/// Buffers, batches, pools and limits: every count at least 1, and consistent.
fn check_sizes(a: &Args) -> Result<(), ConfigError> {
    positive(a.buffer_rows, "--buffer-rows")?;
    positive(a.max_batch, "--max-batch")?;
    positive(a.body_limit, "--body-limit")?;
    positive(a.max_headers, "--max-headers")?;
    positive(a.pool_size as usize, "--pool-size")?;
    positive(a.flush_concurrency, "--flush-concurrency")?;
    if a.flush_concurrency > a.pool_size as usize {
        return Err(ConfigError(
            "--flush-concurrency cannot exceed --pool-size (each batch needs a connection)".into(),
        ));
    }
    positive(a.claim_batch, "--claim-batch")?;
    positive(a.downstream_max_in_flight, "--downstream-max-in-flight")?;
    positive(a.amqp_prefetch as usize, "--amqp-prefetch")?;
    positive(a.step_write_concurrency, "--step-write-concurrency")?;
    Ok(())
}

/// Timeouts and durations: none zero, none infinite or negative.
fn check_timeouts(a: &Args) -> Result<(), ConfigError> {
    if a.lease_ms < 300 {
        return Err(ConfigError("--lease-ms must be at least 300".into()));
    }
    if !(a.idempotency_window_hours > 0.0 && a.idempotency_window_hours.is_finite()) {
        return Err(ConfigError(
            "--idempotency-window-hours must be more than 0".into(),
        ));
    }
    if a.header_timeout_ms == 0
        || a.flush_timeout_ms == 0
        || a.step_timeout_ms == 0
        || a.keep_alive_timeout_ms == 0
    {
        return Err(ConfigError("timeouts must be at least 1 ms".into()));
    }
    for (name, d) in [
        ("CLAMP_AUDIT_RETENTION_DAYS", a.audit_retention_days),
        (
            "CLAMP_DEAD_LETTER_RETENTION_DAYS",
            a.dead_letter_retention_days,
        ),
        ("CLAMP_EVENT_RETENTION_DAYS", a.event_retention_days),
    ] {
        if !(d >= 0.0 && d.is_finite()) {
            return Err(ConfigError(format!(
                "{name} must be a number of days, 0 or more"
            )));
        }
    }
    if a.console_session_idle_minutes == 0 || a.console_session_max_hours == 0 {
        return Err(ConfigError(
            "CLAMP_CONSOLE_SESSION_IDLE_MINUTES and CLAMP_CONSOLE_SESSION_MAX_HOURS must be 1 or more"
                .into(),
        ));
    }
    if a.sign_in_attempts_per_minute == 0 {
        return Err(ConfigError(
            "CLAMP_SIGN_IN_ATTEMPTS_PER_MINUTE must be 1 or more".into(),
        ));
    }
    for (name, d) in [
        (
            "CLAMP_RETENTION_FAILED_DAYS",
            a.retention_failed_days.unwrap_or(0.0),
        ),
        (
            "CLAMP_RETENTION_CANCELLED_DAYS",
            a.retention_cancelled_days.unwrap_or(0.0),
        ),
    ] {
        if !(d >= 0.0 && d.is_finite()) {
            return Err(ConfigError(format!(
                "{name} must be a number of days, 0 or more"
            )));
        }
    }
    let ok = |s: f64| s.is_finite() && s >= 1.0;
    if !(ok(a.partition_min_seconds)
        && ok(a.partition_max_seconds)
        && a.partition_min_seconds <= a.partition_max_seconds
        && a.partition_ahead_seconds.is_finite()
        && a.partition_ahead_seconds >= 0.0
        && ok(a.partition_convert_seconds))
    {
        return Err(ConfigError(
            "CLAMP_PARTITION_MIN_SECONDS and CLAMP_PARTITION_MAX_SECONDS must be 1 or more, \
             the first at most the second; CLAMP_PARTITION_AHEAD_SECONDS 0 or more"
                .into(),
        ));
    }
    if !(a.retention_days >= 0.0 && a.retention_days.is_finite()) {
        return Err(ConfigError(
            "--retention-days must be 0 (keep forever) or more".into(),
        ));
    }
    Ok(())
}

/// The broker URLs and names.
fn check_brokers(a: &Args) -> Result<(), ConfigError> {
    if !(a.amqp_url.starts_with("amqp://") || a.amqp_url.starts_with("amqps://")) {
        return Err(ConfigError(
            "CLAMP_QUEUE_CONNECTION_STR must be an amqp:// or amqps:// URL".into(),
        ));
    }
    if a.amqp_response_queue.is_empty() || a.kafka_response_topic.is_empty() {
        return Err(ConfigError(
            "the response queue and topic names cannot be empty".into(),
        ));
    }
    if a.kafka_brokers.split(',').any(|b| b.trim().is_empty()) {
        return Err(ConfigError(
            "CLAMP_KAFKA_CONNECTION_STR must be host:port[,host:port…]".into(),
        ));
    }
    Ok(())
}

/// The bearer tokens of `--api-tokens` (trimmed, each long enough and printable) and
/// of `--tokens-file`.
fn api_tokens(a: &Args) -> Result<crate::tokens::ApiTokens, ConfigError> {
    let list: Vec<&str> = a
        .api_tokens
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .collect();
    for t in &list {
        crate::tokens::check_token(t)
            .map_err(|why| ConfigError(format!("CLAMP_API_TOKENS: {why}")))?;
    }
    crate::tokens::ApiTokens::new(
        crate::tokens::Tokens::from_list(&list),
        a.tokens_file.clone(),
    )
    .map_err(|why| ConfigError(format!("CLAMP_TOKENS_FILE {why}")))
}

/// The address to listen on: what `--bind` says, if that is safe; by default every
/// interface with tokens (or when serving without them was asked for), else loopback.
fn bind(a: &Args, tokens_on: bool) -> Result<IpAddr, ConfigError> {
    let open = tokens_on || a.allow_unauthenticated;
    match a.bind {
        None if open => Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        None => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        Some(ip) if open || ip.is_loopback() => Ok(ip),
        Some(ip) => Err(ConfigError(format!(
            "--bind {ip} would let other hosts in with no API tokens: set CLAMP_API_TOKENS or \
             CLAMP_TOKENS_FILE, or CLAMP_ALLOW_UNAUTHENTICATED=true to serve them without"
        ))),
    }
}

/// The step retry policy of steps that set none, checked by the workflow's own rules.
fn default_retry(a: &Args) -> Result<crate::workflow::RetryPolicy, ConfigError> {
    let retry = crate::workflow::RetrySpec {
        max_attempts: Some(a.step_retry_max_attempts),
        initial_interval_ms: Some(a.step_retry_initial_interval_ms),
        backoff_coefficient: Some(a.step_retry_backoff_coefficient),
        max_interval_ms: Some(a.step_retry_max_interval_ms),
        retryable_status_codes: None,
    };
    retry
        .check("--step")
        .map_err(|e| ConfigError(e.0.replace("--step.retry.", "--step-retry: ")))?;
    Ok(retry.over(&crate::workflow::RetryPolicy::default()))
}

/// The headers never forwarded: the defaults, less those `--forward-headers` names.
fn header_denylist(forward: &[String]) -> Vec<&'static str> {
    let forwarded: Vec<String> = forward
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    DEFAULT_HEADER_DENYLIST
        .iter()
        .copied()
        .filter(|h| !forwarded.iter().any(|x| x == h))
        .collect()
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid arguments")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guide's configuration table (`docs/configuration.md`) names every flag with its
    /// environment key, so that a flag added here without a row there fails this test.
    #[test]
    fn the_guide_lists_every_flag_and_key() {
        use clap::CommandFactory;
        let guide = include_str!("../../docs/configuration.md");
        let rows: Vec<&str> = guide.lines().filter(|l| l.starts_with("| ")).collect();
        for arg in Args::command().get_arguments() {
            let (Some(flag), Some(env)) = (arg.get_long(), arg.get_env()) else {
                continue;
            };
            let (flag, env) = (
                format!("`--{flag}`"),
                format!("`{}`", env.to_string_lossy()),
            );
            // A hidden flag is documented by its environment key alone.
            let flag = if arg.is_hide_set() { env.clone() } else { flag };
            assert!(
                rows.iter().any(|r| r.contains(&flag) && r.contains(&env)),
                "docs/configuration.md has no configuration row with {flag} and {env}"
            );
        }
    }

    #[test]
    fn broker_settings() {
        let c = Config::from_args(Args::parse_from([
            "clamp",
            "--enable-amqp",
            "1",
            "--enable-kafka",
            "true",
            "--kafka-brokers",
            "k1:9092,k2:9092",
        ]))
        .unwrap();
        assert!(c.brokers.amqp_enabled && c.brokers.kafka_enabled);
        assert_eq!(c.brokers.amqp_response_queue, "clamp_steps_response");
        let bad = |args: &[&str]| {
            let mut all = vec!["clamp"];
            all.extend_from_slice(args);
            Config::from_args(Args::parse_from(all)).unwrap_err().0
        };
        assert!(bad(&["--amqp-url", "http://x"]).contains("amqp://"));
        assert!(bad(&["--kafka-brokers", "a:1,"]).contains("host:port"));
        assert!(bad(&["--amqp-response-queue", ""]).contains("cannot be empty"));
        assert!(bad(&["--retention-days=-1"]).contains("retention"));
        assert!(bad(&["--step-retry-max-attempts", "0"]).contains("maxAttempts"));
        assert!(bad(&["--step-retry-backoff-coefficient", "0.5"]).contains("backoffCoefficient"));
        assert!(bad(&["--downstream-max-in-flight", "0"]).contains("at least 1"));
        assert!(bad(&["--api-tokens", "short"]).contains("at least 16"));
        assert!(bad(&["--api-tokens", "a valid length but spaces"]).contains("printable"));
        assert!(bad(&["--idempotency-window-hours", "0"]).contains("idempotency"));
        let c = Config::from_args(Args::parse_from([
            "clamp",
            "--api-tokens",
            "0123456789abcdef, fedcba9876543210,",
        ]))
        .unwrap();
        assert!(c.api_tokens.is_on());
        assert!(!format!("{c:?}").contains("0123456789abcdef"));
        let c = Config::from_args(Args::parse_from(["clamp", "--retention-days", "0.5"])).unwrap();
        let half = Some(Duration::from_secs(43_200));
        assert_eq!(
            (
                c.retention.completed,
                c.retention.failed,
                c.retention.cancelled
            ),
            (half, half, half)
        );
        let c = Config::from_args(Args::parse_from([
            "clamp",
            "--retention-days",
            "0.5",
            "--retention-failed-days",
            "0",
            "--retention-cancelled-days",
            "1",
        ]))
        .unwrap();
        assert_eq!(
            (
                c.retention.completed,
                c.retention.failed,
                c.retention.cancelled
            ),
            (half, None, Some(Duration::from_secs(86_400)))
        );
        assert!(bad(&[
            "--partition-min-seconds",
            "600",
            "--partition-max-seconds",
            "60"
        ])
        .contains("PARTITION"));
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::from_args(Args::parse_from(["clamp"])).unwrap();
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.ack, AckMode::Commit);
        assert_eq!(c.retry, crate::workflow::RetryPolicy::default());
        assert!(c.downstream_limit <= 1024);
        assert!(c.threads >= 1);
    }

    #[test]
    fn with_no_tokens_only_loopback_unless_told() {
        let cfg = |args: &[&str]| {
            let mut all = vec!["clamp"];
            all.extend_from_slice(args);
            Config::from_args(Args::parse_from(all))
        };
        let ip = |args: &[&str]| cfg(args).unwrap().listen.ip().to_string();
        assert_eq!(ip(&[]), "127.0.0.1");
        assert_eq!(ip(&["--bind", "::1"]), "::1");
        assert_eq!(ip(&["--api-tokens", "0123456789abcdef"]), "0.0.0.0");
        assert_eq!(ip(&["--allow-unauthenticated", "true"]), "0.0.0.0");
        assert_eq!(
            ip(&["--bind", "10.1.2.3", "--allow-unauthenticated", "true"]),
            "10.1.2.3"
        );
        let e = cfg(&["--bind", "0.0.0.0"]).unwrap_err().0;
        assert!(e.contains("CLAMP_ALLOW_UNAUTHENTICATED=true"), "{e}");
    }

    #[test]
    fn rejects_bad_values() {
        let a = Args::parse_from(["clamp", "--max-batch", "0"]);
        assert!(Config::from_args(a).is_err());
        let a = Args::parse_from(["clamp", "--database-url", "not a url"]);
        assert!(Config::from_args(a).is_err());
    }
}
