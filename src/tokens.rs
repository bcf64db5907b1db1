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
        // One name for every request with tokens off: a reference count, not an allocation.
        static NAME: std::sync::LazyLock<Arc<str>> =
            std::sync::LazyLock::new(|| "anonymous".into());
        Caller {
            name: NAME.clone(),
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

    /// Who holds the token whose digest is `d` (a console session's), compared likewise:
    /// None once that token has left the tokens in force.
    pub fn find_digest_of(&self, d: &[u8]) -> Option<&Caller> {
        let d: [u8; 32] = d.try_into().ok()?;
        self.find_digest(&d)
    }

    /// The digest of the accepted token `presented`, with its holder (a console session
    /// keeps the digest, to know whose it is and to end when it leaves).
    pub fn find_with_digest(&self, presented: &[u8]) -> Option<(&Caller, [u8; 32])> {
        let d = digest(presented);
        self.find_digest(&d).map(|c| (c, d))
    }
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
    /// Tokens were on when the server started: no reload may turn them off (an emptied
    /// file during a rotation must not open the server to anyone).
    started_on: bool,
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
    /// A tokens file that gives no token (and no list beside it) is refused: whoever
    /// names a tokens file means to have tokens.
    pub fn new(list: Tokens, file: Option<PathBuf>) -> Result<ApiTokens, String> {
        let mut t = ApiTokens {
            current: RwLock::new(Arc::new(list.clone())),
            list,
            file,
            started_on: false,
        };
        let n = t.reload()?;
        if n == 0 {
            if let Some(path) = &t.file {
                return Err(format!(
                    "{}: gives no token (a line name:role:token at least)",
                    path.display()
                ));
            }
        }
        t.started_on = n > 0;
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

    /// Whether tokens are on: fixed when the server starts, since no reload may turn
    /// them off, and a server started without them has no file to read.
    pub fn is_on(&self) -> bool {
        self.started_on
    }

    /// The tokens file, if one is set.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Reads the file again (the list stays); on an error the tokens in force stay too.
    /// A server started with tokens refuses a file that would leave none in force: only
    /// a restart without tokens turns authentication off. Returns how many tokens are in
    /// force.
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
        if n == 0 && self.started_on {
            return Err(format!(
                "{}: gives no token, which would turn authentication off; a server started \
                 with tokens keeps them until it is restarted without",
                self.file
                    .as_deref()
                    .map_or("(no file)".into(), |p| p.display().to_string())
            ));
        }
        *self.current.write() = Arc::new(all);
        Ok(n)
    }
}

/// Console sign-in attempts per client address: a token bucket each, holding a minute's
/// worth of attempts and refilled at that rate, so a guesser gets a handful a minute
/// while a person who mistyped is never held up. The table is bounded: past
/// `MAX_ADDRESSES`, full buckets (addresses that stopped trying) are forgotten first,
/// then the oldest.
pub struct SignInLimiter {
    per_minute: f64,
    buckets: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

/// Addresses the limiter remembers at most.
const MAX_ADDRESSES: usize = 10_000;

impl SignInLimiter {
    pub fn new(per_minute: u32) -> SignInLimiter {
        SignInLimiter {
            per_minute: f64::from(per_minute.max(1)),
            buckets: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Takes an attempt for `addr`: Ok, or how long until the next one is allowed.
    pub fn attempt(&self, addr: std::net::IpAddr) -> Result<(), std::time::Duration> {
        let now = std::time::Instant::now();
        let rate = self.per_minute / 60.0;
        let mut map = self.buckets.lock();
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&addr) {
            let full = self.per_minute;
            map.retain(|_, b| b.tokens + b.at.elapsed().as_secs_f64() * rate < full);
            if map.len() >= MAX_ADDRESSES {
                let mut ages: Vec<std::time::Instant> = map.values().map(|b| b.at).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                map.retain(|_, b| b.at > cut);
            }
        }
        let b = map.entry(addr).or_insert(Bucket {
            tokens: self.per_minute,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(self.per_minute);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
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
        let (c, d) = t.find_with_digest(b"hashed-token-0123456789").unwrap();
        assert_eq!(c.role, Role::Operate);
        assert_eq!(t.find_digest_of(&d).map(|c| c.role), Some(Role::Operate));
        assert!(t.find_digest_of(b"0000").is_none());
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

    #[test]
    fn no_reload_turns_tokens_off_and_no_empty_file_starts_them() {
        let dir = std::env::temp_dir().join(format!("clamp-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens");
        std::fs::write(&file, "# nobody yet\n").unwrap();
        let e = ApiTokens::new(Tokens::default(), Some(file.clone())).unwrap_err();
        assert!(e.contains("gives no token"), "{e}");
        std::fs::write(&file, "dash:read:dash-token-0123456789\n").unwrap();
        let t = ApiTokens::new(Tokens::default(), Some(file.clone())).unwrap();
        for emptied in ["", "\n# all gone\n"] {
            std::fs::write(&file, emptied).unwrap();
            let e = t.reload().unwrap_err();
            assert!(e.contains("would turn authentication off"), "{e}");
            assert!(t.is_on());
            assert!(t.current().find(b"dash-token-0123456789").is_some());
        }
        std::fs::remove_file(&file).unwrap();
        assert!(t.reload().is_err());
        assert!(t.is_on());
        // Without tokens at start, there is nothing to keep.
        assert!(!ApiTokens::default().is_on());
        assert_eq!(ApiTokens::default().reload(), Ok(0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sign_ins_are_limited_per_address() {
        let l = SignInLimiter::new(3);
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert!(l.attempt(a).is_ok());
        }
        let wait = l.attempt(a).unwrap_err();
        assert!(
            wait > std::time::Duration::from_secs(15) && wait <= std::time::Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(l.attempt(b).is_ok(), "another address is not held up");
        // The table stays bounded.
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            let _ = l.attempt(std::net::IpAddr::V4(std::net::Ipv4Addr::from(i)));
        }
        assert!(l.buckets.lock().len() <= MAX_ADDRESSES);
    }
}
