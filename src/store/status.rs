//! `GET /serviceRequest/{id}`: what a status answer is made of (the request's row and its
//! step rows), read in one statement; or, for a request running here, kept in memory by
//! the executor that wrote them, with the same types and the same values, so an answer
//! rendered from memory (`http::answers`) is byte for byte one from a database read.

use std::sync::Arc;

use bytes::Bytes;
use uuid::Uuid;

use crate::status::{RequestStatus, StepStatus};

/// The request columns every status read returns.
macro_rules! head_columns {
    () => {
        concat!(
            "r.id, r.workflow_name, coalesce(r.workflow_version, 1) AS workflow_version, ",
            crate::store::sql::stored_derived_status!("r"),
            " AS status, \
             r.current_step_id, r.reason, to_json(r.created_at) #>> '{}' AS created_at, \
             extract(epoch FROM r.finished_at)::float8 * 1000 AS request_finished_ms, \
             r.step_attempts, r.last_error, r.retries, r.rerun_of, r.parent_id, r.fan_index, \
             CASE WHEN r.lease_owner IS NULL AND r.lease_until > now() \
                  THEN to_json(r.lease_until) #>> '{}' END AS retry_at, \
             to_json(r.start_at) #>> '{}' AS start_at, r.wait_event, r.wait_key, \
             to_json(r.deadline) #>> '{}' AS deadline, \
             CASE WHEN r.lease_until = 'infinity' AND r.status = ",
            crate::status::status_sql!(New),
            " THEN r.concurrency_key END AS concurrency_key, r.priority"
        )
    };
}

/// The step-record columns every whole status read returns (`st`: its `steps_status`).
macro_rules! step_columns {
    () => {
        concat!(
            ", st.step_id, st.step_name, st.status AS step_status, ",
            crate::store::sql::step_request!("st", "r.payload"),
            " AS request, st.response, \
         st.time_taken_ms, st.attempts, st.reason AS step_reason, st.child_id, \
         extract(epoch FROM st.started_at)::float8 * 1000 AS started_ms, \
         extract(epoch FROM st.finished_at)::float8 * 1000 AS finished_ms"
        )
    };
}

/// The rows of the requests `$1`, for those whose step rows the reader has already. The
/// ids are joined one by one (not `= ANY($1)`), so each is looked up in the partition of
/// its time only: an array condition is not pruned, and would probe every partition.
pub const GET_HEADS: &str = concat!(
    "SELECT ",
    head_columns!(),
    " FROM (SELECT DISTINCT unnest($1::uuid[])) AS u(id) JOIN service_requests r ON r.id = u.id"
);

/// The requests `$1` with their step attempts, oldest first: many status reads in one
/// statement (polls are frequent, and Postgres's cost is mostly per statement).
pub const GET_WHOLE: &str = concat!(
    "SELECT ",
    head_columns!(),
    step_columns!(),
    " FROM (SELECT DISTINCT unnest($1::uuid[])) AS u(id) JOIN service_requests r ON r.id = u.id \
     LEFT JOIN steps_status st ON st.service_request_id = r.id ORDER BY r.id, st.id"
);

/// Of the PAUSED requests `$1`, those at a fan-out step with a child that can proceed
/// (not paused, not held): reads show them IN_PROGRESS (`sql::derived_status!`).
pub const PROCEEDING: &str = concat!(
    "SELECT DISTINCT c.parent_id FROM service_requests c \
     JOIN service_requests p ON p.id = c.parent_id AND p.current_step_id = c.parent_step_id \
     WHERE c.parent_id = ANY($1) AND ",
    crate::store::sql::fan_child_proceeds!("c")
);

/// How many requests of its key wait before request `$3` of workflow `$1`, key `$2`, of
/// priority `$4` (the key's queue order, `slots::queue_order!`).
pub const SLOT_AHEAD: &str = "SELECT count(*) FROM concurrency_slots q \
     WHERE q.workflow_name = $1 AND q.concurrency_key = $2 AND q.queued \
       AND (q.rank, q.id) < (-$4::int, $3::uuid)";

/// The request row, as the answer shows it.
#[derive(Debug, Clone)]
pub struct Head {
    /// Shared with the workflow when the answer is kept from memory.
    pub workflow_name: Arc<str>,
    /// The workflow version it runs (beyond Clamp).
    pub workflow_version: i32,
    /// As reads show it (`IN_PROGRESS` derived).
    pub status: RequestStatus,
    pub current_step_id: i32,
    pub reason: Option<String>,
    /// `created_at` as Postgres renders a timestamptz in JSON (the session is in UTC).
    pub created_at: String,
    pub step_attempts: i32,
    pub last_error: Option<String>,
    pub retry_at: Option<String>,
    /// The start a delayed create asked for (beyond Clamp).
    pub start_at: Option<String>,
    /// Times it was retried after it failed or was cancelled (beyond Clamp).
    pub retries: i32,
    /// The request this one reruns (beyond Clamp).
    pub rerun_of: Option<Uuid>,
    /// The request whose WORKFLOW step started this one (beyond Clamp).
    pub parent_id: Option<Uuid>,
    /// Its branch or item index, when a fan-out step started it (beyond Clamp).
    pub fan_index: Option<i32>,
    /// The event and key it waits for, paused at an EVENT step (beyond Clamp).
    pub wait_event: Option<String>,
    pub wait_key: Option<String>,
    /// When it must have finished by (beyond Clamp).
    pub deadline: Option<String>,
    /// Its key under its workflow's limits, while it waits for a slot (beyond Clamp).
    pub concurrency_key: Option<String>,
    /// Waiting for a slot of its key: how many of the key's requests wait before it.
    pub slot_ahead: Option<i64>,
    /// Its priority, 1 to 9, when created with one (beyond Clamp; None: the default, 5).
    pub priority: Option<i16>,
}

/// What a request that is not running waits for, as its row says (beyond Clamp).
#[derive(Debug, PartialEq, Eq)]
pub enum Waits<'a> {
    /// Paused at an EVENT step: its event and key, and when it times out, if it does.
    Event {
        event: &'a str,
        key: &'a str,
        until: Option<&'a str>,
    },
    /// Paused at an ASYNC step with an `answerTimeout`: when it times out.
    Answer {
        by: &'a str,
    },
    /// Sleeping at a WAIT step (its attempts mark the sleep, with no error): until when.
    Sleep {
        until: &'a str,
    },
    /// A step whose call failed, to be tried again (`retry_at`: when).
    Retry,
    Nothing,
}

impl Head {
    /// What the request waits for, one of the cases above, decided once for every reader.
    pub fn waits(&self) -> Waits<'_> {
        let at = self.retry_at.as_deref();
        let pending = self.step_attempts > 0 && !self.status.is_finished();
        match (self.status, &self.wait_event, &self.wait_key) {
            (RequestStatus::Paused, Some(event), Some(key)) => Waits::Event {
                event,
                key,
                until: at,
            },
            (RequestStatus::Paused, _, _) => at.map_or(Waits::Nothing, |by| Waits::Answer { by }),
            _ if pending && self.last_error.is_none() => {
                at.map_or(Waits::Nothing, |until| Waits::Sleep { until })
            }
            _ if pending => Waits::Retry,
            _ => Waits::Nothing,
        }
    }
}

/// One step attempt's row, as the answer shows it.
#[derive(Debug, Clone)]
pub struct StepRow {
    pub step_id: i32,
    /// Shared with the workflow's step when kept from memory (a kept answer is dropped
    /// for every request that finishes once the cache is full: each allocation it holds
    /// is freed then, cold).
    pub name: Arc<str>,
    /// STARTED (an ASYNC step waiting), COMPLETED, FAILED or SKIPPED.
    pub status: StepStatus,
    pub request: Option<Bytes>,
    pub response: Option<Bytes>,
    pub time_taken_ms: Option<i64>,
    pub reason: Option<String>,
    /// The start and end as read back from `timestamptz` columns, in ms since the epoch.
    pub started_ms: f64,
    pub finished_ms: Option<f64>,
    pub attempts: i32,
    /// The child request a WORKFLOW step started (beyond Clamp).
    pub child_id: Option<Uuid>,
}

/// The step rows of a request this process runs, as committed so far, and where the
/// request row stood after the last of them (its current step and attempts): a read of
/// the request row that finds it there sees exactly these rows.
#[derive(Debug, Clone)]
pub struct Live {
    pub workflow_name: Arc<str>,
    pub workflow_version: i32,
    /// When the request was created, in microseconds since the Unix epoch.
    pub created_us: i64,
    /// Its deadline, likewise (None: none).
    pub deadline_us: Option<i64>,
    /// Its priority (None: the default).
    pub priority: Option<i16>,
    pub steps: Vec<StepRow>,
    pub current_step_id: i32,
    pub step_attempts: i32,
}

/// Milliseconds since the Unix epoch as they come back from a `timestamptz` written with
/// `to_timestamp(ms / 1000.0)` and read with `extract(epoch …)::float8 * 1000`: Postgres
/// keeps microseconds (rounded half to even, after moving to its own epoch) and reads
/// them back as an exact decimal turned into a float.
pub fn roundtrip_ms(ms: f64) -> f64 {
    /// Seconds from 1970-01-01 to 2000-01-01, Postgres's epoch.
    const PG_EPOCH_S: f64 = 946_684_800.0;
    let pg_us = ((ms / 1000.0 - PG_EPOCH_S) * 1_000_000.0).round_ties_even() as i64;
    let unix_us = pg_us + 946_684_800_000_000;
    unix_us as f64 / 1_000_000.0 * 1000.0
}

/// `round(finished_ms - started_ms)` as Postgres computes it on float8 (half to even).
pub fn time_taken_ms(started_ms: f64, finished_ms: f64) -> i64 {
    (finished_ms - started_ms).round_ties_even() as i64
}

/// A `timestamptz` of `micros` since the Unix epoch as Postgres renders it in JSON in a
/// UTC session: `2026-12-01T06:33:19.59255+00:00` (fraction without trailing zeros).
pub fn pg_json_timestamp(micros: i64) -> String {
    let Some(t) = chrono::DateTime::from_timestamp_micros(micros) else {
        return String::new();
    };
    let mut s = t.format("%Y-%m-%dT%H:%M:%S").to_string();
    let frac = micros.rem_euclid(1_000_000);
    if frac != 0 {
        let digits = format!("{frac:06}");
        s.push('.');
        s.push_str(digits.trim_end_matches('0'));
    }
    s.push_str("+00:00");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_as_postgres_renders_them() {
        assert_eq!(
            pg_json_timestamp(1_764_570_799_592_550),
            "2025-12-01T06:33:19.59255+00:00"
        );
        assert_eq!(
            pg_json_timestamp(1_764_570_799_000_000),
            "2025-12-01T06:33:19+00:00"
        );
        assert_eq!(
            pg_json_timestamp(1_764_570_799_000_001),
            "2025-12-01T06:33:19.000001+00:00"
        );
    }

    #[test]
    fn times_round_as_postgres_rounds_them() {
        assert_eq!(time_taken_ms(0.0, 2.5), 2);
        assert_eq!(time_taken_ms(0.0, 3.5), 4);
        let ms = 1_764_570_799_592.550_4;
        assert!((roundtrip_ms(ms) - 1_764_570_799_592.55).abs() < 1e-6);
    }
}
