//! The kazaam-style "shift" transform: every output key (dots nest) takes the value
//! found at a dotted path of the context. Paths may index arrays (`items[0]` or
//! `items.0`) and may start with `context.`, as Clamp's specs often do.

use serde_json::{Map, Value};

/// Why a shift spec was rejected at workflow creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

/// One path segment.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// Validates a spec (`{outKey: "path" | ["path", ...]}`) into (output key, path) pairs;
/// a list of paths becomes an array output, encoded as one pair per path with the same key
/// and a `[]` suffix on the key.
pub fn compile_spec(spec: &Map<String, Value>) -> Result<Vec<(String, String)>, SpecError> {
    let mut out = Vec::with_capacity(spec.len());
    for (k, v) in spec {
        if k.is_empty() || k.split('.').any(str::is_empty) {
            return Err(SpecError(format!("output key {k:?} is not a dotted name")));
        }
        match v {
            Value::String(p) => {
                parse_path(p)?;
                out.push((k.clone(), p.clone()));
            }
            Value::Array(paths) if !paths.is_empty() => {
                for p in paths {
                    let p = p
                        .as_str()
                        .ok_or_else(|| SpecError(format!("paths of {k:?} must be strings")))?;
                    parse_path(p)?;
                    out.push((format!("{k}[]"), p.to_string()));
                }
            }
            _ => {
                return Err(SpecError(format!(
                    "the value of {k:?} must be a path string or a list of them"
                )))
            }
        }
    }
    Ok(out)
}

fn parse_path(path: &str) -> Result<Vec<Seg<'_>>, SpecError> {
    let path = path.strip_prefix("context.").unwrap_or(path);
    let mut segs = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if name.is_empty() && rest.is_empty() {
            return Err(SpecError(format!("path {path:?} has an empty segment")));
        }
        if !name.is_empty() {
            match name.parse::<usize>() {
                Ok(i) if !segs.is_empty() => segs.push(Seg::Index(i)),
                _ => segs.push(Seg::Key(name)),
            }
        }
        while !rest.is_empty() {
            let close = rest
                .find(']')
                .ok_or_else(|| SpecError(format!("path {path:?} has an unclosed '['")))?;
            let idx = rest[1..close]
                .parse::<usize>()
                .map_err(|_| SpecError(format!("path {path:?} has a bad array index")))?;
            segs.push(Seg::Index(idx));
            rest = &rest[close + 1..];
            if !rest.is_empty() && !rest.starts_with('[') {
                return Err(SpecError(format!("path {path:?} is malformed after ']'")));
            }
        }
    }
    Ok(segs)
}

/// Looks a path up in `root`; None when any segment is missing.
pub fn lookup<'v>(root: &'v Value, path: &str) -> Option<&'v Value> {
    walk(root, parse_path(path).ok()?)
}

/// Looks a path up in a context map (its first segment names an entry of it), as
/// `lookup` does in a value: a MAP's list and a WAIT's time are found this way.
pub fn lookup_in<'v>(context: &'v Map<String, Value>, path: &str) -> Option<&'v Value> {
    let mut segs = parse_path(path).ok()?.into_iter();
    let Some(Seg::Key(first)) = segs.next() else {
        return None;
    };
    walk(context.get(first)?, segs)
}

fn walk<'v, 'p>(root: &'v Value, segs: impl IntoIterator<Item = Seg<'p>>) -> Option<&'v Value> {
    let mut cur = root;
    for s in segs {
        cur = match (s, cur) {
            (Seg::Key(k), Value::Object(m)) => m.get(k)?,
            (Seg::Index(i), Value::Array(a)) => a.get(i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Applies a compiled spec to `context`. Missing inputs become `null`, as kazaam does.
pub fn shift(spec: &[(String, String)], context: &Value) -> Value {
    let mut out = Map::new();
    for (key, path) in spec {
        let v = lookup(context, path).cloned().unwrap_or(Value::Null);
        let (key, append) = match key.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (key.as_str(), false),
        };
        insert_nested(&mut out, key, v, append);
    }
    Value::Object(out)
}

fn insert_nested(map: &mut Map<String, Value>, key: &str, v: Value, append: bool) {
    match key.split_once('.') {
        Some((head, rest)) => {
            let child = map
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !child.is_object() {
                *child = Value::Object(Map::new());
            }
            if let Value::Object(m) = child {
                insert_nested(m, rest, v, append);
            }
        }
        None if append => match map
            .entry(key.to_string())
            .or_insert_with(|| Value::Array(vec![]))
        {
            Value::Array(a) => a.push(v),
            other => *other = Value::Array(vec![v]),
        },
        None => {
            map.insert(key.to_string(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(spec: Value, ctx: Value) -> Value {
        let spec = compile_spec(spec.as_object().unwrap()).unwrap();
        shift(&spec, &ctx)
    }

    #[test]
    fn shifts_with_nesting_and_indices() {
        let ctx = json!({
            "step1": {"request": {"user": {"id": 7, "tags": ["a", "b"]}},
                      "response": {"items": [{"sku": "x"}, {"sku": "y"}]}}
        });
        let check = |spec: Value, expected: Value| {
            assert_eq!(run(spec.clone(), ctx.clone()), expected, "{spec}")
        };
        check(json!({"uid": "step1.request.user.id"}), json!({"uid": 7}));
        check(
            json!({"a.b.c": "step1.request.user.id"}),
            json!({"a": {"b": {"c": 7}}}),
        );
        check(
            json!({"first": "step1.response.items[0].sku"}),
            json!({"first": "x"}),
        );
        check(
            json!({"second": "step1.response.items.1.sku"}),
            json!({"second": "y"}),
        );
        check(
            json!({"tag": "context.step1.request.user.tags[1]"}),
            json!({"tag": "b"}),
        );
        check(
            json!({"missing": "step1.request.nope"}),
            json!({"missing": null}),
        );
        check(
            json!({"both": ["step1.request.user.id", "step1.response.items[1].sku"]}),
            json!({"both": [7, "y"]}),
        );
        check(
            json!({"u.id": "step1.request.user.id", "u.first": "step1.response.items[0]"}),
            json!({"u": {"id": 7, "first": {"sku": "x"}}}),
        );
    }

    #[test]
    fn rejects_bad_specs() {
        let bad = |spec: Value| {
            assert!(compile_spec(spec.as_object().unwrap()).is_err(), "{spec}");
        };
        bad(json!({"x": 1}));
        bad(json!({"x": "a..b"}));
        bad(json!({"x": "a[1"}));
        bad(json!({"x": "a[z]"}));
        bad(json!({"": "a"}));
        bad(json!({"x": []}));
    }
}
