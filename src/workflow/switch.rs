//! A SWITCH step's `val` as written (beyond Clamp): `on`, a CEL expression over the
//! context whose value (a string, a number as written, or `true`/`false`) names the case;
//! `cases`, each case's value to its steps; `default`, the steps when no case has the
//! value (without it, such a value fails the step, naming the value). Exactly one path
//! runs; its steps are full steps, compiled as a fan-out step's branches are.

use serde_json::Value;

use super::fan::MAX_BRANCHES;
use super::model::{Step, DEFAULT_CASE};

type Refused = String;

/// A SWITCH's `val`, read.
#[derive(Debug)]
pub struct SwitchShape {
    pub on: String,
    /// Each case's value and steps, in the definition's order.
    pub cases: Vec<(String, Vec<Step>)>,
    pub default: Option<Vec<Step>>,
}

/// Reads a SWITCH's `val`; Err names the field.
pub fn shape(val: &Value, at: &str) -> Result<SwitchShape, Refused> {
    let Some(o) = val.as_object() else {
        return Err(format!("{at}.val is required and must be an object"));
    };
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "on" | "cases" | "default"))
    {
        return Err(format!(
            "{at}.val.{k} is not a field of a SWITCH step (on, cases, default)"
        ));
    }
    let on = o
        .get("on")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!("{at}.val.on is required: an expression over the context naming the case")
        })?
        .to_string();
    let list = o
        .get("cases")
        .and_then(Value::as_object)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            format!("{at}.val.cases is required: an object of each case's value to its steps")
        })?;
    if list.len() > MAX_BRANCHES {
        return Err(format!(
            "{at}.val.cases has {} cases; at most {MAX_BRANCHES}",
            list.len()
        ));
    }
    let mut cases = Vec::with_capacity(list.len());
    for (name, steps_of) in list {
        let here = format!("{at}.val.cases.{name}");
        if name.is_empty()
            || name.len() > 100
            || name == DEFAULT_CASE
            || name.chars().any(|c| c == '/' || c.is_control())
        {
            return Err(format!(
                "{here}: a case's value is 1 to 100 bytes, without '/' or control characters, \
                 and not {DEFAULT_CASE:?}"
            ));
        }
        cases.push((name.clone(), steps(steps_of, &here)?));
    }
    let default = match o.get("default") {
        None | Some(Value::Null) => None,
        Some(v) => Some(steps(v, &format!("{at}.val.default"))?),
    };
    Ok(SwitchShape { on, cases, default })
}

fn steps(v: &Value, at: &str) -> Result<Vec<Step>, Refused> {
    if v.as_array().is_none_or(|l| l.is_empty()) {
        return Err(format!("{at}: a non-empty array of steps"));
    }
    serde_json::from_value(v.clone()).map_err(|e| format!("{at}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step() -> Value {
        json!({"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": "http://x/"}})
    }

    #[test]
    fn reads_cases_in_order_and_the_default() {
        let s = shape(
            &json!({"on": "a.response.kind", "cases": {"b": [step()], "a": [step()]},
                    "default": [step()]}),
            "steps[0]",
        )
        .unwrap();
        assert_eq!(s.on, "a.response.kind");
        let names: Vec<&str> = s.cases.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(s.default.is_some());
    }

    #[test]
    fn refuses_what_is_not_a_switch() {
        for (val, needle) in [
            (json!({"cases": {"a": [step()]}}), "val.on is required"),
            (json!({"on": "x", "cases": {}}), "val.cases is required"),
            (
                json!({"on": "x", "cases": {"a": []}}),
                "cases.a: a non-empty array",
            ),
            (json!({"on": "x", "cases": {"*": [step()]}}), "not \"*\""),
            (
                json!({"on": "x", "cases": {"a/b": [step()]}}),
                "without '/'",
            ),
            (
                json!({"on": "x", "cases": {"a": [step()]}, "else": []}),
                "val.else is not a field",
            ),
            (
                json!({"on": "x", "cases": {"a": [step()]}, "default": {}}),
                "val.default: a non-empty",
            ),
        ] {
            let e = shape(&val, "steps[0]").unwrap_err();
            assert!(e.contains(needle), "{val}: {e}");
        }
    }
}
