//! Databases for tests: a fresh one per test on the shared Postgres (dropped with its
//! value), and a throwaway cluster from `scripts/dev-postgres.sh` for tests that stop
//! or restart Postgres itself.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::NoTls;

use super::alone::Share;

/// Where the test Postgres is (a server URL without a database).
pub fn pg_base() -> String {
    std::env::var("CLAMP_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A database of this test's own, dropped when the value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    /// The machine, shared with other tests or alone (`support::alone`).
    _share: Share,
}

impl TestDb {
    /// A fresh, unique database name; the server creates it (which tests that path too).
    pub fn new() -> TestDb {
        Self::with_share(Share::shared())
    }

    /// A database for a test that bounds how long the server takes: no other test runs
    /// while it is held (`support::alone`).
    pub fn alone() -> TestDb {
        Self::with_share(Share::alone())
    }

    fn with_share(_share: Share) -> TestDb {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "clamp_it_{}_{}_{}",
            std::process::id(),
            n,
            fastrand::u32(..)
        );
        let url = format!("{}/{}", pg_base(), name);
        TestDb { name, url, _share }
    }

    /// A direct connection, for checking what the server wrote.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .expect("test db connects");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .expect("count query")
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot be async; a short-lived runtime on its own thread does the cleanup.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((c, conn)) =
                    tokio_postgres::connect(&format!("{}/postgres", pg_base()), NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = c
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// A throwaway cluster from `scripts/dev-postgres.sh`, stopped and removed on drop.
pub struct DevCluster {
    pub dir: String,
}

impl DevCluster {
    pub fn script() -> String {
        format!("{}/scripts/dev-postgres.sh", env!("CARGO_MANIFEST_DIR"))
    }

    pub fn start(dir: &str, port: u16) -> String {
        let out = std::process::Command::new(Self::script())
            .args(["start", dir, &port.to_string()])
            .output()
            .expect("dev-postgres.sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    pub fn stop(&self) {
        let out = std::process::Command::new(Self::script())
            .args(["stop", &self.dir])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Migrates `db` as a release that stopped at migration `last` would have (a database to
/// upgrade), without starting a server.
pub async fn migrate_to(db: &TestDb, last: i32) {
    let cfg = clamp::config::Config::for_tests(&db.url);
    let connector = clamp::store::connect::PgConnector::for_config(&cfg).unwrap();
    let mut c = clamp::store::migrate::connect_or_create(&connector)
        .await
        .unwrap();
    clamp::store::migrate::run_to(&mut c, last).await.unwrap();
}

/// Stores `def` as version 1 of its workflow straight into the tables (a database to
/// upgrade, with no server to define it through).
pub async fn insert_workflow(c: &tokio_postgres::Client, def: &serde_json::Value) {
    c.execute(
        "WITH w AS (INSERT INTO workflows (id, name, description, enabled, definition, version) \
             VALUES (gen_random_uuid(), $1, '', true, $2::text::jsonb || jsonb_build_object('created_at', now(), 'updated_at', now(), 'version', 1), 1) \
             RETURNING name, definition, created_at) \
         INSERT INTO workflow_versions (name, version, description, definition, created_at) \
         SELECT name, 1, '', definition, created_at FROM w",
        &[&def["name"].as_str().unwrap(), &def.to_string()],
    )
    .await
    .unwrap();
}

/// The names of the tables or indexes attached to `parent` (a partitioned table's
/// partitions, a partitioned index's partitions' indexes).
pub async fn partitions_of(c: &tokio_postgres::Client, parent: &str) -> Vec<String> {
    c.query(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = $1::text::regclass",
        &[&parent],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}
