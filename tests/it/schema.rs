//! The schema after every migration, checked in as `src/store/schema.sql`: a fresh database
//! is migrated by a server starting on it, its catalog is rendered (tables with their
//! columns in order, constraints, indexes, row types, sequences, views, functions and
//! triggers, each sorted by name), and the rendering must equal the file. Run with
//! `CLAMP_BLESS=1` to rewrite the file instead. Every statement of the store
//! (`store::statements`) is then prepared against that schema, so none names a column or
//! a type the migrations do not make.

use std::fmt::Write;

use tokio_postgres::Client;

use crate::support::*;

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/schema.sql");

const HEADER: &str = "\
-- The schema of Clamp's database after every migration (src/store/migrations/), as
-- Postgres's catalog describes it: tables with their columns in order, constraints,
-- indexes, row types, sequences, views, functions and triggers, each sorted by name.
-- Generated, do not edit: the integration test schema::schema_sql_is_current (tests/it/schema.rs)
-- migrates a fresh database and fails when this file is stale; regenerate it with
--     CLAMP_BLESS=1 cargo test --test it schema::
";

#[tokio::test]
async fn schema_sql_is_current() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let c = db.client().await;
    let want = format!("{HEADER}{}", render(&c).await);
    s.shutdown().await;
    if std::env::var_os("CLAMP_BLESS").is_some() {
        std::fs::write(PATH, &want).expect("schema.sql is writable");
        return;
    }
    let have = std::fs::read_to_string(PATH).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or("its end".to_string(), |n| format!("line {}", n + 1));
        panic!(
            "src/store/schema.sql is stale (first difference at {line}): regenerate it with \
             `CLAMP_BLESS=1 cargo test --test it schema::` and review the diff"
        );
    }
}

#[tokio::test]
async fn every_statement_prepares_against_the_schema() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let c = db.client().await;
    let mut refused = Vec::new();
    for (name, sql) in clamp::store::statements::all() {
        if let Err(e) = c.prepare(sql).await {
            refused.push(format!("{name}: {}", clamp_error(&e)));
        }
    }
    s.shutdown().await;
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

fn clamp_error(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

/// The catalog of the `public` schema, rendered as DDL-like text.
async fn render(c: &Client) -> String {
    let mut out = String::new();
    tables(c, &mut out).await;
    row_types(c, &mut out).await;
    for (title, sql) in [
        ("sequences", SEQUENCES),
        ("views", VIEWS),
        ("functions", FUNCTIONS),
        ("triggers", TRIGGERS),
        ("extensions", EXTENSIONS),
    ] {
        let rows = c.query(sql, &[]).await.expect(title);
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n-- {title}");
        for r in rows {
            let _ = writeln!(out, "{};", r.get::<_, String>(0).trim_end());
        }
    }
    out
}

/// Tables and partitioned tables, not their partitions (named by the time they begin,
/// made by the server as time goes: `store::partitions`).
const TABLES: &str = "\
SELECT c.oid, c.relname, coalesce(array_to_string(c.reloptions, ', '), ''),
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname";

const COLUMNS: &str = "\
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum";

/// Not-null constraints are the columns' own (Postgres 18 lists them here too).
const CONSTRAINTS: &str = "\
SELECT conname, pg_get_constraintdef(oid)
FROM pg_constraint WHERE conrelid = $1 AND contype <> 'n'
ORDER BY conname";

const INDEXES: &str = "\
SELECT pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1
ORDER BY c.relname";

/// Composite types of their own (not a table's row type).
const ROW_TYPES: &str = "\
SELECT t.typname, t.typrelid
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
JOIN pg_class c ON c.oid = t.typrelid
WHERE n.nspname = 'public' AND t.typtype = 'c' AND c.relkind = 'c'
ORDER BY t.typname";

const SEQUENCES: &str = "\
SELECT 'CREATE SEQUENCE ' || c.relname || ' AS ' || format_type(s.seqtypid, NULL)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_sequence s ON s.seqrelid = c.oid
WHERE n.nspname = 'public'
ORDER BY c.relname";

const VIEWS: &str = "\
SELECT 'CREATE VIEW ' || c.relname || ' AS' || chr(10) || pg_get_viewdef(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('v', 'm')
ORDER BY c.relname";

const FUNCTIONS: &str = "\
SELECT pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')
ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)";

/// A partitioned table's own triggers, not the clones on its partitions (whose names
/// carry the time they were made).
const TRIGGERS: &str = "\
SELECT pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND NOT t.tgisinternal AND t.tgparentid = 0
ORDER BY c.relname, t.tgname";

const EXTENSIONS: &str = "\
SELECT 'CREATE EXTENSION ' || extname FROM pg_extension WHERE extname <> 'plpgsql'
ORDER BY extname";

/// Each table: its columns in order, its storage options, constraints and indexes.
async fn tables(c: &Client, out: &mut String) {
    for t in c.query(TABLES, &[]).await.expect("tables") {
        let oid: u32 = t.get(0);
        let name: String = t.get(1);
        let options: String = t.get(2);
        let partitioned: Option<String> = t.get(3);
        let _ = writeln!(out, "\nCREATE TABLE {name} (");
        let columns = c.query(COLUMNS, &[&oid]).await.expect("columns");
        let n = columns.len();
        for (i, col) in columns.iter().enumerate() {
            let (col_name, ty, not_null, default): (String, String, bool, Option<String>) =
                (col.get(0), col.get(1), col.get(2), col.get(3));
            let mut line = format!("    {col_name} {ty}");
            if not_null {
                line.push_str(" NOT NULL");
            }
            if let Some(d) = default {
                let _ = write!(line, " DEFAULT {d}");
            }
            let comma = if i + 1 < n { "," } else { "" };
            let _ = writeln!(out, "{line}{comma}");
        }
        match (options.as_str(), partitioned) {
            (_, Some(key)) => {
                let _ = writeln!(out, ") PARTITION BY {key};");
            }
            ("", None) => out.push_str(");\n"),
            (o, None) => {
                let _ = writeln!(out, ") WITH ({o});");
            }
        }
        for con in c.query(CONSTRAINTS, &[&oid]).await.expect("constraints") {
            let (con_name, def): (String, String) = (con.get(0), con.get(1));
            let _ = writeln!(out, "ALTER TABLE {name} ADD CONSTRAINT {con_name} {def};");
        }
        for idx in c.query(INDEXES, &[&oid]).await.expect("indexes") {
            let _ = writeln!(out, "{};", idx.get::<_, String>(0));
        }
    }
}

/// The composite types the statements take rows as (migration 15).
async fn row_types(c: &Client, out: &mut String) {
    for t in c.query(ROW_TYPES, &[]).await.expect("row types") {
        let (name, relid): (String, u32) = (t.get(0), t.get(1));
        let fields = c.query(COLUMNS, &[&relid]).await.expect("fields");
        let fields: Vec<String> = fields
            .iter()
            .map(|f| format!("    {} {}", f.get::<_, String>(0), f.get::<_, String>(1)))
            .collect();
        let _ = writeln!(out, "\nCREATE TYPE {name} AS (\n{}\n);", fields.join(",\n"));
    }
}
