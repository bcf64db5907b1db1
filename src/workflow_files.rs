//! `clamp workflows apply|export`: workflow definitions kept as files (in a repository,
//! reviewed like code) and a server's workflows brought in line with them. `apply`
//! validates every file first, as the server validates a definition, and applies nothing
//! when any is invalid; then it creates each new name and stores a new version of each
//! changed one (an unchanged definition stores nothing), through a running server
//! (`--url`) or the database itself (`--database-url`, as the server takes it).
//! `export` writes the latest version of every workflow as `<name>.json`, without the
//! server's stamps, so that applying an export changes nothing. Triggers are files too
//! (`triggers`).

mod triggers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::config::{Args, Config};
use crate::store::queries;
use crate::workflow::{compile, set_default_reply_to, WorkflowDef};

#[derive(Debug, Parser)]
#[command(
    name = "clamp workflows",
    about = "Workflow definitions as files: apply them to a server, or export a server's"
)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Validate every definition (files, or directories of *.json files), then create or
    /// version each; prints per file `created`, `new version N` or `unchanged`.
    Apply {
        /// Validate and report what would change; store nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        target: Target,
        /// Definition files, or directories of them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Write the latest version of every workflow as DIR/<name>.json.
    Export {
        #[command(flatten)]
        target: Target,
        dir: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct Target {
    /// A running clamp server (e.g. http://localhost:8080) to apply through.
    #[arg(long, conflicts_with = "database_url")]
    url: Option<String>,
    /// The database to apply to directly, as the server takes it (default: the server's).
    #[arg(long)]
    database_url: Option<String>,
    /// The bearer token for `--url`, when the server has `--api-tokens`.
    #[arg(long, env = "CLAMP_API_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A PEM file of CA certificates an `https://` `--url` is trusted by, besides the
    /// system's roots (a server whose certificate a private CA signed).
    #[arg(long, requires = "url")]
    ca_file: Option<PathBuf>,
}

/// Runs `clamp workflows …` (`args` after the program name, `workflows` first).
pub fn main(args: Vec<String>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}`: the whole cause chain on one line ("a: b: c").
            eprintln!("clamp workflows: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Apply {
            dry_run,
            target,
            paths,
        } => apply(&target, &paths, dry_run).await,
        Cmd::Export { target, dir } => {
            let backend = Backend::connect(&target).await?;
            std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
            for def in backend.all().await? {
                let name = def["name"].as_str().unwrap_or_default().to_string();
                let path = dir.join(format!("{name}.json"));
                let mut text =
                    serde_json::to_string_pretty(&unstamped(def)).expect("a definition serializes");
                text.push('\n');
                std::fs::write(&path, text).with_context(|| path.display().to_string())?;
                println!("{}: exported", path.display());
            }
            triggers::export(&backend, &dir).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `clamp workflows apply`: every file read and checked first (nothing is applied when
/// one is invalid, refused or names a workflow that cannot be included), then each
/// applied in turn.
async fn apply(target: &Target, paths: &[PathBuf], dry_run: bool) -> anyhow::Result<ExitCode> {
    let files = definition_files(paths)?;
    let (defs, hooks, errors) = read_all(&files);
    if !errors.is_empty() {
        return Ok(refused_all(
            &errors,
            &format!("{} of {} files are invalid", errors.len(), files.len()),
        ));
    }
    let backend = Backend::connect(target).await?;
    // Through the database, the checks the server runs on `POST /workflow` are run
    // here, with the server's configuration (its destination policy and secrets);
    // through a server, the server runs them.
    if let Backend::Db(db) = &backend {
        let refused: Refused = defs
            .iter()
            .filter_map(|(path, def)| {
                crate::ops::workflows::compile_checked(&db.config, def.clone())
                    .err()
                    .map(|e| (path.clone(), anyhow!(e.message())))
            })
            .collect();
        if !refused.is_empty() {
            let what = format!("{} of {} files are refused", refused.len(), defs.len());
            return Ok(refused_all(&refused, &what));
        }
    }
    let mut refused = check_includes(&backend, &defs).await?;
    refused.extend(check_started(&backend, &defs, &hooks).await?);
    if !refused.is_empty() {
        let what = format!(
            "{} files name workflows that cannot be included or started",
            refused.len()
        );
        return Ok(refused_all(&refused, &what));
    }
    let mut failed = false;
    let mut said = |path: &Path, r: anyhow::Result<String>| match r {
        Ok(what) => println!("{}: {what}", path.display()),
        Err(why) => {
            failed = true;
            eprintln!("{}: error: {why:#}", path.display());
        }
    };
    for (path, def) in defs {
        said(&path, apply_one(&backend, &def, dry_run).await);
    }
    // After the workflows they start.
    for (path, def) in hooks {
        said(&path, triggers::apply_one(&backend, &def, dry_run).await);
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Says why each file was refused, and that nothing was applied.
fn refused_all(refused: &[(PathBuf, anyhow::Error)], what: &str) -> ExitCode {
    for (path, why) in refused {
        eprintln!("{}: error: {why:#}", path.display());
    }
    eprintln!("clamp workflows: {what}; nothing applied");
    ExitCode::from(1)
}

/// The files named, and the `*.json` files under the directories named, their
/// subdirectories too (`triggers/` of an export), sorted so the order of output and
/// application is stable.
fn definition_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            json_under(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    if out.is_empty() {
        bail!("no definition files found");
    }
    Ok(out)
}

/// The `*.json` files under `dir`, each directory's files before its subdirectories'.
fn json_under(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let (dirs, files): (Vec<PathBuf>, Vec<PathBuf>) = entries.into_iter().partition(|p| p.is_dir());
    out.extend(
        files
            .into_iter()
            .filter(|f| f.extension().is_some_and(|x| x == "json")),
    );
    for d in dirs {
        json_under(&d, out)?;
    }
    Ok(())
}

/// Files and what each defines, or why not.
type Read = Vec<(PathBuf, WorkflowDef)>;
type Hooks = Vec<(PathBuf, Value)>;
type Refused = Vec<(PathBuf, anyhow::Error)>;

/// Every file parsed and validated: the workflows (in include order), the triggers, and
/// the errors of those that are not valid (a name defined by two files is an error of
/// the second).
fn read_all(files: &[PathBuf]) -> (Read, Hooks, Refused) {
    let defaults = match config(None) {
        Ok(c) => c,
        Err(why) => {
            let e = vec![(PathBuf::from("(configuration)"), why)];
            return (Vec::new(), Vec::new(), e);
        }
    };
    let mut defs: Read = Vec::new();
    let mut hooks: Hooks = Vec::new();
    let mut errors = Vec::new();
    for f in files {
        let value = match read_json(f) {
            Ok(v) => v,
            Err(why) => {
                errors.push((f.clone(), why));
                continue;
            }
        };
        if triggers::is_trigger(&value) {
            match triggers::check(&value) {
                Ok((name, _)) => match hooks.iter().find(|(_, h)| h["name"] == name.as_str()) {
                    Some((other, _)) => errors.push((
                        f.clone(),
                        anyhow!("trigger {name} is defined in {} too", other.display()),
                    )),
                    None => hooks.push((f.clone(), value)),
                },
                Err(why) => errors.push((f.clone(), why)),
            }
            continue;
        }
        match read_one(value, &defaults) {
            Ok(def) => match defs.iter().find(|(_, d)| d.name == def.name) {
                Some((other, _)) => errors.push((
                    f.clone(),
                    anyhow!(
                        "workflow {} is defined in {} too",
                        def.name,
                        other.display()
                    ),
                )),
                None => defs.push((f.clone(), def)),
            },
            Err(why) => errors.push((f.clone(), why)),
        }
    }
    (in_include_order(defs), hooks, errors)
}

/// Before anything is applied: the workflow each trigger starts must be one of the files
/// or known to the target (the server checks again, with the version, as each is stored).
async fn check_started(backend: &Backend, defs: &Read, hooks: &Hooks) -> anyhow::Result<Refused> {
    let mut refused = Vec::new();
    for (path, h) in hooks {
        let (_, workflow) = triggers::check(h)?;
        if defs.iter().any(|(_, d)| d.name == workflow) {
            continue;
        }
        if backend.current(&workflow).await?.is_none() {
            refused.push((
                path.clone(),
                anyhow!("starts workflow {workflow}, which is neither a file here nor known"),
            ));
        }
    }
    Ok(refused)
}

/// The definitions ordered so that a workflow that another one includes (a WORKFLOW
/// step) is applied before it, names otherwise in file order; a circle among them is left
/// as it is, for the server to refuse with its path.
fn in_include_order(mut defs: Read) -> Read {
    let mut out: Read = Vec::with_capacity(defs.len());
    while !defs.is_empty() {
        let ready = defs.iter().position(|(_, d)| {
            d.steps.iter().all(|s| {
                s.mode != "WORKFLOW"
                    || s.val
                        .get("workflow")
                        .and_then(Value::as_str)
                        .is_none_or(|n| {
                            n == d.name || !defs.iter().any(|(_, other)| other.name == n)
                        })
            })
        });
        out.push(defs.remove(ready.unwrap_or(0)));
    }
    out
}

/// A definition file's JSON object.
fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read(path)?;
    let value: Value = serde_json::from_slice(&text).context("not JSON")?;
    if !value.is_object() {
        bail!("the definition must be a JSON object");
    }
    Ok(value)
}

fn read_one(value: Value, cfg: &Config) -> anyhow::Result<WorkflowDef> {
    let mut def: WorkflowDef =
        serde_json::from_value(value).context("invalid workflow definition")?;
    def.version = 1;
    let b = &cfg.brokers;
    set_default_reply_to(&mut def, &b.amqp_response_queue, &b.kafka_response_topic);
    compile(def).map(|wf| wf.def).map_err(|e| anyhow!(e.0))
}

/// The workflows a definition's WORKFLOW steps start.
fn included(steps: &[crate::workflow::model::Step]) -> Vec<String> {
    steps
        .iter()
        .filter(|s| s.mode == "WORKFLOW")
        .filter_map(|s| s.val.get("workflow").and_then(Value::as_str))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Before anything is applied: every workflow a file's WORKFLOW step names must be one of
/// the files or known to the target, and no workflow may come to include itself (the
/// files as they will be, the others as stored). The server checks again as each is
/// stored; this makes an apply all or nothing for these errors too, through either target.
async fn check_includes(backend: &Backend, defs: &Read) -> anyhow::Result<Refused> {
    use std::collections::HashMap;
    // name → what it includes (None: known nowhere)
    let mut graph: HashMap<String, Option<Vec<String>>> = defs
        .iter()
        .map(|(_, d)| (d.name.clone(), Some(included(&d.steps))))
        .collect();
    let mut todo: Vec<String> = graph.values().flatten().flatten().cloned().collect();
    while let Some(name) = todo.pop() {
        if graph.contains_key(&name) {
            continue;
        }
        let found = backend.current(&name).await?;
        let inc = found
            .and_then(|v| serde_json::from_value::<WorkflowDef>(v).ok())
            .map(|d| included(&d.steps));
        if let Some(i) = &inc {
            todo.extend(i.iter().cloned());
        }
        graph.insert(name, inc);
    }
    let mut refused = Vec::new();
    for (path, d) in defs {
        let direct = included(&d.steps);
        if let Some(missing) = direct.iter().find(|n| matches!(graph.get(*n), Some(None))) {
            refused.push((
                path.clone(),
                anyhow!("includes workflow {missing}, which is neither a file here nor known"),
            ));
            continue;
        }
        // A path back to this workflow, depth first.
        let mut stack: Vec<Vec<String>> = direct
            .iter()
            .map(|n| vec![d.name.clone(), n.clone()])
            .collect();
        let mut seen: Vec<String> = Vec::new();
        while let Some(path_names) = stack.pop() {
            let last = path_names.last().expect("a path has a last name").clone();
            if last == d.name {
                refused.push((
                    path.clone(),
                    anyhow!(
                        "the workflow would include itself: {}",
                        path_names.join(" → ")
                    ),
                ));
                break;
            }
            if seen.contains(&last) {
                continue;
            }
            seen.push(last.clone());
            for next in graph.get(&last).cloned().flatten().unwrap_or_default() {
                let mut p = path_names.clone();
                p.push(next);
                stack.push(p);
            }
        }
    }
    Ok(refused)
}

/// The server's configuration from its environment (as `clamp` itself reads it), with
/// `database_url` if given: its broker defaults fill in a definition as the server's do.
fn config(database_url: Option<&str>) -> anyhow::Result<Config> {
    let mut argv = vec!["clamp".to_string()];
    if let Some(db) = database_url {
        argv.extend(["--database-url".to_string(), db.to_string()]);
    }
    Config::from_args(Args::try_parse_from(argv)?).map_err(|e| anyhow!(e))
}

/// A workflow name as a path segment.
fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A definition without what the server stamps on it (id, version, times).
fn unstamped(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        for k in ["id", "version", "created_at", "updated_at"] {
            o.remove(k);
        }
    }
    v
}

async fn apply_one(backend: &Backend, def: &WorkflowDef, dry_run: bool) -> anyhow::Result<String> {
    if let (Backend::Db(db), false) = (backend, dry_run) {
        return db.apply(def).await;
    }
    let current = backend.current(&def.name).await?;
    let version = |v: &Value| v["version"].as_i64().unwrap_or(1);
    let Some(current) = current else {
        if dry_run {
            return Ok("would be created".into());
        }
        let created = backend.create(def).await?;
        return Ok(format!("created (version {})", version(&created)));
    };
    if dry_run {
        let mine = unstamped(serde_json::to_value(def).expect("a definition serializes"));
        return Ok(if mine == unstamped(current.clone()) {
            format!("unchanged (version {})", version(&current))
        } else {
            format!("would become version {}", version(&current) + 1)
        });
    }
    let stored = backend.put(def).await?;
    Ok(if version(&stored) == version(&current) {
        format!("unchanged (version {})", version(&stored))
    } else {
        format!("new version {}", version(&stored))
    })
}

/// Where definitions are applied: a running server, or the database.
enum Backend {
    Http {
        client: hyper_util::client::legacy::Client<
            hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
            Full<Bytes>,
        >,
        base: String,
        token: Option<String>,
    },
    /// The database, through the operations a server runs.
    Db(Box<Db>),
}

/// What `ops::workflows` uses, built here as a server builds its own: the server's
/// configuration read from the environment, a workflow map, a pool; and the name the
/// audit trail gives the changes.
struct Db {
    pool: crate::store::Pool,
    config: Config,
    workflows: crate::store::workflow_map::WorkflowMap,
    who: crate::tokens::Caller,
}

impl Db {
    fn deps(&self) -> crate::ops::Deps<'_> {
        crate::ops::Deps {
            config: &self.config,
            workflows: &self.workflows,
            pool: &self.pool,
            triggers_changed: None,
        }
    }

    /// One definition applied as `POST /workflow` or `PUT /workflow/{name}` would store
    /// it: the same checks, the same statements, the same audit record.
    async fn apply(&self, def: &WorkflowDef) -> anyhow::Result<String> {
        use crate::ops::workflows::{self, Applied};
        let refused = |e: crate::ops::OpError| anyhow!(e.message());
        let wf = workflows::compile_checked(&self.config, def.clone()).map_err(refused)?;
        Ok(
            match workflows::apply(&self.deps(), &self.who, wf)
                .await
                .map_err(refused)?
            {
                Applied::Created(wf) => format!("created (version {})", wf.def.version),
                Applied::Replaced(r) if r.new => format!("new version {}", r.stored.def.version),
                Applied::Replaced(r) => format!("unchanged (version {})", r.stored.def.version),
            },
        )
    }
}

/// The audit trail's name for changes applied from files: the command and the user who
/// ran it (as the environment names them).
fn cli_caller() -> crate::tokens::Caller {
    let user = std::env::var("USER").unwrap_or_else(|_| "an unknown user".into());
    crate::tokens::Caller {
        name: format!("clamp workflows apply ({user})").into(),
        role: crate::tokens::Role::Admin,
    }
}

impl Backend {
    async fn connect(t: &Target) -> anyhow::Result<Backend> {
        if let Some(url) = &t.url {
            let roots = crate::tls::roots(true, t.ca_file.as_deref())?;
            let tls = crate::tls::client(crate::tls::Verify::Full(roots), None, &[])?;
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .build();
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build(https);
            return Ok(Backend::Http {
                client,
                base: url.trim_end_matches('/').to_string(),
                token: t.token.clone(),
            });
        }
        let cfg = config(t.database_url.as_deref())?;
        let db = std::sync::Arc::new(
            crate::store::connect::PgConnector::for_config(&cfg)
                .map_err(|e| anyhow!(crate::error_chain::one_line(&e)))?,
        );
        let mut client = crate::store::migrate::connect_or_create(&db)
            .await
            .map_err(|e| anyhow!(crate::error_chain::one_line(&e)))?;
        crate::store::migrate::run(&mut client)
            .await
            .map_err(|e| anyhow!(crate::error_chain::one_line(&e)))?;
        let pool = crate::store::pool::build(db, &cfg, 1);
        Ok(Backend::Db(Box::new(Db {
            pool,
            config: cfg,
            workflows: Default::default(),
            who: cli_caller(),
        })))
    }

    /// Sends one request to the server; its status and JSON answer.
    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let Backend::Http {
            client,
            base,
            token,
        } = self
        else {
            unreachable!("only the HTTP backend calls");
        };
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let req = req.body(Full::new(body))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| anyhow!("{base}: {}", crate::error_chain::one_line(&e)))?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status >= 400 && status != 404 {
            bail!(
                "the server answered {status}: {}",
                v["message"].as_str().unwrap_or("(no message)")
            );
        }
        Ok((status, v))
    }

    /// The latest stored definition of `name`, if there is one.
    async fn current(&self, name: &str) -> anyhow::Result<Option<Value>> {
        match self {
            Backend::Http { .. } => {
                let path = format!("/workflow/{}", segment(name));
                let (status, v) = self.call(hyper::Method::GET, &path, None).await?;
                Ok((status == 200).then_some(v))
            }
            Backend::Db(db) => {
                let conn = db.pool.get().await?;
                Ok(queries::latest_definition(&conn, name).await?)
            }
        }
    }

    /// Through a server: `POST /workflow` (the database goes through `Db::apply`).
    async fn create(&self, def: &WorkflowDef) -> anyhow::Result<Value> {
        let body = serde_json::to_value(def).expect("a definition serializes");
        let (status, v) = self
            .call(hyper::Method::POST, "/workflow", Some(body))
            .await?;
        if status == 404 {
            bail!("the server has no POST /workflow");
        }
        Ok(v)
    }

    /// Through a server: `PUT /workflow/{name}`.
    async fn put(&self, def: &WorkflowDef) -> anyhow::Result<Value> {
        let path = format!("/workflow/{}", segment(&def.name));
        let body = serde_json::to_value(def).expect("a definition serializes");
        let (status, v) = self.call(hyper::Method::PUT, &path, Some(body)).await?;
        if status == 404 {
            bail!("the workflow is not known to the server any more");
        }
        Ok(v)
    }

    /// The latest version of every workflow.
    async fn all(&self) -> anyhow::Result<Vec<Value>> {
        match self {
            Backend::Http { .. } => {
                let mut out = Vec::new();
                for page in 1.. {
                    let path = format!("/workflows?pageSize=1000&pageNumber={page}");
                    let (_, v) = self.call(hyper::Method::GET, &path, None).await?;
                    let list = v["workflows"].as_array().cloned().unwrap_or_default();
                    let total = v["totalWorkflowsCount"].as_u64().unwrap_or(0) as usize;
                    let empty = list.is_empty();
                    out.extend(list);
                    if empty || out.len() >= total {
                        break;
                    }
                }
                Ok(out)
            }
            Backend::Db(db) => {
                let conn = db.pool.get().await?;
                let defs = queries::all_workflows(&conn.client).await?;
                Ok(defs
                    .into_iter()
                    .map(|d| serde_json::to_value(d).expect("a definition serializes"))
                    .collect())
            }
        }
    }
}
