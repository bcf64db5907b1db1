//! The shapes of the fan-out modes' `val` (beyond Clamp), read and checked before their
//! steps are compiled (`validate`): a PARALLEL step's branches, a MAP step's list, body
//! and limits. Only the shape is checked here; the steps inside are compiled as a
//! workflow of their own by `validate`, which knows the enclosing workflow.

use serde_json::Value;

use super::model::{Branch, Mode, Step, StepType, ITEM_BRANCH};

/// Most branches a PARALLEL step may have.
pub const MAX_BRANCHES: usize = 64;
/// Most items a MAP step runs; a list longer than this fails the step.
pub const MAX_ITEMS: usize = 10_000;
/// Most items of one MAP step running at once.
pub const MAX_CONCURRENCY: u32 = 1_000;
/// A MAP's `maxConcurrency` when it gives none.
pub const DEFAULT_CONCURRENCY: u32 = 16;
/// How deep fan-out steps nest (a MAP in a PARALLEL branch is 2).
pub const MAX_DEPTH: u32 = 3;

/// Bits of a lane record's id (`lane_step_id`) for the branch step, and for the branch.
const LANE_STEP_BITS: u32 = 10;
const LANE_BRANCH_BITS: u32 = 6;
const LANE_LOW_BITS: u32 = LANE_STEP_BITS + LANE_BRANCH_BITS;
/// Fan-out step ids whose lanes' record ids fit in a positive i32 (negated).
const LANE_FAN_LIMIT: u32 = 1 << (31 - LANE_LOW_BITS);

/// Where a lane's step record belongs: the PARALLEL step, the branch's index, and the
/// step's id within the branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneStep {
    pub fan: u32,
    pub branch: u32,
    pub step: u32,
}

/// The `steps_status.step_id` of a lane's step record: negative, so it never meets a
/// step of the request's own workflow (whose ids are positive), and every reader keyed
/// on a step id passes it by; `lane_of` reads it back.
pub fn lane_step_id(l: LaneStep) -> i32 {
    -(((l.fan << LANE_LOW_BITS) | (l.branch << LANE_STEP_BITS) | l.step) as i32)
}

/// The lane a record id names (None: a step of the request's own workflow).
pub fn lane_of(step_id: i32) -> Option<LaneStep> {
    if step_id >= 0 {
        return None;
    }
    let v = step_id.unsigned_abs();
    Some(LaneStep {
        fan: v >> LANE_LOW_BITS,
        branch: (v >> LANE_STEP_BITS) & ((1 << LANE_BRANCH_BITS) - 1),
        step: v & ((1 << LANE_STEP_BITS) - 1),
    })
}

/// The range of record ids of fan-out step `fan`'s lanes (lowest, highest).
pub fn lane_range(fan: u32) -> (i32, i32) {
    let base = fan << LANE_LOW_BITS;
    (
        -((base | ((1 << LANE_LOW_BITS) - 1)) as i32),
        -(base as i32),
    )
}

/// Whether a PARALLEL step's branches run as lanes of their request: every step of every
/// branch is a call answered at once (SYNC HTTP, or an AMQP or Kafka message sent) with
/// no onFailure or compensate steps of its own (a branch that may compensate runs as a
/// request that can), and the ids fit `lane_step_id`. Anything that pauses
/// (ASYNC, WAIT, EVENT, WORKFLOW, a nested fan-out) needs a row of its own to wait in: such
/// a step's branches run as child requests.
pub fn fits_lanes(fan: u32, branches: &[Branch]) -> bool {
    fan > 0
        && fan < LANE_FAN_LIMIT
        && branches.len() <= 1 << LANE_BRANCH_BITS
        && branches.iter().all(|b| {
            let wf = &b.sub.0;
            wf.steps.len() < 1 << LANE_STEP_BITS
                && wf.steps.iter().all(|s| {
                    matches!(s.mode, Mode::Http | Mode::Amqp | Mode::Kafka)
                        && s.step_type == StepType::Sync
                        && s.on_failure.is_empty()
                        && s.compensate.is_empty()
                })
        })
}

/// Why a `val` is refused (the caller wraps it as a validation error).
pub type Refused = String;

/// A PARALLEL step's branches: names and steps, in order.
pub fn branches(val: &Value, at: &str) -> Result<Vec<(String, Vec<Step>)>, Refused> {
    let list = val
        .get("branches")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("{at}.val.branches is required: a non-empty array"))?;
    if list.len() > MAX_BRANCHES {
        return Err(format!(
            "{at}.val.branches has {} branches; at most {MAX_BRANCHES}",
            list.len()
        ));
    }
    let mut out: Vec<(String, Vec<Step>)> = Vec::with_capacity(list.len());
    for (k, b) in list.iter().enumerate() {
        let at = format!("{at}.val.branches[{k}]");
        let name = b
            .get("name")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{at}.name is required"))?;
        if name.chars().any(|c| c == '/' || c.is_control()) || name.len() > 100 {
            return Err(format!(
                "{at}.name {name:?} must be at most 100 bytes, without '/' or control characters"
            ));
        }
        if name == ITEM_BRANCH {
            // A MAP's per-item steps are named so below their step.
            return Err(format!("{at}.name {name:?} is reserved"));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("{at}.name {name:?} is used by another branch"));
        }
        out.push((name.to_string(), steps(b, &at)?));
    }
    Ok(out)
}

/// A MAP step's `val` as written.
#[derive(Debug)]
pub struct MapShape {
    pub items: String,
    /// The per-item steps, or (None) a workflow named by `workflow`.
    pub steps: Option<Vec<Step>>,
    pub max_concurrency: u32,
    pub tolerated_failures: u32,
}

/// A MAP step's `val`: where its list is, what runs per item, and its limits.
pub fn map(val: &Value, at: &str) -> Result<MapShape, Refused> {
    let items = val
        .get("items")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            format!("{at}.val.items is required: the path of a list in the context (e.g. \"order.response.lines\")")
        })?;
    let has_steps = val.get("steps").is_some();
    let has_workflow = val.get("workflow").is_some();
    if has_steps == has_workflow {
        return Err(format!(
            "{at}.val needs exactly one of steps (run per item) and workflow (a child request per item)"
        ));
    }
    let max_concurrency = match val.get("maxConcurrency") {
        None | Some(Value::Null) => DEFAULT_CONCURRENCY,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_CONCURRENCY as u64).contains(&n) => n as u32,
            _ => {
                return Err(format!(
                    "{at}.val.maxConcurrency must be a whole number from 1 to {MAX_CONCURRENCY}"
                ))
            }
        },
    };
    let tolerated_failures = match val.get("toleratedFailures") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_ITEMS as u64 => n as u32,
            _ => {
                return Err(format!(
                    "{at}.val.toleratedFailures must be a whole number from 0 to {MAX_ITEMS}"
                ))
            }
        },
    };
    Ok(MapShape {
        items: items.to_string(),
        steps: if has_steps {
            Some(steps(val, &format!("{at}.val"))?)
        } else {
            None
        },
        max_concurrency,
        tolerated_failures,
    })
}

/// The `steps` array of a branch or a MAP, as steps.
fn steps(v: &Value, at: &str) -> Result<Vec<Step>, Refused> {
    let list = v
        .get("steps")
        .filter(|s| s.as_array().is_some_and(|l| !l.is_empty()))
        .ok_or_else(|| format!("{at}.steps is required: a non-empty array of steps"))?;
    serde_json::from_value(list.clone()).map_err(|e| format!("{at}.steps: {e}"))
}

/// Why a MAP step's list cannot be run over (its step fails, naming it).
#[derive(Debug, thiserror::Error)]
pub enum ItemsError {
    #[error("MAP items {0:?} is not a list in the context")]
    NotAList(String),
    #[error("MAP items {path:?} has {n} items; at most {MAX_ITEMS}")]
    TooMany { path: String, n: usize },
}

/// The list a MAP step runs over: the value at `path` (dotted) in `context`, which must
/// be an array of at most `MAX_ITEMS`.
pub fn items<'a>(
    context: &'a serde_json::Map<String, Value>,
    path: &str,
) -> Result<&'a [Value], ItemsError> {
    let list = super::transform::lookup_in(context, path)
        .and_then(Value::as_array)
        .ok_or_else(|| ItemsError::NotAList(path.to_string()))?;
    if list.len() > MAX_ITEMS {
        return Err(ItemsError::TooMany {
            path: path.to_string(),
            n: list.len(),
        });
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn branches_are_named_uniquely_and_have_steps() {
        let s = json!([{"name": "a", "mode": "HTTP", "val": {}}]);
        assert_eq!(
            branches(
                &json!({"branches": [{"name": "x", "steps": s}]}),
                "steps[0]"
            )
            .unwrap()
            .len(),
            1
        );
        for (bad, why) in [
            (json!({}), "branches is required"),
            (json!({"branches": []}), "branches is required"),
            (json!({"branches": [{"steps": s}]}), "name is required"),
            (
                json!({"branches": [{"name": "a/b", "steps": s}]}),
                "without '/'",
            ),
            (json!({"branches": [{"name": "x"}]}), "steps is required"),
            (
                json!({"branches": [{"name": "item", "steps": s}]}),
                "reserved",
            ),
            (
                json!({"branches": [{"name": "x", "steps": s}, {"name": "x", "steps": s}]}),
                "used by another branch",
            ),
        ] {
            let e = branches(&bad, "steps[0]").unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_map_has_items_one_body_and_bounded_limits() {
        let s = json!([{"name": "a", "mode": "HTTP", "val": {}}]);
        let m = map(&json!({"items": "a.response", "steps": s}), "steps[0]").unwrap();
        assert_eq!(
            (m.max_concurrency, m.tolerated_failures),
            (DEFAULT_CONCURRENCY, 0)
        );
        for (bad, why) in [
            (json!({"steps": s}), "items is required"),
            (json!({"items": "x"}), "exactly one of"),
            (
                json!({"items": "x", "steps": s, "workflow": "w"}),
                "exactly one of",
            ),
            (
                json!({"items": "x", "steps": s, "maxConcurrency": 0}),
                "maxConcurrency",
            ),
            (
                json!({"items": "x", "steps": s, "maxConcurrency": 1001}),
                "maxConcurrency",
            ),
            (
                json!({"items": "x", "steps": s, "toleratedFailures": -1}),
                "toleratedFailures",
            ),
        ] {
            let e = map(&bad, "steps[0]").unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn lane_ids_are_negative_and_read_back() {
        for l in [
            LaneStep {
                fan: 1,
                branch: 0,
                step: 1,
            },
            LaneStep {
                fan: 3,
                branch: 63,
                step: 1023,
            },
            LaneStep {
                fan: LANE_FAN_LIMIT - 1,
                branch: 7,
                step: 2,
            },
        ] {
            let id = lane_step_id(l);
            assert!(id < 0, "{l:?}");
            assert_eq!(lane_of(id), Some(l));
            let (lo, hi) = lane_range(l.fan);
            assert!((lo..=hi).contains(&id), "{l:?}");
            for other in [l.fan - 1, l.fan + 1]
                .into_iter()
                .filter(|f| (1..LANE_FAN_LIMIT).contains(f))
            {
                let (lo, hi) = lane_range(other);
                assert!(!(lo..=hi).contains(&id), "{l:?} in {other}'s range");
            }
        }
        assert_eq!(lane_of(5), None);
        assert_eq!(lane_of(0), None);
    }

    #[test]
    fn items_are_found_by_path_and_bounded() {
        let ctx = json!({"order": {"response": {"lines": [1, 2, 3]}}, "n": 1});
        let ctx = ctx.as_object().unwrap();
        assert_eq!(items(ctx, "order.response.lines").unwrap().len(), 3);
        assert!(matches!(items(ctx, "n"), Err(ItemsError::NotAList(p)) if p == "n"));
        assert!(items(ctx, "n")
            .unwrap_err()
            .to_string()
            .contains("not a list"));
        assert!(items(ctx, "order.missing").is_err());
        let big = json!({"l": vec![0; MAX_ITEMS + 1]});
        let too_many = items(big.as_object().unwrap(), "l").unwrap_err();
        assert!(matches!(too_many, ItemsError::TooMany { n, .. } if n == MAX_ITEMS + 1));
        assert!(too_many.to_string().contains("at most"));
    }
}
