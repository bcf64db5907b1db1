//! Every statement the store sends to Postgres, by name, so the SQL can be read whole.
//!
//! The statements are consts of the files that run them, spliced with `concat!` from the
//! fragments of `sql.rs` and `crate::status::status_sql!`; read in the source, a statement
//! is in pieces. [`all`] lists each one expanded, and [`templates`] the few built per call
//! (a value or an ORDER BY in their text) with placeholders in braces. A unit test renders
//! both into `src/store/statements.sql` and fails when that file is stale, so a change to
//! a fragment shows, in review, every statement it changes. The migrations themselves are
//! not here: `src/store/schema.sql` holds the schema they build.

use super::{
    audit, buffer, cancel, children, compensations, connect, dead_letters, deadlines, delayed,
    events, fan, housekeeping, idempotency, kafka_offsets, keeper, lanes, leases, migrate,
    notifications, partitions, pauses, pool, queries, rerun, retention, retry, schedules, search,
    sessions, slots, stats, status, step_responses, transitions, triggers,
};

/// Every fixed statement of the store, expanded: (`file::CONST`, text), grouped by file.
pub fn all() -> Vec<(&'static str, &'static str)> {
    vec![
        // Creates.
        ("pool::sql::INSERT_REQUESTS", pool::sql::INSERT_REQUESTS),
        ("idempotency::INSERT_KEYED", idempotency::INSERT_KEYED),
        (
            "idempotency::INSERT_KEYED_CONFLICTS",
            idempotency::INSERT_KEYED_CONFLICTS,
        ),
        ("idempotency::LOOKUP", idempotency::LOOKUP),
        ("idempotency::DELETE_EXPIRED", idempotency::DELETE_EXPIRED),
        (
            "buffer::RESET_STATEMENT_TIMEOUT",
            buffer::RESET_STATEMENT_TIMEOUT,
        ),
        ("delayed::INSERT", delayed::INSERT),
        ("slots::LOCK_MANY", slots::LOCK_MANY),
        ("partitions::REQUESTS_FIRST", partitions::REQUESTS_FIRST),
        ("slots::INSERT", slots::INSERT),
        ("slots::ADMIT", slots::ADMIT),
        ("slots::KEYS_OF", slots::KEYS_OF),
        ("slots::WAITING_WORKFLOWS", slots::WAITING_WORKFLOWS),
        ("slots::DUE_KEYS", slots::DUE_KEYS),
        ("slots::WAITING_COUNTS", slots::WAITING_COUNTS),
        ("slots::WAITING_BY_KEY", slots::WAITING_BY_KEY),
        ("slots::FORGET_STARTS", slots::FORGET_STARTS),
        // The executor's statements.
        ("leases::CLAIM", leases::CLAIM),
        ("leases::RENEW", leases::RENEW),
        ("leases::RELEASE", leases::RELEASE),
        ("leases::LOAD_CONTEXT", leases::LOAD_CONTEXT),
        (
            "transitions::WRITE_TRANSITIONS",
            transitions::WRITE_TRANSITIONS,
        ),
        (
            "transitions::WRITE_TRANSITIONS_TELLING",
            transitions::WRITE_TRANSITIONS_TELLING,
        ),
        (
            "step_responses::REQUEST_STATE",
            step_responses::REQUEST_STATE,
        ),
        ("step_responses::RESUME", step_responses::RESUME),
        ("step_responses::ANSWERED", step_responses::ANSWERED),
        ("cancel::CANCEL", cancel::CANCEL),
        ("cancel::CANCEL_COMPENSATING", cancel::CANCEL_COMPENSATING),
        ("cancel::ASKED_AT_CREATE", cancel::ASKED_AT_CREATE),
        ("cancel::STATUS_AND_REASON", cancel::STATUS_AND_REASON),
        ("retry::RETRY", retry::RETRY),
        ("retry::STATUS", retry::STATUS),
        ("retry::RETRY_MATCHING", retry::RETRY_MATCHING),
        ("rerun::SOURCE", rerun::SOURCE),
        ("rerun::LAST_RECORDS", rerun::LAST_RECORDS),
        ("rerun::INSERT", rerun::INSERT),
        ("children::START", children::START),
        ("children::UNTOLD", children::UNTOLD),
        ("children::TOLD", children::TOLD),
        ("lanes::RECORDS", lanes::RECORDS),
        ("compensations::LAST_RECORDS", compensations::LAST_RECORDS),
        ("compensations::UNDOABLE", compensations::UNDOABLE),
        ("compensations::UNDO_CHILDREN", compensations::UNDO_CHILDREN),
        ("compensations::GO_ON", compensations::GO_ON),
        ("fan::START", fan::START),
        ("fan::RESTART", fan::RESTART),
        ("fan::RUNNING", fan::RUNNING),
        ("fan::HOLD", fan::HOLD),
        ("fan::REOPEN", fan::REOPEN),
        ("fan::COUNT", fan::COUNT),
        ("fan::CANCEL_REST", fan::CANCEL_REST),
        ("fan::PARTS", fan::PARTS),
        ("fan::JOIN", fan::JOIN),
        ("fan::LAST_PART", fan::LAST_PART),
        ("fan::NEXT_ITERATION", fan::NEXT_ITERATION),
        ("fan::DONE", fan::DONE),
        ("fan::DUE", fan::DUE),
        ("fan::PLACE", fan::PLACE),
        ("fan::CHILDREN", fan::CHILDREN),
        ("deadlines::DUE", deadlines::DUE),
        ("deadlines::EXPIRE", deadlines::EXPIRE),
        ("deadlines::PAST_DEADLINE", deadlines::PAST_DEADLINE),
        ("deadlines::END", deadlines::END),
        ("deadlines::TIMERS", deadlines::TIMERS),
        ("audit::RECORD", audit::RECORD),
        ("audit::LIST", audit::LIST),
        ("sessions::CREATE", sessions::CREATE),
        ("sessions::TOUCH", sessions::TOUCH),
        ("sessions::END", sessions::END),
        ("housekeeping::AUDIT", housekeeping::AUDIT),
        ("housekeeping::DEAD_LETTERS", housekeeping::DEAD_LETTERS),
        ("housekeeping::NOTIFICATIONS", housekeeping::NOTIFICATIONS),
        ("housekeeping::SESSIONS", housekeeping::SESSIONS),
        ("events::LOCK", events::LOCK),
        ("events::KEPT", events::KEPT),
        ("events::PAUSE", events::PAUSE),
        ("events::DELIVER", events::DELIVER),
        ("events::FORGET", events::FORGET),
        ("events::TAKE", events::TAKE),
        ("notifications::CLAIM", notifications::CLAIM),
        ("notifications::DELIVERED", notifications::DELIVERED),
        ("notifications::AGAIN", notifications::AGAIN),
        ("notifications::FAILED", notifications::FAILED),
        ("notifications::OF_REQUEST", notifications::OF_REQUEST),
        ("pauses::LIST", pauses::LIST),
        ("pauses::GET", pauses::GET),
        ("pauses::PAUSE", pauses::PAUSE),
        ("pauses::UNPAUSE", pauses::UNPAUSE),
        ("pauses::FREE", pauses::FREE),
        ("pauses::PARK", pauses::PARK),
        ("pauses::PARKED_COUNTS", pauses::PARKED_COUNTS),
        ("triggers::INSERT", triggers::INSERT),
        ("triggers::GET", triggers::GET),
        ("triggers::LIST", triggers::LIST),
        ("triggers::PUT", triggers::PUT),
        ("triggers::DELETE", triggers::DELETE),
        ("triggers::SET_PAUSED", triggers::SET_PAUSED),
        ("schedules::INSERT", schedules::INSERT),
        ("schedules::NOW", schedules::NOW),
        ("schedules::GET", schedules::GET),
        ("schedules::LIST", schedules::LIST),
        ("schedules::PUT", schedules::PUT),
        ("schedules::DELETE", schedules::DELETE),
        ("schedules::PAUSE", schedules::PAUSE),
        ("schedules::RESUME", schedules::RESUME),
        ("schedules::LAST_FIRES", schedules::LAST_FIRES),
        ("schedules::LAST_FIRES_OF", schedules::LAST_FIRES_OF),
        ("schedules::DUE", schedules::DUE),
        ("schedules::SET_NEXT", schedules::SET_NEXT),
        ("schedules::FIRE", schedules::FIRE),
        ("schedules::FIRE_AT", schedules::FIRE_AT),
        ("schedules::PRUNE", schedules::PRUNE),
        ("partitions::TRY_LOCK", partitions::TRY_LOCK),
        ("partitions::LAYOUT", partitions::LAYOUT),
        ("partitions::LIST", partitions::LIST),
        ("partitions::ADD", partitions::ADD),
        ("partitions::INSERTED", partitions::INSERTED),
        ("keeper::UNLOCK", keeper::UNLOCK),
        ("retention::STILL_OPEN", retention::STILL_OPEN),
        ("keeper::OVERRIDES", keeper::OVERRIDES),
        ("keeper::BOUNDS", keeper::BOUNDS),
        ("keeper::HEAP_BYTES", keeper::HEAP_BYTES),
        ("keeper::SWAP", keeper::SWAP),
        ("keeper::SESSION_TIMEOUT", keeper::SESSION_TIMEOUT),
        ("keeper::SESSION_SEQSCAN", keeper::SESSION_SEQSCAN),
        ("keeper::SWAP_LOCK_TIMEOUT", keeper::SWAP_LOCK_TIMEOUT),
        ("keeper::LOCK_TIMEOUT", keeper::LOCK_TIMEOUT),
        ("keeper::STARTUP_LOCK_TIMEOUT", keeper::STARTUP_LOCK_TIMEOUT),
        ("keeper::LOCK", keeper::LOCK),
        ("keeper::RESET_LOCK_TIMEOUT", keeper::RESET_LOCK_TIMEOUT),
        (
            "keeper::RESET_STATEMENT_TIMEOUT",
            keeper::RESET_STATEMENT_TIMEOUT,
        ),
        // Reads.
        ("status::GET_HEADS", status::GET_HEADS),
        ("status::GET_WHOLE", status::GET_WHOLE),
        ("status::PROCEEDING", status::PROCEEDING),
        ("status::SLOT_AHEAD", status::SLOT_AHEAD),
        ("queries::INSERT_WORKFLOW", queries::INSERT_WORKFLOW),
        ("queries::PUT_WORKFLOW", queries::PUT_WORKFLOW),
        ("queries::WORKFLOW_VERSION", queries::WORKFLOW_VERSION),
        ("queries::WORKFLOW_VERSIONS", queries::WORKFLOW_VERSIONS),
        ("queries::DEFINITION", queries::DEFINITION),
        ("queries::ALL_WORKFLOWS", queries::ALL_WORKFLOWS),
        ("queries::COUNT_WORKFLOWS", queries::COUNT_WORKFLOWS),
        ("queries::REQUESTS_PAGE", queries::REQUESTS_PAGE),
        // The search: its optional filters are NULL-able parameters, so each of these is
        // the whole statement; which one runs depends on the filter's shape.
        ("search::SEARCH_ALL", search::SEARCH_ALL),
        ("search::SEARCH_WORKFLOW", search::SEARCH_WORKFLOW),
        ("search::SEARCH_SETTLED_BADLY", search::SEARCH_SETTLED_BADLY),
        (
            "search::SEARCH_SETTLED_BADLY_WORKFLOW",
            search::SEARCH_SETTLED_BADLY_WORKFLOW,
        ),
        ("search::SEARCH_RERUNS", search::SEARCH_RERUNS),
        ("search::SEARCH_AWAITING", search::SEARCH_AWAITING),
        ("search::SEARCH_LABELS_RECENT", search::SEARCH_LABELS_RECENT),
        ("search::SEARCH_LABELS", search::SEARCH_LABELS),
        ("search::SEARCH_WAITING_SLOT", search::SEARCH_WAITING_SLOT),
        ("stats::COUNTS", stats::COUNTS),
        // Brokers' state.
        ("kafka_offsets::GET", kafka_offsets::GET),
        ("kafka_offsets::SET", kafka_offsets::SET),
        ("kafka_offsets::TRY_LOCK", kafka_offsets::TRY_LOCK),
        ("kafka_offsets::UNLOCK", kafka_offsets::UNLOCK),
        ("kafka_offsets::JOIN", kafka_offsets::JOIN),
        ("kafka_offsets::MEMBERS", kafka_offsets::MEMBERS),
        ("dead_letters::INSERT", dead_letters::INSERT),
        // Connections and migrations.
        ("connect::READ_ONLY", connect::READ_ONLY),
        ("pool::sql::EMPTY", pool::sql::EMPTY),
        ("pool::sql::PING", pool::sql::PING),
        ("pool::sql::GENERIC_PLANS", pool::sql::GENERIC_PLANS),
        ("pool::sql::BEGIN", pool::sql::BEGIN),
        ("pool::sql::COMMIT", pool::sql::COMMIT),
        ("migrate::MIGRATION_TIMEOUT", migrate::MIGRATION_TIMEOUT),
        ("migrate::LOCK", migrate::LOCK),
        ("migrate::CREATE_LEDGER", migrate::CREATE_LEDGER),
        ("migrate::APPLIED", migrate::APPLIED),
        ("migrate::RECORD", migrate::RECORD),
    ]
}

/// The statements built per call, by the function that builds them, with each value in
/// their text shown as a placeholder in braces.
pub fn templates() -> Vec<(&'static str, String)> {
    // A set named by placeholders, for the statements that name a set's partitions.
    let set = partitions::Set {
        suffix: "{suffix}".into(),
        lo: None,
        hi: None,
        detaching: false,
    };
    vec![
        (
            "buffer::set_statement_timeout",
            buffer::set_statement_timeout("{ms}"),
        ),
        (
            "queries::workflows_page_sql",
            queries::workflows_page_sql("{order}"),
        ),
        (
            "migrate::create_database",
            migrate::create_database("{name}"),
        ),
        ("retention::look_sql", retention::look_sql(&set)),
        ("retention::export_sql", retention::export_sql(&set)),
        (
            "retention::detach_sql",
            retention::detach_sql(&set, false).join(";\n"),
        ),
        (
            "retention::detach_sql (finalize)",
            retention::detach_sql(&set, true).join(";\n"),
        ),
        (
            "retention::attach_sql",
            retention::attach_sql(&set).join(";\n"),
        ),
        ("retention::drop_sql", retention::drop_sql(&set)),
        (
            "keeper::add_bound_sql",
            keeper::add_bound_sql("{table}", "{key}", "{bound}"),
        ),
        (
            "keeper::validate_bound_sql",
            keeper::validate_bound_sql("{table}"),
        ),
        ("keeper::drop_bound_sql", keeper::drop_bound_sql("{table}")),
        (
            "keeper::statement_timeout_sql",
            keeper::statement_timeout_sql("{ms}"),
        ),
    ]
}

/// Lines longer than this are wrapped.
const WIDTH: usize = 100;

/// Where a long line is broken, longest first (so `LEFT JOIN` is not taken as `JOIN`).
const CLAUSES: [&str; 10] = [
    "LEFT JOIN",
    "ON CONFLICT",
    "ORDER BY",
    "GROUP BY",
    "RETURNING",
    "FROM",
    "WHERE",
    "JOIN",
    "LIMIT",
    "VALUES",
];

/// The text of `statements.sql`: a header, then each statement under a `-- name` line,
/// its lines trimmed at the end and long ones broken before their clauses.
pub fn render() -> String {
    let mut out = String::from(
        "-- Every statement the server sends to Postgres, expanded: the consts and macros of\n\
         -- src/store/ as src/store/statements.rs lists them, in its order.\n\
         -- Generated, do not edit: the unit test store::statements::tests::statements_sql_is_current\n\
         -- fails when this file is stale; regenerate it with\n\
         --     CLAMP_BLESS=1 cargo test --lib store::statements\n",
    );
    for (name, sql) in all() {
        out.push_str(&format!("\n-- {name}\n{};\n", format(sql)));
    }
    for (name, sql) in templates() {
        out.push_str(&format!(
            "\n-- {name}\n-- (a template, built per call: the parts in braces are filled in)\n{};\n",
            format(&sql)
        ));
    }
    out
}

/// A statement as it is rendered: no blank lines around it, no trailing spaces, and lines
/// longer than `WIDTH` wrapped (`wrap`).
fn format(sql: &str) -> String {
    let mut lines = Vec::new();
    for line in sql.trim().lines() {
        lines.extend(wrap(line.trim_end()));
    }
    lines.join("\n")
}

/// A line no longer than `WIDTH`, or the pieces of a longer one: broken before its clause
/// keywords at the shallowest parenthesis depth that has any, else after commas at the
/// shallowest depth that has any (as many items a piece as fit); the pieces after the
/// first are indented four spaces more, and wrapped again in turn. Quoted text is never
/// broken.
fn wrap(line: &str) -> Vec<String> {
    if line.len() <= WIDTH {
        return vec![line.to_string()];
    }
    let indent = &line[..line.len() - line.trim_start().len()];
    let cuts = clause_cuts(line).or_else(|| comma_cuts(line, indent.len() + 4));
    // A comma that ends the line is no place to break it.
    let Some(cuts) = cuts.filter(|c| c.iter().all(|&c| c < line.len())) else {
        return vec![line.to_string()];
    };
    let mut bounds = vec![0];
    bounds.extend(cuts);
    bounds.push(line.len());
    let mut out = Vec::new();
    for (n, w) in bounds.windows(2).enumerate() {
        let piece = line[w[0]..w[1]].trim();
        let piece = match n {
            0 => format!("{indent}{piece}"),
            _ => format!("{indent}    {piece}"),
        };
        // Every piece is shorter than the line, so wrapping ends.
        match piece.len() < line.len() {
            true => out.extend(wrap(&piece)),
            false => out.push(piece),
        }
    }
    out
}

/// Each byte of `line` with its parenthesis depth, outside quotes only (None inside).
fn depths(line: &str) -> Vec<Option<usize>> {
    let (mut depth, mut quoted) = (0usize, false);
    line.bytes()
        .map(|b| {
            match b {
                b'\'' => quoted = !quoted,
                b'(' if !quoted => depth += 1,
                b')' if !quoted => depth = depth.saturating_sub(1),
                _ => {}
            }
            (!quoted && b != b'\'').then_some(depth)
        })
        .collect()
}

/// Where to break `line` before clause keywords: the spaces before each keyword at the
/// shallowest depth with one (not before the line's first word).
fn clause_cuts(line: &str) -> Option<Vec<usize>> {
    let d = depths(line);
    let first_word = line.len() - line.trim_start().len();
    let at: Vec<(usize, usize)> = (first_word + 1..line.len())
        .filter(|&i| line.as_bytes()[i] == b' ')
        .filter_map(|i| Some((i, d[i]?)))
        .filter(|&(i, _)| {
            let rest = &line[i + 1..];
            CLAUSES.iter().any(|c| {
                rest.starts_with(c)
                    && rest[c.len()..].starts_with([' ', '\n'])
                    && !(*c == "JOIN" && line[..i].ends_with("LEFT"))
            })
        })
        .collect();
    let shallowest = at.iter().map(|&(_, d)| d).min()?;
    Some(
        at.into_iter()
            .filter(|&(_, d)| d == shallowest)
            .map(|(i, _)| i)
            .collect(),
    )
}

/// Where to break `line` after commas at the shallowest depth with one: as many items on
/// a piece as fit in `WIDTH` (pieces after the first start `indent` in), at least one.
fn comma_cuts(line: &str, indent: usize) -> Option<Vec<usize>> {
    let d = depths(line);
    let commas: Vec<(usize, usize)> = line
        .bytes()
        .enumerate()
        .filter(|&(i, b)| b == b',' && i + 1 < line.len())
        .filter_map(|(i, _)| Some((i + 1, d[i]?)))
        .collect();
    let shallowest = commas.iter().map(|&(_, d)| d).min()?;
    let mut cuts = Vec::new();
    let (mut start, mut room, mut last_fit) = (0, WIDTH, None);
    for end in commas
        .into_iter()
        .filter(|&(_, d)| d == shallowest)
        .map(|(i, _)| i)
    {
        if end - start <= room {
            last_fit = Some(end);
            continue;
        }
        let cut = last_fit.unwrap_or(end);
        cuts.push(cut);
        (start, room) = (cut, WIDTH - indent);
        last_fit = (end > cut && end - start <= room).then_some(end);
    }
    if line.len() - start > room {
        cuts.extend(last_fit);
    }
    (!cuts.is_empty()).then_some(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/statements.sql");

    #[test]
    fn statements_sql_is_current() {
        let want = render();
        if std::env::var_os("CLAMP_BLESS").is_some() {
            std::fs::write(PATH, &want).expect("statements.sql is writable");
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
                "src/store/statements.sql is stale (first difference at {line}): \
                 regenerate it with `CLAMP_BLESS=1 cargo test --lib store::statements` \
                 and review the diff"
            );
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = all().iter().map(|(n, _)| *n).collect();
        names.extend(templates().iter().map(|(n, _)| *n));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a statement is listed twice");
    }

    /// Every `const …: &str` of the store's files is listed, and no statement is written
    /// inline where it runs: a new statement cannot miss `statements.sql`.
    #[test]
    fn every_statement_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store");
        let listed: Vec<&str> = all().iter().map(|(n, _)| *n).collect();
        let mut missing = Vec::new();
        // The store's files and those of its rooms (`conn/`, `intake/`), each named by
        // its file as the store re-exports it.
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(dir).expect("src/store is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() && path.join("mod.rs").exists() {
                for inner in std::fs::read_dir(&path).expect("a room of src/store is readable") {
                    paths.push(inner.expect("a directory entry").path());
                }
            } else {
                paths.push(path);
            }
        }
        for path in paths {
            let file = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            if path.extension().is_none_or(|e| e != "rs") || file == "statements" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a store file is readable");
            // Tests may hold statements of their own.
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            let mut module = vec![file.to_string()];
            for line in text.lines() {
                let t = line.trim_start();
                if let Some(m) = t
                    .strip_prefix("pub mod ")
                    .and_then(|m| m.strip_suffix(" {"))
                {
                    module = vec![file.to_string(), m.to_string()];
                }
                for inline in [
                    ".stmt(\"",
                    ".query(\"",
                    ".query_one(\"",
                    ".query_opt(\"",
                    ".execute(\"",
                    "simple_query(\"",
                    "batch_execute(\"",
                ] {
                    if t.contains(inline) {
                        missing.push(format!("{file}.rs: a statement written inline: {t}"));
                    }
                }
                let Some(rest) = t
                    .strip_prefix("pub(super) const ")
                    .or_else(|| t.strip_prefix("pub(in crate::store) const "))
                    .or_else(|| t.strip_prefix("pub const "))
                    .or_else(|| t.strip_prefix("const "))
                else {
                    continue;
                };
                let Some((name, _)) = rest.split_once(": &str") else {
                    continue;
                };
                let full = format!("{}::{name}", module.join("::"));
                if !listed.contains(&full.as_str()) {
                    missing.push(format!("{full} is not in statements::all()"));
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn long_lines_break_before_top_level_clauses() {
        let line = format!(
            "SELECT a, extract(epoch FROM b), 'x FROM y' FROM t LEFT JOIN u ON u.a = t.a WHERE {} ORDER BY a",
            "c = 1 AND d = 2 AND e = 3"
        );
        assert_eq!(
            wrap(&line),
            [
                "SELECT a, extract(epoch FROM b), 'x FROM y'",
                "    FROM t",
                "    LEFT JOIN u ON u.a = t.a",
                "    WHERE c = 1 AND d = 2 AND e = 3",
                "    ORDER BY a",
            ]
        );
        assert_eq!(format("  SELECT 1  \n"), "SELECT 1");
        // No clause to break before: after commas, as many items a line as fit.
        let items: Vec<String> = (0..12).map(|n| format!("column_{n:02}")).collect();
        let list = format!("  f({})", items.join(", "));
        assert_eq!(
            wrap(&list),
            [
                "  f(column_00, column_01, column_02, column_03, column_04, column_05, column_06, column_07,",
                "      column_08, column_09, column_10, column_11)",
            ]
        );
    }
}
