//! The one value a plain selection (`payload.customer.id`) reads from a JSON document,
//! taken from its bytes without building the rest: a limited create computes its key on
//! every create, and parsing the whole payload into a `serde_json::Value` (every key and
//! string allocated, every object a sorted map) was most of what the key cost.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// `json` reduced to what `fields` selects: the objects along the path, each holding only
/// the next field, and the value at its end, as a full parse would give them (for a key
/// given twice, the last). A path that ends early (a field not there) keeps the objects
/// it found; a value that is not an object where the path goes on is `Null`, and so is a
/// document that is not JSON (a selection through either fails, as it does on the full
/// document).
pub fn pick(json: &[u8], fields: &[String]) -> Value {
    let mut de = serde_json::Deserializer::from_slice(json);
    match Pick(fields).deserialize(&mut de) {
        Ok(v) if de.end().is_ok() => v,
        _ => Value::Null,
    }
}

/// Deserializes the value under `.0` (empty: the whole value).
struct Pick<'a>(&'a [String]);

impl<'de> DeserializeSeed<'de> for Pick<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.is_empty() {
            Value::deserialize(d)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Pick<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    // A value that is not an object holds no field: `Null` in its place, so that a key
    // given twice is still read from its last value, and a selection through it fails
    // as it does on the full document.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let (field, rest) = self.0.split_first().expect("a field to select");
        let mut found = None;
        while let Some(is_field) = map.next_key_seed(KeyIs(field))? {
            if is_field {
                found = Some(map.next_value_seed(Pick(rest))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        let mut m = Map::new();
        if let Some(v) = found {
            m.insert(field.clone(), v);
        }
        Ok(Value::Object(m))
    }
}

/// Whether an object's key is `.0` (compared where it lies, unescaped keys unallocated).
struct KeyIs<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    /// What the selection reads from the full parse.
    fn full(json: &str, p: &[&str]) -> Option<Value> {
        let mut at = serde_json::from_str::<Value>(json).ok()?;
        for f in p {
            at = at.as_object()?.get(*f)?.clone();
        }
        Some(at)
    }

    fn picked(json: &str, p: &[&str]) -> Option<Value> {
        let mut at = pick(json.as_bytes(), &fields(p));
        for f in p {
            at = at.as_object()?.get(*f)?.clone();
        }
        Some(at)
    }

    #[test]
    fn reads_what_a_full_parse_reads() {
        let doc = r#"{"claim":{"type":"MOTOR","amount":12.5,"n":-3},"k":"k7",
            "list":[1,{"k":"no"}],"esc\u0061ped":"yes","dup":1,"dup":{"x":"last"},
            "nested":{"deeper":{"id":42}}}"#;
        for p in [
            &["k"][..],
            &["claim", "type"],
            &["claim", "amount"],
            &["claim", "n"],
            &["escaped"],
            &["dup"],
            &["dup", "x"],
            &["nested", "deeper", "id"],
            &["nested", "deeper"],
            &["list"],
            &["missing"],
            &["claim", "missing"],
            &["k", "deeper"],
            &["list", "k"],
        ] {
            assert_eq!(picked(doc, p), full(doc, p), "{p:?}");
        }
    }

    /// A limited create's key from its payload's text is the key from the parsed
    /// payload, for plain selections (read by `pick`) and other expressions alike.
    #[test]
    fn a_key_from_the_text_is_the_key_from_the_parsed_payload() {
        use crate::workflow::expr::KeyExpr;
        use crate::workflow::model::Concurrency;
        let docs = [
            r#"{"k":"k7","n":3,"c":{"id":"C-1","n":-2.5},"b":true}"#,
            r#"{"k":12,"c":{"id":{"deep":1}}}"#,
            r#"{"c":"not an object","k":null}"#,
            r#"{"k":"first","k":"last"}"#,
            r#"["not", "an", "object"]"#,
            "not json",
        ];
        for source in [
            "payload.k",
            "payload.n",
            "payload.c.id",
            "payload.c.n",
            "payload.b",
            "payload.missing",
            "'t-' + string(payload.k)",
            "payload",
        ] {
            let c = Concurrency {
                key: Some(KeyExpr::compile(source, &fields(&["payload"])).unwrap()),
                limit: 1,
                rate: None,
            };
            for doc in docs {
                let parsed = serde_json::from_str(doc).unwrap_or(Value::Null);
                assert_eq!(
                    c.key_of_json(doc.as_bytes()),
                    c.key_of(parsed),
                    "{source} over {doc}"
                );
            }
        }
    }

    #[test]
    fn a_document_that_is_not_an_object_or_not_json_is_null() {
        for doc in [
            r#""text""#,
            "[1,2]",
            "12",
            "null",
            "true",
            "{",
            r#"{"k":1} x"#,
            "",
        ] {
            assert_eq!(pick(doc.as_bytes(), &fields(&["k"])), Value::Null, "{doc}");
        }
    }
}
