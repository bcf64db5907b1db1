//! Pausing a workflow (beyond Clamp): `POST /workflow/{name}/pause` and `/resume`. While
//! paused, its creates are accepted and stored and none starts; a running request
//! finishes the step it is at and parks before its next one (`store::pauses`). A resume
//! makes the parked requests claimable at once, in creation order, under the workflow's
//! concurrency limit as before. The pause is in Postgres: every instance follows it
//! within a second, and it outlives restarts. Both are audited.

use super::access::Op;
use super::audit::{recorded, Told};
use super::{OpError, Result};
use crate::state::Core;
use crate::store::pauses as store;
pub use crate::store::pauses::{Pause, Pauses};
use crate::tokens::Caller;

impl Told for Pause {}

/// What a resume did.
pub struct Resumed {
    /// Whether the workflow was paused.
    pub was_paused: bool,
    /// Parked requests made claimable.
    pub freed: u64,
}

impl Told for Resumed {
    fn told(&self) -> String {
        format!("ok, {} parked requests freed", self.freed)
    }
}

/// Pauses `name` (404 when no such workflow; pausing a paused one changes nothing).
pub async fn pause(core: &Core, who: &Caller, name: &str) -> Result<Pause> {
    let r = async {
        super::create::workflow(core, name, None).await?;
        let doing = "pause workflow";
        let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
        let p = store::pause(&conn, name, &who.name)
            .await
            .map_err(OpError::store(doing))?;
        core.app.pauses.mark(name, true);
        Ok(p)
    }
    .await;
    recorded(&core.pool, who, Op::PauseWorkflow, name, r).await
}

/// Resumes `name`: its parked requests run again (404 when no such workflow; resuming
/// one that is not paused changes nothing).
pub async fn resume(core: &Core, who: &Caller, name: &str) -> Result<Resumed> {
    let r = async {
        super::create::workflow(core, name, None).await?;
        let doing = "resume workflow";
        let mut conn = core.pool.get().await.map_err(OpError::pool(doing))?;
        let (was_paused, freed) = store::resume(&mut conn, name)
            .await
            .map_err(OpError::store(doing))?;
        core.app.pauses.mark(name, false);
        core.executor.wake();
        Ok(Resumed { was_paused, freed })
    }
    .await;
    recorded(&core.pool, who, Op::ResumeWorkflow, name, r).await
}

/// The pause of `name`, if it is paused (as stored, not as this instance last read).
pub async fn of(core: &Core, name: &str) -> Result<Option<Pause>> {
    let doing = "read workflow pause";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    store::get(&conn, name).await.map_err(OpError::store(doing))
}
