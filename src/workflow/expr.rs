//! `when` conditions: CEL expressions compiled when a workflow is created and evaluated
//! against the context `{step_name: {request, response}}` when a step is reached.
//!
//! Clamp wrote conditions like `user_authentication.request.claimDetails.claimType == 'MOTOR'`,
//! optionally prefixed with `context.`; both forms work here. Step names with spaces are
//! referred to with `_` in their place.

use std::fmt;

use serde_json::{Map, Value};

/// A compiled `when` condition.
pub struct Condition {
    source: String,
    program: cel::Program,
    /// Top-level names the expression reads (step context names, or `context`).
    variables: Vec<String>,
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condition")
            .field("source", &self.source)
            .finish()
    }
}

/// Why a condition was rejected at workflow creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionError(pub String);

impl Condition {
    /// Compiles `source`, checking that every name it reads is one of `known` step
    /// context names (or `context`, which holds them all).
    pub fn compile(source: &str, known: &[String]) -> Result<Condition, ConditionError> {
        let program = cel::Program::compile(source.trim()).map_err(|e| {
            ConditionError(format!("does not compile: {}", one_line(&e.to_string())))
        })?;
        let mut variables: Vec<String> = program
            .references()
            .variables()
            .into_iter()
            .map(str::to_string)
            .collect();
        variables.sort();
        for v in &variables {
            if v != "context" && !known.iter().any(|k| k == v) {
                return Err(ConditionError(format!(
                    "refers to {v:?}, which is not a step of this workflow"
                )));
            }
        }
        Ok(Condition {
            source: source.to_string(),
            program,
            variables,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates against `context` (`{step_context_name: {request, response}}`).
    ///
    /// A missing field, a type mismatch or a non-boolean result counts as false: a
    /// condition over data a step did not return must not crash the request.
    pub fn eval(&self, context: &Map<String, Value>) -> bool {
        let mut ctx = cel::Context::default();
        for v in &self.variables {
            let value = if v == "context" {
                Value::Object(context.clone())
            } else {
                context.get(v).cloned().unwrap_or(Value::Null)
            };
            if ctx.add_variable(v.as_str(), value).is_err() {
                return false;
            }
        }
        matches!(self.program.execute(&ctx), Ok(cel::Value::Bool(true)))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The name a step has inside conditions and transform paths.
pub fn context_name(step_name: &str) -> String {
    step_name.trim().replace(' ', "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Map<String, Value> {
        json!({
            "user_authentication": {
                "request": {"claimDetails": {"claimType": "MOTOR", "amount": 1200}},
                "response": {"ok": true, "items": [1, 2, 3]}
            }
        })
        .as_object()
        .unwrap()
        .clone()
    }

    fn known() -> Vec<String> {
        vec!["user_authentication".to_string(), "other".to_string()]
    }

    #[test]
    fn evaluates_conditions() {
        let check = |src: &str, expected: bool| {
            let c = Condition::compile(src, &known()).unwrap_or_else(|e| panic!("{src}: {e:?}"));
            assert_eq!(c.eval(&ctx()), expected, "{src}");
        };
        check(
            "user_authentication.request.claimDetails.claimType == 'MOTOR'",
            true,
        );
        check(
            "user_authentication.request.claimDetails.claimType == 'HOME'",
            false,
        );
        check(
            "context.user_authentication.request.claimDetails.claimType == 'MOTOR'",
            true,
        );
        check(
            "user_authentication.request.claimDetails.amount > 1000",
            true,
        );
        check(
            "user_authentication.response.ok && size(user_authentication.response.items) == 3",
            true,
        );
        // Missing data is false, not an error.
        check("user_authentication.request.missing.deeper == 'x'", false);
        check("other.response.anything == 1", false);
        // A non-boolean result is false.
        check("user_authentication.request.claimDetails.amount", false);
    }

    #[test]
    fn rejects_bad_conditions() {
        assert!(Condition::compile("a ==", &known()).is_err());
        assert!(Condition::compile("((", &known()).is_err());
        let e = Condition::compile("nosuchstep.request.x == 1", &known()).unwrap_err();
        assert!(e.0.contains("nosuchstep"), "{e:?}");
    }

    #[test]
    fn context_names() {
        assert_eq!(context_name("user authentication"), "user_authentication");
        assert_eq!(context_name("step1"), "step1");
    }
}
