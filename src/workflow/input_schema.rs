//! A workflow's `inputSchema` (beyond Clamp): a JSON Schema (2020-12) every create's
//! payload must meet, so a request missing what a later step needs is refused at the door
//! (400, with the failing paths) instead of failing at that step minutes or days later.
//! Compiled once per version, with the workflow (`validate`), and kept with it in the
//! workflow map; a create of a workflow without one pays nothing (no parse, no check).
//! References resolve inside the schema only: no file or network is ever read.

use serde_json::Value;

use super::ValidationError;

/// Most failures a refusal names (the first ones, in the schema's order).
const MAX_NAMED: usize = 10;

/// A compiled `inputSchema`.
pub struct InputSchema(jsonschema::Validator);

impl std::fmt::Debug for InputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InputSchema")
    }
}

/// Compiles a definition's `inputSchema` (Draft 2020-12 whatever `$schema` it names).
pub fn compile(schema: &Value) -> Result<InputSchema, ValidationError> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(ValidationError(
            "inputSchema: a JSON Schema (an object, or true or false)".into(),
        ));
    }
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map(InputSchema)
        .map_err(|e| ValidationError(format!("inputSchema: not a valid JSON Schema: {e}")))
}

impl InputSchema {
    /// Checks a create's payload (JSON text, already checked to be an object); Err names
    /// each failing path (a JSON pointer, `/` the payload itself) and why.
    pub fn check(&self, payload: &[u8]) -> Result<(), String> {
        let v: Value = serde_json::from_slice(payload)
            .map_err(|_| "the body is not valid JSON".to_string())?;
        self.check_value(&v)
    }

    /// `check` of a payload already parsed.
    pub fn check_value(&self, v: &Value) -> Result<(), String> {
        let mut failed = self.0.iter_errors(v).peekable();
        if failed.peek().is_none() {
            return Ok(());
        }
        let named: Vec<String> = failed
            .take(MAX_NAMED)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() { "/".into() } else { path };
                format!("{path}: {e}")
            })
            .collect();
        Err(format!(
            "the payload does not match the workflow's inputSchema: {}",
            named.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> InputSchema {
        compile(&json!({
            "type": "object",
            "required": ["amount", "currency"],
            "properties": {
                "amount": {"type": "number", "minimum": 0},
                "currency": {"type": "string", "enum": ["EUR", "USD"]},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
            },
            "$defs": {"line": {"type": "object", "required": ["sku"]}}
        }))
        .unwrap()
    }

    #[test]
    fn a_payload_that_meets_it_passes() {
        let s = schema();
        assert!(s
            .check(br#"{"amount": 5, "currency": "EUR", "lines": [{"sku": "a"}]}"#)
            .is_ok());
    }

    #[test]
    fn each_failing_path_is_named() {
        let why = schema()
            .check(br#"{"currency": "GBP", "lines": [{"sku": "a"}, {}]}"#)
            .unwrap_err();
        assert!(
            why.contains("/: \"amount\" is a required property"),
            "{why}"
        );
        assert!(why.contains("/currency: "), "{why}");
        assert!(
            why.contains("/lines/1: \"sku\" is a required property"),
            "{why}"
        );
    }

    #[test]
    fn a_schema_that_is_not_one_or_reaches_outside_is_refused() {
        for bad in [
            json!({"type": "nonsense"}),
            json!("a string"),
            json!({"$ref": "https://schemas.example/order.json"}),
            json!({"$ref": "file:///etc/passwd"}),
        ] {
            let why = compile(&bad).unwrap_err().0;
            assert!(why.starts_with("inputSchema: "), "{bad}: {why}");
        }
    }
}
