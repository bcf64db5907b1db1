//! Schedules (beyond Clamp): a definition that starts a workflow at times given by a cron
//! pattern (with seconds, in an IANA time zone) or by a fixed interval, read and checked
//! here, and the fire times it gives. Pure: the runner (`engine::timers::schedules`) and the
//! reads (`GET /schedules/{name}`'s next fires) both take every fire time from
//! `CompiledSchedule::next_after`, so what a read promises is what the runner does.
//!
//! Daylight-saving changes are croner's (the OCPS rules, as vixie cron): a fixed-time
//! pattern whose wall-clock time falls in a skipped hour fires once, at the first instant
//! after the gap; in a repeated hour it fires once, at the earlier instant. A pattern whose
//! hour, minute or second is a wildcard or a step is an interval, and follows real time
//! through both: it fires at every matching wall-clock time that happens.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde_json::{Map, Value};

use super::validate::MAX_NAME_LEN;
use super::ValidationError;

/// What a fire does while the schedule's previous run has not finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Start nothing; the fire is recorded as skipped. The default: a slow run is not
    /// piled on (Temporal's default too).
    #[default]
    Skip,
    /// Start a run anyway: runs may overlap.
    Allow,
}

/// Which fire times missed while no instance ran (or the schedule's fires were late by
/// more than `LATE_GRACE`) are made up when fires resume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// None: only fires at most `LATE_GRACE` old start.
    None,
    /// The most recent missed fire only. The default: after an outage the work the
    /// schedule stands for is done once, not as many times as it was missed.
    #[default]
    Latest,
    /// Every missed fire, oldest first, up to the `MAX_CATCH_UP` most recent ones.
    All,
}

/// How late a fire may start under `catchUp: none`: the lateness of a live runner (its
/// pass interval, a slow statement), not an outage.
pub const LATE_GRACE: Duration = Duration::from_secs(5);

/// Most missed fires `catchUp: all` makes up after an outage: the most recent ones.
pub const MAX_CATCH_UP: usize = 1000;

/// Most fires of one schedule one pass of the runner makes (the rest in the next passes).
pub const MAX_FIRES_PER_PASS: usize = 100;

/// The longest `every` accepted.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 86_400);

/// A schedule's definition as posted and stored (camelCase JSON). `paused` is not part
/// of it: it is the schedule's state, changed by pause and resume.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleDef {
    pub name: String,
    pub workflow: String,
    /// The workflow version each fire runs; None: the latest when the fire happens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// An IANA zone name; the cron pattern is read on its wall clock.
    pub timezone: String,
    /// Each run's payload (a JSON object).
    pub payload: Value,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    /// Each run's priority (`?priority=` of a create; None: the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i16>,
}

/// When a schedule fires.
#[derive(Debug, Clone)]
enum When {
    Cron(Box<croner::Cron>),
    /// Every this many milliseconds since the Unix epoch (a whole number of seconds).
    Every(i64),
}

/// A definition checked and ready to give fire times.
#[derive(Debug, Clone)]
pub struct CompiledSchedule {
    pub def: ScheduleDef,
    pub tz: Tz,
    when: When,
}

/// What one pass of the runner does for a due schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The fire times to make now, oldest first.
    pub fires: Vec<DateTime<Utc>>,
    /// The first fire time not made by this pass (None: the schedule never fires again).
    pub next: Option<DateTime<Utc>>,
}

const FIELDS: [&str; 11] = [
    "name", "workflow", "version", "cron", "every", "timezone", "payload", "overlap", "catchUp",
    "paused", "priority",
];

fn bad<T>(msg: String) -> Result<T, ValidationError> {
    Err(ValidationError(msg))
}

/// A name as a path segment and a key: the rules of workflow names.
fn check_name(field: &str, v: Option<&Value>) -> Result<String, ValidationError> {
    let Some(v) = v else {
        return bad(format!("{field}: is required"));
    };
    let Some(s) = v.as_str() else {
        return bad(format!("{field}: must be a string"));
    };
    if s.trim().is_empty() {
        return bad(format!("{field}: must not be empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return bad(format!("{field}: is longer than {MAX_NAME_LEN} bytes"));
    }
    if s.chars().any(|c| c == '/' || c.is_control()) {
        return bad(format!(
            "{field}: must not contain '/' or control characters"
        ));
    }
    Ok(s.to_string())
}

/// An optional string field (a `null` is refused like any other non-string: a field
/// left out takes its default).
fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, ValidationError> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => bad(format!("{field}: must be a string")),
    }
}

/// True when a string anywhere in `v` holds U+0000, which jsonb cannot store.
fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Reads `every`: whole numbers with a unit (`s`, `m`, `h`, `d`), one or more, as `90s`,
/// `5m`, `1h30m`, `1d`; at least a second, at most `MAX_EVERY`.
pub fn parse_every(s: &str) -> Result<Duration, ValidationError> {
    let msg = || {
        ValidationError(format!(
            "every: {s:?} is not a duration like \"30s\", \"5m\", \"1h30m\" or \"1d\""
        ))
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(msg()),
        };
        let n: u64 = digits.parse().map_err(|_| msg())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(msg)?;
    }
    if !digits.is_empty() || total == 0 && s.trim().is_empty() {
        return Err(msg());
    }
    let d = Duration::from_secs(total);
    if d < Duration::from_secs(1) {
        return bad("every: must be at least 1s".into());
    }
    if d > MAX_EVERY {
        return bad("every: must be at most 366d".into());
    }
    Ok(d)
}

/// The cron parser: seconds optional (a five-field pattern fires at second 0).
fn cron_parser() -> croner::parser::CronParser {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
}

/// Reads and checks a posted (or stored) definition; the error names the field. The
/// workflow's existence is the caller's to check (it is in Postgres).
pub fn validate(v: &Value) -> Result<CompiledSchedule, ValidationError> {
    let Value::Object(obj) = v else {
        return bad("the schedule definition must be a JSON object".into());
    };
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return bad(format!("{k}: unknown field"));
    }
    let name = check_name("name", obj.get("name"))?;
    let workflow = check_name("workflow", obj.get("workflow"))?;
    let version = match obj.get("version") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n @ 1..=0x7fff_ffff) => Some(n as u32),
            _ => return bad("version: must be a whole number from 1".into()),
        },
    };
    let timezone = opt_str(obj, "timezone")?.unwrap_or("UTC").to_string();
    let tz: Tz = timezone
        .parse()
        .map_err(|_| ValidationError(format!("timezone: unknown zone {timezone:?}")))?;
    let cron = opt_str(obj, "cron")?.map(str::to_string);
    let every = opt_str(obj, "every")?.map(str::to_string);
    let when = match (&cron, &every) {
        (Some(_), Some(_)) => return bad("cron, every: give one of them, not both".into()),
        (None, None) => return bad("cron, every: one of them is required".into()),
        (Some(c), None) => When::Cron(Box::new(
            cron_parser()
                .parse(c)
                .map_err(|e| ValidationError(format!("cron: {c:?}: {e}")))?,
        )),
        (None, Some(e)) => When::Every(parse_every(e)?.as_millis() as i64),
    };
    let payload = match obj.get("payload") {
        None => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) if !has_nul(p) => p.clone(),
        Some(Value::Object(_)) => {
            return bad("payload: contains \\u0000, which cannot be stored".into())
        }
        Some(_) => return bad("payload: must be a JSON object".into()),
    };
    let overlap = match opt_str(obj, "overlap")? {
        None | Some("skip") => Overlap::Skip,
        Some("allow") => Overlap::Allow,
        Some(_) => return bad("overlap: must be \"skip\" or \"allow\"".into()),
    };
    let catch_up = match opt_str(obj, "catchUp")? {
        None | Some("latest") => CatchUp::Latest,
        Some("none") => CatchUp::None,
        Some("all") => CatchUp::All,
        Some(_) => return bad("catchUp: must be \"none\", \"latest\" or \"all\"".into()),
    };
    let priority = match obj.get("priority") {
        None => None,
        Some(v) => super::model::priority(v.as_i64()).map_err(ValidationError)?,
    };
    if !matches!(obj.get("paused"), None | Some(Value::Bool(_))) {
        return bad("paused: must be true or false".into());
    }
    Ok(CompiledSchedule {
        def: ScheduleDef {
            name,
            workflow,
            version,
            cron,
            every,
            timezone,
            payload,
            overlap,
            catch_up,
            priority,
        },
        tz,
        when,
    })
}

/// The `paused` a posted definition asks for (None: not given).
pub fn paused_in(v: &Value) -> Option<bool> {
    v.get("paused").and_then(Value::as_bool)
}

impl CompiledSchedule {
    /// The first fire time strictly after `t`; None when there is none (a cron pattern
    /// whose years are past). The one source of fire times.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.when {
            When::Every(ms) => {
                let k = t.timestamp_millis().div_euclid(*ms) + 1;
                DateTime::from_timestamp_millis(k.checked_mul(*ms)?)
            }
            When::Cron(c) => c
                .find_next_occurrence(&t.with_timezone(&self.tz), false)
                .ok()
                .map(|l| l.with_timezone(&Utc)),
        }
    }

    /// The first fire time after `now`, or why there is none (a 400 at create).
    pub fn first_after(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, ValidationError> {
        self.next_after(now).ok_or_else(|| {
            ValidationError(format!(
                "cron: {:?} has no fire time after now",
                self.def.cron.as_deref().unwrap_or("")
            ))
        })
    }

    /// Fire times in (`after`, `upto`], oldest first, at most `limit`.
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = after;
        while out.len() < limit {
            match self.next_after(t) {
                Some(f) if f <= upto => {
                    out.push(f);
                    t = f;
                }
                _ => break,
            }
        }
        out
    }

    /// A time a little before the `n`th most recent fire time at or before `upto` (or the
    /// Unix epoch when there are fewer): only where `fires_between` starts looking, so a
    /// long outage is not walked fire by fire; the fire times still come from
    /// `next_after`. A cron pattern steps back with croner's backward search.
    fn nth_back(&self, upto: DateTime<Utc>, n: usize) -> DateTime<Utc> {
        let floor = DateTime::<Utc>::UNIX_EPOCH;
        let before = |t: DateTime<Utc>| t - chrono::Duration::seconds(1);
        match &self.when {
            When::Every(ms) => {
                let k = upto.timestamp_millis().div_euclid(*ms) - n as i64 + 1;
                DateTime::from_timestamp_millis(k.saturating_mul(*ms))
                    .map_or(floor, before)
                    .max(floor)
            }
            When::Cron(c) => {
                let mut t = upto.with_timezone(&self.tz);
                let mut inclusive = true;
                for _ in 0..n {
                    match c.find_previous_occurrence(&t, inclusive) {
                        Ok(p) if p.with_timezone(&Utc) >= floor => t = p,
                        _ => return floor,
                    }
                    inclusive = false;
                }
                before(t.with_timezone(&Utc))
            }
        }
    }

    /// What a pass of the runner at `now` does for this schedule, whose first fire time
    /// not yet made is `from`: the fires `catchUp` asks for among those due, and the next
    /// fire time to wait for.
    pub fn due(&self, from: DateTime<Utc>, now: DateTime<Utc>) -> Due {
        if from > now {
            return Due {
                fires: Vec::new(),
                next: Some(from),
            };
        }
        // `from` itself is due: look from just before it.
        let start = from - chrono::Duration::milliseconds(1);
        let after = match self.def.catch_up {
            CatchUp::None => start.max(now - LATE_GRACE),
            CatchUp::Latest => start.max(self.nth_back(now, 1)),
            CatchUp::All => start.max(self.nth_back(now, MAX_CATCH_UP)),
        };
        let mut fires = self.fires_between(after, now, MAX_FIRES_PER_PASS);
        if self.def.catch_up == CatchUp::Latest && fires.len() > 1 {
            fires.drain(..fires.len() - 1);
        }
        let next = match fires.last() {
            // Due fires left for the next pass.
            Some(&last) if fires.len() == MAX_FIRES_PER_PASS => self.next_after(last),
            _ => self.next_after(now),
        };
        Due { fires, next }
    }

    /// `t` on this schedule's wall clock, as RFC 3339 with its offset.
    pub fn local(&self, t: DateTime<Utc>) -> String {
        self.tz
            .from_utc_datetime(&t.naive_utc())
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(v: Value) -> CompiledSchedule {
        validate(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    fn cron(pattern: &str, tz: &str) -> CompiledSchedule {
        compile(json!({"name": "s", "workflow": "w", "cron": pattern, "timezone": tz}))
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn message(v: Value) -> String {
        validate(&v).map(|_| ()).unwrap_err().0
    }

    #[test]
    fn reads_a_definition_with_its_defaults() {
        let s = compile(json!({"name": "nightly", "workflow": "report", "cron": "0 0 3 * * *"}));
        assert_eq!(s.def.timezone, "UTC");
        assert_eq!(s.def.overlap, Overlap::Skip);
        assert_eq!(s.def.catch_up, CatchUp::Latest);
        assert_eq!(s.def.payload, json!({}));
        assert_eq!(
            serde_json::to_value(&s.def).unwrap(),
            json!({"name": "nightly", "workflow": "report", "cron": "0 0 3 * * *",
                   "timezone": "UTC", "payload": {}, "overlap": "skip", "catchUp": "latest"})
        );
        // What is stored reads back the same.
        let again = compile(serde_json::to_value(&s.def).unwrap());
        assert_eq!(again.def, s.def);
        let s = compile(
            json!({"name": "n", "workflow": "w", "every": "90s", "version": 2,
            "payload": {"a": 1}, "overlap": "allow", "catchUp": "all", "paused": true}),
        );
        assert_eq!(s.def.version, Some(2));
        assert_eq!(s.def.catch_up, CatchUp::All);
        assert_eq!(paused_in(&json!({"paused": true})), Some(true));
    }

    #[test]
    fn refuses_bad_definitions_naming_the_field() {
        let base = || json!({"name": "s", "workflow": "w", "cron": "* * * * * *"});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            message(b)
        };
        let check = |msg: String, starts: &str| {
            assert!(
                msg.starts_with(starts),
                "{msg:?} should start with {starts:?}"
            )
        };
        check(
            message(json!([])),
            "the schedule definition must be a JSON object",
        );
        check(with("name", json!("")), "name: ");
        check(with("name", json!("a/b")), "name: ");
        check(with("name", json!(5)), "name: ");
        check(
            message(json!({"workflow": "w", "cron": "* * * * *"})),
            "name: is required",
        );
        check(with("workflow", json!(null)), "workflow: ");
        check(with("timezone", json!(null)), "timezone: ");
        check(with("payload", json!(null)), "payload: ");
        check(with("version", json!(null)), "version: ");
        check(with("cron", json!("every tuesday")), "cron: ");
        check(with("cron", json!("61 * * * * *")), "cron: ");
        check(with("every", json!("1s")), "cron, every: ");
        check(
            message(json!({"name": "s", "workflow": "w"})),
            "cron, every: ",
        );
        assert_eq!(
            with("timezone", json!("Mars/Base")),
            "timezone: unknown zone \"Mars/Base\""
        );
        check(with("version", json!(0)), "version: ");
        check(with("version", json!("2")), "version: ");
        check(with("payload", json!([1])), "payload: ");
        check(with("payload", json!({"a": "\u{0}"})), "payload: ");
        check(with("overlap", json!("sometimes")), "overlap: ");
        check(with("catchUp", json!("some")), "catchUp: ");
        check(with("paused", json!("yes")), "paused: ");
        check(with("colour", json!("red")), "colour: unknown field");
        let every = |e: &str| message(json!({"name": "s", "workflow": "w", "every": e}));
        for e in ["", "0s", "500ms", "1x", "5", "s", "1.5s", "367d", "-1s"] {
            check(every(e), "every: ");
        }
    }

    #[test]
    fn reads_durations() {
        for (s, secs) in [
            ("1s", 1),
            ("30s", 30),
            ("5m", 300),
            ("1h", 3600),
            ("1d", 86_400),
            ("1h30m", 5400),
        ] {
            assert_eq!(parse_every(s).unwrap(), Duration::from_secs(secs), "{s}");
        }
    }

    #[test]
    fn every_is_aligned_to_the_epoch() {
        let s = compile(json!({"name": "s", "workflow": "w", "every": "1s"}));
        let t = utc("2026-05-01T10:00:00.400Z");
        assert_eq!(s.next_after(t), Some(utc("2026-05-01T10:00:01Z")));
        assert_eq!(
            s.next_after(utc("2026-05-01T10:00:01Z")),
            Some(utc("2026-05-01T10:00:02Z"))
        );
        let fires = s.fires_between(t, utc("2026-05-01T10:00:10Z"), 100);
        assert_eq!(fires.len(), 10);
        assert!(fires
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)));
        let s = compile(json!({"name": "s", "workflow": "w", "every": "5m",
            "timezone": "Asia/Kolkata"}));
        assert_eq!(
            s.next_after(utc("2026-05-01T10:02:00Z")),
            Some(utc("2026-05-01T10:05:00Z"))
        );
    }

    #[test]
    fn cron_with_seconds_and_without() {
        let s = cron("*/15 * * * * *", "UTC");
        assert_eq!(
            s.next_after(utc("2026-05-01T10:00:00.5Z")),
            Some(utc("2026-05-01T10:00:15Z"))
        );
        let s = cron("30 9 * * 1-5", "UTC");
        // 2026-05-02 is a Saturday: the next weekday is Monday the 4th.
        assert_eq!(
            s.next_after(utc("2026-05-01T10:00:00Z")),
            Some(utc("2026-05-04T09:30:00Z"))
        );
        let s = cron("0 0 0 1 1 * 2020", "UTC");
        assert_eq!(s.next_after(utc("2026-05-01T10:00:00Z")), None);
        assert!(s
            .first_after(utc("2026-05-01T10:00:00Z"))
            .unwrap_err()
            .0
            .starts_with("cron: "));
    }

    /// The fire times of a day in local wall-clock terms.
    fn fires_on(s: &CompiledSchedule, from: &str, to: &str) -> Vec<String> {
        s.fires_between(utc(from), utc(to), 10_000)
            .into_iter()
            .map(|t| s.local(t))
            .collect()
    }

    #[test]
    fn a_fixed_time_in_the_skipped_hour_fires_once_just_after_it() {
        // Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC).
        let s = cron("0 30 2 * * *", "Europe/Berlin");
        let fires = fires_on(&s, "2026-03-27T12:00:00Z", "2026-03-31T12:00:00Z");
        assert_eq!(
            fires,
            [
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00",
                "2026-03-31T02:30:00+02:00",
            ]
        );
    }

    #[test]
    fn a_fixed_time_in_the_repeated_hour_fires_once() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET (01:00 UTC), so
        // 02:30 happens twice (00:30 and 01:30 UTC).
        let s = cron("0 30 2 * * *", "Europe/Berlin");
        let fires = s.fires_between(
            utc("2026-10-24T12:00:00Z"),
            utc("2026-10-26T12:00:00Z"),
            100,
        );
        assert_eq!(
            fires,
            [utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn an_interval_pattern_follows_real_time_across_both_changes() {
        // Every minute: the skipped hour has no minutes, the repeated one has them twice.
        let s = cron("0 * * * * *", "Europe/Berlin");
        let spring = s.fires_between(
            utc("2026-03-28T23:00:00Z"),
            utc("2026-03-29T03:00:00Z"),
            10_000,
        );
        assert_eq!(spring.len(), 4 * 60);
        assert!(spring
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::minutes(1)));
        let autumn = s.fires_between(
            utc("2026-10-24T23:00:00Z"),
            utc("2026-10-25T03:00:00Z"),
            10_000,
        );
        assert_eq!(autumn.len(), 4 * 60);
        assert!(autumn
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::minutes(1)));
        // Every second through the skipped hour: no second missed or doubled.
        let s = cron("* * * * * *", "Europe/Berlin");
        let secs = s.fires_between(
            utc("2026-03-29T00:59:50Z"),
            utc("2026-03-29T01:00:10Z"),
            100,
        );
        assert_eq!(secs.len(), 20);
        assert!(secs
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)));
    }

    #[test]
    fn due_fires_follow_the_catch_up_policy() {
        let def =
            |c: &str| compile(json!({"name": "s", "workflow": "w", "every": "1s", "catchUp": c}));
        let from = utc("2026-05-01T10:00:00Z");
        let now = utc("2026-05-01T10:01:00.300Z");
        // Not due yet: nothing, and the same next time.
        let early = def("all").due(from, utc("2026-05-01T09:59:59.5Z"));
        assert_eq!(
            early,
            Due {
                fires: vec![],
                next: Some(from)
            }
        );
        // none: only fires at most LATE_GRACE old.
        let d = def("none").due(from, now);
        assert_eq!(d.fires.first(), Some(&utc("2026-05-01T10:00:56Z")));
        assert_eq!(d.fires.last(), Some(&utc("2026-05-01T10:01:00Z")));
        assert_eq!(d.next, Some(utc("2026-05-01T10:01:01Z")));
        // latest: the most recent one only.
        let d = def("latest").due(from, now);
        assert_eq!(d.fires, [utc("2026-05-01T10:01:00Z")]);
        assert_eq!(d.next, Some(utc("2026-05-01T10:01:01Z")));
        // all: every one, oldest first, `MAX_FIRES_PER_PASS` a pass.
        let d = def("all").due(from, now);
        assert_eq!(d.fires.len(), 61);
        assert_eq!(d.fires[0], from);
        let late = utc("2026-05-01T11:00:00Z");
        let d = def("all").due(from, late);
        assert_eq!(d.fires.len(), MAX_FIRES_PER_PASS);
        // At most the `MAX_CATCH_UP` most recent missed fires.
        assert_eq!(
            d.fires[0],
            late - chrono::Duration::seconds(MAX_CATCH_UP as i64 - 1)
        );
        assert_eq!(d.next, Some(d.fires[99] + chrono::Duration::seconds(1)));
        let mut made = d.fires.clone();
        let mut next = d.next.unwrap();
        while next <= late {
            let d = def("all").due(next, late);
            made.extend(&d.fires);
            next = d.next.unwrap();
        }
        assert_eq!(made.len(), MAX_CATCH_UP);
        assert!(made
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)));
        assert_eq!(next, late + chrono::Duration::seconds(1));
    }

    #[test]
    fn catch_up_across_a_daylight_saving_change_agrees_with_the_forward_walk() {
        // A missed day that includes the skipped hour, for a fixed-time pattern.
        let s = compile(json!({"name": "s", "workflow": "w", "cron": "0 30 2 * * *",
            "timezone": "Europe/Berlin", "catchUp": "latest"}));
        let from = utc("2026-03-28T01:30:00Z");
        let d = s.due(from, utc("2026-03-29T01:10:00Z"));
        assert_eq!(d.fires, [utc("2026-03-29T01:00:00Z")]);
        assert_eq!(s.local(d.next.unwrap()), "2026-03-30T02:30:00+02:00");
        // All, for an every-minute pattern across the repeated hour: every minute once.
        let s = compile(json!({"name": "s", "workflow": "w", "cron": "0 * * * * *",
            "timezone": "Europe/Berlin", "catchUp": "all"}));
        let d = s.due(utc("2026-10-25T00:30:00Z"), utc("2026-10-25T01:29:30Z"));
        assert_eq!(d.fires.len(), 60);
        assert!(d
            .fires
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::minutes(1)));
        let d = s.due(utc("2026-10-24T00:30:00Z"), utc("2026-10-25T01:29:30Z"));
        assert_eq!(d.fires.len(), MAX_FIRES_PER_PASS);
        assert_eq!(
            d.fires[0],
            utc("2026-10-25T01:29:00Z") - chrono::Duration::minutes(MAX_CATCH_UP as i64 - 1)
        );
    }
}
