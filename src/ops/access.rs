//! Who may do which operation (beyond Clamp): each operation needs a role, and a caller
//! whose token has a lower one is refused, with the role it needs named. Every carrier of
//! the operations (the API, the console) asks here, so a role means the same everywhere.

use super::{OpError, Result};
use crate::tokens::{Caller, Role};

/// The operations (stated beside the routes that carry them: `crate::routes`).
pub use crate::routes::Op;

/// The role `op` needs.
pub fn needs(op: Op) -> Role {
    match op {
        Op::Read => Role::Read,
        Op::Create
        | Op::Cancel
        | Op::Retry
        | Op::BulkRetry
        | Op::Rerun
        | Op::StepResponse
        | Op::DeliverEvent
        | Op::PauseWorkflow
        | Op::ResumeWorkflow
        | Op::Hook => Role::Operate,
        Op::DefineWorkflow | Op::ChangeSchedule | Op::ChangeTrigger | Op::ReadAudit => Role::Admin,
    }
}

/// What the audit trail calls `op`, when it records it (None: not a change it records).
pub fn audited(op: Op) -> Option<&'static str> {
    match op {
        Op::Cancel => Some("cancel"),
        Op::Retry => Some("retry"),
        Op::BulkRetry => Some("bulk retry"),
        Op::Rerun => Some("rerun"),
        Op::DefineWorkflow => Some("define workflow"),
        Op::PauseWorkflow => Some("pause workflow"),
        Op::ResumeWorkflow => Some("resume workflow"),
        Op::ChangeSchedule => Some("change schedule"),
        Op::ChangeTrigger => Some("change trigger"),
        Op::Read | Op::Create | Op::StepResponse | Op::DeliverEvent | Op::Hook | Op::ReadAudit => {
            None
        }
    }
}

/// Whether `caller` may do `op`.
pub fn may(caller: &Caller, op: Op) -> bool {
    caller.role >= needs(op)
}

/// Ok when `caller` may do `op`; else 403 naming the role it needs and the one it has.
pub fn allow(caller: &Caller, op: Op) -> Result<()> {
    if may(caller, op) {
        return Ok(());
    }
    Err(OpError::Forbidden(format!(
        "this needs the {} role; token '{}' has {}",
        needs(op).as_str(),
        caller.name,
        caller.role.as_str()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_do_what_those_below_it_may() {
        let as_role = |role| Caller {
            name: "t".into(),
            role,
        };
        let (read, operate, admin) = (
            as_role(Role::Read),
            as_role(Role::Operate),
            as_role(Role::Admin),
        );
        assert!(may(&read, Op::Read) && !may(&read, Op::Create));
        assert!(may(&operate, Op::Retry) && !may(&operate, Op::DefineWorkflow));
        assert!(may(&admin, Op::ChangeSchedule));
        let e = allow(&read, Op::Cancel).unwrap_err();
        assert_eq!(
            e.message(),
            "this needs the operate role; token 't' has read"
        );
    }
}
