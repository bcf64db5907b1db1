//! Concurrency limits by key (beyond Clamp; migrations 22 and 34). A request of a
//! workflow that declares `concurrency` carries its key (`concurrency_key`). It holds a
//! slot from its admission until it finishes (a pause or a sleep holds it too); until
//! admitted it is NEW and held (`lease_until = 'infinity'`, which no claim takes).
//! Slots are counted from `concurrency_slots`, one row per request that waits for or
//! holds a slot, written by the statement that changes the request's row (migration 36:
//! the limited insert, an admission, a finishing step write, a cancel, a retry; `follow!`),
//! so in its transaction: never a number kept apart, so a crash can neither free one
//! twice nor leak one: a request of a dead instance keeps its slot while it is continued
//! elsewhere, and frees it when it finishes.
//!
//! Every admission of a key runs under a transaction-scoped advisory lock of (workflow,
//! key), taken by its own statement first, so the count that follows sees every admission
//! committed before it: two instances never admit past the limit. Admission is in
//! order per key (priority, then creation: ids are UUIDv7), and a create finds a queue before it waits in
//! it: it is admitted at once only when its key has a free slot and nobody waiting.

use uuid::Uuid;

use super::{PgConn, Result};

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// The slot rows of the requests a statement's CTE `$changed` changed, written by that
/// statement (migration 36: no trigger keeps them): a request that waits for or holds a
/// slot has its row (`queued` as it waits, its rank), any other has none. `$changed`
/// returns each request's `id, workflow_name, concurrency_key, status, lease_until,
/// priority`; a request without a key is passed over. For the statements that can change
/// a keyed request's slot state other than by finishing it (a cancel, a retry, a
/// compensating cancel, a rerun); a step write's finishes go by `transitions`' `freed!`,
/// an admission by `ADMIT`'s own update. Two CTEs, `slots_gone` and `slots_kept`,
/// each aimed by id at the primary key (`= ANY (ARRAY(…))`, never a join the planner
/// could answer with a scan of every slot row).
macro_rules! follow {
    ($changed:literal) => {
        concat!(
            "slots_gone AS (DELETE FROM concurrency_slots q WHERE q.id = ANY (ARRAY(\
             SELECT f.id FROM ",
            $changed,
            " f WHERE f.concurrency_key IS NOT NULL \
             AND concurrency_slot_state(f.status, f.lease_until) = 0))), \
             slots_kept AS (INSERT INTO concurrency_slots \
             (id, workflow_name, concurrency_key, queued, rank) \
             SELECT f.id, f.workflow_name, f.concurrency_key, \
             concurrency_slot_state(f.status, f.lease_until) = 1, ",
            crate::store::slots::rank_of!("f.priority"),
            " FROM ",
            $changed,
            " f WHERE f.concurrency_key IS NOT NULL \
             AND concurrency_slot_state(f.status, f.lease_until) > 0 \
             ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)"
        )
    };
}
pub(crate) use follow;

/// What `follow!`'s CTE must return of each changed request, its columns qualified by
/// an alias where the statement reads another table with an `id` (`follows!("s")`).
macro_rules! follows {
    () => {
        "id, workflow_name, concurrency_key, status, lease_until, priority"
    };
    ($s:literal) => {
        concat!(
            $s,
            ".id, ",
            $s,
            ".workflow_name, ",
            $s,
            ".concurrency_key, ",
            $s,
            ".status, ",
            $s,
            ".lease_until, ",
            $s,
            ".priority"
        )
    };
}
pub(crate) use follows;

/// The advisory locks of (workflow, key) pairs, `$1` workflows and `$2` keys, taken in the
/// order of their hashes, so two batches never wait on each other in a cycle. Every
/// admission takes its key's lock here (a batch of creates, or one key's admission), so
/// all compute the same hash.
pub(super) const LOCK_MANY: &str = "SELECT pg_advisory_xact_lock(h) FROM \
     (SELECT DISTINCT hashtextextended(w || '/' || k, 22) AS h \
      FROM unnest($1::text[], $2::text[]) AS t(w, k)) l ORDER BY h";

/// How many requests of key `$k` of workflow `$w` hold a slot (index-only, at most the
/// key's limit of entries).
macro_rules! holders {
    ($w:literal, $k:literal) => {
        concat!(
            "(SELECT count(*) FROM concurrency_slots h WHERE h.workflow_name = ",
            $w,
            " AND h.concurrency_key = ",
            $k,
            " AND NOT h.queued)"
        )
    };
}

/// A request's place among its key's by priority, `concurrency_slots.rank` (migration 34
/// spells it too): the priority negated, so that higher ones come first.
macro_rules! rank_of {
    ($priority:literal) => {
        concat!("-coalesce(", $priority, ", 5)")
    };
}
pub(crate) use rank_of;

/// A key's queue order (`concurrency_slots_queue`'s last two columns): higher priorities
/// first (`rank_of!`), then creation order (ids are UUIDv7).
macro_rules! queue_order {
    ($s:literal) => {
        concat!($s, ".rank, ", $s, ".id")
    };
}

/// The starts of key `$k` of workflow `$w` within the last `$p` ms, unless `$n` (the rate)
/// is NULL: then 0 (the count is not made). Read from `concurrency_starts` (migration
/// 34), one row per admission under a rate, written by the admitting statement itself.
macro_rules! started_within {
    ($w:literal, $k:literal, $n:literal, $p:literal) => {
        concat!(
            "(CASE WHEN ",
            $n,
            "::bigint IS NULL THEN 0 ELSE \
             (SELECT count(*) FROM concurrency_starts a WHERE a.workflow_name = ",
            $w,
            " AND a.concurrency_key = ",
            $k,
            " AND a.admitted_at > statement_timestamp() - ",
            $p,
            "::float8 * interval '1 millisecond') END)"
        )
    };
}

/// How long a start row is kept: past the longest window (a minute, `perMinute`).
const STARTS_KEPT: std::time::Duration = std::time::Duration::from_secs(120);

/// Deletes the start rows older than `$1` ms (`STARTS_KEPT`).
pub(super) const FORGET_STARTS: &str = "DELETE FROM concurrency_starts \
     WHERE admitted_at < statement_timestamp() - $1::float8 * interval '1 millisecond'";

/// A batch of limited creates, under their keys' locks: per key, as many as it has room
/// for are admitted (claimable at once), oldest first, and only when nobody waits for
/// it; the rest are held. Arrays, one element per create: `$1` ids, `$2` workflows,
/// `$3` payloads, `$4` headers, `$5` versions named (0: the latest), `$6` deadlines in ms
/// from now (NULL: none), `$7` keys, `$8` limits, `$9` rates (NULL: none), `$10` their
/// windows in ms, `$11` priorities (NULL: the default), `$12` labels, `$13` notify masks,
/// `$14` whether an admitted one is leased to this instance (`$16`, for `$17` ms: its
/// executor had room and starts it after the commit, as a plain create is handed over;
/// else it waits unleased for a claim), `$15` creation times. Returns each id, whether it was
/// admitted, whether one held waits for its key's rate (its window had no room for it,
/// or a queue held it while the slots had room: a queue that a rate keeps; with only a
/// rate declared, every wait is the rate's). A key with a queue counts neither its starts
/// nor, without a limit of its own (`NO_LIMIT`, 2147483647), its slots: nothing is
/// admitted past a queue.
pub(super) const INSERT: &str = concat!(
    "WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], \
                         $6::float8[], $7::text[], $8::bigint[], $9::bigint[], $10::float8[], \
                         $11::int2[], $12::text[], $13::int2[], $14::bool[], \
                         $15::timestamptz[]) \
      AS t(id, workflow, payload, headers, ver, deadline_ms, key, lim, rate, window_ms, priority, \
           labels, notify, leased, created)
), keys AS (
    SELECT workflow, key, min(lim) AS lim, min(rate) AS rate, min(window_ms) AS window_ms \
    FROM input GROUP BY workflow, key
), ",
    crate::store::sql::batch_versions!("$2"),
    ", room AS (
    -- A LATERAL probe per key, not an EXISTS: the planner may answer an EXISTS with one
    -- hashed scan of every waiting row.
    SELECT k.*, w.one IS NOT NULL AS queued \
    FROM keys k LEFT JOIN LATERAL (SELECT 1 AS one FROM concurrency_slots q \
      WHERE q.workflow_name = k.workflow AND q.concurrency_key = k.key AND q.queued \
      LIMIT 1) w ON true
), counted AS MATERIALIZED (
    -- Materialized: the ranking reads a key's room twice, and an inlined CTE would
    -- count its slot holders once per reading.
    SELECT r.*, \
      CASE WHEN r.queued AND (r.rate IS NULL OR r.lim >= 2147483647) THEN NULL \
        ELSE r.lim - ",
    holders!("r.workflow", "r.key"),
    " END AS slot_room, \
      CASE WHEN r.queued THEN NULL ELSE coalesce(r.rate, r.lim) - ",
    started_within!("r.workflow", "r.key", "r.rate", "r.window_ms"),
    " END AS rate_room \
    FROM room r
), ranked AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.workflow, i.key \
                                    ORDER BY ",
    rank_of!("i.priority"),
    ", i.id) AS rank, \
      CASE WHEN c.queued THEN 0 ELSE least(c.slot_room, c.rate_room) END AS free, \
      c.queued, c.slot_room, c.rate_room, ",
    crate::store::sql::pinned_version!("i.ver", "v.version"),
    " AS stored_version \
    FROM input i JOIN counted c ON c.workflow = i.workflow AND c.key = i.key \
    LEFT JOIN v ON v.name = i.workflow
), stored AS (
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until, \
                              workflow_version, deadline, concurrency_key, admitted_at, priority, \
                              labels, notify, created_at)
SELECT t.id, t.workflow, t.payload, t.headers, \
  CASE WHEN t.rank <= t.free AND t.leased THEN $16::uuid END, \
  CASE WHEN t.rank > t.free THEN 'infinity'::timestamptz \
       WHEN t.leased THEN ",
    crate::store::sql::now_plus_ms!("$17"),
    " \
       ELSE '-infinity'::timestamptz END, \
  t.stored_version, t.created + t.deadline_ms * interval '1 millisecond', t.key, \
  CASE WHEN t.rank <= t.free THEN statement_timestamp() END, t.priority, \
  string_to_array(t.labels, E'\\n'), t.notify, t.created \
FROM ranked t), slot_rows AS (
-- Each create's slot row (migration 34), written by the insert that creates it (no
-- trigger does, migration 36).
INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank)
SELECT t.id, t.workflow, t.key, t.rank > t.free, ",
    rank_of!("t.priority"),
    " FROM ranked t), \
starts AS (
-- A start under a rate is counted by its own row (`started_within!`).
INSERT INTO concurrency_starts (workflow_name, concurrency_key, admitted_at)
SELECT t.workflow, t.key, statement_timestamp() FROM ranked t \
WHERE t.rank <= t.free AND t.rate IS NOT NULL)
-- What each create became, read from the ranking that stored it (no join back to the
-- inserted rows: a create is admitted exactly when its rank is within its key's room).
SELECT t.id, t.rank <= t.free, \
  t.rank > t.free AND t.rate IS NOT NULL AND CASE WHEN t.queued \
    THEN t.slot_room IS NULL OR t.rank <= t.slot_room ELSE t.rank > t.rate_room END, \
  coalesce(t.stored_version, 1) \
FROM ranked t"
);

// `INSERT` spells the limit of a workflow that declares only a rate.
const _: () = assert!(crate::workflow::model::NO_LIMIT == 2147483647);

/// How a limited create was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Admitted at once (its key had a free slot and room in its window): leased to this
    /// instance when `Lease::leased` said so, else claimable.
    Admitted,
    /// Waiting for a slot of its key.
    ForSlot,
    /// Waiting for room in its key's rate window.
    ForRate,
}

/// Admits the first waiting requests of a key (`queue_order!`) into its free slots and its
/// rate's room, under its lock, and marks their slot rows held (`held`): `$1` workflow,
/// `$2` key, `$3` limit, `$4` rate (NULL: none), `$5` its window in ms. Returns the
/// admitted ids.
pub(super) const ADMIT: &str = concat!(
    "WITH admitted AS (UPDATE service_requests \
       SET lease_until = '-infinity', admitted_at = statement_timestamp() \
     WHERE id IN (SELECT q.id FROM concurrency_slots q WHERE q.workflow_name = $1 \
                    AND q.concurrency_key = $2 AND q.queued ORDER BY ",
    queue_order!("q"),
    " \
                  LIMIT greatest(0, least($3 - ",
    holders!("$1", "$2"),
    ", coalesce($4::bigint, $3) - ",
    started_within!("$1", "$2", "$4", "$5"),
    "))) AND concurrency_key IS NOT NULL AND lease_until = 'infinity' AND status = ",
    crate::status::status_sql!(New),
    " RETURNING id), held AS ( \
     UPDATE concurrency_slots slot SET queued = false WHERE slot.id = ANY (ARRAY(SELECT id FROM admitted))), \
     starts AS ( \
     INSERT INTO concurrency_starts (workflow_name, concurrency_key, admitted_at) \
     SELECT $1, $2, statement_timestamp() FROM admitted WHERE $4::bigint IS NOT NULL) \
     SELECT id FROM admitted"
);

/// The workflows and keys of requests (`$1`) that hold or held a slot, where requests
/// wait: a key nobody waits for needs no admission (one that starts waiting after this
/// look is admitted by the next pass). When no request waits for any key (a limit with
/// room to spare), one probe of the queue's index says so first and the requests are
/// not read (a gating `EXISTS`, evaluated once: most of this look's cost was finding
/// each finished request's key across the sets).
pub(super) const KEYS_OF: &str = "SELECT DISTINCT r.workflow_name, r.concurrency_key \
     FROM unnest($1::uuid[]) AS u(id) JOIN service_requests r ON r.id = u.id \
     CROSS JOIN LATERAL (SELECT 1 FROM concurrency_slots q WHERE q.workflow_name = r.workflow_name \
                     AND q.concurrency_key = r.concurrency_key AND q.queued LIMIT 1) w \
     WHERE r.concurrency_key IS NOT NULL \
       AND EXISTS (SELECT 1 FROM concurrency_slots q WHERE q.queued)";

/// The workflows with requests waiting for a slot (a skip scan of the queue's index).
pub(super) const WAITING_WORKFLOWS: &str = "WITH RECURSIVE w AS ( \
       (SELECT q.workflow_name AS name FROM concurrency_slots q WHERE q.queued \
        ORDER BY q.workflow_name LIMIT 1) \
       UNION ALL \
       SELECT (SELECT q.workflow_name FROM concurrency_slots q \
               WHERE q.workflow_name > w.name AND q.queued ORDER BY q.workflow_name LIMIT 1) \
       FROM w WHERE w.name IS NOT NULL) \
     SELECT name FROM w WHERE name IS NOT NULL";

/// The keys of workflow `$1` with requests waiting, fewer than `$2` holding slots and
/// fewer than `$5` (NULL: no rate) started within the last `$6` ms (a skip scan of the
/// queue's index), at most `$3`, from after key `$4` (NULL: from the first; a pass goes
/// round the keys, so none waits behind the others).
pub(super) const DUE_KEYS: &str = concat!(
    "WITH RECURSIVE k AS ( \
       (SELECT q.concurrency_key AS key FROM concurrency_slots q WHERE q.workflow_name = $1 \
          AND ($4::text IS NULL OR q.concurrency_key > $4) AND q.queued \
        ORDER BY q.concurrency_key LIMIT 1) \
       UNION ALL \
       SELECT (SELECT q.concurrency_key FROM concurrency_slots q WHERE q.workflow_name = $1 \
                 AND q.concurrency_key > k.key AND q.queued \
               ORDER BY q.concurrency_key LIMIT 1) FROM k WHERE k.key IS NOT NULL) \
     SELECT key FROM k WHERE key IS NOT NULL AND ",
    holders!("$1", "k.key"),
    " < $2 AND ",
    started_within!("$1", "k.key", "$5", "$6"),
    " < coalesce($5::bigint, 1) LIMIT $3"
);

/// Requests waiting for a slot, by workflow (for /metrics, at most every 30 s).
pub(super) const WAITING_COUNTS: &str =
    "SELECT q.workflow_name, count(*) FROM concurrency_slots q WHERE q.queued \
     GROUP BY q.workflow_name";

/// The keys of workflow `$1` with the most requests waiting, at most `$2`, each with the
/// workflow's requests waiting and keys with requests waiting, all told (the console).
pub(super) const WAITING_BY_KEY: &str =
    "SELECT q.concurrency_key, count(*), sum(count(*)) OVER ()::int8, count(*) OVER () \
     FROM concurrency_slots q WHERE q.workflow_name = $1 AND q.queued \
     GROUP BY q.concurrency_key ORDER BY count(*) DESC, q.concurrency_key LIMIT $2";

/// One limited create.
pub struct Limited {
    pub id: Uuid,
    pub workflow: String,
    /// 0: the latest version when stored.
    pub version: i32,
    pub payload: String,
    pub headers: String,
    pub deadline_ms: Option<f64>,
    pub key: String,
    pub limit: u32,
    /// Its priority (None: the default): it orders the key's queue too.
    pub priority: Option<i16>,
    /// Most starts of the key within `.1` ms, if a rate is declared.
    pub rate: Option<(u32, u32)>,
    /// Its labels, separated by newlines (None: none).
    pub labels: Option<String>,
    /// The final statuses its workflow tells of (None: none).
    pub notify: Option<i16>,
    /// When it was created (µs since the Unix epoch): its `created_at`, and what its
    /// deadline counts from.
    pub created_us: i64,
}

/// A rate as the statements take it: (starts or NULL, window ms).
fn rate_args(rate: Option<(u32, u32)>) -> (Option<i64>, f64) {
    match rate {
        Some((n, ms)) => (Some(n as i64), ms as f64),
        None => (None, 0.0),
    }
}

/// Stores a batch of limited creates in one transaction (their keys' locks, then one
/// insert), sent in one round trip: how each, in order, was stored.
pub async fn insert(conn: &PgConn, rows: &[Limited], lease: &Lease<'_>) -> Result<Vec<Stored>> {
    let lock = conn.stmt(LOCK_MANY).await?;
    // Borrowed, not copied: the batch's texts go to Postgres as they are.
    let col = |f: &dyn Fn(&Limited) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let workflows = col(&|r| r.workflow.as_str());
    let keys = col(&|r| r.key.as_str());
    let payloads = col(&|r| r.payload.as_str());
    let headers = col(&|r| r.headers.as_str());
    let versions: Vec<i32> = rows.iter().map(|r| r.version).collect();
    let deadlines: Vec<Option<f64>> = rows.iter().map(|r| r.deadline_ms).collect();
    let limits: Vec<i64> = rows.iter().map(|r| r.limit as i64).collect();
    let rates: Vec<Option<i64>> = rows.iter().map(|r| rate_args(r.rate).0).collect();
    let windows: Vec<f64> = rows.iter().map(|r| rate_args(r.rate).1).collect();
    let priorities: Vec<Option<i16>> = rows.iter().map(|r| r.priority).collect();
    let labels: Vec<Option<&str>> = rows.iter().map(|r| r.labels.as_deref()).collect();
    let notify: Vec<Option<i16>> = rows.iter().map(|r| r.notify).collect();
    let created: Vec<std::time::SystemTime> = rows
        .iter()
        .map(|r| super::buffer::system_time(r.created_us))
        .collect();
    let lease_ms = lease.lease.as_secs_f64() * 1000.0;
    let insert_params: [Param<'_>; 17] = [
        &ids,
        &workflows,
        &payloads,
        &headers,
        &versions,
        &deadlines,
        &keys,
        &limits,
        &rates,
        &windows,
        &priorities,
        &labels,
        &notify,
        &lease.leased,
        &created,
        &lease.owner,
        &lease_ms,
    ];
    let lock_params: [Param<'_>; 2] = [&workflows, &keys];
    // Aimed at the partition that holds the batch's ids (its parent locked first,
    // `partitions::REQUESTS_FIRST`): 10 % less a call than routed through the parent,
    // whose routing is set up on every run. The keys' locks and counts name no request
    // table.
    let set = conn.partitions().one_set(ids.iter().copied());
    let (lock, lock_params, insert_params) = (&lock, &lock_params, &insert_params);
    let done = super::partitions::on_set(conn, INSERT, set.as_ref(), |insert| async move {
        conn.in_one_trip(
            &[super::partitions::REQUESTS_FIRST],
            Some((lock, &lock_params[..])),
            &insert,
            insert_params,
        )
        .await
    })
    .await?;
    let stored: std::collections::HashMap<Uuid, Stored> = done
        .iter()
        .map(|r| {
            let how = match (r.get(1), r.get(2)) {
                (true, _) => Admission::Admitted,
                (false, Some(true)) => Admission::ForRate,
                (false, _) => Admission::ForSlot,
            };
            let version = r.get::<_, i32>(3).max(1) as u32;
            (r.get(0), Stored { how, version })
        })
        .collect();
    Ok(ids
        .iter()
        .map(|id| {
            stored.get(id).copied().unwrap_or(Stored {
                how: Admission::ForSlot,
                version: 1,
            })
        })
        .collect())
}

/// Which of a batch of limited creates are leased to this instance if admitted (`leased`,
/// one per create), whose lease (`owner`) and for how long.
pub struct Lease<'a> {
    pub leased: &'a [bool],
    pub owner: Uuid,
    pub lease: std::time::Duration,
}

/// How one limited create was stored, and the version its row was pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub how: Admission,
    pub version: u32,
}

pub async fn admit(
    conn: &PgConn,
    workflow: &str,
    key: &str,
    limit: u32,
    rate: Option<(u32, u32)>,
) -> Result<Vec<Uuid>> {
    let (n, ms) = rate_args(rate);
    let lock = conn.stmt(LOCK_MANY).await?;
    let admit = conn.stmt(ADMIT).await?;
    let (workflows, keys) = ([workflow], [key]);
    let lock_params: [Param<'_>; 2] = [&&workflows[..], &&keys[..]];
    let limit = limit as i64;
    let admit_params: [Param<'_>; 5] = [&workflow, &key, &limit, &n, &ms];
    let rows = conn
        .in_one_trip(&[], Some((&lock, &lock_params[..])), &admit, &admit_params)
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Deletes the start rows no window reaches any more.
pub async fn forget_starts(conn: &PgConn) -> Result<u64> {
    let stmt = conn.stmt(FORGET_STARTS).await?;
    let kept_ms = STARTS_KEPT.as_secs_f64() * 1000.0;
    Ok(conn.client.execute(&stmt, &[&kept_ms]).await?)
}

/// The (workflow, key) of those of `ids` that are limited. One look per partition set
/// the ids are in (one, but for requests that ran across a set's edge), aimed at that
/// set's partitions: the ids come joined from an array, so a look at the partitioned
/// table probes every partition for each of them.
pub async fn keys_of(conn: &PgConn, ids: &[Uuid]) -> Result<Vec<(String, String)>> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for (set, group) in conn.partitions().group(ids, |id| *id) {
        let rows = super::partitions::on_set(conn, KEYS_OF, set.as_ref(), |stmt| {
            let group = &group;
            async move { conn.client.query(&stmt, &[group]).await }
        })
        .await?;
        keys.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
    }
    // A key of requests in two sets is looked at once.
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

/// The workflows with waiting requests.
pub async fn waiting_workflows(conn: &PgConn) -> Result<Vec<String>> {
    let stmt = conn.stmt(WAITING_WORKFLOWS).await?;
    let rows = conn.client.query(&stmt, &[]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Keys of `workflow` with waiting requests and a free slot, after `after`.
pub async fn due_keys(
    conn: &PgConn,
    workflow: &str,
    limit: u32,
    rate: Option<(u32, u32)>,
    max: i64,
    after: Option<&str>,
) -> Result<Vec<String>> {
    let stmt = conn.stmt(DUE_KEYS).await?;
    let (n, ms) = rate_args(rate);
    let rows = conn
        .client
        .query(&stmt, &[&workflow, &(limit as i64), &max, &after, &n, &ms])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Waiting requests by workflow.
pub async fn waiting_counts(conn: &PgConn) -> Result<Vec<(String, i64)>> {
    let stmt = conn.stmt(WAITING_COUNTS).await?;
    let rows = conn.client.query(&stmt, &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// A workflow's waiting requests: all told, and the keys with the most.
#[derive(Debug, Default)]
pub struct Waiting {
    /// Requests waiting, of every key.
    pub requests: i64,
    /// Keys with requests waiting.
    pub keys: i64,
    /// The keys with the most requests waiting, with their counts, most first.
    pub top: Vec<(String, i64)>,
}

/// The requests of `workflow` waiting, and its `max` keys with the most.
pub async fn waiting_by_key(conn: &PgConn, workflow: &str, max: i64) -> Result<Waiting> {
    let stmt = conn.stmt(WAITING_BY_KEY).await?;
    let rows = conn.client.query(&stmt, &[&workflow, &max]).await?;
    Ok(Waiting {
        requests: rows.first().map_or(0, |r| r.get(2)),
        keys: rows.first().map_or(0, |r| r.get(3)),
        top: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
    })
}
