//! API tokens and what each may do (beyond Clamp). A token has a name (what the audit
//! and the logs show, never the token) and a role: `read` (every read, the console
//! without its actions), `operate` (also create, cancel, retry, rerun, step responses,
//! events) or `admin` (also workflows, versions and schedules). They come from
//! `--api-tokens` (each `admin`, named `token-1`, `token-2`, … in order: how existing
//! deployments keep working) and from a file of `name:role:token` or
//! `name:role:sha256:<hex digest of the token>` lines (`--tokens-file`), read again on
//! SIGHUP. Only digests are kept: a presented token is hashed once and compared with
//! every entry in constant time, so timing tells nothing about which matched.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted: a guessable token is no protection.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token may do; each role may do all that the one below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Read,
    Operate,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read" => Some(Role::Read),
            "operate" => Some(Role::Operate),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// Who is asking: a token's name and role (with tokens off, `anonymous`, who may do all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: Arc<str>,
    pub role: Role,
}

impl Caller {
    /// The caller when tokens are off.
    pub fn anonymous() -> Caller {
        Caller {
            name: "anonymous".into(),
            role: Role::Admin,
        }
    }
}

/// One accepted token: its name, role, and the SHA-256 digest of the token.
#[derive(Clone)]
pub struct Token {
    pub caller: Caller,
    digest: [u8; 32],
}

/// The SHA-256 digest of a token, as the tokens file may give it.
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The accepted tokens at one moment (none: authentication is off).
#[derive(Clone, Default)]
pub struct Tokens(Vec<Token>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    /// `--api-tokens`: each an admin, named by its place in the list.
    pub fn from_list<S: AsRef<str>>(plain: &[S]) -> Tokens {
        Tokens(
            plain
                .iter()
                .enumerate()
                .map(|(i, t)| Token {
                    caller: Caller {
                        name: format!("token-{}", i + 1).into(),
                        role: Role::Admin,
                    },
                    digest: digest(t.as_ref().as_bytes()),
                })
                .collect(),
        )
    }

    /// A tokens file: one `name:role:token` or `name:role:sha256:<64 hex>` per line;
    /// blank lines and lines starting with `#` are skipped. The error names the line.
    pub fn parse_file(text: &str) -> Result<Tokens, String> {
        let mut out: Vec<Token> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |why: &str| format!("line {}: {why}", n + 1);
            let mut parts = line.splitn(3, ':');
            let (Some(name), Some(role), Some(secret)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(at("expected name:role:token"));
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(at("the name must be printable ASCII without spaces"));
            }
            if out.iter().any(|t| &*t.caller.name == name) {
                return Err(at(&format!("the name {name:?} is given twice")));
            }
            let role = Role::parse(role)
                .ok_or_else(|| at(&format!("role {role:?} is not one of read, operate, admin")))?;
            let digest = match secret.strip_prefix("sha256:") {
                Some(hex) => parse_hex(hex).ok_or_else(|| {
                    at("a sha256: digest must be 64 hex digits (e.g. from sha256sum)")
                })?,
                None => {
                    check_token(secret).map_err(|why| at(&why))?;
                    digest(secret.as_bytes())
                }
            };
            out.push(Token {
                caller: Caller {
                    name: name.into(),
                    role,
                },
                digest,
            });
        }
        Ok(Tokens(out))
    }

    pub fn is_on(&self) -> bool {
        !self.0.is_empty()
    }

    /// The token `presented` is, compared with every entry in constant time.
    pub fn find(&self, presented: &[u8]) -> Option<&Caller> {
        self.find_digest(&digest(presented))
    }

    fn find_digest(&self, d: &[u8; 32]) -> Option<&Caller> {
        let mut found = None;
        for t in &self.0 {
            if bool::from(t.digest.ct_eq(d)) && found.is_none() {
                found = Some(&t.caller);
            }
        }
        found
    }

    /// The console session a cookie value names (`session_value`), compared likewise.
    pub fn find_session(&self, cookie: &[u8]) -> Option<&Caller> {
        let mut found = None;
        for t in &self.0 {
            if bool::from(session_of(&t.digest).as_bytes().ct_eq(cookie)) && found.is_none() {
                found = Some(&t.caller);
            }
        }
        found
    }

    /// The console session cookie's value for a token: derived from its digest, so the
    /// cookie holds neither the token nor what the file holds.
    pub fn session_value(token: &[u8]) -> String {
        session_of(&digest(token))
    }
}

fn session_of(d: &[u8; 32]) -> String {
    let mut h = Sha256::new();
    h.update(b"clamp console session\0");
    h.update(d);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A plain token: long enough, printable, no spaces.
pub fn check_token(t: &str) -> Result<(), String> {
    if t.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "every token must be at least {MIN_TOKEN_LEN} characters"
        ));
    }
    if t.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err("tokens are printable ASCII without spaces".into());
    }
    Ok(())
}

/// The tokens in force, and where they come from, so that a SIGHUP can read them again.
pub struct ApiTokens {
    list: Tokens,
    file: Option<PathBuf>,
    current: RwLock<Arc<Tokens>>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.current())
    }
}

impl Default for ApiTokens {
    fn default() -> ApiTokens {
        ApiTokens::new(Tokens::default(), None).expect("no file to read")
    }
}

impl ApiTokens {
    /// `list` (from `--api-tokens`) and the tokens of `file`, read now.
    pub fn new(list: Tokens, file: Option<PathBuf>) -> Result<ApiTokens, String> {
        let t = ApiTokens {
            current: RwLock::new(Arc::new(list.clone())),
            list,
            file,
        };
        t.reload()?;
        Ok(t)
    }

    /// Plain admin tokens only (as `--api-tokens` gives them), shared as the
    /// configuration holds them.
    pub fn from_list<S: AsRef<str>>(plain: &[S]) -> Arc<ApiTokens> {
        Arc::new(ApiTokens::new(Tokens::from_list(plain), None).expect("no file to read"))
    }

    /// The tokens in force now.
    pub fn current(&self) -> Arc<Tokens> {
        self.current.read().clone()
    }

    pub fn is_on(&self) -> bool {
        self.current.read().is_on()
    }

    /// The tokens file, if one is set.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Reads the file again (the list stays); on an error the tokens in force stay too.
    /// Returns how many tokens are in force.
    pub fn reload(&self) -> Result<usize, String> {
        let mut all = self.list.clone();
        if let Some(path) = &self.file {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let from_file =
                Tokens::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            all.0.extend(from_file.0);
        }
        let n = all.0.len();
        *self.current.write() = Arc::new(all);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_gives_names_roles_and_tokens_or_their_digests() {
        let hashed = digest(b"hashed-token-0123456789")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        let t = Tokens::parse_file(&format!(
            "# the dashboard\ndash:read:dash-token-0123456789\n\n\
             oncall:operate:sha256:{hashed}\nci:admin:ci:token:with:colons\n"
        ))
        .unwrap();
        let who = |tok: &str| t.find(tok.as_bytes()).map(|c| (c.name.to_string(), c.role));
        assert_eq!(
            who("dash-token-0123456789"),
            Some(("dash".into(), Role::Read))
        );
        assert_eq!(
            who("hashed-token-0123456789"),
            Some(("oncall".into(), Role::Operate))
        );
        assert_eq!(
            who("ci:token:with:colons"),
            Some(("ci".into(), Role::Admin))
        );
        assert_eq!(who("dash-token-012345678"), None);
        let s = Tokens::session_value(b"hashed-token-0123456789");
        assert_eq!(
            t.find_session(s.as_bytes()).map(|c| c.role),
            Some(Role::Operate)
        );
        assert!(t.find_session(b"0000").is_none());
        assert_eq!(format!("{t:?}"), "Tokens(3 configured)");
    }

    #[test]
    fn a_bad_line_is_named() {
        for (text, needle) in [
            ("a:read", "line 1: expected name:role:token"),
            (
                "a:owner:token-0123456789abcdef",
                "not one of read, operate, admin",
            ),
            ("a:read:short", "at least 16"),
            ("a:read:sha256:abc", "64 hex digits"),
            (
                "a:read:token-0123456789abc\na:admin:token-0123456789abd",
                "line 2: the name \"a\" is given twice",
            ),
        ] {
            let e = Tokens::parse_file(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn the_list_is_admin_and_a_reload_reads_the_file_again() {
        let dir = std::env::temp_dir().join(format!("clamp-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens");
        std::fs::write(&file, "dash:read:dash-token-0123456789\n").unwrap();
        let t = ApiTokens::new(
            Tokens::from_list(&["list-token-0123456789"]),
            Some(file.clone()),
        )
        .unwrap();
        let role = |tok: &str| t.current().find(tok.as_bytes()).map(|c| c.role);
        assert_eq!(role("list-token-0123456789"), Some(Role::Admin));
        assert_eq!(role("dash-token-0123456789"), Some(Role::Read));
        std::fs::write(&file, "dash:operate:dash-token-0123456789\n").unwrap();
        assert_eq!(t.reload(), Ok(2));
        assert_eq!(role("dash-token-0123456789"), Some(Role::Operate));
        // A broken file leaves the tokens in force.
        std::fs::write(&file, "dash:root:dash-token-0123456789\n").unwrap();
        assert!(t.reload().is_err());
        assert_eq!(role("dash-token-0123456789"), Some(Role::Operate));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
