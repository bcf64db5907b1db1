//! Workflows: define (version 1), replace (the next version, beyond Clamp), read (the
//! latest as Postgres has it, or one version), versions, and Clamp's page of them. A
//! definition is validated and compiled before it is stored (a `when` that does not
//! compile is refused there), and its WORKFLOW steps must start known workflows without
//! a circle. Every one read or stored is cached in the workflow map.

use std::sync::Arc;

use bytes::Bytes;

use super::access::Op;
use super::audit::{recorded, Told, NOT_CREATED};
use super::{Deps, OpError, Result};
use crate::config::Config;
use crate::destinations::Destinations;
use crate::secrets::Secrets;
pub use crate::store::queries::WorkflowSort;
use crate::store::queries::{self, Versioned};
use crate::store::workflow_map::WorkflowMap;
use crate::store::{LoadError, StoreError};
use crate::tokens::Caller;
use crate::workflow::brokers::{self, AmqpTarget, Endpoint, KafkaTarget};
use crate::workflow::validate::includes;
use crate::workflow::{compile, set_default_reply_to, Val, Workflow, WorkflowDef};

/// A definition as posted, validated, compiled and checked (its version left to the
/// store).
pub fn compile_posted(cfg: &Config, body: &[u8]) -> Result<Workflow> {
    let mut def: WorkflowDef = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v @ serde_json::Value::Object(_)) => serde_json::from_value(v)
            .map_err(|e| OpError::BadRequest(format!("invalid workflow definition: {e}")))?,
        Ok(_) => {
            return Err(OpError::BadRequest(
                "the workflow definition must be a JSON object".into(),
            ))
        }
        Err(e) => {
            return Err(OpError::BadRequest(format!(
                "the body is not valid JSON: {e}"
            )))
        }
    };
    def.version = 1;
    compile_checked(cfg, def)
}

/// A definition compiled and checked as `POST /workflow` checks it, wherever it comes
/// from (`clamp workflows apply` too): the steps' broker replies default to the server's
/// response queue and topic, every secret a step names exists, and every destination is
/// one the policy allows.
pub fn compile_checked(cfg: &Config, mut def: WorkflowDef) -> Result<Workflow> {
    let b = &cfg.brokers;
    set_default_reply_to(&mut def, &b.amqp_response_queue, &b.kafka_response_topic);
    let wf = compile(def).map_err(|e| OpError::BadRequest(e.0))?;
    check_calls(&cfg.secrets, &cfg.destinations, &wf)?;
    Ok(wf)
}

/// Every step of `wf` that calls out (HTTP, AMQP, Kafka), its branches' and items' too,
/// checked by `check`; the first refusal is 400, naming the step.
fn each_call<E: std::fmt::Display>(
    wf: &Workflow,
    check: &impl Fn(&Val) -> std::result::Result<(), E>,
) -> Result<()> {
    for s in &wf.steps {
        let subs = s.val.subs();
        if subs.is_empty() {
            check(&s.val).map_err(|e| OpError::BadRequest(format!("step '{}': {e}", s.name)))?;
        }
        for sub in subs {
            each_call(&sub.0, check)?;
        }
    }
    Ok(())
}

/// Every secret a step names exists now (never showing a value), and every destination a
/// step calls is one the policy allows, as far as the definition tells (a literal
/// address, a name it denies).
fn check_calls(secrets: &Secrets, policy: &Destinations, wf: &Workflow) -> Result<()> {
    each_call(wf, &|v: &Val| match v {
        Val::Http(h) => h
            .secret_url
            .as_deref()
            .into_iter()
            .chain(h.headers.iter().filter_map(|(_, v)| v.to_str().ok()))
            .try_for_each(|t| secrets.check(t)),
        Val::Amqp(a) => secrets.check(&a.connection_url),
        Val::Kafka(k) => secrets.check(&k.connection_url),
        _ => Ok(()),
    })?;
    each_call(wf, &|v: &Val| match v {
        Val::Http(h) => h.url.host().map_or(Ok(()), |host| {
            policy.check_host(host).map_err(|e| e.to_string())
        }),
        Val::Amqp(a) => broker_hosts(&a.connection_url, |t| {
            AmqpTarget::read(t).map(|t| vec![t.endpoint])
        })
        .and_then(|hosts| check_hosts(policy, &hosts)),
        Val::Kafka(k) => broker_hosts(&k.connection_url, |t| {
            KafkaTarget::read(t).map(|t| t.brokers)
        })
        .and_then(|hosts| check_hosts(policy, &hosts)),
        _ => Ok(()),
    })
}

/// The brokers a connection string names, read as its client will read it (secret
/// references standing in for their values: they may not give a host).
fn broker_hosts(
    text: &str,
    read: impl Fn(&str) -> std::result::Result<Vec<Endpoint>, String>,
) -> std::result::Result<Vec<Endpoint>, String> {
    let hosts = read(&brokers::for_definition(text)?)?;
    hosts.iter().try_for_each(brokers::refuse_secret_host)?;
    Ok(hosts)
}

fn check_hosts(policy: &Destinations, hosts: &[Endpoint]) -> std::result::Result<(), String> {
    hosts
        .iter()
        .try_for_each(|e| policy.check_host(&e.host.as_str()))
        .map_err(|e| e.to_string())
}

/// A workflow still to look at while checking includes: the path to it, its name and
/// version, and where the root names it.
type Pending = (Vec<String>, String, Option<u32>, Option<String>);

/// Refuses (400) a workflow whose WORKFLOW steps start an unknown workflow (or version),
/// or that would include itself, directly or through others (the message names the
/// circle). Any new circle passes through the workflow being stored, so only paths from
/// it are followed.
async fn check_includes(d: &Deps<'_>, wf: &Workflow) -> Result<()> {
    let root = wf.def.name.clone();
    let mut todo: Vec<Pending> = includes(wf)
        .into_iter()
        .map(|(name, v, at)| (vec![root.clone()], name, v, Some(at)))
        .collect();
    let mut seen: Vec<(String, Option<u32>)> = Vec::new();
    while let Some((path, name, version, at)) = todo.pop() {
        let mut path = path;
        path.push(name.clone());
        if name == root {
            return Err(OpError::BadRequest(format!(
                "the workflow would include itself: {}",
                path.join(" → ")
            )));
        }
        if seen.contains(&(name.clone(), version)) {
            continue;
        }
        seen.push((name.clone(), version));
        let map = d.workflows;
        let found = match version {
            Some(v) => map.get_or_load_version(d.pool, &name, v).await,
            None => map.get_or_load(d.pool, &name).await,
        };
        let child = match found {
            Ok(Some(c)) => c,
            Ok(None) | Err(LoadError::Invalid { .. }) => {
                let what = version.map_or(String::new(), |v| format!(" version {v}"));
                return Err(OpError::BadRequest(match at {
                    Some(at) => format!("{at}.val.workflow: no workflow {name}{what}"),
                    None => format!(
                        "{} includes {name}{what}, which is not known",
                        path.join(" → ")
                    ),
                }));
            }
            Err(LoadError::Store(error)) => {
                return Err(OpError::Store {
                    error,
                    doing: "workflow lookup",
                })
            }
        };
        for (n, v, _) in includes(&child) {
            todo.push((path.clone(), n, v, None));
        }
    }
    Ok(())
}

impl Told for Arc<Workflow> {}

/// `POST /workflow`: the posted definition (`compile_posted`) stored as version 1 of a
/// new name (409 when it is taken). Recorded in the audit trail as `who`'s.
pub async fn define(d: &Deps<'_>, who: &Caller, body: &[u8]) -> Result<Arc<Workflow>> {
    let r = match compile_posted(d.config, body) {
        Ok(wf) => define_compiled(d, wf).await,
        Err(e) => Err(e),
    };
    let target = r.as_ref().map_or(NOT_CREATED, |wf| wf.def.name.as_str());
    let target = target.to_string();
    recorded(d.pool, who, Op::DefineWorkflow, &target, r).await
}

async fn define_compiled(d: &Deps<'_>, mut wf: Workflow) -> Result<Arc<Workflow>> {
    check_includes(d, &wf).await?;
    let doing = "create workflow";
    let id = crate::ids::new_v7();
    wf.def.id = id.to_string();
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    match queries::insert_workflow(&conn, &wf.def, id).await {
        Ok(created_at) => {
            wf.def.created_at = created_at.clone();
            wf.def.updated_at = created_at;
            wf.json =
                Bytes::from(serde_json::to_vec(&wf.def).expect("a workflow always serializes"));
            let wf = Arc::new(wf);
            d.workflows.insert(wf.clone());
            Ok(wf)
        }
        Err(StoreError::Conflict) => Err(OpError::Conflict(format!(
            "a workflow named '{}' already exists",
            wf.def.name
        ))),
        Err(error) => Err(OpError::Store { error, doing }),
    }
}

fn no_workflow(name: &str) -> OpError {
    OpError::NotFound(format!("No record exists with workflow name : {name}"))
}

/// `PUT /workflow/{name}` (beyond Clamp): `wf` becomes the workflow's next version; the
/// same definition as the latest stores nothing and answers the latest. Requests already
/// created keep their version. Recorded in the audit trail as `who`'s.
pub async fn replace(d: &Deps<'_>, who: &Caller, name: &str, body: &[u8]) -> Result<Arc<Workflow>> {
    let r = match compile_posted(d.config, body) {
        Ok(wf) => replace_compiled(d, name, wf).await.map(|v| v.stored),
        Err(e) => Err(e),
    };
    recorded(d.pool, who, Op::DefineWorkflow, name, r).await
}

/// A definition applied from a file (`clamp workflows apply`): created when its name is
/// new, else stored as the next version unless it is the latest already. Checked and
/// recorded as `POST /workflow` and `PUT /workflow/{name}` are.
pub enum Applied {
    Created(Arc<Workflow>),
    Replaced(Replaced),
}

/// What storing a next version came to.
pub struct Replaced {
    pub stored: Arc<Workflow>,
    /// Whether it is a new version (false: the same definition was the latest).
    pub new: bool,
}

impl Told for Applied {
    fn told(&self) -> String {
        match self {
            Applied::Created(_) => "ok".into(),
            Applied::Replaced(r) if r.new => format!("version {}", r.stored.def.version),
            Applied::Replaced(r) => format!("unchanged (version {})", r.stored.def.version),
        }
    }
}

/// `wf`, compiled and checked (`compile_checked`), applied as a file is: the next version
/// of a stored name, or a new name. Recorded in the audit trail as `who`'s.
pub async fn apply(d: &Deps<'_>, who: &Caller, wf: Workflow) -> Result<Applied> {
    let name = wf.def.name.clone();
    let r = match d.workflows.get_or_load(d.pool, &name).await {
        Ok(None) => define_compiled(d, wf).await.map(Applied::Created),
        // A stored version that no longer validates is replaced like any other.
        Ok(Some(_)) | Err(LoadError::Invalid { .. }) => {
            replace_compiled(d, &name, wf).await.map(Applied::Replaced)
        }
        Err(LoadError::Store(error)) => Err(OpError::Store {
            error,
            doing: "workflow lookup",
        }),
    };
    recorded(d.pool, who, Op::DefineWorkflow, &name, r).await
}

async fn replace_compiled(d: &Deps<'_>, name: &str, wf: Workflow) -> Result<Replaced> {
    if wf.def.name != name {
        return Err(OpError::BadRequest(format!(
            "name: the definition is named {:?}, the path {name:?}",
            wf.def.name
        )));
    }
    check_includes(d, &wf).await?;
    let doing = "version workflow";
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    let (stored, new) = match queries::put_workflow(&conn, &wf.def)
        .await
        .map_err(OpError::store(doing))?
    {
        Versioned::New(v) => (v, true),
        Versioned::Unchanged(v) => (v, false),
        Versioned::Unknown => return Err(no_workflow(name)),
    };
    drop(conn);
    let stored = cached(d.workflows, stored)?;
    Ok(Replaced { stored, new })
}

/// A stored definition compiled and cached (as served: `json` is it, stamps included).
fn cached(map: &WorkflowMap, stored: serde_json::Value) -> Result<Arc<Workflow>> {
    let internal =
        |why: String| OpError::Internal(format!("a stored workflow does not load: {why}"));
    let def: WorkflowDef = serde_json::from_value(stored).map_err(|e| internal(e.to_string()))?;
    let mut wf = compile(def).map_err(|e| internal(e.0))?;
    wf.json = Bytes::from(serde_json::to_vec(&wf.def).expect("a workflow always serializes"));
    let wf = Arc::new(wf);
    map.insert(wf.clone());
    Ok(wf)
}

/// `GET /workflow/{name}`: the latest version as Postgres has it (another instance may
/// have stored it), or beyond Clamp `version`.
pub async fn read(d: &Deps<'_>, name: &str, version: Option<u32>) -> Result<Arc<Workflow>> {
    if let Some(version) = version {
        return match d.workflows.get_or_load_version(d.pool, name, version).await {
            Ok(Some(wf)) => Ok(wf),
            Ok(None) => Err(OpError::NotFound(format!(
                "workflow {name} has no version {version}"
            ))),
            Err(LoadError::Invalid { reason, .. }) => Err(OpError::Conflict(format!(
                "that version no longer validates: {reason}"
            ))),
            Err(LoadError::Store(error)) => Err(OpError::Store {
                error,
                doing: "workflow lookup",
            }),
        };
    }
    if crate::workflow::validate::check_name(name).is_err() {
        return Err(no_workflow(name));
    }
    let doing = "workflow lookup";
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    let stored = queries::latest_definition(&conn, name)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(|| no_workflow(name))?;
    drop(conn);
    match d.workflows.get(name) {
        // Known here already: served as cached (the same bytes as the version's).
        Some(wf) if Some(wf.def.version as u64) == stored["version"].as_u64() => Ok(wf),
        _ => cached(d.workflows, stored),
    }
}

/// One version of a workflow.
pub struct Version {
    pub version: i32,
    pub created_at: String,
    pub description: String,
}

/// `GET /workflow/{name}/versions` (beyond Clamp): every version, oldest first.
pub async fn versions(d: &Deps<'_>, name: &str) -> Result<Vec<Version>> {
    let doing = "workflow versions";
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    let v = queries::workflow_versions(&conn, name)
        .await
        .map_err(OpError::store(doing))?;
    if v.is_empty() {
        return Err(no_workflow(name));
    }
    Ok(v.into_iter()
        .map(|(version, created_at, description)| Version {
            version,
            created_at,
            description,
        })
        .collect())
}

/// A page of definitions (as stored) and how many there are.
pub struct WorkflowPage {
    pub definitions: Vec<serde_json::Value>,
    pub total: i64,
}

/// `GET /workflows`: page `number` (1-based, as Clamp) of `size` definitions, sorted.
pub async fn list(
    d: &Deps<'_>,
    number: i64,
    size: i64,
    sort: &[(WorkflowSort, bool)],
) -> Result<WorkflowPage> {
    let doing = "list workflows";
    let conn = d.pool.get().await.map_err(OpError::pool(doing))?;
    let (definitions, total) = queries::workflows_page(&conn, size, size * (number - 1), sort)
        .await
        .map_err(OpError::store(doing))?;
    Ok(WorkflowPage { definitions, total })
}
