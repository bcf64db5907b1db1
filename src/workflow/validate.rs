//! Validation of a workflow definition (Clamp's rules, and the checks Clamp left to run
//! time), assigning step ids and types, and compiling conditions and transforms.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::expr::{context_name, Condition, KeyExpr};
use super::model::*;
use super::transform::compile_spec;

/// Why a definition was rejected: answered as 400 with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ValidationError> {
    Err(ValidationError(msg.into()))
}

/// Longest workflow name accepted (it is a URL path segment and a key in every row).
pub const MAX_NAME_LEN: usize = 200;

/// Checks a workflow name (also used for names in URLs).
pub fn check_name(name: &str) -> Result<(), ValidationError> {
    if name.trim().is_empty() {
        return err("name is required");
    }
    if name.len() > MAX_NAME_LEN {
        return err(format!("name is longer than {MAX_NAME_LEN} bytes"));
    }
    if name.chars().any(|c| c == '/' || c.is_control()) {
        return err("name must not contain '/' or control characters");
    }
    Ok(())
}

/// Validates `def`, assigns step ids (main steps in order, each step's `onFailure` steps
/// numbered right after it) and types, and compiles it.
pub fn compile(def: WorkflowDef) -> Result<Workflow, ValidationError> {
    check_name(&def.name)?;
    compile_in(
        def,
        &Scope {
            depth: 0,
            outer: &[],
            at: "",
        },
    )
}

/// Where a sequence of steps is compiled: a workflow (depth 0, nothing outside it), or
/// the steps of a fan-out step's branch or item (depth: fan-out steps around them).
struct Scope<'a> {
    depth: u32,
    /// Names the steps may refer to besides their own (the enclosing context's).
    outer: &'a [String],
    /// Where in the whole definition these steps are, for messages ("" at the top).
    at: &'a str,
}

fn compile_in(mut def: WorkflowDef, scope: &Scope) -> Result<Workflow, ValidationError> {
    if def.steps.is_empty() {
        return err("steps is required and must not be empty");
    }
    let known = known_names(&def, scope)?;
    let deadline = deadline_of(&def)?;
    let name = def.name.clone();
    let version = def.version;
    let mut steps = Vec::new();
    let mut main = Vec::with_capacity(def.steps.len());
    let mut next_id = 1u32;
    for (i, s) in def.steps.iter_mut().enumerate() {
        let at = format!("{}steps[{i}]", scope.at);
        let id = next_id;
        next_id += 1;
        main.push(id);
        let here = Here {
            workflow: &name,
            version,
            depth: scope.depth,
        };
        let mut compiled = compile_step(s, id, &at, &known, &here)?;
        for (j, f) in s.on_failure.iter_mut().enumerate() {
            let at = format!("{at}.onFailure[{j}]");
            if !f.on_failure.is_empty() {
                return err(format!("{at}: onFailure steps cannot have onFailure steps"));
            }
            let fid = next_id;
            next_id += 1;
            compiled.on_failure.push(fid);
            let here = Here {
                workflow: &name,
                version,
                depth: scope.depth,
            };
            let c = compile_step(f, fid, &at, &known, &here)?;
            if c.mode.has_children() {
                // Nothing would wait for its children: the request fails as its
                // onFailure steps finish.
                return err(format!(
                    "{at}.mode {} cannot be an onFailure step",
                    c.mode.as_str()
                ));
            }
            steps.push((fid, c));
        }
        for (j, f) in s.compensate.iter_mut().enumerate() {
            let at = format!("{at}.compensate[{j}]");
            if !f.on_failure.is_empty() || !f.compensate.is_empty() {
                return err(format!(
                    "{at}: compensate steps cannot have onFailure or compensate steps"
                ));
            }
            let cid = next_id;
            next_id += 1;
            compiled.compensate.push(cid);
            let here = Here {
                workflow: &name,
                version,
                depth: scope.depth,
            };
            let c = compile_step(f, cid, &at, &known, &here)?;
            if c.mode.has_children() {
                // Compensations run as a failing request's last steps, as onFailure
                // steps do: nothing would wait for children.
                return err(format!(
                    "{at}.mode {} cannot be a compensate step",
                    c.mode.as_str()
                ));
            }
            steps.push((cid, c));
        }
        steps.push((id, compiled));
    }
    steps.sort_by_key(|(id, _)| *id);
    let steps: Vec<CompiledStep> = steps.into_iter().map(|(_, c)| c).collect();
    let json = Bytes::from(serde_json::to_vec(&def).expect("a workflow always serializes"));
    let uses_context = steps.iter().any(reads_context);
    let compensates = steps
        .iter()
        .any(|s| !s.compensate.is_empty() || s.children_compensate());
    if let Some(r) = &def.retention {
        super::retention::check(r).map_err(ValidationError)?;
    }
    let notify = match (&def.notify, scope.depth) {
        (Some(n), 0) => super::notify::compile(n, compile_val)?,
        _ => Vec::new(),
    };
    let notify_mask = super::notify::mask(&notify);
    let input_schema = match (&def.input_schema, scope.depth) {
        (Some(schema), 0) => Some(super::input_schema::compile(schema)?),
        _ => None,
    };
    let concurrency = match (&def.concurrency, &def.rate_limit) {
        (None, None) => None,
        _ if scope.depth > 0 => None,
        (c, r) => Some(limits(c.as_ref(), r.as_ref())?),
    };
    Ok(Workflow {
        name: def.name.as_str().into(),
        def,
        json,
        steps,
        main,
        uses_context,
        deadline,
        concurrency,
        notify,
        notify_mask,
        input_schema,
        compensates,
    })
}

/// Every step name, as conditions see it, so `when` can be checked against them: the
/// steps' own names first (they hide an outer one of the same name), then the enclosing
/// context's.
fn known_names(def: &WorkflowDef, scope: &Scope) -> Result<Vec<String>, ValidationError> {
    let mut known = Vec::new();
    for (i, s) in def.steps.iter().enumerate() {
        let at = format!("{}steps[{i}]", scope.at);
        collect_names(s, &at, &mut known)?;
        for (j, f) in s.on_failure.iter().enumerate() {
            collect_names(f, &format!("{at}.onFailure[{j}]"), &mut known)?;
        }
        for (j, f) in s.compensate.iter().enumerate() {
            collect_names(f, &format!("{at}.compensate[{j}]"), &mut known)?;
        }
    }
    for o in scope.outer {
        if !known.contains(o) {
            known.push(o.clone());
        }
    }
    Ok(known)
}

/// The workflow's deadline, if it has one. A branch's or item's steps have none of their
/// own: they run within their request's.
fn deadline_of(def: &WorkflowDef) -> Result<Option<std::time::Duration>, ValidationError> {
    let Some(text) = &def.deadline else {
        return Ok(None);
    };
    super::wait::duration(text)
        .and_then(|d| {
            if d.is_zero() {
                Err("must be longer than nothing".into())
            } else {
                Ok(d)
            }
        })
        .map(Some)
        .map_err(|why| ValidationError(format!("deadline {text:?} {why}")))
}

/// Whether a step reads its request's context: a condition, a transform, a MAP (its
/// list), a WAIT `until` (its time), an EVENT (its key), lanes whose steps read it (they
/// see this request's, kept only when something reads it). The steps of a branch or item
/// that read it see the enclosing context too (loaded when they start: `engine`).
fn reads_context(s: &CompiledStep) -> bool {
    s.when.is_some()
        || s.transform.is_some()
        || s.mode == Mode::Map
        || s.mode == Mode::Switch
        || s.mode == Mode::Loop
        || matches!(&s.val, Val::Parallel(p) if p.lanes && p.branches.iter().any(|b| b.sub.0.uses_context))
        || matches!(
            s.val,
            Val::Wait(super::model::WaitVal::Until(_)) | Val::Event(_)
        )
}

/// Most requests of one key a workflow's concurrency may let run at once.
pub const MAX_CONCURRENCY_LIMIT: u32 = 100_000;

/// Most starts per key a `rateLimit` may allow per period.
pub const MAX_RATE: u32 = 1_000_000;

/// A workflow's `concurrency` and `rateLimit`: a limit from 1 to `MAX_CONCURRENCY_LIMIT`, a
/// rate of one of `perSecond` and `perMinute`, and one key expression (the same text in
/// both when both name one) that reads only `payload`.
fn limits(
    c: Option<&super::model::ConcurrencyDef>,
    r: Option<&super::model::RateLimitDef>,
) -> Result<super::model::Concurrency, ValidationError> {
    let limit = match c {
        None => super::model::NO_LIMIT,
        Some(c) if (1..=MAX_CONCURRENCY_LIMIT).contains(&c.limit) => c.limit,
        Some(_) => {
            return err(format!(
                "concurrency.limit must be a whole number from 1 to {MAX_CONCURRENCY_LIMIT}"
            ))
        }
    };
    let rate = match r {
        None => None,
        Some(r) => Some(match (r.per_second, r.per_minute) {
            (Some(n), None) if (1..=MAX_RATE).contains(&n) => (n, 1_000),
            (None, Some(n)) if (1..=MAX_RATE).contains(&n) => (n, 60_000),
            _ => {
                return err(format!(
                    "rateLimit needs exactly one of perSecond and perMinute, a whole number from 1 to {MAX_RATE}"
                ))
            }
        }),
    };
    let key_text = |k: Option<&String>, what: &str| -> Result<Option<String>, ValidationError> {
        match k.map(|k| k.trim()) {
            None => Ok(None),
            Some("") => err(format!(
                "{what}.key must be a CEL expression over payload, e.g. \"payload.account\""
            )),
            Some(k) => Ok(Some(k.to_string())),
        }
    };
    let ck = key_text(c.and_then(|c| c.key.as_ref()), "concurrency")?;
    let rk = key_text(r.and_then(|r| r.key.as_ref()), "rateLimit")?;
    let (source, what) = match (c.is_some() && r.is_some(), ck, rk) {
        (true, a, b) if a != b => {
            return err(
                "rateLimit.key must be concurrency.key when both are declared (both limits count the same key)",
            )
        }
        (_, Some(a), _) => (Some(a), "concurrency"),
        (_, None, Some(b)) => (Some(b), "rateLimit"),
        (_, None, None) => (None, ""),
    };
    let key = match source {
        None => None,
        Some(source) => Some(
            super::expr::KeyExpr::compile(&source, &["payload".to_string()])
                .map_err(|e| ValidationError(format!("{what}.key: {}", e.0)))?,
        ),
    };
    Ok(super::model::Concurrency { key, limit, rate })
}

fn collect_names(s: &Step, at: &str, known: &mut Vec<String>) -> Result<(), ValidationError> {
    if s.name.trim().is_empty() {
        return err(format!("{at}.name is required"));
    }
    let cname = context_name(&s.name);
    if known.contains(&cname) {
        return err(format!(
            "{at}.name {:?} is used by another step (names must be unique, with spaces read as '_')",
            s.name
        ));
    }
    known.push(cname);
    Ok(())
}

/// Step `id` of a definition, checked and compiled (its id and type written back into
/// the definition as served); `known` are the names its `when` may refer to.
fn compile_step(
    s: &mut Step,
    id: u32,
    at: &str,
    known: &[String],
    here: &Here,
) -> Result<CompiledStep, ValidationError> {
    s.id = id;
    let mode = step_mode(s, at)?;
    let step_type = step_type(mode, s, at)?;
    s.step_type = step_type.as_str().to_string();
    let val = if mode.fans_out() {
        fan_val(mode, &mut s.val, id, at, known, here)?
    } else if mode == Mode::Event {
        event_val(&s.val, at, known)?
    } else {
        compile_val(mode, &s.val, at)?
    };
    let when = if s.when.trim().is_empty() {
        None
    } else {
        let c = Condition::compile(&s.when, known)
            .map_err(|e| ValidationError(format!("{at}.when {:?} {}", s.when, e.0)))?;
        Some(Arc::new(c))
    };
    let transform = step_transform(s, at)?;
    if let Some(r) = &s.retry {
        r.check(at)?;
    }
    let answer_timeout = match mode {
        // An EVENT step's own `timeout` is its answer's.
        Mode::Event => event_timeout(&s.val, at)?,
        _ => answer_timeout(s, mode, step_type, at)?,
    };
    Ok(CompiledStep {
        id,
        retry: s.retry.clone(),
        answer_timeout,
        name: s.name.as_str().into(),
        context_name: context_name(&s.name),
        mode,
        step_type,
        val,
        when,
        transform,
        on_failure: Vec::new(),
        compensate: Vec::new(),
    })
}

/// An EVENT step's `val`: `{"event": "<name>", "key": "<CEL over the context>",
/// "timeout"?: "<ISO 8601>"}`; the key's expression reads the names a `when` may.
fn event_val(val: &Value, at: &str, known: &[String]) -> Result<Val, ValidationError> {
    let Some(o) = val.as_object() else {
        return err(format!("{at}.val is required and must be an object"));
    };
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "event" | "key" | "timeout"))
    {
        return err(format!(
            "{at}.val.{k} is not a field of an EVENT step (event, key, timeout)"
        ));
    }
    let event = match str_field(val, "event") {
        Some(e) if e.len() <= 200 && !e.contains('/') => e.to_string(),
        _ => {
            return err(format!(
                "{at}.val.event is required: the event's name (at most 200 characters, no '/')"
            ))
        }
    };
    let Some(source) = str_field(val, "key") else {
        return err(format!(
            "{at}.val.key is required: an expression over the context giving the event's key"
        ));
    };
    let key = KeyExpr::compile(source, known)
        .map_err(|e| ValidationError(format!("{at}.val.key {source:?} {}", e.0)))?;
    Ok(Val::Event(EventVal {
        event,
        key: Arc::new(key),
    }))
}

/// An EVENT step's `timeout`: how long it waits for its event (ISO 8601), if it says.
fn event_timeout(val: &Value, at: &str) -> Result<Option<std::time::Duration>, ValidationError> {
    match val.get("timeout") {
        None => Ok(None),
        Some(t) => {
            let text = t.as_str().unwrap_or_default();
            super::wait::duration(text)
                .map(Some)
                .map_err(|why| ValidationError(format!("{at}.val.timeout {t} {why}")))
        }
    }
}

/// How long a sent ASYNC step waits for its answer: an ISO 8601 duration, on a step
/// answered by a posted response or a broker reply (not a child's outcome, not the clock).
fn answer_timeout(
    s: &Step,
    mode: Mode,
    step_type: StepType,
    at: &str,
) -> Result<Option<std::time::Duration>, ValidationError> {
    let Some(text) = &s.answer_timeout else {
        return Ok(None);
    };
    if step_type != StepType::Async || !matches!(mode, Mode::Http | Mode::Amqp | Mode::Kafka) {
        return err(format!(
            "{at}.answerTimeout applies to ASYNC HTTP, AMQP and KAFKA steps (they wait for an answer)"
        ));
    }
    super::wait::duration(text)
        .map(Some)
        .map_err(|why| ValidationError(format!("{at}.answerTimeout {text:?} {why}")))
}

/// A step's mode: required, one of the four.
fn step_mode(s: &Step, at: &str) -> Result<Mode, ValidationError> {
    match s.mode.as_str() {
        "HTTP" => Ok(Mode::Http),
        "AMQP" => Ok(Mode::Amqp),
        "KAFKA" => Ok(Mode::Kafka),
        "WORKFLOW" => Ok(Mode::Workflow),
        "PARALLEL" => Ok(Mode::Parallel),
        "MAP" => Ok(Mode::Map),
        "WAIT" => Ok(Mode::Wait),
        "EVENT" => Ok(Mode::Event),
        "SWITCH" => Ok(Mode::Switch),
        "LOOP" => Ok(Mode::Loop),
        "" => err(format!(
            "{at}.mode is required (HTTP, AMQP, KAFKA, WORKFLOW, PARALLEL, MAP, SWITCH, LOOP, WAIT or EVENT)"
        )),
        other => err(format!(
            "{at}.mode {other:?} must be HTTP, AMQP, KAFKA, WORKFLOW, PARALLEL, MAP, SWITCH, LOOP, WAIT or EVENT"
        )),
    }
}

/// A step's type: an HTTP step is SYNC unless it says ASYNC; any other is ASYNC, whatever
/// it says (a spelling other than SYNC or ASYNC is refused).
fn step_type(mode: Mode, s: &Step, at: &str) -> Result<StepType, ValidationError> {
    Ok(match (mode, s.step_type.as_str()) {
        (_, t) if !matches!(t, "" | "SYNC" | "ASYNC") => {
            return err(format!("{at}.type {t:?} must be SYNC or ASYNC"))
        }
        (Mode::Http, "ASYNC") => StepType::Async,
        (Mode::Http, _) => StepType::Sync,
        // A WAIT is answered by the clock, not by a posted response.
        (Mode::Wait, "ASYNC") => return err(format!("{at}.type of a WAIT step is SYNC")),
        (Mode::Wait, _) => StepType::Sync,
        // A broker step is always answered later, and a child workflow finishes later:
        // both are always ASYNC.
        (_, _) => StepType::Async,
    })
}

/// A step's request transform, compiled when `transform` is on (JSON only, with a spec).
fn step_transform(s: &Step, at: &str) -> Result<Option<Vec<(String, String)>>, ValidationError> {
    if !matches!(s.transform_format.as_str(), "" | "JSON" | "json") {
        return err(format!(
            "{at}.transformFormat {:?} is not supported (only JSON)",
            s.transform_format
        ));
    }
    if !s.transform {
        return Ok(None);
    }
    let spec = match &s.request_transform {
        Some(rt) if !rt.spec.is_empty() => &rt.spec,
        _ => {
            return err(format!(
                "{at}.requestTransform.spec is required when transform is true"
            ))
        }
    };
    let map: serde_json::Map<String, Value> = spec.clone().into_iter().collect();
    compile_spec(&map)
        .map(Some)
        .map_err(|e| ValidationError(format!("{at}.requestTransform.spec: {}", e.0)))
}

/// `scheme://host:port` of an absolute URL, the port defaulted from the scheme.
fn host_key(uri: &hyper::Uri) -> Arc<str> {
    let scheme = uri.scheme_str().unwrap_or("http");
    let port = uri.port_u16().unwrap_or(default_port(uri));
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    format!("{scheme}://{host}:{port}").into()
}

fn str_field<'a>(val: &'a Value, key: &str) -> Option<&'a str> {
    val.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// A step's `val`, checked and compiled for its mode; `at` names the step in messages.
fn compile_val(mode: Mode, val: &Value, at: &str) -> Result<Val, ValidationError> {
    if !val.is_object() {
        return err(format!("{at}.val is required and must be an object"));
    }
    // Each mode reads its own fields; what they share (an object, named by `at`) is
    // checked once here.
    match mode {
        Mode::Http => http_val(val, at).map(Val::Http),
        Mode::Amqp => amqp_val(val, at).map(Val::Amqp),
        Mode::Kafka => kafka_val(val, at).map(Val::Kafka),
        Mode::Workflow => workflow_val(val, at).map(Val::Workflow),
        Mode::Wait => super::wait::wait_val(val, at).map(Val::Wait),
        Mode::Event => err(format!(
            "{at}.val: an EVENT step is compiled with its names"
        )),
        Mode::Parallel | Mode::Map | Mode::Switch | Mode::Loop => {
            err(format!("{at}.val: a fan-out step is compiled whole"))
        }
    }
}

/// The workflow a step is compiled in, and how many fan-out steps enclose it.
struct Here<'a> {
    workflow: &'a str,
    /// Its version, which the workflows of its fan-out steps share.
    version: u32,
    depth: u32,
}

/// A PARALLEL or MAP step's `val`: its branches (or per-item steps) compiled as
/// workflows of their own, named below this one (`model::Sub`), seeing this workflow's
/// step names and, in a MAP, `item` and `index`; the compiled steps (ids and types
/// assigned) written back into `val` as served.
fn fan_val(
    mode: Mode,
    val: &mut Value,
    id: u32,
    at: &str,
    known: &[String],
    here: &Here,
) -> Result<Val, ValidationError> {
    if !val.is_object() {
        return err(format!("{at}.val is required and must be an object"));
    }
    if here.depth >= super::fan::MAX_DEPTH {
        return err(format!(
            "{at}: fan-out steps nest at most {} deep",
            super::fan::MAX_DEPTH
        ));
    }
    let sub = |branch: &str, steps: Vec<Step>, outer: &[String], at: &str| {
        let def = WorkflowDef {
            name: format!("{}/{id}/{branch}", here.workflow),
            version: here.version,
            enabled: true,
            steps,
            ..WorkflowDef::default()
        };
        let scope = Scope {
            depth: here.depth + 1,
            outer,
            at: &format!("{at}."),
        };
        compile_in(def, &scope).map(|wf| Sub(Arc::new(wf)))
    };
    if mode == Mode::Switch {
        let shape = super::switch::shape(val, at).map_err(ValidationError)?;
        let on = KeyExpr::compile(&shape.on, known)
            .map_err(|e| ValidationError(format!("{at}.val.on {:?} {}", shape.on, e.0)))?;
        let mut cases = Vec::with_capacity(shape.cases.len());
        for (name, steps) in shape.cases {
            let at = format!("{at}.val.cases.{name}");
            let sub = sub(&name, steps, known, &at)?;
            val["cases"][&name] =
                serde_json::to_value(&sub.0.def.steps).expect("steps always serialize");
            cases.push(Branch { name, sub });
        }
        let default = match shape.default {
            None => None,
            Some(steps) => {
                let at = format!("{at}.val.default");
                let sub = sub(DEFAULT_CASE, steps, known, &at)?;
                val["default"] =
                    serde_json::to_value(&sub.0.def.steps).expect("steps always serialize");
                Some(Branch {
                    name: DEFAULT_CASE.to_string(),
                    sub,
                })
            }
        };
        return Ok(Val::Switch(SwitchVal {
            on: Arc::new(on),
            cases,
            default,
        }));
    }
    if mode == Mode::Loop {
        let shape = super::loops::shape(val, at).map_err(ValidationError)?;
        // The body sees `iteration`; `while` sees the body's steps too.
        let mut outer = known.to_vec();
        outer.push(ITERATION.to_string());
        let body = sub(LOOP_BODY, shape.steps, &outer, &format!("{at}.val"))?;
        outer.extend(body.0.steps.iter().map(|s| s.context_name.clone()));
        let while_ = Condition::compile(&shape.while_, &outer)
            .map_err(|e| ValidationError(format!("{at}.val.while {:?} {}", shape.while_, e.0)))?;
        val["steps"] = serde_json::to_value(&body.0.def.steps).expect("steps always serialize");
        return Ok(Val::Loop(LoopVal {
            body,
            while_: Arc::new(while_),
            max_iterations: shape.max_iterations,
        }));
    }
    if mode == Mode::Parallel {
        let shape = super::fan::branches(val, at).map_err(ValidationError)?;
        let mut branches = Vec::with_capacity(shape.len());
        for (k, (name, steps)) in shape.into_iter().enumerate() {
            let at = format!("{at}.val.branches[{k}]");
            let sub = sub(&name, steps, known, &at)?;
            val["branches"][k]["steps"] =
                serde_json::to_value(&sub.0.def.steps).expect("steps always serialize");
            branches.push(Branch { name, sub });
        }
        let lanes = super::fan::fits_lanes(id, &branches);
        return Ok(Val::Parallel(ParallelVal { branches, lanes }));
    }
    let shape = super::fan::map(val, at).map_err(ValidationError)?;
    let body = match shape.steps {
        Some(steps) => {
            let mut outer = known.to_vec();
            outer.extend([ITEM_BRANCH.to_string(), "index".to_string()]);
            let sub = sub(ITEM_BRANCH, steps, &outer, &format!("{at}.val"))?;
            val["steps"] = serde_json::to_value(&sub.0.def.steps).expect("steps always serialize");
            MapBody::Steps(sub)
        }
        None => MapBody::Workflow(workflow_val(val, at)?),
    };
    Ok(Val::Map(MapVal {
        items: shape.items,
        body,
        max_concurrency: shape.max_concurrency,
        tolerated_failures: shape.tolerated_failures,
    }))
}

/// An HTTP step's `val`: the call is checked and prepared whole here (method, absolute
/// URL, headers, the `Host` header and the per-host key), so a running step only sends.
fn http_val(val: &Value, at: &str) -> Result<HttpVal, ValidationError> {
    let method = http_method(val, at)?;
    let url = str_field(val, "url")
        .ok_or_else(|| ValidationError(format!("{at}.val.url is required")))?;
    // A secret may be named in the query only (the host and path are what the policy,
    // the per-host limit and the traces see); the URL is checked with the references
    // percent-encoded, as `url` keeps them.
    let secret_url = match crate::secrets::names(url) {
        Ok(n) if n.is_empty() => None,
        Ok(_)
            if url
                .find('?')
                .is_some_and(|q| q < url.find("{{").unwrap_or(0)) =>
        {
            Some(Arc::<str>::from(url))
        }
        Ok(_) => {
            return err(format!(
                "{at}.val.url: a {{{{secret:NAME}}}} may be used in the URL's query only"
            ))
        }
        Err(why) => return err(format!("{at}.val.url: {why}")),
    };
    let shown = url.replace("{{", "%7B%7B").replace("}}", "%7D%7D");
    let uri: hyper::Uri = shown
        .parse()
        .map_err(|_| ValidationError(format!("{at}.val.url {url:?} is not a valid URL")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return err(format!(
            "{at}.val.url {url:?} must be an absolute http:// or https:// URL"
        ));
    }
    let headers = match val.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(h)) => {
            parse_headers(h).map_err(|e| ValidationError(format!("{at}.val.headers: {}", e.0)))?
        }
        Some(_) => {
            return err(format!(
                "{at}.val.headers must be a string like \"K:v;K2:v2;\""
            ))
        }
    };
    let timeout_ms = match val.get("timeout_ms") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=3_600_000).contains(&ms) => Some(ms),
            _ => return err(format!("{at}.val.timeout_ms must be 1..=3600000")),
        },
    };
    let mut secret_headers = false;
    for (_, v) in &headers {
        let refs = crate::secrets::names(v)
            .map_err(|why| ValidationError(format!("{at}.val.headers: {why}")))?;
        secret_headers |= !refs.is_empty();
    }
    let host_key = host_key(&uri);
    let host = host_header(&uri)
        .ok_or_else(|| ValidationError(format!("{at}.val.url {url:?} has no valid host")))?;
    // Every pair parsed when it was validated (parse_headers).
    let headers = header_pairs(&headers);
    Ok(HttpVal {
        method,
        url: uri,
        headers,
        host,
        timeout_ms,
        host_key,
        secret_url,
        secret_headers,
    })
}

/// An HTTP step's method: one of the five Clamp accepts.
fn http_method(val: &Value, at: &str) -> Result<hyper::Method, ValidationError> {
    match str_field(val, "method") {
        Some(m @ ("GET" | "POST" | "PUT" | "PATCH" | "DELETE")) => {
            Ok(m.parse::<hyper::Method>().expect("known method"))
        }
        Some(m) => err(format!(
            "{at}.val.method {m:?} must be GET, POST, PUT, PATCH or DELETE"
        )),
        None => err(format!("{at}.val.method is required")),
    }
}

/// An AMQP step's `val`: a broker URL and somewhere to publish (a queue or an exchange).
fn amqp_val(val: &Value, at: &str) -> Result<AmqpVal, ValidationError> {
    let connection_url = str_field(val, "connection_url")
        .ok_or_else(|| ValidationError(format!("{at}.val.connection_url is required")))?;
    // Read as the client will read it (secret references standing in for their values).
    super::brokers::for_definition(connection_url)
        .and_then(|text| super::brokers::AmqpTarget::read(&text))
        .and_then(|t| super::brokers::refuse_secret_host(&t.endpoint))
        .map_err(|why| ValidationError(format!("{at}.val.connection_url: {why}")))?;
    let queue_name = str_field(val, "queue_name").unwrap_or_default().to_string();
    let exchange_name = str_field(val, "exchange_name")
        .unwrap_or_default()
        .to_string();
    if queue_name.is_empty() && exchange_name.is_empty() {
        return err(format!("{at}.val needs queue_name or exchange_name"));
    }
    Ok(AmqpVal {
        connection_url: connection_url.to_string(),
        queue_name,
        exchange_name,
        routing_key: str_field(val, "routing_key")
            .unwrap_or_default()
            .to_string(),
        content_type: str_field(val, "content_type")
            .filter(|c| !c.is_empty())
            .unwrap_or("application/json")
            .to_string(),
        reply_to: str_field(val, "reply_to").unwrap_or_default().to_string(),
    })
}

/// A Kafka step's `val`: bootstrap brokers (each `host:port`, kept trimmed) and a topic
/// name Kafka accepts, so a bad one fails at definition time rather than at each publish.
fn kafka_val(val: &Value, at: &str) -> Result<KafkaVal, ValidationError> {
    let connection_url = str_field(val, "connection_url")
        .ok_or_else(|| ValidationError(format!("{at}.val.connection_url is required")))?;
    let topic_name = str_field(val, "topic_name")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ValidationError(format!("{at}.val.topic_name is required")))?;
    if !valid_topic(topic_name) {
        return err(format!(
            "{at}.val.topic_name may hold only letters, digits, '.', '_' and '-' (at most 249)"
        ));
    }
    // Read by the one parser the Kafka client is built from.
    super::brokers::for_definition(connection_url)
        .and_then(|text| super::brokers::KafkaTarget::read(&text))
        .and_then(|t| {
            t.brokers
                .iter()
                .try_for_each(super::brokers::refuse_secret_host)
        })
        .map_err(|why| {
            ValidationError(format!(
                "{at}.val.connection_url must be host:port[,host:port…] or kafka://… ({why})"
            ))
        })?;
    let brokers: Vec<&str> = connection_url.split(',').map(str::trim).collect();
    Ok(KafkaVal {
        connection_url: brokers.join(","),
        topic_name: topic_name.to_string(),
        reply_to: str_field(val, "reply_to").unwrap_or_default().to_string(),
    })
}

/// A WORKFLOW step's `val`: the child workflow's name and, optionally, the version it
/// pins (whether that workflow exists is checked where workflows are stored).
fn workflow_val(val: &Value, at: &str) -> Result<WorkflowVal, ValidationError> {
    let workflow = str_field(val, "workflow")
        .ok_or_else(|| ValidationError(format!("{at}.val.workflow is required")))?;
    check_name(workflow).map_err(|_| {
        ValidationError(format!(
            "{at}.val.workflow {workflow:?} is not a workflow name"
        ))
    })?;
    let version = match val.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u32::MAX as u64).contains(&n) => Some(n as u32),
            _ => return err(format!("{at}.val.version must be a whole number from 1")),
        },
    };
    Ok(WorkflowVal {
        workflow: workflow.to_string(),
        version,
    })
}

/// The workflows a workflow's WORKFLOW steps start, with the version each names, and
/// where in the definition each is.
pub fn includes(wf: &Workflow) -> Vec<(String, Option<u32>, String)> {
    let mut out = Vec::new();
    for (i, s) in wf.def.steps.iter().enumerate() {
        let mut visit = |s: &Step, at: String| {
            if s.mode == "WORKFLOW" || (s.mode == "MAP" && s.val.get("workflow").is_some()) {
                let name = s
                    .val
                    .get("workflow")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let version = s
                    .val
                    .get("version")
                    .and_then(Value::as_u64)
                    .map(|v| v as u32);
                out.push((name.trim().to_string(), version, at));
            }
        };
        visit(s, format!("steps[{i}]"));
    }
    // The steps of fan-out steps, which may start workflows too.
    for s in &wf.steps {
        for sub in s.val.subs() {
            out.extend(includes(&sub.0));
        }
    }
    out
}

/// Kafka's own rule for topic names.
fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Gives every AMQP and Kafka step without a `reply_to` the configured response queue or
/// topic, so the stored workflow says where answers go (as the services read it).
pub fn set_default_reply_to(def: &mut WorkflowDef, amqp_queue: &str, kafka_topic: &str) {
    fn visit(s: &mut Step, amqp_queue: &str, kafka_topic: &str) {
        let default = match s.mode.as_str() {
            "AMQP" => amqp_queue,
            "KAFKA" => kafka_topic,
            _ => "",
        };
        if let (false, Some(val)) = (default.is_empty(), s.val.as_object_mut()) {
            let missing = val
                .get("reply_to")
                .and_then(|v| v.as_str())
                .is_none_or(str::is_empty);
            if missing {
                val.insert("reply_to".into(), default.into());
            }
        }
        for f in s.on_failure.iter_mut().chain(s.compensate.iter_mut()) {
            visit(f, amqp_queue, kafka_topic);
        }
        // The steps of a fan-out step's branches, or of its items.
        let inner: Vec<&mut Value> = match s.mode.as_str() {
            "PARALLEL" => s
                .val
                .get_mut("branches")
                .and_then(Value::as_array_mut)
                .map(|bs| bs.iter_mut().filter_map(|b| b.get_mut("steps")).collect())
                .unwrap_or_default(),
            "MAP" => s.val.get_mut("steps").into_iter().collect(),
            _ => Vec::new(),
        };
        for steps in inner {
            if let Ok(mut list) = serde_json::from_value::<Vec<Step>>(steps.clone()) {
                for i in &mut list {
                    visit(i, amqp_queue, kafka_topic);
                }
                *steps = serde_json::to_value(list).expect("steps always serialize");
            }
        }
    }
    for s in &mut def.steps {
        visit(s, amqp_queue, kafka_topic);
    }
}

/// Parses Clamp's header string `"K:v;K2:v2;"` into validated (name, value) pairs.
/// The port a URL without one means.
fn default_port(uri: &hyper::Uri) -> u16 {
    if matches!(uri.scheme_str(), Some("https" | "wss")) {
        443
    } else {
        80
    }
}

/// The `Host` header of a call to `uri`, as hyper-util's client derives it when a request
/// has none: the host, and `:port` unless the port is the scheme's default.
fn host_header(uri: &hyper::Uri) -> Option<hyper::header::HeaderValue> {
    let host = uri.host()?;
    match uri.port_u16() {
        Some(p) if p != default_port(uri) => {
            hyper::header::HeaderValue::from_str(&format!("{host}:{p}"))
        }
        _ => hyper::header::HeaderValue::from_str(host),
    }
    .ok()
}

/// Header pairs as an HTTP call sends them, parsed once; a pair that is not a valid
/// header is left out (a forwarded one may not be; an AMQP or Kafka step still carries it).
pub fn header_pairs(
    pairs: &[(String, String)],
) -> Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)> {
    pairs
        .iter()
        .filter_map(|(k, v)| {
            Some((
                hyper::header::HeaderName::from_bytes(k.as_bytes()).ok()?,
                hyper::header::HeaderValue::from_str(v).ok()?,
            ))
        })
        .collect()
}

pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>, ValidationError> {
    let mut out = Vec::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once(':')
            .ok_or_else(|| ValidationError(format!("{part:?} is not Name:value")))?;
        let (k, v) = (k.trim(), v.trim());
        hyper::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| ValidationError(format!("{k:?} is not a valid header name")))?;
        hyper::header::HeaderValue::from_str(v).map_err(|_| {
            ValidationError(format!("the value of {k:?} is not a valid header value"))
        })?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(v: Value) -> WorkflowDef {
        serde_json::from_value(v).unwrap()
    }

    fn http(name: &str) -> Value {
        json!({"name": name, "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}})
    }

    #[test]
    fn compensations_run_last_completed_first_each_steps_own_in_order() {
        let mut a = http("a");
        a["onFailure"] = json!([http("a fail")]);
        a["compensate"] = json!([http("undo a 1"), http("undo a 2")]);
        let mut c = http("c");
        c["compensate"] = json!([http("undo c")]);
        let w = compile(def(
            json!({"name": "w", "steps": [a, http("b"), c, http("d")]}),
        ))
        .unwrap();
        // a 1, its onFailure 2, its compensations 3 and 4; b 5; c 6, undo c 7; d 8.
        assert_eq!(w.main, vec![1, 5, 6, 8]);
        assert_eq!(w.step(1).unwrap().compensate, vec![3, 4]);
        assert!(w.compensates);
        assert_eq!(w.compensations(8, |_| true), vec![(7, 6), (3, 1), (4, 1)]);
        // c failed (not completed), b was skipped.
        assert_eq!(w.compensations(6, |m| m != 5), vec![(3, 1), (4, 1)]);
        assert!(
            !compile(def(json!({"name": "w", "steps": [http("x")]})))
                .unwrap()
                .compensates
        );
    }

    #[test]
    fn assigns_ids_and_types() {
        let mut s1 = http("a");
        s1["onFailure"] = json!([http("a fail 1"), http("a fail 2")]);
        let w = compile(def(json!({"name": "w", "steps": [s1, http("b"),
            {"name": "c", "mode": "AMQP", "val": {"connection_url": "amqp://g:g@h:5672/", "queue_name": "q"}},
            {"name": "d", "mode": "KAFKA", "val": {"connection_url": "h:9092", "topic_name": "t"}},
            {"name": "e", "type": "ASYNC", "mode": "HTTP", "val": {"method": "POST", "url": "http://h/x"}}]})))
        .unwrap();
        assert_eq!(w.main, vec![1, 4, 5, 6, 7]);
        assert_eq!(w.step(1).unwrap().on_failure, vec![2, 3]);
        assert_eq!(&*w.step(3).unwrap().name, "a fail 2");
        assert_eq!(w.step(3).unwrap().context_name, "a_fail_2");
        let types: Vec<_> = w.steps.iter().map(|s| s.step_type).collect();
        assert_eq!(types[..4], [StepType::Sync; 4]);
        assert_eq!(types[4..], [StepType::Async; 3]);
        assert_eq!(w.def.steps[0].on_failure[1].id, 3);
        assert_eq!(w.def.steps[2].step_type, "ASYNC");
        assert_eq!(w.next_main(1), Some(4));
        assert_eq!(w.next_main(7), None);
        assert_eq!(w.next_main(2), None);
    }

    #[test]
    fn broker_steps_get_the_default_reply_to_unless_given() {
        let mut d = def(json!({"name": "w", "steps": [
            {"name": "a", "mode": "AMQP", "val": {"connection_url": "amqp://h", "queue_name": "q"},
             "onFailure": [{"name": "k", "mode": "KAFKA", "val": {"connection_url": "h:9092", "topic_name": "t"}}]},
            {"name": "b", "mode": "AMQP", "val": {"connection_url": "amqp://h", "queue_name": "q", "reply_to": "mine"}},
            {"name": "c", "mode": "HTTP", "val": {"method": "GET", "url": "http://h/"}}]}));
        set_default_reply_to(&mut d, "answers", "answers_topic");
        assert_eq!(d.steps[0].val["reply_to"], "answers");
        assert_eq!(d.steps[0].on_failure[0].val["reply_to"], "answers_topic");
        assert_eq!(d.steps[1].val["reply_to"], "mine");
        assert!(d.steps[2].val.get("reply_to").is_none());
        let w = compile(d).unwrap();
        match &w.step(1).unwrap().val {
            Val::Amqp(v) => assert_eq!(v.reply_to, "answers"),
            other => panic!("{other:?}"),
        }
        match &w.step(2).unwrap().val {
            Val::Kafka(v) => {
                assert_eq!(v.reply_to, "answers_topic");
                assert_eq!(v.connection_url, "h:9092");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kafka_vals_are_checked() {
        let kafka = |val: Value| {
            compile(def(
                json!({"name": "w", "steps": [{"name": "a", "mode": "KAFKA", "val": val}]}),
            ))
        };
        assert!(kafka(json!({"connection_url": "a:1, b:2", "topic_name": "t.x-1_y"})).is_ok());
        for (val, needle) in [
            (
                json!({"connection_url": "nohost", "topic_name": "t"}),
                "host:port",
            ),
            (
                json!({"connection_url": "h:notaport", "topic_name": "t"}),
                "host:port",
            ),
            (json!({"connection_url": "h:1"}), "topic_name is required"),
            (
                json!({"connection_url": "h:1", "topic_name": "bad topic"}),
                "may hold only",
            ),
        ] {
            let e = kafka(val.clone()).unwrap_err();
            assert!(e.0.contains(needle), "{val}: {e}");
        }
    }

    #[test]
    fn rejects_what_clamp_rejects_and_more() {
        let bad = |v: Value, needle: &str| {
            let e = compile(def(v.clone())).unwrap_err();
            assert!(e.0.contains(needle), "{v}: {e}");
        };
        bad(json!({"steps": [http("a")]}), "name is required");
        bad(json!({"name": "w"}), "steps is required");
        bad(json!({"name": "w", "steps": []}), "steps is required");
        bad(json!({"name": "w/x", "steps": [http("a")]}), "'/'");
        bad(
            json!({"name": "w", "steps": [{"mode": "HTTP", "val": {}}]}),
            "steps[0].name is required",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "val": {}}]}),
            "mode is required",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "FTP", "val": {}}]}),
            "must be HTTP, AMQP, KAFKA, WORKFLOW, PARALLEL, MAP, SWITCH, LOOP, WAIT or EVENT",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP"}]}),
            "val is required",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"url": "http://h/"}}]}),
            "method is required",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "FETCH", "url": "http://h/"}}]}),
            "method",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET"}}]}),
            "url is required",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "not a url"}}]}),
            "url",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "/relative"}}]}),
            "absolute",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "ftp://h/x"}}]}),
            "http:// or https://",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "http://h/", "headers": "novalue"}}]}),
            "headers",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "type": "LATER", "mode": "HTTP", "val": {"method": "GET", "url": "http://h/"}}]}),
            "SYNC or ASYNC",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "AMQP", "val": {"queue_name": "q"}}]}),
            "connection_url",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "AMQP", "val": {"connection_url": "amqp://h"}}]}),
            "queue_name or exchange_name",
        );
        bad(
            json!({"name": "w", "steps": [{"name": "a", "mode": "KAFKA", "val": {"connection_url": "h:9092"}}]}),
            "topic_name",
        );
        bad(
            json!({"name": "w", "steps": [http("a"), http("a")]}),
            "unique",
        );
        bad(
            json!({"name": "w", "steps": [http("a b"), http("a_b")]}),
            "unique",
        );
        let mut s = http("a");
        s["when"] = json!("a.request.x ==");
        bad(json!({"name": "w", "steps": [s]}), "does not compile");
        let mut s = http("a");
        s["when"] = json!("zzz.request.x == 1");
        bad(json!({"name": "w", "steps": [s]}), "not a step");
        let mut s = http("a");
        s["transform"] = json!(true);
        bad(
            json!({"name": "w", "steps": [s]}),
            "requestTransform.spec is required",
        );
        let mut s = http("a");
        s["transform"] = json!(true);
        s["requestTransform"] = json!({"spec": {"x": 5}});
        bad(json!({"name": "w", "steps": [s]}), "path string");
        let mut s = http("a");
        s["onFailure"] = json!([{"name": "f", "mode": "HTTP", "val": {"method": "GET", "url": "http://h/"}, "onFailure": [http("g")]}]);
        bad(json!({"name": "w", "steps": [s]}), "cannot have onFailure");
    }

    #[test]
    fn parses_header_strings() {
        assert_eq!(
            parse_headers("Content-Type:application/json;X-A: b ;").unwrap(),
            vec![
                ("Content-Type".into(), "application/json".into()),
                ("X-A".into(), "b".into())
            ]
        );
        assert_eq!(parse_headers("").unwrap(), vec![]);
        assert!(parse_headers("bad header:x").is_err());
    }

    #[test]
    fn serves_assigned_fields() {
        let w = compile(def(json!({"name": "w", "steps": [http("a")]}))).unwrap();
        let back: Value = serde_json::from_slice(&w.json).unwrap();
        assert_eq!(back["steps"][0]["id"], 1);
        assert_eq!(back["steps"][0]["type"], "SYNC");
    }

    #[test]
    fn host_header_is_what_the_client_would_send() {
        let h = |u: &str| host_header(&u.parse().unwrap()).unwrap();
        assert_eq!(h("http://svc/x"), "svc");
        assert_eq!(h("http://svc:80/x"), "svc");
        assert_eq!(h("http://svc:8080/x"), "svc:8080");
        assert_eq!(h("http://127.0.0.1:9000/"), "127.0.0.1:9000");
        assert_eq!(h("https://svc:443/x"), "svc");
        assert_eq!(h("https://svc:80/x"), "svc:80");
    }

    #[test]
    fn https_steps_have_their_own_host_key() {
        let key = |u: &str| host_key(&u.parse().unwrap());
        assert_eq!(&*key("https://Pay.example/v1"), "https://pay.example:443");
        assert_eq!(&*key("http://pay.example/v1"), "http://pay.example:80");
        assert_eq!(
            &*key("https://pay.example:8443/"),
            "https://pay.example:8443"
        );
        let w = compile(def(json!({"name": "w", "steps": [
            {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": "https://pay.example/charge"}}]})))
        .unwrap();
        assert_eq!(w.def.steps[0].name, "a");
    }
}
