//! `when` conditions: CEL expressions compiled when a workflow is created and evaluated
//! against the context `{step_name: {request, response}}` when a step is reached.
//!
//! Clamp wrote conditions like `user_authentication.request.claimDetails.claimType == 'MOTOR'`,
//! optionally prefixed with `context.`; both forms work here. Step names with spaces are
//! referred to with `_` in their place.

use std::fmt;

use serde_json::{Map, Value};

/// A compiled CEL expression over the context, and the names it reads: what a `when`
/// condition and an EVENT step's key share.
struct Compiled {
    source: String,
    program: cel::Program,
    /// Top-level names the expression reads (step context names, or `context`).
    variables: Vec<String>,
    /// The expression is a plain selection (`payload.customer.id`): its name, then the
    /// fields, which a key reads straight from the data (`KeyExpr::text`).
    path: Option<Vec<String>>,
}

impl Compiled {
    fn parse(source: &str) -> Result<Compiled, ConditionError> {
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
        let path = member_path(program.expression());
        Ok(Compiled {
            source: source.to_string(),
            program,
            variables,
            path,
        })
    }

    /// Every name it reads must be one of `known` step context names (or `context`).
    fn check_names(self, known: &[String]) -> Result<Compiled, ConditionError> {
        self.check_names_as(known, "a step of this workflow")
    }

    /// Every name it reads must be one of `known` (or `context`); `what` says what the
    /// names are, for the refusal.
    fn check_names_as(self, known: &[String], what: &str) -> Result<Compiled, ConditionError> {
        for v in &self.variables {
            if v != "context" && !known.iter().any(|k| k == v) {
                return Err(ConditionError(format!(
                    "refers to {v:?}, which is not {what}"
                )));
            }
        }
        Ok(self)
    }

    /// Runs it over `context`; the outer error (naming it as `what`) is a name that could
    /// not be bound, the inner one CEL's.
    fn execute(
        &self,
        context: &Map<String, Value>,
        what: &str,
    ) -> Result<Result<cel::Value, cel::ExecutionError>, ConditionError> {
        let mut ctx = cel::Context::default();
        for v in &self.variables {
            let value = if v == "context" {
                Value::Object(context.clone())
            } else {
                context.get(v).cloned().unwrap_or(Value::Null)
            };
            ctx.add_variable(v.as_str(), value).map_err(|e| {
                ConditionError(format!("{what} {:?}: cannot read {v}: {e}", self.source))
            })?;
        }
        Ok(self.program.execute(&ctx))
    }
}

/// A compiled `when` condition.
pub struct Condition(Compiled);

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condition")
            .field("source", &self.0.source)
            .finish()
    }
}

/// Why a condition was rejected at workflow creation, or could not be evaluated at run
/// time (which fails its step).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConditionError(pub String);

impl Condition {
    /// Compiles `source`, checking that every name it reads is one of `known` step
    /// context names (or `context`, which holds them all).
    pub fn compile(source: &str, known: &[String]) -> Result<Condition, ConditionError> {
        Condition::compile_over(source, known, "a step of this workflow")
    }

    /// Compiles `source` over the names `known`, which are `what` (a trigger's message's
    /// fields, say).
    pub fn compile_over(
        source: &str,
        known: &[String],
        what: &str,
    ) -> Result<Condition, ConditionError> {
        let c = Compiled::parse(source)?;
        if let Some(kind) = non_boolean(c.program.expression()) {
            return Err(ConditionError(format!(
                "is {kind}, not a boolean expression"
            )));
        }
        c.check_names_as(known, what).map(Condition)
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.0.source
    }

    /// Evaluates against `context` (`{step_context_name: {request, response}}`).
    ///
    /// A field the data does not have (a step that did not return it, a step not run yet)
    /// counts as false: a condition over data a step did not return must not fail the
    /// request. A result that is not a boolean, or an expression that cannot be evaluated
    /// over the data it got (e.g. a string compared with a number), is an error: the step
    /// fails with the reason rather than being skipped silently.
    pub fn eval(&self, context: &Map<String, Value>) -> Result<bool, ConditionError> {
        let source = &self.0.source;
        match self.0.execute(context, "condition")? {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(ConditionError(format!(
                "condition {source:?} evaluated to {}, not a boolean",
                type_name(&other)
            ))),
            Err(e) if is_missing_data(&e) => Ok(false),
            Err(e) => Err(ConditionError(format!(
                "condition {source:?} cannot be evaluated: {}",
                one_line(&e.to_string())
            ))),
        }
    }
}

/// An EVENT step's correlation key: a CEL expression over the context (as a `when`
/// reads it) whose value, a string or a number, names the event instance the step waits
/// for (`"claim.request.id"`, `"'order-' + string(order.response.id)"`).
pub struct KeyExpr(Compiled);

impl KeyExpr {
    /// Compiles `source`; every name it reads must be a step context name (or `context`).
    pub fn compile(source: &str, known: &[String]) -> Result<KeyExpr, ConditionError> {
        Compiled::parse(source)?.check_names(known).map(KeyExpr)
    }

    /// Compiles `source` over the names `known`, which are `what`.
    pub fn compile_over(
        source: &str,
        known: &[String],
        what: &str,
    ) -> Result<KeyExpr, ConditionError> {
        Compiled::parse(source)?
            .check_names_as(known, what)
            .map(KeyExpr)
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.0.source
    }

    /// The fields it selects under `name` when it is a plain selection of them
    /// (`payload.customer.id`: `["customer", "id"]`); None for anything else.
    pub fn fields_under(&self, name: &str) -> Option<&[String]> {
        match self.0.path.as_deref() {
            Some([first, rest @ ..]) if first == name && !rest.is_empty() => Some(rest),
            _ => None,
        }
    }

    /// A SWITCH's case for `context`: as `eval`, and a boolean as `true` or `false`.
    pub fn eval_case(&self, context: &Map<String, Value>) -> Result<String, ConditionError> {
        self.text(context, true)
    }

    /// The key for `context`: a string as it is, a number as written; anything else (or
    /// data that is not there) is an error naming the expression.
    pub fn eval(&self, context: &Map<String, Value>) -> Result<String, ConditionError> {
        self.text(context, false)
    }

    /// The value for `context` as text, a boolean too when `booleans`; one evaluation.
    fn text(&self, context: &Map<String, Value>, booleans: bool) -> Result<String, ConditionError> {
        // A plain selection that finds a string or a number is read straight from the
        // data, as CEL would render it: no copy of the data into CEL's values (a limited
        // create's key is computed on every create). Anything else (a missing field, a
        // value of another kind) goes through CEL, for its answer and its error.
        if let Some(text) = self
            .0
            .path
            .as_deref()
            .and_then(|p| path_text(p, context, booleans))
        {
            return Ok(text);
        }
        let source = &self.0.source;
        match self.0.execute(context, "key")? {
            Ok(cel::Value::String(s)) => Ok(s.to_string()),
            Ok(cel::Value::Int(i)) => Ok(i.to_string()),
            Ok(cel::Value::UInt(u)) => Ok(u.to_string()),
            Ok(cel::Value::Float(f)) => Ok(f.to_string()),
            Ok(cel::Value::Bool(b)) if booleans => Ok(b.to_string()),
            Ok(other) => Err(ConditionError(format!(
                "key {source:?} evaluated to {}, not a string or a number",
                type_name(&other)
            ))),
            Err(e) => Err(ConditionError(format!(
                "key {source:?} cannot be evaluated: {}",
                one_line(&e.to_string())
            ))),
        }
    }
}

impl fmt::Debug for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyExpr({:?})", self.0.source)
    }
}

impl PartialEq for KeyExpr {
    fn eq(&self, other: &KeyExpr) -> bool {
        self.0.source == other.0.source
    }
}

impl Eq for KeyExpr {}

impl PartialEq for Condition {
    fn eq(&self, other: &Condition) -> bool {
        self.0.source == other.0.source
    }
}

impl Eq for Condition {}

/// The names of a plain selection (`a.b.c`: a name and at least one field, none tested
/// with `has`), or None.
fn member_path(e: &cel::IdedExpr) -> Option<Vec<String>> {
    use cel::common::ast::Expr;
    match &e.expr {
        Expr::Select(sel) if !sel.test => {
            let mut path = match &sel.operand.expr {
                Expr::Ident(name) => vec![name.clone()],
                _ => member_path(&sel.operand)?,
            };
            path.push(sel.field.clone());
            Some(path)
        }
        _ => None,
    }
}

/// What CEL makes of the value at `path` in `context` as a key's text (`KeyExpr::text`),
/// when the value is a string or a number (or a boolean, with `booleans`); None for
/// anything else, left to CEL. `context` as a name is the whole context.
fn path_text(path: &[String], context: &Map<String, Value>, booleans: bool) -> Option<String> {
    let (root, fields) = path.split_first()?;
    let (first, fields) = if root == "context" {
        fields.split_first()?
    } else {
        (root, fields)
    };
    let mut at = context.get(first)?;
    for f in fields {
        at = at.as_object()?.get(f)?;
    }
    match at {
        Value::String(s) => Some(s.clone()),
        // As CEL takes JSON numbers: a non-negative integer as uint, a negative one as
        // int, any other as double; each written as Rust writes it.
        Value::Number(n) => Some(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.to_string(),
            (None, Some(i)) => i.to_string(),
            _ => n.as_f64()?.to_string(),
        }),
        Value::Bool(b) if booleans => Some(b.to_string()),
        _ => None,
    }
}

/// Errors that mean "the data has no such field": such a condition is false.
fn is_missing_data(e: &cel::ExecutionError) -> bool {
    use cel::ExecutionError as E;
    match e {
        E::NoSuchKey(_) | E::UndeclaredReference(_) => true,
        // Selecting a field of null (a step that answered nothing, or not run yet).
        E::UnsupportedTargetType { target } => matches!(target, cel::Value::Null),
        E::NoSuchOverload(o) => {
            o.function() == "_._" && o.argument_types().first().is_some_and(|t| t == "null_type")
        }
        _ => false,
    }
}

fn type_name(v: &cel::Value) -> &'static str {
    use cel::Value as V;
    match v {
        V::Int(_) | V::UInt(_) => "an integer",
        V::Float(_) => "a number",
        V::String(_) => "a string",
        V::Bytes(_) => "bytes",
        V::List(_) => "a list",
        V::Map(_) => "a map",
        V::Null => "null",
        V::Bool(_) => "a boolean",
        _ => "not a boolean",
    }
}

/// What an expression is when its result is known, without data, not to be a boolean
/// (a literal, arithmetic, a list or map, a conversion): such a `when` is refused when
/// the workflow is created. None when it is, or may be, a boolean.
fn non_boolean(e: &cel::IdedExpr) -> Option<&'static str> {
    use cel::common::ast::{operators as op, Expr, LiteralValue};
    match &e.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => None,
        Expr::Literal(LiteralValue::Null) => Some("null"),
        Expr::Literal(LiteralValue::String(_)) => Some("a string"),
        Expr::Literal(LiteralValue::Bytes(_)) => Some("bytes"),
        Expr::Literal(_) => Some("a number"),
        Expr::List(_) => Some("a list"),
        Expr::Map(_) | Expr::Struct(_) => Some("a map"),
        Expr::Call(c) => match c.func_name.as_str() {
            op::ADD | op::SUBSTRACT | op::MULTIPLY | op::DIVIDE | op::MODULO | op::NEGATE => {
                Some("arithmetic")
            }
            "size" | "int" | "uint" | "double" => Some("a number"),
            "string" => Some("a string"),
            "bytes" => Some("bytes"),
            "timestamp" | "duration" => Some("a time"),
            op::CONDITIONAL => {
                let a = non_boolean(c.args.get(1)?);
                let b = non_boolean(c.args.get(2)?);
                a.and(b)
            }
            _ => None,
        },
        _ => None,
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
            assert_eq!(c.eval(&ctx()), Ok(expected), "{src}");
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
        check("context.nosuch.request == 1", false);
    }

    #[test]
    fn a_non_boolean_result_is_an_error_not_false() {
        let fails = |src: &str, why: &str| {
            let c = Condition::compile(src, &known()).unwrap_or_else(|e| panic!("{src}: {e:?}"));
            let e = c.eval(&ctx()).unwrap_err();
            assert!(e.0.contains(why), "{src}: {e}");
        };
        fails(
            "user_authentication.request.claimDetails.amount",
            "an integer",
        );
        fails("user_authentication.request.claimDetails", "a map");
        fails(
            "user_authentication.request.claimDetails.claimType > 3",
            "cannot be evaluated",
        );
    }

    #[test]
    fn refuses_conditions_known_not_to_be_boolean() {
        for src in [
            "1+2",
            "'text'",
            "42",
            "[true]",
            "size(user_authentication.response.items)",
            "true ? 1 : 2",
            "-user_authentication.request.x",
        ] {
            let e = Condition::compile(src, &known()).unwrap_err();
            assert!(e.0.contains("not a boolean"), "{src}: {e:?}");
        }
        for src in [
            "true",
            "user_authentication.response.ok",
            "true ? user_authentication.response.ok : 2",
            "1 < 2",
            "!user_authentication.response.ok",
            "'a' in ['a']",
        ] {
            assert!(Condition::compile(src, &known()).is_ok(), "{src}");
        }
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

#[cfg(test)]
mod path_tests {
    use super::*;
    use serde_json::json;

    /// A plain selection read straight from the data answers exactly as CEL does, for
    /// every kind of value and every way the data can lack it.
    #[test]
    fn a_selection_read_from_the_data_answers_as_cel_does() {
        let names = ["payload".to_string(), "step".to_string()];
        let sources = [
            "payload.a.b",
            "payload.a",
            "step.response.id",
            "context.step.response.id",
        ];
        let values = [
            json!("x"),
            json!(""),
            json!(42),
            json!(0),
            json!(u64::MAX),
            json!(-7),
            json!(i64::MIN),
            json!(1.5),
            json!(1e20),
            json!(-0.25),
            json!(true),
            json!(false),
            json!(null),
            json!({"c": 1}),
            json!([1, 2]),
        ];
        let mut datas: Vec<Value> = values
            .iter()
            .map(|v| json!({"a": {"b": v}, "response": {"id": v}}))
            .collect();
        datas.extend([
            json!({}),
            json!({"a": 5}),
            json!({"a": {"c": 1}}),
            json!(null),
        ]);
        for source in sources {
            let fast = KeyExpr::compile(source, &names).unwrap();
            assert!(fast.0.path.is_some(), "{source}");
            let mut slow = KeyExpr::compile(source, &names).unwrap();
            slow.0.path = None;
            for data in &datas {
                let mut ctx = Map::new();
                ctx.insert("payload".into(), data.clone());
                ctx.insert("step".into(), data.clone());
                for booleans in [false, true] {
                    assert_eq!(
                        fast.text(&ctx, booleans),
                        slow.text(&ctx, booleans),
                        "{source} over {data} (booleans: {booleans})"
                    );
                }
            }
        }
    }

    #[test]
    fn only_plain_selections_are_read_straight() {
        let names = ["payload".to_string()];
        let path = |s: &str| KeyExpr::compile(s, &names).unwrap().0.path;
        assert_eq!(
            path("payload.customer.id"),
            Some(vec!["payload".into(), "customer".into(), "id".into()])
        );
        for s in [
            "payload",
            "'k-' + payload.id",
            "payload['id']",
            "string(payload.id)",
        ] {
            assert_eq!(path(s), None, "{s}");
        }
    }
}
