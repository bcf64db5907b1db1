//! SQL fragments every statement that needs them shares, so a rule is written once.

/// The `WHEN` of a status read that shows a `NEW` row as `IN_PROGRESS`: held by a live
/// lease, or past its first step (`derived_status!`).
macro_rules! new_running {
    ($t:literal) => {
        concat!(
            "WHEN ",
            $t,
            ".status = ",
            crate::status::status_sql!(New),
            " AND (",
            $t,
            ".current_step_id > 0 OR (",
            $t,
            ".lease_until > now() AND ",
            $t,
            // A parked request (its workflow paused, `store::pauses`) has not started.
            ".lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN ",
            crate::status::status_sql!(InProgress)
        )
    };
}

/// A fan-out child (branch or item) `$c` that can proceed: not finished, not paused, not
/// held. Its parent, PAUSED at the step, reads as `IN_PROGRESS` meanwhile.
macro_rules! fan_child_proceeds {
    ($c:literal) => {
        concat!(
            $c,
            ".fan_index IS NOT NULL AND ",
            $c,
            ".status IN (",
            crate::status::status_sql!(New),
            ", ",
            crate::status::status_sql!(InProgress),
            ", ",
            crate::status::status_sql!(Resumed),
            ") AND ",
            $c,
            ".lease_until <> 'infinity'"
        )
    };
}

/// `derived_status!` without its look at a PAUSED row's fan-out children: the status
/// reads (`store::status`), which are hot, make that look only for the PAUSED rows they
/// find, in a statement of its own (`status::PROCEEDING`), since a correlated subquery
/// in their columns costs every read (about 3%, measured with pgbench).
macro_rules! stored_derived_status {
    ($t:literal) => {
        concat!(
            "CASE ",
            crate::store::sql::new_running!($t),
            " ELSE ",
            $t,
            ".status END"
        )
    };
}

/// The status a read shows: between steps the stored status stays `NEW` (so the update
/// after each step is a HOT update), and a `NEW` row held by a live lease or whose current
/// step is past the first is `IN_PROGRESS` (an unleased one waiting for its start, a
/// delayed create, stays `NEW`); a `PAUSED` row at a fan-out step with a child that can
/// proceed (not paused, not held) is `IN_PROGRESS` too. The argument is the table alias.
macro_rules! derived_status {
    ($t:literal) => {
        concat!(
            "CASE ",
            crate::store::sql::new_running!($t),
            " WHEN ",
            $t,
            ".status = ",
            crate::status::status_sql!(Paused),
            " AND EXISTS (SELECT 1 FROM service_requests fc WHERE fc.parent_id = ",
            $t,
            ".id AND fc.parent_step_id = ",
            $t,
            ".current_step_id AND ",
            crate::store::sql::fan_child_proceeds!("fc"),
            ") THEN ",
            crate::status::status_sql!(InProgress),
            " ELSE ",
            $t,
            ".status END"
        )
    };
}

/// `now()` plus the milliseconds in the parameter or column (cast to float8), on the
/// database's clock: every lease and due time is taken from one clock, whichever instance
/// writes it.
macro_rules! now_plus_ms {
    ($param:literal) => {
        concat!("now() + ", $param, "::float8 * interval '1 millisecond'")
    };
}

/// A row's `created_at` in microseconds since the Unix epoch (exact: `extract` gives a
/// numeric). The argument is the table alias.
macro_rules! created_us {
    ($t:literal) => {
        concat!(
            "(extract(epoch FROM ",
            $t,
            ".created_at) * 1000000)::bigint"
        )
    };
}

/// A new batch row `t`'s deadline (beyond Clamp): `deadline_ms` after its creation, or
/// NULL (none).
macro_rules! new_deadline {
    () => {
        "t.created + t.deadline_ms * interval '1 millisecond'"
    };
}

/// A new request row's `lease_owner, lease_until`: leased to `$6` for `$7` ms (or the
/// two parameters given) when the input column `leased` says so (the local executor
/// takes it after commit), else free.
macro_rules! fresh_lease {
    () => {
        $crate::store::sql::fresh_lease!("$6", "$7")
    };
    ($owner:literal, $ms:literal) => {
        concat!(
            "CASE WHEN leased THEN ",
            $owner,
            "::uuid END, CASE WHEN leased THEN ",
            $crate::store::sql::now_plus_ms!($ms),
            " ELSE '-infinity' END"
        )
    };
}

/// A step record's request as readers see it: a step that received the request's payload
/// unchanged (most first steps) stores `''` instead of a second copy of it (no JSON text
/// is empty, so the mark is unambiguous), and this puts the payload back. The arguments
/// are the step record's and the request row's aliases (or a column reference for the
/// payload).
macro_rules! step_request {
    ($st:literal, $payload:literal) => {
        concat!(
            "CASE WHEN ",
            $st,
            ".request = '' THEN ",
            $payload,
            " ELSE ",
            $st,
            ".request END"
        )
    };
}

// Exported to the store's files only: a `#[macro_export]` macro lives at the crate root,
// which would make every statement here depend on `lib.rs`.
/// The latest version of each workflow a batch names (`$names`), read once per batch
/// (one index probe per distinct name): the CTE `v` that `pinned_version!` joins to, and
/// whose rows the statement answers. Materialized: a statement that reads `v` once would
/// have it inlined, and the planner then probes the index once per row of the batch
/// (the limited insert did: one probe per create).
macro_rules! batch_versions {
    ($names:literal) => {
        concat!(
            "v AS MATERIALIZED (SELECT w.name, w.version FROM workflows w WHERE w.name = ANY(",
            $names,
            "::text[]))"
        )
    };
}

/// The version a new row runs: the one it names (`$named` > 0), else the latest
/// (`$latest`, NULL for a workflow without versions: 1); stored as NULL when it is 1
/// (migration 11). Without arguments: a batch row `t` joined to `v` of `batch_versions!`.
macro_rules! pinned_version {
    () => {
        $crate::store::sql::pinned_version!("t.ver", "v.version")
    };
    ($named:literal, $latest:literal) => {
        concat!(
            "NULLIF(CASE WHEN ",
            $named,
            " > 0 THEN ",
            $named,
            " ELSE coalesce(",
            $latest,
            ", 1) END, 1)"
        )
    };
}

/// The CTE `fenced` of a step that waits for child requests (WORKFLOW, PARALLEL, MAP):
/// request `$1`, leased to `$3` and not cancelled, paused at step `$2` and unleased (its
/// children's outcome resumes it); returns its id and headers, which the children take.
/// The notifications of the rows of `$from` (a CTE returning `id, notify, workflow_name,
/// workflow_version, status, reason`) whose new status their workflow tells of (the bits of
/// migration 28): the outbox rows, written in the statement that finishes the requests.
macro_rules! tell {
    ($from:literal) => {
        concat!(
            "INSERT INTO notifications (service_request_id, workflow_name, workflow_version, \
             status, reason) \
             SELECT n.id, n.workflow_name, coalesce(n.workflow_version, 1), n.status, n.reason \
             FROM ",
            $from,
            " n WHERE n.notify IS NOT NULL AND n.notify & (CASE n.status WHEN ",
            crate::status::status_sql!(Completed),
            " THEN 1 WHEN ",
            crate::status::status_sql!(Failed),
            " THEN 2 WHEN ",
            crate::status::status_sql!(Cancelled),
            " THEN 4 ELSE 0 END) <> 0"
        )
    };
}
pub(crate) use tell;

macro_rules! pause_for_children {
    () => {
        concat!(
            "fenced AS (
    UPDATE service_requests s SET status = ",
            crate::status::status_sql!(Paused),
            ", current_step_id = $2, updated_at = now(),
           step_attempts = 0, last_error = NULL, lease_owner = NULL, lease_until = '-infinity'
    WHERE s.id = $1 AND s.lease_owner = $3 AND s.status <> ",
            crate::status::status_sql!(Cancelled),
            "
    RETURNING s.id, s.headers, s.priority, s.labels
)"
        )
    };
}

/// The statuses a claim takes a row in (`service_requests_claim_order`'s predicate), as a
/// parenthesized SQL list: `status IN claimable!()`.
macro_rules! claimable {
    () => {
        concat!(
            "(",
            crate::status::status_sql!(New),
            ", ",
            crate::status::status_sql!(InProgress),
            ", ",
            crate::status::status_sql!(Resumed),
            ")"
        )
    };
}

/// What a claimed row returns, of row `$t`, for `leases::Claimed::from_row`: the columns
/// a job continues from, ending with its deadline in ms from now (NULL: none, or none
/// that applies while its onFailure steps run).
macro_rules! claimed_columns {
    ($t:literal) => {
        concat!(
            $t,
            ".id, ",
            $t,
            ".workflow_name, ",
            $t,
            ".status, ",
            $t,
            ".payload, ",
            $t,
            ".headers, ",
            $t,
            ".current_step_id, ",
            $t,
            ".step_request, ",
            $t,
            ".failed_step_id, ",
            $t,
            ".reason, ",
            $t,
            ".step_attempts, ",
            crate::store::sql::created_us!($t),
            " AS created_us, coalesce(",
            $t,
            ".workflow_version, 1) AS version, ",
            $t,
            ".parent_id, ",
            $t,
            ".retries, CASE WHEN ",
            $t,
            ".failed_step_id IS NULL THEN extract(epoch FROM ",
            $t,
            ".deadline - now())::float8 * 1000 END AS deadline_in_ms, ",
            $t,
            ".priority"
        )
    };
}

/// A row's place in the claim order: `service_requests_claim_order`'s expression
/// (migrations 23 and 32, which say why), spelled identically so that the planner matches
/// it. Bands, each a range of the index: fresh rows below 0 (higher priorities first,
/// then creation order); rows due at a time in nine bands of `due_band!()` s from 0, the
/// highest priority's first, each ordered by that time; paused rows with a deadline from
/// `paused_rank!()` on, parked rows from `parked_rank!()` on, held rows at Infinity.
/// Runnable rows rank below `now_rank!()` in their band.
macro_rules! claim_rank {
    () => {
        concat!(
            "(CASE \
        WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid \
            THEN 2000000000000::float8 \
                 + date_part('epoch', created_at - '1970-01-01 00:00:00+00'::timestamptz) \
        WHEN status = ",
            crate::status::status_sql!(Paused),
            " \
            THEN CASE WHEN lease_until = 'infinity'::timestamptz \
                        OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 \
                      ELSE 1000000000000::float8 \
                           + date_part('epoch', lease_until - '1970-01-01 00:00:00+00'::timestamptz) \
                 END \
        WHEN lease_until = '-infinity'::timestamptz \
            THEN date_part('epoch', created_at - '1970-01-01 00:00:00+00'::timestamptz) \
                 - coalesce(priority, 5)::float8 * 10000000000::float8 \
        WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 \
        ELSE date_part('epoch', lease_until - '1970-01-01 00:00:00+00'::timestamptz) \
             + (9 - coalesce(priority, 5))::float8 * 10000000000::float8 \
    END)"
        )
    };
}

/// The rows `service_requests_claim_order` holds (its predicate, spelled identically): a
/// look that names it and reads only `lease_until` (included) is an index-only scan.
macro_rules! claim_order_rows {
    () => {
        concat!(
            "(status IN ",
            crate::store::sql::claimable!(),
            " OR (status = ",
            crate::status::status_sql!(Paused),
            " AND lease_until > '-infinity'::timestamptz) \
             OR lease_owner = '00000000-0000-0000-0000-000000000000'::uuid)"
        )
    };
}

/// Where the paused rows' band starts (`claim_rank!`): a deadline at epoch second t ranks
/// at this plus t.
macro_rules! paused_rank {
    () => {
        "1000000000000::float8"
    };
}

/// Where the parked rows' band starts (`claim_rank!`).
macro_rules! parked_rank {
    () => {
        "2000000000000::float8"
    };
}

/// The parked requests (their lease owner the nil id): the claim order's parked band.
macro_rules! parked_rows {
    () => {
        concat!(
            "lease_owner = '00000000-0000-0000-0000-000000000000'::uuid AND ",
            crate::store::sql::claim_rank!(),
            " >= ",
            crate::store::sql::parked_rank!(),
            " AND ",
            crate::store::sql::claim_rank!(),
            " < 'Infinity'::float8"
        )
    };
}

/// The rows of the band of `claim_rank!` that starts at `$from` (SQL) and are due now:
/// ranked above its start and below its start plus `now_rank!()`.
macro_rules! due_in_band {
    ($from:expr) => {
        concat!(
            crate::store::sql::claim_rank!(),
            " > ",
            $from,
            " AND ",
            crate::store::sql::claim_rank!(),
            " < ",
            $from,
            " + ",
            crate::store::sql::now_rank!()
        )
    };
}

/// Now as a `claim_rank!` of the first due band (priority 9): rows ranked below it are
/// runnable; band `b` (priority 9 - b) is runnable below `b * due_band!()` plus this.
macro_rules! now_rank {
    () => {
        "date_part('epoch', now() - '1970-01-01 00:00:00+00'::timestamptz)"
    };
}

/// The width of one due band of `claim_rank!` (s): 10^10, beyond any epoch second until
/// the year 2286.
macro_rules! due_band {
    () => {
        "10000000000::float8"
    };
}

pub(crate) use {
    batch_versions, claim_order_rows, claim_rank, claimable, claimed_columns, created_us,
    derived_status, due_band, due_in_band, fan_child_proceeds, fresh_lease, new_deadline,
    new_running, now_plus_ms, now_rank, parked_rank, parked_rows, pause_for_children, paused_rank,
    pinned_version, step_request, stored_derived_status,
};
