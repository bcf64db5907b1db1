//! A LOOP step's `val` as written (beyond Clamp): `steps`, the body, run once per
//! iteration as a child request; `while`, a CEL condition read after each iteration over
//! the context (the body's answers and `iteration`, counted from 1, included): another
//! iteration runs while it holds; `maxIterations`, the bound every loop must have.

use serde_json::Value;

use super::model::Step;

type Refused = String;

/// The most iterations a LOOP may be given: each is a child request kept with its
/// parent, so the bound is on rows as much as on time.
pub const MAX_ITERATIONS: u32 = 10_000;

/// A LOOP's `val`, read.
#[derive(Debug)]
pub struct LoopShape {
    pub steps: Vec<Step>,
    pub while_: String,
    pub max_iterations: u32,
}

/// Reads a LOOP's `val`; Err names the field.
pub fn shape(val: &Value, at: &str) -> Result<LoopShape, Refused> {
    let Some(o) = val.as_object() else {
        return Err(format!("{at}.val is required and must be an object"));
    };
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "steps" | "while" | "maxIterations"))
    {
        return Err(format!(
            "{at}.val.{k} is not a field of a LOOP step (steps, while, maxIterations)"
        ));
    }
    let steps = match o.get("steps") {
        Some(v) if v.as_array().is_some_and(|l| !l.is_empty()) => {
            serde_json::from_value(v.clone()).map_err(|e| format!("{at}.val.steps: {e}"))?
        }
        _ => {
            return Err(format!(
                "{at}.val.steps is required: a non-empty array of the steps of one iteration"
            ))
        }
    };
    let while_ = o
        .get("while")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!("{at}.val.while is required: a condition over the context, read after each iteration")
        })?
        .to_string();
    let max_iterations = o
        .get("maxIterations")
        .and_then(Value::as_u64)
        .filter(|n| (1..=MAX_ITERATIONS as u64).contains(n))
        .ok_or_else(|| {
            format!("{at}.val.maxIterations is required: a whole number from 1 to {MAX_ITERATIONS}")
        })? as u32;
    Ok(LoopShape {
        steps,
        while_,
        max_iterations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step() -> Value {
        json!({"name": "poll", "mode": "HTTP", "val": {"method": "GET", "url": "http://x/"}})
    }

    #[test]
    fn reads_the_body_the_condition_and_the_bound() {
        let s = shape(
            &json!({"steps": [step()], "while": " poll.response.status != 'ready' ",
                    "maxIterations": 20}),
            "steps[0]",
        )
        .unwrap();
        assert_eq!(s.steps.len(), 1);
        assert_eq!(s.while_, "poll.response.status != 'ready'");
        assert_eq!(s.max_iterations, 20);
    }

    #[test]
    fn refuses_what_is_not_a_loop() {
        for (val, needle) in [
            (
                json!({"while": "true", "maxIterations": 2}),
                "val.steps is required",
            ),
            (
                json!({"steps": [], "while": "true", "maxIterations": 2}),
                "val.steps is required",
            ),
            (
                json!({"steps": [step()], "maxIterations": 2}),
                "val.while is required",
            ),
            (
                json!({"steps": [step()], "while": "true"}),
                "maxIterations is required",
            ),
            (
                json!({"steps": [step()], "while": "true", "maxIterations": 0}),
                "from 1 to 10000",
            ),
            (
                json!({"steps": [step()], "while": "true", "maxIterations": 10001}),
                "from 1 to 10000",
            ),
            (
                json!({"steps": [step()], "while": "true", "maxIterations": 2, "until": "x"}),
                "val.until is not a field",
            ),
        ] {
            let e = shape(&val, "steps[0]").unwrap_err();
            assert!(e.contains(needle), "{val}: {e}");
        }
    }
}
