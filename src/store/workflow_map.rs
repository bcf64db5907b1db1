//! The in-memory workflow map, by name and version. Versions never change and are never
//! deleted, so a cached version never goes stale; the latest version of a name may be
//! older here than in Postgres (another instance stored a new one), which is why a create
//! is pinned to a version by its insert statement, not by this map (`store::buffer`),
//! and a request runs the version its row names (`get_or_load_version`). A name missing
//! here is looked up in Postgres once (another instance may have created it), and misses
//! are remembered briefly so a flood of unknown names cannot turn into a flood of
//! queries. A stored definition that no longer validates is remembered for good (only a
//! new server could accept it), and logged once, when found.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::{Pool, StoreError};
use crate::workflow::Workflow;

/// Why a workflow could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// Postgres could not be asked (transient or not, as the store error says).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored definition no longer validates (e.g. an upgrade tightened validation):
    /// permanent until the server changes again.
    #[error("workflow {name} no longer validates: {reason}")]
    Invalid { name: String, reason: String },
}

/// How long a name that Postgres did not know is answered 404 without asking again.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// Most remembered misses; past this the memory of misses is cleared (it is only a cache).
const MAX_NEGATIVE: usize = 16 * 1024;

/// Every loaded version of one workflow, by number.
type Versions = BTreeMap<u32, Arc<Workflow>>;

/// Name → the latest compiled version known here, and (name, version) → each version
/// loaded; shared by every runtime.
#[derive(Default)]
pub struct WorkflowMap {
    map: RwLock<HashMap<Box<str>, Arc<Workflow>>>,
    versions: RwLock<HashMap<Box<str>, Versions>>,
    misses: Mutex<HashMap<Box<str>, Instant>>,
    /// Stored definitions that no longer validate, with why.
    invalid: Mutex<HashMap<Box<str>, Arc<str>>>,
}

impl WorkflowMap {
    /// The latest version known here, if any. Takes a read lock for a hash lookup only.
    #[inline]
    pub fn get(&self, name: &str) -> Option<Arc<Workflow>> {
        self.map.read().get(name).cloned()
    }

    /// One version, if loaded here.
    pub fn get_version(&self, name: &str, version: u32) -> Option<Arc<Workflow>> {
        self.versions.read().get(name)?.get(&version).cloned()
    }

    /// Caches a version (the latest known if no newer one is; also forgetting any
    /// remembered miss for its name).
    pub fn insert(&self, wf: Arc<Workflow>) {
        let name: Box<str> = wf.def.name.as_str().into();
        self.misses.lock().remove(&name);
        self.versions
            .write()
            .entry(name.clone())
            .or_default()
            .insert(wf.def.version, wf.clone());
        let mut map = self.map.write();
        match map.get(&name) {
            Some(known) if known.def.version > wf.def.version => {}
            _ => {
                map.insert(name, wf);
            }
        }
    }

    /// True when `name` was recently looked up in Postgres and not found.
    pub fn recently_missed(&self, name: &str) -> bool {
        let mut misses = self.misses.lock();
        match misses.get(name) {
            Some(at) if at.elapsed() < NEGATIVE_TTL => true,
            Some(_) => {
                misses.remove(name);
                false
            }
            None => false,
        }
    }

    /// Remembers that Postgres did not know `name`.
    pub fn remember_miss(&self, name: &str) {
        let mut misses = self.misses.lock();
        if misses.len() >= MAX_NEGATIVE {
            misses.clear();
        }
        misses.insert(name.into(), Instant::now());
    }

    /// Why the stored workflow `name` no longer validates, if it was found so.
    pub fn known_invalid(&self, name: &str) -> Option<Arc<str>> {
        self.invalid.lock().get(name).cloned()
    }

    /// Remembers that the stored workflow `name` does not validate (bounded like misses).
    pub fn remember_invalid(&self, name: &str, reason: &str) {
        let mut invalid = self.invalid.lock();
        if invalid.len() >= MAX_NEGATIVE {
            invalid.clear();
        }
        invalid.insert(name.into(), reason.into());
    }

    /// The workflow named `name`: from memory, else from Postgres once (another instance
    /// may have created it), compiled and cached. `None` when no such workflow exists
    /// (remembered for `NEGATIVE_TTL`, and never asked for names that cannot exist).
    pub async fn get_or_load(
        &self,
        pool: &Pool,
        name: &str,
    ) -> Result<Option<Arc<Workflow>>, LoadError> {
        if let Some(wf) = self.get(name) {
            return Ok(Some(wf));
        }
        if self.recently_missed(name) || crate::workflow::validate::check_name(name).is_err() {
            return Ok(None);
        }
        if let Some(reason) = self.known_invalid(name) {
            return Err(LoadError::Invalid {
                name: name.to_string(),
                reason: reason.to_string(),
            });
        }
        let conn = pool.get().await.map_err(StoreError::from)?;
        let found = super::queries::workflow_by_name(&conn, name).await?;
        drop(conn);
        match found {
            Some(def) => self.compiled(name, def, true).map(Some),
            None => {
                self.remember_miss(name);
                Ok(None)
            }
        }
    }

    /// Version `version` of `name`: from memory, else from Postgres (once; versions never
    /// change). `None` when the name has no such version.
    pub async fn get_or_load_version(
        &self,
        pool: &Pool,
        name: &str,
        version: u32,
    ) -> Result<Option<Arc<Workflow>>, LoadError> {
        // The steps of a fan-out step's branch or item (`order/3/acme`): found in the
        // version of the workflow they belong to (stored names hold no '/').
        if let Some((root, path)) = name.split_once('/') {
            let wf = Box::pin(self.get_or_load_version(pool, root, version)).await?;
            return Ok(wf.and_then(|wf| wf.sub(path)));
        }
        if let Some(wf) = self.get_version(name, version) {
            return Ok(Some(wf));
        }
        let conn = pool.get().await.map_err(StoreError::from)?;
        let found = super::queries::workflow_version(&conn, name, version).await?;
        drop(conn);
        // A missing version is not a missing name: nothing to remember.
        match found {
            Some(def) => self.compiled(name, def, false).map(Some),
            None => Ok(None),
        }
    }

    /// Compiles and caches a stored definition of `name`; an invalid one is remembered
    /// for the name when it is the `latest`.
    fn compiled(
        &self,
        name: &str,
        def: crate::workflow::WorkflowDef,
        latest: bool,
    ) -> Result<Arc<Workflow>, LoadError> {
        match crate::workflow::compile(def) {
            Ok(wf) => {
                let wf = Arc::new(wf);
                self.insert(wf.clone());
                Ok(wf)
            }
            Err(e) => {
                tracing::error!(workflow = name, reason = %e.0, "stored workflow no longer validates");
                if latest {
                    self.remember_invalid(name, &e.0);
                }
                Err(LoadError::Invalid {
                    name: name.to_string(),
                    reason: e.0,
                })
            }
        }
    }

    /// Number of cached workflows (names).
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::{compile, WorkflowDef};

    fn wf(name: &str) -> Arc<Workflow> {
        let def: WorkflowDef = serde_json::from_value(serde_json::json!({
            "name": name,
            "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "http://h/"}}]
        }))
        .unwrap();
        Arc::new(compile(def).unwrap())
    }

    #[test]
    fn caches_hits_and_misses() {
        let m = WorkflowMap::default();
        assert!(m.get("w").is_none());
        assert!(!m.recently_missed("w"));
        m.remember_miss("w");
        assert!(m.recently_missed("w"));
        m.insert(wf("w"));
        assert!(!m.recently_missed("w"));
        assert_eq!(m.get("w").unwrap().def.name, "w");
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn keeps_every_version_and_the_latest() {
        let m = WorkflowMap::default();
        let v = |n: u32| {
            let mut def = wf("w").def.clone();
            def.version = n;
            Arc::new(compile(def).unwrap())
        };
        m.insert(v(2));
        m.insert(v(1));
        assert_eq!(m.get("w").unwrap().def.version, 2);
        assert_eq!(m.get_version("w", 1).unwrap().def.version, 1);
        m.insert(v(3));
        assert_eq!(m.get("w").unwrap().def.version, 3);
        assert!(m.get_version("w", 4).is_none());
    }

    #[test]
    fn remembers_definitions_that_no_longer_validate() {
        let m = WorkflowMap::default();
        assert!(m.known_invalid("old").is_none());
        m.remember_invalid("old", "a step has no name");
        assert_eq!(
            m.known_invalid("old").as_deref(),
            Some("a step has no name")
        );
        assert!(m.known_invalid("other").is_none());
    }
}
