//! Postgres over TLS, as libpq's `sslmode` documents it, against clusters the test starts
//! (`scripts/dev-postgres.sh`): one with `ssl = on`, a server certificate of the test's own
//! CA for the name `db.internal`, and `hostssl … cert` for one user; one without TLS.
//! Also: each host of a multi-host URL gets one deadline (TCP, TLS and startup), and a
//! query is cancelled over the connection's TLS settings.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::pki::Ca;
use crate::support::*;

/// A throwaway cluster with TLS on, and the CA that signed its certificate.
struct TlsCluster {
    _cluster: DevCluster,
    port: u16,
    ca: Ca,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let ca = Ca::new("pg");
        let server = ca.server("server", &["db.internal"]);
        ca.give_to_postgres();
        let port = free_port();
        let dir = format!("/tmp/clamp-it-pgtls-{}-{port}", std::process::id());
        let _ = std::fs::remove_dir_all(&dir);
        let out = std::process::Command::new(DevCluster::script())
            .args(["start", &dir, &port.to_string()])
            .env(
                "PG_EXTRA_CONF",
                format!(
                    "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nssl_ca_file = '{}'",
                    server.cert.display(),
                    server.key.display(),
                    ca.ca_file().display()
                ),
            )
            .env(
                "PG_HBA_FIRST",
                "hostssl all certuser 127.0.0.1/32 cert\nhost all certuser 127.0.0.1/32 reject",
            )
            .output()
            .expect("dev-postgres.sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        TlsCluster {
            _cluster: DevCluster { dir },
            port,
            ca,
        }
    }

    /// A URL for `db` on this cluster; `host` is what TLS verifies, the address is
    /// always 127.0.0.1.
    fn url(&self, user: &str, db: &str, host: &str, params: &str) -> String {
        let hostaddr = if host == "127.0.0.1" {
            String::new()
        } else {
            "&hostaddr=127.0.0.1".to_string()
        };
        format!(
            "postgres://{user}@{host}:{}/{db}?{params}{hostaddr}",
            self.port
        )
    }

    async fn admin(&self) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(
            &format!("postgres://postgres@127.0.0.1:{}/postgres", self.port),
            tokio_postgres::NoTls,
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        c
    }
}

/// Starts clamp on `url`: the one-line reason it could not, or the running server.
async fn start(url: &str) -> Result<TestServer, String> {
    let mut cfg = config(url);
    cfg.database = clamp::config::Database::parse(url, &|_| None).map_err(|e| e.0)?;
    match clamp::start(cfg).await {
        Ok(server) => {
            let addr = server.local_addr();
            Ok(TestServer {
                server: Some(server),
                addr,
            })
        }
        Err(e) => Err(e.to_string()),
    }
}

/// How many of clamp's connections to `db` are encrypted, and how many are not.
async fn encrypted(admin: &tokio_postgres::Client, db: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'clamp' AND a.datname = $1",
            &[&db],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn works(s: &TestServer) {
    s.create_workflow(&simple_workflow("tls-db")).await;
    let r = s
        .post_json("/serviceRequest/tls-db", &json!({"x": 1}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_means_what_libpq_says() {
    let pg = TlsCluster::start();
    let admin = pg.admin().await;
    admin
        .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
        .await
        .unwrap();
    let ca = pg.ca.ca_file();
    let ca = ca.display();
    let stranger = Ca::new("stranger");

    // verify-full against the name the certificate holds: connects, creates the
    // database, migrates, and every connection is encrypted.
    let s = start(&pg.url(
        "postgres",
        "a",
        "db.internal",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    works(&s).await;
    let (tls, plain) = encrypted(&admin, "a").await;
    assert!(tls >= 1 && plain == 0, "{tls} encrypted, {plain} plain");
    s.shutdown().await;

    // verify-full against an address the certificate does not name: refused, saying so.
    let e = start(&pg.url(
        "postgres",
        "b",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .err()
    .expect("verify-full accepted a certificate for another name");
    assert!(e.contains("not valid for host name 127.0.0.1"), "{e}");
    assert!(!e.contains('\n'), "{e}");

    // verify-ca checks the chain only: the same address is fine.
    let s = start(&pg.url(
        "postgres",
        "b",
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    works(&s).await;
    s.shutdown().await;

    // Another CA: refused, whichever mode checks the chain (require too, with a root).
    for mode in ["verify-full", "verify-ca", "require"] {
        let e = start(&pg.url(
            "postgres",
            "c",
            "db.internal",
            &format!(
                "sslmode={mode}&sslrootcert={}",
                stranger.ca_file().display()
            ),
        ))
        .await
        .err()
        .unwrap_or_else(|| panic!("{mode} accepted a certificate of an unknown CA"));
        assert!(e.contains("not signed by a trusted CA"), "{mode}: {e}");
    }

    // require without a root certificate: encrypted, not verified (libpq's meaning).
    let s = start(&pg.url("postgres", "d", "127.0.0.1", "sslmode=require"))
        .await
        .unwrap();
    works(&s).await;
    // Its connections are there, and encrypted (no plain one is not enough: none at all
    // would pass that too).
    let (tls, plain) = encrypted(&admin, "d").await;
    assert!(
        tls >= 1 && plain == 0,
        "require: {tls} encrypted, {plain} plain"
    );
    s.shutdown().await;

    // prefer (the default) takes TLS when the server offers it; disable never does.
    let s = start(&pg.url("postgres", "e", "127.0.0.1", ""))
        .await
        .unwrap();
    works(&s).await;
    let (tls, plain) = encrypted(&admin, "e").await;
    assert!(
        tls >= 1 && plain == 0,
        "prefer: {tls} encrypted, {plain} plain"
    );
    s.shutdown().await;
    let s = start(&pg.url("postgres", "f", "127.0.0.1", "sslmode=disable"))
        .await
        .unwrap();
    works(&s).await;
    let (tls, plain) = encrypted(&admin, "f").await;
    assert!(
        tls == 0 && plain >= 1,
        "disable: {tls} encrypted, {plain} plain"
    );
    s.shutdown().await;

    // A user the server admits by client certificate only: with it, in; without, out.
    let client = pg.ca.client("certuser", "certuser");
    let with_cert = format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        client.cert.display(),
        client.key.display()
    );
    let s = start(&pg.url("certuser", "g", "db.internal", &with_cert))
        .await
        .unwrap();
    works(&s).await;
    s.shutdown().await;
    let e = start(&pg.url(
        "certuser",
        "h",
        "db.internal",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .err()
    .expect("a user that needs a client certificate got in without one");
    assert!(e.contains("certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_refuses_a_server_without_tls_and_prefer_falls_back() {
    let port = free_port();
    let dir = format!("/tmp/clamp-it-pgplain-{}-{port}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    let _cluster = DevCluster { dir: dir.clone() };
    DevCluster::start(&dir, port);
    let url =
        |db: &str, params: &str| format!("postgres://postgres@127.0.0.1:{port}/{db}?{params}");
    let e = start(&url("a", "sslmode=require"))
        .await
        .err()
        .expect("require connected in plain text");
    assert!(e.contains("does not support TLS"), "{e}");
    let s = start(&url("b", "sslmode=prefer")).await.unwrap();
    works(&s).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_certificate_exits_1_with_one_line() {
    let pg = TlsCluster::start();
    let stranger = Ca::new("stranger-bin");
    let url = pg.url(
        "postgres",
        "clamp",
        "db.internal",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            stranger.ca_file().display()
        ),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_clamp"))
        .args(["--bind", "127.0.0.1", "--port", "0", "--database-url", &url])
        .env("LOG_LEVEL", "error")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("not signed by a trusted CA"), "{stderr}");
    assert!(lines[0].contains("db.internal"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_never_answers_costs_one_deadline_then_the_next_is_tried() {
    // A host that takes connections and then says nothing, as a frozen server does.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    // Connections it was asked for: whether a host was tried is counted, not timed.
    let knocks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = knocks.clone();
    let _held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            kept.push(s);
        }
    });
    let knocked = || knocks.load(std::sync::atomic::Ordering::SeqCst);
    let base = pg_base();
    let real = base.rsplit(':').next().unwrap().to_string();
    let url = format!("postgres://postgres@127.0.0.1:{silent_port},127.0.0.1:{real}/postgres");
    let mut cfg = config(&url);
    cfg.db_connect_timeout = Duration::from_millis(500);
    let connector = clamp::store::connect::PgConnector::for_config(&cfg).unwrap();
    let t0 = Instant::now();
    let c = connector
        .connect(None)
        .await
        .expect("the second host connects");
    let took = t0.elapsed();
    assert_eq!(c.host, 1);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(knocked(), 1, "the silent host was tried once");
    // The silent host is tried last while it is remembered as failed: the next host
    // answers, so it is not asked at all.
    let c2 = connector.connect(None).await.unwrap();
    assert_eq!(c2.host, 1);
    assert_eq!(knocked(), 1, "the silent host was tried first again");
    // Every host failing says why, each.
    let url = format!(
        "postgres://postgres@127.0.0.1:{silent_port},127.0.0.1:{}/postgres",
        free_port()
    );
    let mut cfg = config(&url);
    cfg.db_connect_timeout = Duration::from_millis(300);
    let e = clamp::store::connect::PgConnector::for_config(&cfg)
        .unwrap()
        .connect(None)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("127.0.0.1:{silent_port}: no answer within 300 ms")),
        "{e}"
    );
    assert!(e.contains("refused"), "{e}");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_is_cancelled_over_the_connections_tls() {
    let pg = TlsCluster::start();
    let ca = pg.ca.ca_file();
    let url = pg.url(
        "postgres",
        "postgres",
        "db.internal",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    let mut cfg = config(&url);
    cfg.database = clamp::config::Database::parse(&url, &|_| None).unwrap();
    let connector = clamp::store::connect::PgConnector::for_config(&cfg).unwrap();
    let c = connector.connect(None).await.unwrap();
    let token = c.client.cancel_token();
    let client = std::sync::Arc::new(c.client);
    let sleeper = {
        let client = client.clone();
        tokio::spawn(async move { client.simple_query("SELECT pg_sleep(60)").await })
    };
    // Cancel once the statement is running.
    let admin = pg.admin().await;
    wait_for("the sleep to run", Duration::from_secs(5), || async {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    })
    .await;
    let t0 = Instant::now();
    connector.cancel(token, c.host).await;
    let e = sleeper
        .await
        .unwrap()
        .expect_err("the sleep was not cancelled");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}
