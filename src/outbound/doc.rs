//! A step's request or response as JSON text, parsed only when something reads inside it.
//!
//! Most workflows have no `when` and no transform: a request's payload goes to the first
//! step, each response to the next step and into the step records, all as text. Keeping the
//! text (shared, not copied) and parsing it into a `Value` only for conditions and
//! transforms spares every step a parse, a clone and several re-serializations.

use bytes::Bytes;
use serde_json::Value;

/// Valid JSON text.
#[derive(Debug, Clone)]
pub struct Doc(Bytes);

impl Doc {
    /// Text that is known to be JSON (validated on the way in, or written by this server).
    pub fn trusted(text: impl Into<Bytes>) -> Doc {
        Doc(text.into())
    }

    /// A downstream's answer: kept as it came when it is JSON, `null` when empty, and a
    /// JSON string of the text otherwise.
    pub fn from_response(body: Bytes) -> Doc {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Doc(Bytes::from_static(b"null"));
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
            return Doc(body);
        }
        let text = String::from_utf8_lossy(&body);
        Doc(Bytes::from(
            serde_json::to_vec(&Value::String(text.into_owned())).expect("strings serialize"),
        ))
    }

    /// A failed step's record: `{"errors": {"code": …, "message": …}}` (Clamp's shape).
    pub fn error(code: i64, message: &str) -> Doc {
        Doc::from_value(&serde_json::json!({"errors": {"code": code, "message": message}}))
    }

    pub fn from_value(v: &Value) -> Doc {
        Doc(Bytes::from(
            serde_json::to_vec(v).expect("values serialize"),
        ))
    }

    /// The same text: the same shared buffer (the usual case, a step that passes its
    /// request on unchanged), or equal bytes.
    pub fn same(&self, other: &Doc) -> bool {
        (self.0.as_ptr() == other.0.as_ptr() && self.0.len() == other.0.len()) || self.0 == other.0
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text as a shared buffer (a reference count, not a copy), e.g. as a request body.
    pub fn to_bytes(&self) -> Bytes {
        self.0.clone()
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from validated JSON (UTF-8) or serde's output.
        std::str::from_utf8(&self.0).unwrap_or("null")
    }

    /// The parsed document (`null` if it somehow is not JSON).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or(Value::Null)
    }
}

/// One step's entry in the context conditions and transforms read:
/// `{"request": …, "response": …}` (Clamp's shape).
pub fn context_entry(request: Value, response: Value) -> Value {
    let mut m = serde_json::Map::with_capacity(2);
    m.insert("request".into(), request);
    m.insert("response".into(), response);
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_kept_when_json_and_made_json_otherwise() {
        let raw = Bytes::from_static(b"{\"b\": 1, \"a\": [true]}");
        assert_eq!(Doc::from_response(raw.clone()).as_bytes(), &raw[..]);
        assert_eq!(Doc::from_response(Bytes::new()).as_str(), "null");
        assert_eq!(
            Doc::from_response(Bytes::from_static(b" \n")).as_str(),
            "null"
        );
        assert_eq!(
            Doc::from_response(Bytes::from_static(b"plain \"text\"")).as_str(),
            "\"plain \\\"text\\\"\""
        );
        assert_eq!(
            Doc::from_response(Bytes::from_static(b"{\"a\":")).value(),
            Value::String("{\"a\":".into())
        );
        assert_eq!(Doc::from_response(Bytes::from_static(b"42")).value(), 42);
    }
}
