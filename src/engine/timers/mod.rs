//! What the engine does at a time rather than at a step's end: deadlines that pass
//! (`deadlines`), schedules that fire (`schedules`), and the concurrency slots a limited
//! workflow's waiting requests are admitted to as others finish (`slots`).

pub(crate) mod deadlines;
pub(crate) mod schedules;
pub(crate) mod slots;
