//! A request's labels (beyond Clamp): `key:value` texts that say what it is about
//! (`tenant:acme`, `order:4711`), given at its create (`?label=`, repeatable, or the
//! `Clamp-Labels` header, comma-separated), kept by its children and reruns, and found by
//! search (`GET /serviceRequests?label=…`). A request without labels stores NULL.
//!
//! A key is a short identifier (letters, digits, `_ . / -`); a value is printable text
//! without commas (the header's separator) or control characters. Sorted and unique, so
//! one set of labels is stored one way whatever order it was given in.

use std::fmt;

/// Most labels one request carries.
pub const MAX_LABELS: usize = 16;
/// Longest key, in bytes.
pub const MAX_KEY: usize = 63;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 200;
/// The label by which a create asks that a cancel of its request run the request's
/// compensations first (as `compensateOnCancel` asks for every request of a workflow).
pub const COMPENSATE_ON_CANCEL: &str = "clamp.compensate:on-cancel";

/// The header a create may give its labels in, comma-separated.
pub const HEADER: &str = "clamp-labels";

/// A request's labels: at least one, sorted, unique, each checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels(Vec<String>);

/// Why a label was refused (a 400 whose text names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLabel(pub String);

impl fmt::Display for BadLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Labels {
    /// The labels of `given` (each one `key:value`, surrounding blanks ignored); None for
    /// none.
    pub fn parse<'a>(given: impl IntoIterator<Item = &'a str>) -> Result<Option<Labels>, BadLabel> {
        let mut all: Vec<String> = Vec::new();
        for text in given {
            let text = text.trim();
            check(text)?;
            all.push(text.to_owned());
            if all.len() > MAX_LABELS * 2 {
                break;
            }
        }
        all.sort_unstable();
        all.dedup();
        if all.len() > MAX_LABELS {
            return Err(BadLabel(format!(
                "label: at most {MAX_LABELS} labels per request"
            )));
        }
        Ok((!all.is_empty()).then_some(Labels(all)))
    }

    /// The labels of a header's value: `key:value` texts separated by commas.
    pub fn parse_header(value: &[u8]) -> Result<Option<Labels>, BadLabel> {
        let text =
            std::str::from_utf8(value).map_err(|_| BadLabel("Clamp-Labels: not UTF-8".into()))?;
        Labels::parse(text.split(',').filter(|s| !s.trim().is_empty()))
    }

    /// These labels and `more`'s, as one set (a create may give both forms).
    pub fn merge(a: Option<Labels>, b: Option<Labels>) -> Result<Option<Labels>, BadLabel> {
        match (a, b) {
            (None, b) => Ok(b),
            (a, None) => Ok(a),
            (Some(a), Some(b)) => Labels::parse(a.0.iter().chain(b.0.iter()).map(String::as_str)),
        }
    }

    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// One text, the labels separated by newlines (which no label holds): how a column of
    /// a multi-row statement carries a row's labels (`string_to_array(…, E'\n')`).
    pub fn joined(&self) -> String {
        self.0.join("\n")
    }
}

/// Checks one `key:value` label.
fn check(text: &str) -> Result<(), BadLabel> {
    let bad = |why: &str| Err(BadLabel(format!("label {text:?}: {why}")));
    let Some((key, value)) = text.split_once(':') else {
        return bad("must be key:value");
    };
    if key.is_empty() || key.len() > MAX_KEY {
        return bad(&format!("its key must be 1 to {MAX_KEY} bytes"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-'))
    {
        return bad("its key may hold only letters, digits, _ . / and -");
    }
    if value.is_empty() || value.len() > MAX_VALUE {
        return bad(&format!("its value must be 1 to {MAX_VALUE} bytes"));
    }
    if value.chars().any(|c| c.is_control() || c == ',') {
        return bad("its value may not hold commas or control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(given: &[&str]) -> Vec<String> {
        Labels::parse(given.iter().copied())
            .unwrap()
            .map(|l| l.0)
            .unwrap_or_default()
    }

    #[test]
    fn labels_are_sorted_unique_and_trimmed() {
        assert_eq!(
            labels(&["tenant:acme", " order:4711 ", "tenant:acme"]),
            ["order:4711", "tenant:acme"]
        );
        assert!(labels(&[]).is_empty());
        // A value may hold colons and spaces: only the first colon splits.
        assert_eq!(labels(&["url:https://x/y z"]), ["url:https://x/y z"]);
    }

    #[test]
    fn bad_labels_are_refused_with_their_text() {
        for bad in [
            "tenant",
            ":acme",
            "tenant:",
            "ten ant:acme",
            "tenant:a,b",
            "tenant:a\nb",
        ] {
            let e = Labels::parse([bad]).unwrap_err();
            assert!(e.0.contains("label"), "{bad:?}: {e}");
        }
        let long_key = format!("{}:v", "k".repeat(MAX_KEY + 1));
        assert!(Labels::parse([long_key.as_str()]).is_err());
        let long_value = format!("k:{}", "v".repeat(MAX_VALUE + 1));
        assert!(Labels::parse([long_value.as_str()]).is_err());
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("k:{i}")).collect();
        assert!(Labels::parse(many.iter().map(String::as_str)).is_err());
        let enough: Vec<String> = (0..MAX_LABELS).map(|i| format!("k:{i}")).collect();
        assert!(Labels::parse(enough.iter().map(String::as_str)).is_ok());
    }

    #[test]
    fn a_header_splits_at_commas_and_merges_with_the_query() {
        let h = Labels::parse_header(b"order:4711, tenant:acme,").unwrap();
        assert_eq!(h.clone().unwrap().0, ["order:4711", "tenant:acme"]);
        let q = Labels::parse(["tenant:acme", "region:eu"]).unwrap();
        let all = Labels::merge(h, q).unwrap().unwrap();
        assert_eq!(all.0, ["order:4711", "region:eu", "tenant:acme"]);
        assert_eq!(all.joined(), "order:4711\nregion:eu\ntenant:acme");
        assert_eq!(Labels::parse_header(b" , ").unwrap(), None);
    }
}
