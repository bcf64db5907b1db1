//! The workflow definition as clients send and read it (Clamp's JSON field names),
//! and the compiled form the engine runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::expr::Condition;
use super::retry::RetrySpec;

/// A workflow as stored and returned: Clamp's field names.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct WorkflowDef {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Beyond Clamp: the version (1 for a workflow as `POST /workflow` created it; the
    /// server numbers them, whatever a definition it is sent says).
    #[serde(default = "first")]
    pub version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub updated_at: String,
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Beyond Clamp: how long a request may run, from its start (ISO 8601); past it, the
    /// step it is at fails, its onFailure steps run, and no further step starts. A create
    /// may set its own (`?deadline=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Beyond Clamp: at most `limit` of its requests with the same key run at once,
    /// across instances; the others wait, in creation order per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyDef>,
    /// Beyond Clamp: at most so many of its requests with the same key start per second
    /// or per minute, across instances; the others wait, as for `concurrency`.
    #[serde(default, rename = "rateLimit", skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitDef>,
    /// Beyond Clamp: how long its finished requests are kept, by status (ISO 8601; null
    /// forever), over the server's ages (`workflow::retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<std::collections::BTreeMap<String, Option<String>>>,
    /// Beyond Clamp: where its requests' outcomes are told (`workflow::notify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<serde_json::Value>>,
    /// Beyond Clamp: the JSON Schema (2020-12) every create's payload must meet
    /// (`workflow::input_schema`).
    #[serde(
        default,
        rename = "inputSchema",
        skip_serializing_if = "Option::is_none"
    )]
    pub input_schema: Option<serde_json::Value>,
    /// Beyond Clamp: a cancel of its requests runs their compensations first unless the
    /// cancel says `compensate=false` (without it, only a cancel that asks does).
    #[serde(
        default,
        rename = "compensateOnCancel",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub compensate_on_cancel: bool,
}

/// A workflow's `rateLimit` as written: a key as `concurrency`'s (the same one when both
/// are declared), and one of `perSecond` and `perMinute`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, rename = "perSecond", skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
    #[serde(default, rename = "perMinute", skip_serializing_if = "Option::is_none")]
    pub per_minute: Option<u32>,
}

/// A workflow's `concurrency` as written: a CEL expression over the create's payload
/// (`payload.account`) whose value keys the limit, or none (the whole workflow is one key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub limit: u32,
}

/// A workflow's limits by key (`concurrency` and `rateLimit`), compiled.
#[derive(Debug)]
pub struct Concurrency {
    /// None: every request of the workflow has the same key, `""`.
    pub key: Option<super::expr::KeyExpr>,
    /// Most running at once per key (`NO_LIMIT` when only a rate is declared).
    pub limit: u32,
    /// Most starts per key within a window: (starts, window in ms).
    pub rate: Option<(u32, u32)>,
}

/// The priorities a create or a schedule may give: higher runs first
/// (`store::leases::claim`).
pub const MIN_PRIORITY: i16 = 1;
pub const MAX_PRIORITY: i16 = 9;
/// The priority of a create that gives none (stored as NULL).
pub const DEFAULT_PRIORITY: i16 = 5;

/// A priority as given (None: not a whole number): a whole number from `MIN_PRIORITY` to
/// `MAX_PRIORITY`, the default kept as None, as when none is given; else why not.
pub fn priority(given: Option<i64>) -> Result<Option<i16>, String> {
    match given {
        Some(p) if p == DEFAULT_PRIORITY as i64 => Ok(None),
        Some(p) if (MIN_PRIORITY as i64..=MAX_PRIORITY as i64).contains(&p) => Ok(Some(p as i16)),
        _ => Err(format!(
            "priority: must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} \
             (higher runs first; {DEFAULT_PRIORITY} when not given)"
        )),
    }
}

/// The concurrency of a workflow that declares only a rate.
pub const NO_LIMIT: u32 = i32::MAX as u32;

/// The key of a request whose payload the key expression fails on: such requests share
/// one queue rather than fail (a create is never refused for its key).
pub const FALLBACK_KEY: &str = "(no key)";

impl Concurrency {
    /// The key of a request with this payload (parsed JSON, taken: it is read once).
    pub fn key_of(&self, payload: serde_json::Value) -> String {
        let Some(expr) = &self.key else {
            return String::new();
        };
        let mut ctx = serde_json::Map::with_capacity(1);
        ctx.insert("payload".into(), payload);
        expr.eval(&ctx).unwrap_or_else(|_| FALLBACK_KEY.to_string())
    }

    /// The key of a request with this payload as sent (JSON text; text that is not JSON
    /// is read as null): a plain selection (`payload.customer.id`, the usual key) reads
    /// only its value from the text (`pick`), any other expression the whole payload.
    pub fn key_of_json(&self, payload: &[u8]) -> String {
        let Some(expr) = &self.key else {
            return String::new();
        };
        let payload = match expr.fields_under("payload") {
            Some(fields) => super::pick::pick(payload, fields),
            None => serde_json::from_slice(payload).unwrap_or(serde_json::Value::Null),
        };
        self.key_of(payload)
    }
}

fn yes() -> bool {
    true
}

fn first() -> u32 {
    1
}

/// One step of a workflow.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Step {
    #[serde(default)]
    pub id: u32,
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "type")]
    pub step_type: String,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub val: serde_json::Value,
    #[serde(default)]
    pub transform: bool,
    #[serde(
        default,
        rename = "transformFormat",
        skip_serializing_if = "String::is_empty"
    )]
    pub transform_format: String,
    #[serde(
        default,
        rename = "requestTransform",
        skip_serializing_if = "Option::is_none"
    )]
    pub request_transform: Option<RequestTransform>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub when: String,
    #[serde(default, rename = "onFailure", skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<Step>,
    /// Beyond Clamp: steps that undo this one, run when its request fails after it
    /// completed (in reverse order of completion with the others', each once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compensate: Vec<Step>,
    /// Beyond Clamp: how a failing call of this step is retried (the server default
    /// fills in what is left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Beyond Clamp: how long an ASYNC step waits for its answer (ISO 8601), after which
    /// it fails with a timeout (retried as its retry policy says).
    #[serde(
        default,
        rename = "answerTimeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub answer_timeout: Option<String>,
}

/// Clamp's `requestTransform`: a kazaam-style shift spec, output key ← dotted input path.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RequestTransform {
    #[serde(default)]
    pub spec: BTreeMap<String, serde_json::Value>,
}

/// How a step talks to its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Http,
    Amqp,
    Kafka,
    /// Beyond Clamp: a child service request of another workflow.
    Workflow,
    /// Beyond Clamp: branches of steps run side by side, each a child request.
    Parallel,
    /// Beyond Clamp: steps (or a workflow) run once per item of a list, each a child
    /// request, so many at a time.
    Map,
    /// Beyond Clamp: the request sleeps (in Postgres) for a duration or until a time.
    Wait,
    /// Beyond Clamp: the request waits for an event delivered with its key.
    Event,
    /// Beyond Clamp: one path of steps of several, chosen by a value of the context, run
    /// as a child request (the fan-out machinery, with one child).
    Switch,
    /// Beyond Clamp: steps run again while a condition over their answers holds, each
    /// iteration a child request (the fan-out machinery, one child at a time).
    Loop,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Http => "HTTP",
            Mode::Amqp => "AMQP",
            Mode::Kafka => "KAFKA",
            Mode::Workflow => "WORKFLOW",
            Mode::Parallel => "PARALLEL",
            Mode::Map => "MAP",
            Mode::Wait => "WAIT",
            Mode::Event => "EVENT",
            Mode::Switch => "SWITCH",
            Mode::Loop => "LOOP",
        }
    }

    /// Whether the step's answer comes from child requests (their outcome resumes it).
    pub fn has_children(self) -> bool {
        matches!(
            self,
            Mode::Workflow | Mode::Parallel | Mode::Map | Mode::Switch | Mode::Loop
        )
    }

    /// Whether the step's children are of steps of its own definition, started and
    /// joined by the fan-out machinery (`engine::fan`): PARALLEL and MAP (several, joined),
    /// SWITCH (one, its path's) and LOOP (one per iteration, one after another).
    pub fn fans_out(self) -> bool {
        matches!(self, Mode::Parallel | Mode::Map | Mode::Switch | Mode::Loop)
    }
}

/// Whether the request waits for the step's answer (SYNC) or pauses until one is posted (ASYNC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepType {
    Sync,
    Async,
}

impl StepType {
    pub fn as_str(self) -> &'static str {
        match self {
            StepType::Sync => "SYNC",
            StepType::Async => "ASYNC",
        }
    }
}

/// An HTTP step's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpVal {
    pub method: hyper::Method,
    pub url: hyper::Uri,
    /// Parsed from Clamp's `"K:v;K2:v2;"` form, once, into what a call sends.
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// The `Host` header a call sends (what the HTTP client would derive from `url` on
    /// every call: the host, with the port unless it is the scheme's default).
    pub host: hyper::header::HeaderValue,
    /// Per-step total timeout override, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// The downstream host as calls to it are limited: `scheme://host:port`, with the
    /// default port filled in, so every step calling one host shares one limit.
    pub host_key: Arc<str>,
    /// The URL as defined when its query refers to secrets (`{{secret:NAME}}`), resolved
    /// at each call (beyond Clamp); `url` then holds the references percent-encoded.
    pub secret_url: Option<Arc<str>>,
    /// Some header value refers to a secret, resolved at each call.
    pub secret_headers: bool,
}

/// An AMQP step's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpVal {
    pub connection_url: String,
    pub queue_name: String,
    pub exchange_name: String,
    pub routing_key: String,
    pub content_type: String,
    /// Where the service should send its answer (set at creation when not given).
    pub reply_to: String,
}

/// A Kafka step's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaVal {
    /// Bootstrap brokers, `host:port[,host:port…]`.
    pub connection_url: String,
    pub topic_name: String,
    /// Where the service should send its answer (set at creation when not given).
    pub reply_to: String,
}

/// A WORKFLOW step's child: a workflow, and the version it runs (None: the latest when
/// the child is created).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowVal {
    pub workflow: String,
    pub version: Option<u32>,
}

/// Steps of a fan-out step (a PARALLEL branch, a MAP's per-item steps), compiled as a
/// workflow of their own: its name is the enclosing workflow's, the step's id and the
/// branch (`order/3/acme`, `order/4/item`), which no stored workflow can have (names
/// hold no '/'), and each branch or item runs as a child request of it.
#[derive(Debug, Clone)]
pub struct Sub(pub Arc<Workflow>);

impl PartialEq for Sub {
    fn eq(&self, other: &Sub) -> bool {
        self.0.name == other.0.name && self.0.json == other.0.json
    }
}

impl Eq for Sub {}

/// One branch of a PARALLEL step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub name: String,
    pub sub: Sub,
}

/// A PARALLEL step: every branch starts at once; it completes when all have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelVal {
    pub branches: Vec<Branch>,
    /// Its branches run as lanes of the request itself (`engine::lanes`), not as child
    /// requests: every step of every branch is a call answered at once (SYNC HTTP, AMQP
    /// or Kafka), and its record's id fits the lane encoding (`fan::lane_step_id`).
    pub lanes: bool,
}

/// What a MAP step runs per item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapBody {
    Steps(Sub),
    Workflow(WorkflowVal),
}

/// A MAP step: its body once per item of the list at `items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapVal {
    /// A dotted path into the context (`order.response.lines`).
    pub items: String,
    pub body: MapBody,
    /// Items running at once (the others wait, in Postgres).
    pub max_concurrency: u32,
    /// Items that may fail with the step still completing (their entries are null).
    pub tolerated_failures: u32,
}

/// The branch name of a SWITCH's `default` path (no case can be named so).
pub const DEFAULT_CASE: &str = "*";

/// A SWITCH step: `on`'s value over the context picks the case whose name it is (else
/// the default); that case's steps run as one child request, and its last answer is the
/// step's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchVal {
    pub on: Arc<super::expr::KeyExpr>,
    /// The cases, in the definition's order, each a branch named by its value.
    pub cases: Vec<Branch>,
    /// The path when no case has the value (named `DEFAULT_CASE`).
    pub default: Option<Branch>,
}

impl SwitchVal {
    /// The path `value` takes: its case, else the default.
    pub fn path(&self, value: &str) -> Option<&Branch> {
        self.cases
            .iter()
            .find(|b| b.name == value)
            .or(self.default.as_ref())
    }

    /// Every path, cases then the default.
    pub fn paths(&self) -> impl Iterator<Item = &Branch> {
        self.cases.iter().chain(self.default.as_ref())
    }
}

/// The branch name of a LOOP's body in its workflow's name (`order/4/body`).
pub const LOOP_BODY: &str = "body";

/// The name under which a LOOP's body and `while` read the iteration's number (from 1).
pub const ITERATION: &str = "iteration";

/// A LOOP step: its body runs as a child request per iteration, one after another; after
/// each, `while` over the context (the body's answers and `iteration` included) says
/// whether another runs, at most `max_iterations` in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopVal {
    pub body: Sub,
    pub while_: Arc<Condition>,
    pub max_iterations: u32,
}

/// A WAIT step: how long it sleeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitVal {
    Duration(std::time::Duration),
    /// A dotted path in the context to an RFC 3339 time.
    Until(String),
}

/// An EVENT step: the event it waits for, and its key's expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventVal {
    pub event: String,
    pub key: Arc<super::expr::KeyExpr>,
}

/// A validated `val`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    Http(HttpVal),
    Amqp(AmqpVal),
    Kafka(KafkaVal),
    Workflow(WorkflowVal),
    Parallel(ParallelVal),
    Map(MapVal),
    Wait(WaitVal),
    Event(EventVal),
    Switch(SwitchVal),
    Loop(LoopVal),
}

impl Val {
    /// The workflows of its own steps a step runs as children: a PARALLEL's branches, a
    /// MAP's per-item steps, a SWITCH's paths, a LOOP's body.
    pub fn subs(&self) -> Vec<&Sub> {
        match self {
            Val::Parallel(p) => p.branches.iter().map(|b| &b.sub).collect(),
            Val::Map(MapVal {
                body: MapBody::Steps(sub),
                ..
            }) => vec![sub],
            Val::Switch(s) => s.paths().map(|b| &b.sub).collect(),
            Val::Loop(l) => vec![&l.body],
            _ => Vec::new(),
        }
    }
}

/// The branch name of a MAP's per-item steps in their workflow's name (`order/4/item`).
pub const ITEM_BRANCH: &str = "item";

/// A step ready to run: its definition plus what was compiled from it.
#[derive(Debug, Clone)]
pub struct CompiledStep {
    pub id: u32,
    /// Shared, not copied, by every record and status answer of the step.
    pub name: Arc<str>,
    /// The name as it appears in `when` and transform paths (spaces become `_`).
    pub context_name: String,
    pub mode: Mode,
    pub step_type: StepType,
    pub val: Val,
    pub when: Option<Arc<Condition>>,
    /// The shift spec when `transform` is on.
    pub transform: Option<Vec<(String, String)>>,
    /// Ids of this step's `onFailure` steps, in order.
    pub on_failure: Vec<u32>,
    /// Ids of this step's `compensate` steps, in order.
    pub compensate: Vec<u32>,
    /// The step's own retry settings, if it has any.
    pub retry: Option<RetrySpec>,
    /// How long the step, sent, waits for its answer (ASYNC HTTP, AMQP and KAFKA steps).
    pub answer_timeout: Option<std::time::Duration>,
}

/// One place a workflow's outcomes are told (`workflow::notify`).
#[derive(Debug, Clone)]
pub struct NotifyTarget {
    /// The final statuses it is told of (`notify::bit`s).
    pub on: i16,
    /// Where it goes.
    pub to: NotifyTo,
    /// The key that signs the body, a `{{secret:NAME}}` reference.
    pub secret: Option<String>,
}

/// Where a notification goes: an HTTP step's `val` (POSTed), or an AMQP or Kafka step's
/// (published as a step's message is, confirmed by the broker).
#[derive(Debug, Clone)]
pub enum NotifyTo {
    Http(HttpVal),
    Amqp(AmqpVal),
    Kafka(KafkaVal),
}

/// A validated workflow: the definition, its JSON as served, and the steps compiled.
#[derive(Debug)]
pub struct Workflow {
    pub def: WorkflowDef,
    /// `def.name`, shared by the status answers kept of its requests.
    pub name: Arc<str>,
    /// The stored definition serialized once, served by `GET /workflow/{name}`.
    pub json: Bytes,
    /// Every step (main and onFailure) indexed by `id - 1`.
    pub steps: Vec<CompiledStep>,
    /// Ids of the main sequence, in order.
    pub main: Vec<u32>,
    /// Whether any step reads earlier steps (a `when` or a transform); if none does, a
    /// request continuing after a pause or a crash need not reload what they did.
    pub uses_context: bool,
    /// How long its requests may run, from their start (`def.deadline`).
    pub deadline: Option<std::time::Duration>,
    /// Its concurrency limit by key (`def.concurrency`), if any.
    pub concurrency: Option<Concurrency>,
    /// Where its requests' outcomes are told (`def.notify`), and the final statuses any
    /// of them is told of, as the request row keeps them (None: none).
    pub notify: Vec<NotifyTarget>,
    pub notify_mask: Option<i16>,
    /// What every create's payload must meet (`def.input_schema`), compiled once.
    pub input_schema: Option<super::input_schema::InputSchema>,
    /// Whether any step has `compensate` steps, or is a fan-out step whose children may
    /// (a failure then reads which steps completed).
    pub compensates: bool,
}

impl CompiledStep {
    /// Whether this fan-out step's children may have steps to undo: its own steps'
    /// workflows compensate, or its items are requests of a stored workflow (which may).
    pub fn children_compensate(&self) -> bool {
        self.mode.fans_out()
            && (self.val.subs().iter().any(|s| s.0.compensates)
                || matches!(
                    self.val,
                    Val::Map(MapVal {
                        body: MapBody::Workflow(_),
                        ..
                    })
                ))
    }
}

impl Workflow {
    /// A failing request's compensations, in the order they run, each with the step it
    /// undoes: first the children of `failed` when it is a fan-out step (its branches or
    /// items that completed, or were cancelled by its failure, undo theirs), then, for each
    /// main step that `completed`, the last to complete first (main steps complete in
    /// their order), its `compensate` steps in order, then its children's. A fan-out
    /// step's own id stands for its children's compensations.
    pub fn compensations(&self, failed: u32, completed: impl Fn(u32) -> bool) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        if self
            .step(failed)
            .is_some_and(CompiledStep::children_compensate)
        {
            out.push((failed, failed));
        }
        for &m in self
            .main
            .iter()
            .rev()
            .filter(|&&m| m != failed && completed(m))
        {
            let Some(s) = self.step(m) else { continue };
            out.extend(s.compensate.iter().map(|&c| (c, m)));
            if s.children_compensate() {
                out.push((m, m));
            }
        }
        out
    }

    /// The step with this id, if any.
    pub fn step(&self, id: u32) -> Option<&CompiledStep> {
        id.checked_sub(1).and_then(|i| self.steps.get(i as usize))
    }

    /// The fan-out steps' own workflow at `path` below this one (`3/acme`, `3/acme/2/item`:
    /// step id and branch, repeated for each level of nesting).
    pub fn sub(self: &Arc<Self>, path: &str) -> Option<Arc<Workflow>> {
        let mut wf = self.clone();
        let mut parts = path.split('/');
        while let Some(step) = parts.next() {
            let branch = parts.next()?;
            let step = wf.step(step.parse().ok()?)?;
            let next = match &step.val {
                Val::Parallel(p) => p.branches.iter().find(|b| b.name == branch)?.sub.0.clone(),
                Val::Map(MapVal {
                    body: MapBody::Steps(sub),
                    ..
                }) if branch == ITEM_BRANCH => sub.0.clone(),
                Val::Switch(sw) => sw.paths().find(|b| b.name == branch)?.sub.0.clone(),
                Val::Loop(l) if branch == LOOP_BODY => l.body.0.clone(),
                _ => return None,
            };
            wf = next;
        }
        Some(wf)
    }

    /// The main-sequence step after `id`, if any (None also for onFailure ids).
    pub fn next_main(&self, id: u32) -> Option<u32> {
        let pos = self.main.iter().position(|&s| s == id)?;
        self.main.get(pos + 1).copied()
    }
}
