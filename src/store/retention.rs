//! Retention (beyond Clamp): a history dropped, never deleted row by row. A set of
//! partitions (`partitions`) goes when every request in it has finished and is past the
//! age that applies to it: its workflow's `retention` for its status, else the server's
//! (`--retention-days` for COMPLETED, `--retention-failed-days`, `--retention-cancelled-
//! days`; a status with no age keeps its requests forever). A request still open in an
//! old set (a PAUSED request may wait forever) keeps its set, found by id as ever, until it
//! finishes; so does one not yet past its age. Each set is looked at once its range is
//! older than the smallest age and `--partition-skew-seconds` (an instance whose clock is
//! behind makes ids of the past), then again when it may have become free.
//!
//! A set that may go is written out first when `--retention-export-dir` is set (one JSON
//! line per request, its steps in it, to `<dir>/service_requests_p<suffix>.jsonl`, synced
//! before the drop), then detached (`DETACH PARTITION … CONCURRENTLY`: creates and steps
//! go on) and looked at once more, detached, before it is dropped: a request that came in
//! between the look and the detach (a clock far behind) puts the set back instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use futures_util::{pin_mut, TryStreamExt};
use tokio::io::AsyncWriteExt;
use tokio_postgres::Client;

use super::partitions::{v7_ms, Set, TABLES};
use crate::status::RequestStatus;

/// How long finished requests are kept, by status: the server's (a workflow's own
/// overriding it, `Overrides`).
pub type Policy = crate::config::Retention;

fn by_status(p: &Policy) -> [(RequestStatus, Option<Duration>); 3] {
    [
        (RequestStatus::Completed, p.completed),
        (RequestStatus::Failed, p.failed),
        (RequestStatus::Cancelled, p.cancelled),
    ]
}

/// Workflows' own ages: (workflow, status, age); an age of None keeps them forever.
pub type Overrides = Vec<(String, RequestStatus, Option<Duration>)>;

/// What a look at a set found.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    pub rows: i64,
    pub open: i64,
    /// When the last of them is past its age (ms; None when it holds no finished one).
    pub free_at_ms: Option<f64>,
    /// One of them is kept forever.
    pub forever: bool,
    pub now_ms: f64,
    /// The first thousand of those not finished, to be looked up by id until they are.
    pub open_ids: Vec<uuid::Uuid>,
}

impl Look {
    /// The set may go now.
    pub fn free(&self) -> bool {
        self.open == 0 && !self.forever && self.free_at_ms.is_none_or(|t| t <= self.now_ms)
    }

    /// When to look again (ms), if ever: when the last finished one is past its age, or,
    /// while some are open, after `again`.
    pub fn next_ms(&self, again: Duration) -> Option<f64> {
        if self.forever {
            return None;
        }
        let later = self.now_ms + again.as_millis() as f64;
        Some(match (self.open, self.free_at_ms) {
            (0, Some(t)) => t,
            _ => later,
        })
    }
}

/// `$1` workflows, `$2` their statuses, `$3` their ages (ms, NULL forever), `$4` the
/// server's statuses, `$5` its ages: the look at a set's partition (its name in the text):
/// its rows, those not finished, the latest moment one of them becomes free, whether one
/// is kept forever, and the database's clock.
pub fn look_sql(set: &Set) -> String {
    template(
        concat!(
    "SELECT count(*)::bigint, count(*) FILTER (WHERE s.status NOT IN (",
    crate::status::status_sql!(Finished),
    "))::bigint,
       (extract(epoch FROM max(s.finished_at + (CASE WHEN a.wf IS NULL THEN d.ms ELSE a.ms END) * interval '1 millisecond')) * 1000)::float8,
       coalesce(bool_or(s.status IN (",
    crate::status::status_sql!(Finished),
    ") AND (CASE WHEN a.wf IS NULL THEN d.ms ELSE a.ms END) IS NULL), false),
       (extract(epoch FROM now()) * 1000)::float8,
       (array_agg(s.id) FILTER (WHERE s.status NOT IN (",
            crate::status::status_sql!(Finished),
            ")))[1:1000]
FROM {partition} s
LEFT JOIN unnest($1::text[], $2::text[], $3::float8[]) a(wf, st, ms)
       ON a.wf = s.workflow_name AND a.st = s.status
LEFT JOIN unnest($4::text[], $5::float8[]) d(st, ms) ON d.st = s.status"
),
        set,
    )
}

/// Every request of a set's partition with its steps, one JSON document a row, by id
/// (the partitions' names in the text).
pub fn export_sql(set: &Set) -> String {
    template(
        "SELECT json_build_object('request', to_jsonb(s), 'steps', \
     coalesce((SELECT jsonb_agg(to_jsonb(st) ORDER BY st.id) FROM {steps} st \
               WHERE st.service_request_id = s.id), '[]'::jsonb))::text \
     FROM {partition} s ORDER BY s.id",
        set,
    )
}

fn template(sql: &str, set: &Set) -> String {
    sql.replace("{partition}", &set.partition("service_requests"))
        .replace("{steps}", &set.partition("steps_status"))
}

/// Looks at one set's service_requests partition (or, `detached`, the same table after
/// its detach) with the ages of `policy` and `overrides`.
pub async fn look(
    c: &Client,
    set: &Set,
    policy: &Policy,
    overrides: &Overrides,
) -> Result<Look, tokio_postgres::Error> {
    let ms = |d: &Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
    let wfs: Vec<&str> = overrides.iter().map(|o| o.0.as_str()).collect();
    let sts: Vec<&str> = overrides.iter().map(|o| o.1.as_str()).collect();
    let ages: Vec<Option<f64>> = overrides.iter().map(|o| ms(&o.2)).collect();
    let d_sts: Vec<&str> = by_status(policy).iter().map(|(s, _)| s.as_str()).collect();
    let d_ages: Vec<Option<f64>> = by_status(policy).iter().map(|(_, a)| ms(a)).collect();
    let r = c
        .query_one(&look_sql(set), &[&wfs, &sts, &ages, &d_sts, &d_ages])
        .await?;
    Ok(Look {
        rows: r.get(0),
        open: r.get(1),
        free_at_ms: r.get(2),
        forever: r.get(3),
        now_ms: r.get(4),
        open_ids: r.get::<_, Option<Vec<uuid::Uuid>>>(5).unwrap_or_default(),
    })
}

/// Whether a set's range ended long enough ago to be looked at, at `now_ms`: by the
/// smallest age that applies and by how far behind an instance's clock may be.
pub fn due(set: &Set, now_ms: u64, smallest_age: Duration, skew: Duration) -> bool {
    set.hi
        .is_some_and(|hi| v7_ms(hi) + (smallest_age + skew).as_millis() as u64 <= now_ms)
}

/// Writes a set's requests to `dir`, synced, before it goes; returns the file.
pub async fn export(c: &Client, set: &Set, dir: &Path) -> std::io::Result<PathBuf> {
    let name = format!("{}.jsonl", set.partition("service_requests"));
    let path = dir.join(&name);
    let partial = dir.join(format!("{name}.partial"));
    let mut f = tokio::fs::File::create(&partial).await?;
    let sql = export_sql(set);
    let rows = c
        .query_raw(&sql, std::iter::empty::<&str>())
        .await
        .map_err(std::io::Error::other)?;
    pin_mut!(rows);
    let mut buf = Vec::with_capacity(1 << 16);
    while let Some(row) = rows.try_next().await.map_err(std::io::Error::other)? {
        buf.extend_from_slice(row.get::<_, &str>(0).as_bytes());
        buf.push(b'\n');
        if buf.len() >= 1 << 16 {
            f.write_all(&buf).await?;
            buf.clear();
        }
    }
    f.write_all(&buf).await?;
    f.sync_all().await?;
    drop(f);
    tokio::fs::rename(&partial, &path).await?;
    tokio::fs::File::open(dir).await?.sync_all().await?;
    Ok(path)
}

/// `DETACH … CONCURRENTLY` of each of a set's partitions (two transactions each, so not
/// in one of ours); one already detached is skipped, one left half done is finished.
pub fn detach_sql(set: &Set, finalize: bool) -> Vec<String> {
    TABLES
        .iter()
        .map(|(t, _)| {
            let how = if finalize { "FINALIZE" } else { "CONCURRENTLY" };
            format!(
                "ALTER TABLE {t} DETACH PARTITION {} {how}",
                set.partition(t)
            )
        })
        .collect()
}

/// Puts a detached set back (a request came in after the look).
pub fn attach_sql(set: &Set) -> Vec<String> {
    let bound =
        |u: Option<uuid::Uuid>, none: &str| u.map_or(none.to_string(), |u| format!("'{u}'"));
    TABLES
        .iter()
        .map(|(t, _)| {
            format!(
                "ALTER TABLE {t} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})",
                set.partition(t),
                bound(set.lo, "MINVALUE"),
                bound(set.hi, "MAXVALUE")
            )
        })
        .collect()
}

/// Drops a detached set's tables.
pub fn drop_sql(set: &Set) -> String {
    let names: Vec<String> = TABLES.iter().map(|(t, _)| set.partition(t)).collect();
    format!("DROP TABLE IF EXISTS {}", names.join(", "))
}

/// `$1` ids: how many of those requests have not finished (each looked up by id, in the
/// partition of its time).
pub(super) const STILL_OPEN: &str = concat!(
    "SELECT count(*) FROM unnest($1::uuid[]) AS u(id) JOIN service_requests s ON s.id = u.id \
     WHERE s.status NOT IN (",
    crate::status::status_sql!(Finished),
    ")"
);

/// What a keeper knows of a set it looked at.
#[derive(Debug, Clone)]
enum Known {
    /// Look again at this time (None: never; a request in it is kept forever).
    At(Option<f64>),
    /// Open requests hold it: these ids (all of them) are looked up each pass, and the set
    /// looked at again when none is open.
    HeldBy(Vec<uuid::Uuid>),
}

/// When each set may be looked at again (per keeper; a new keeper looks at each once).
#[derive(Debug, Default)]
pub struct Agenda(HashMap<String, Known>);

impl Agenda {
    /// Whether to look at `set` at `now_ms` (a set held by open requests it knows all of
    /// is looked at when `c` says none of them is open any more).
    pub async fn wants(
        &self,
        c: &Client,
        set: &Set,
        now_ms: f64,
    ) -> Result<bool, tokio_postgres::Error> {
        Ok(match self.0.get(&set.suffix) {
            None => true,
            Some(Known::At(None)) => false,
            Some(Known::At(Some(t))) => *t <= now_ms,
            Some(Known::HeldBy(ids)) => {
                let open: i64 = c.query_one(STILL_OPEN, &[ids]).await?.get(0);
                open == 0
            }
        })
    }

    /// What a look found: held by open requests (all of them known), or when to look again.
    pub fn note(&mut self, set: &Set, look: &Look, again: std::time::Duration) {
        let known = if look.open > 0 && look.open as usize == look.open_ids.len() {
            Known::HeldBy(look.open_ids.clone())
        } else {
            Known::At(look.next_ms(again))
        };
        self.0.insert(set.suffix.clone(), known);
    }

    /// Look at it again on the next pass.
    pub fn soon(&mut self, set: &Set) {
        self.0.insert(set.suffix.clone(), Known::At(Some(0.0)));
    }

    pub fn forget(&mut self, set: &Set) {
        self.0.remove(&set.suffix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_free_when_all_is_finished_and_past_its_age() {
        let look = |open, free_at: Option<f64>, forever| Look {
            rows: 10,
            open,
            free_at_ms: free_at,
            forever,
            now_ms: 1000.0,
            open_ids: Vec::new(),
        };
        assert!(look(0, Some(900.0), false).free());
        assert!(look(0, None, false).free(), "an empty set");
        assert!(!look(1, Some(900.0), false).free(), "one still open");
        assert!(
            !look(0, Some(1100.0), false).free(),
            "one not yet past its age"
        );
        assert!(!look(0, Some(900.0), true).free(), "one kept forever");
        let again = Duration::from_secs(60);
        assert_eq!(look(0, Some(1100.0), false).next_ms(again), Some(1100.0));
        assert_eq!(look(2, Some(1100.0), false).next_ms(again), Some(61_000.0));
        assert_eq!(look(0, None, true).next_ms(again), None);
    }

    #[test]
    fn statements_name_the_sets_partitions() {
        let set = Set {
            suffix: "20261205t211500".into(),
            lo: Some("01a24800-0000-7000-8000-000000000000".parse().unwrap()),
            hi: None,
            detaching: false,
        };
        assert!(export_sql(&set).contains("FROM service_requests_p20261205t211500 s"));
        assert!(export_sql(&set).contains("steps_status_p20261205t211500 st"));
        assert_eq!(detach_sql(&set, false).len(), 4);
        assert!(detach_sql(&set, true)[1].ends_with("steps_status_p20261205t211500 FINALIZE"));
        assert!(
            attach_sql(&set)[0].ends_with("'01a24800-0000-7000-8000-000000000000') TO (MAXVALUE)")
        );
        assert_eq!(
            drop_sql(&set),
            "DROP TABLE IF EXISTS service_requests_p20261205t211500, steps_status_p20261205t211500, \
             fan_joins_p20261205t211500, event_takes_p20261205t211500"
        );
    }
}
