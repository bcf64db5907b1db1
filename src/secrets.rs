//! Secrets by reference (beyond Clamp): a step's header values, URL query and broker
//! connection string may say `{{secret:NAME}}`, resolved when the call is made from a
//! file `NAME` in `--secrets-dir` (a mounted Kubernetes or Docker secret; read at each
//! call, so a changed file is used by the next call with no restart) or else from the
//! environment variable `CLAMP_SECRET_NAME` (only that prefix: a definition cannot read
//! the server's own settings, its database URL say). The definition, and so every read
//! of it, keeps the reference; the value exists only in the call.

use std::path::PathBuf;

/// How a reference starts and ends.
const OPEN: &str = "{{secret:";
const CLOSE: &str = "}}";
/// The environment variables secrets may come from.
pub const ENV_PREFIX: &str = "CLAMP_SECRET_";

/// Whether `text` refers to a secret (the cheap test a call makes first).
pub fn refers(text: &str) -> bool {
    text.contains(OPEN)
}

/// The names `text` refers to, in order; an unclosed reference or a name that is not
/// letters, digits, `_`, `-` and `.` (not first) is an error saying so.
pub fn names(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else {
            return Err("a {{secret:NAME}} reference is not closed".into());
        };
        let name = &after[..end];
        if !valid_name(name) {
            return Err(format!(
                "{name:?} is not a secret name (letters, digits, '_', '-' and '.', not first)"
            ));
        }
        out.push(name);
        rest = &after[end + CLOSE.len()..];
    }
    Ok(out)
}

/// The one form of a secret's name, checked where a definition names it and again where
/// a value is read: letters, digits, `_`, `-` and `.`, not starting with `.`, so a name
/// is always one file in the secrets directory (no `/`, no `..`, no absolute path).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Why a secret could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("secret {0} is not set (no file {0} in the secrets directory, no {ENV_PREFIX}{0})")]
pub struct Missing(pub String);

/// Where secrets come from.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    dir: Option<PathBuf>,
}

impl Secrets {
    pub fn new(dir: Option<PathBuf>) -> Secrets {
        Secrets { dir }
    }

    /// A secret's value now: its file (without a final line break), else its variable.
    pub fn get(&self, name: &str) -> Result<String, Missing> {
        // Checked again here, whatever stored the reference: a name outside the one form
        // could read any file the server may read.
        if !valid_name(name) {
            return Err(Missing(name.to_string()));
        }
        if let Some(dir) = &self.dir {
            if let Ok(v) = std::fs::read_to_string(dir.join(name)) {
                return Ok(v
                    .strip_suffix('\n')
                    .map(|v| v.strip_suffix('\r').unwrap_or(v))
                    .unwrap_or(&v)
                    .to_string());
            }
        }
        std::env::var(format!("{ENV_PREFIX}{name}")).map_err(|_| Missing(name.to_string()))
    }

    /// Every secret `text` refers to exists (a definition naming one that does not is
    /// refused); malformed references are refused too.
    pub fn check(&self, text: &str) -> Result<(), String> {
        for name in names(text)? {
            self.get(name).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// `text` with each reference replaced by its value, passed through `encode` (for a
    /// URL, percent-encoding; for a header, as it is).
    pub fn resolve(&self, text: &str, encode: fn(&str) -> String) -> Result<String, Missing> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + OPEN.len()..];
            let Some(end) = after.find(CLOSE) else {
                break;
            };
            out.push_str(&encode(&self.get(&after[..end])?));
            rest = &after[end + CLOSE.len()..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// A value as it goes into a URL's query: percent-encoded.
pub fn for_url(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// A value as it goes into a header: as it is.
pub fn as_is(v: &str) -> String {
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_checked_and_resolved() {
        assert_eq!(
            names("Bearer {{secret:PAY_KEY}} and {{secret:other.key}}"),
            Ok(vec!["PAY_KEY", "other.key"])
        );
        assert!(names("{{secret:open").unwrap_err().contains("not closed"));
        assert!(names("{{secret:../etc/passwd}}").is_err());
        assert!(names("{{secret:}}").is_err());
        let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("PAY_KEY"), "sk live/1&2\n").unwrap();
        let s = Secrets::new(Some(dir.clone()));
        assert_eq!(
            s.resolve("Bearer {{secret:PAY_KEY}}", as_is).unwrap(),
            "Bearer sk live/1&2"
        );
        assert_eq!(
            s.resolve("/x?k={{secret:PAY_KEY}}&a=1", for_url).unwrap(),
            "/x?k=sk+live%2F1%262&a=1"
        );
        assert_eq!(s.resolve("no reference", as_is).unwrap(), "no reference");
        // A name outside the one form is never read, whoever stored it.
        std::fs::write(dir.join("inside"), "x").unwrap();
        let outside = dir.join("inside").display().to_string();
        for name in [outside.as_str(), "../inside", "./inside", "a/../inside", ""] {
            assert_eq!(s.get(name), Err(Missing(name.into())), "{name}");
        }
        assert!(names("{{secret:..}}").is_err() && names("{{secret:a/b}}").is_err());
        assert!(s.check("{{secret:PAY_KEY}}").is_ok());
        let e = s.check("{{secret:NOPE_0}}").unwrap_err();
        assert!(e.contains("secret NOPE_0 is not set"), "{e}");
        assert_eq!(
            s.resolve("{{secret:NOPE_0}}", as_is),
            Err(Missing("NOPE_0".into()))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
