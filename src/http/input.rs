//! Request bodies as the typed inputs of operations: a body is empty (the input's
//! defaults) or a JSON object read into a `#[derive(Deserialize)]` struct, and a body that
//! is not is a 400 whose message names the field at fault (`status: …`), or says what
//! shape the body must have.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::ops::OpError;

/// `body` as `T`: its default when the body is empty or blank; else the JSON object's
/// fields (the struct says which it refuses: `deny_unknown_fields`). `shape` says what the
/// body must be, for a body that is not a JSON object.
pub fn typed<T: DeserializeOwned + Default>(body: &[u8], shape: &str) -> Result<T, OpError> {
    let Some(first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Ok(T::default());
    };
    if *first != b'{' {
        return Err(OpError::BadRequest(shape.into()));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let input: T = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| OpError::BadRequest(named(&e, shape)))?;
    // Nothing may follow the object.
    de.end().map_err(|_| OpError::BadRequest(shape.into()))?;
    Ok(input)
}

/// A field's error as `field: why`, without serde_json's place in the text (`at line 1
/// column 9`); an unknown field as `field: unknown field (expected …)`.
fn named(e: &serde_path_to_error::Error<serde_json::Error>, shape: &str) -> String {
    let inner = e.inner();
    if inner.is_syntax() || inner.is_eof() {
        return shape.into();
    }
    let why = without_place(&inner.to_string());
    if let Some(rest) = why.strip_prefix("unknown field `") {
        let (field, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = expected.trim_start_matches(", ").replace('`', "");
        return format!("{field}: unknown field ({expected})");
    }
    match e.path().to_string().as_str() {
        "." | "" => shape.into(),
        path => format!("{path}: {why}"),
    }
}

/// serde_json's message without its place in the text.
fn without_place(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// A field that, when present, holds a value: `null` is refused (the document gives it
/// a type), not taken for an absence.
pub fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A field that is present, even as `null`, as `Some` (its JSON text, compact): for
/// fields where `null` is a value (a step's request), not an absence.
pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Value::deserialize(d).map(|v| Some(v.to_string()))
}
