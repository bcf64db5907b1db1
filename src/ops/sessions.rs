//! Console sign-in and sessions (beyond Clamp). A sign-in checks a token as the API
//! does, limited per client address (`tokens::SignInLimiter`; past the rate an attempt
//! is refused without looking at its token); a refusal is counted, not written to the
//! audit trail (anyone could write there), while a sign-in is audited. A session is a
//! random id kept server-side (`store::sessions`, so every instance knows it), with an
//! idle and an absolute expiry; it names its token by digest, so it ends when that token
//! leaves the tokens in force, and holding a digest (a `sha256:` line of the tokens file)
//! signs no one in.

use std::net::IpAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{OpError, Result};
use crate::config::Config;
use crate::state::App;
use crate::store::sessions;
use crate::store::Pool;
use crate::tokens::Caller;

/// What a sign-in came to.
pub enum SignIn {
    /// Signed in: the session's id, for the cookie.
    Started { session: String },
    /// The token is not accepted.
    Refused,
    /// Too many attempts from this address: try again after this long.
    Limited(Duration),
}

/// A session id: 32 bytes from the system's secure random source, as hex.
fn new_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source works");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What is stored of a session id: its SHA-256, so the table alone signs no one in.
fn hash(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// Signs in with `token`, from `peer`.
pub async fn sign_in(app: &App, pool: &Pool, peer: Option<IpAddr>, token: &str) -> Result<SignIn> {
    if let Some(addr) = peer {
        if let Err(wait) = app.sign_ins.attempt(addr) {
            app.metrics.sign_ins_limited.inc();
            return Ok(SignIn::Limited(wait));
        }
    }
    let tokens = app.config.api_tokens.current();
    let Some((caller, digest)) = tokens.find_with_digest(token.as_bytes()) else {
        app.metrics.sign_ins_refused.inc();
        return Ok(SignIn::Refused);
    };
    let caller = caller.clone();
    let session = new_id();
    let conn = pool.get().await.map_err(OpError::pool("sign-in"))?;
    sessions::create(&conn, &hash(&session), &digest)
        .await
        .map_err(OpError::store("sign-in"))?;
    drop(conn);
    super::audit::record(pool, &caller, "console sign-in", "console", "ok").await;
    Ok(SignIn::Started { session })
}

/// Who the session `id` signs in, if it is live and its token still in force.
pub async fn session(cfg: &Config, pool: &Pool, id: &str) -> Result<Option<Caller>> {
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let conn = pool.get().await.map_err(OpError::pool("session"))?;
    let digest = sessions::touch(&conn, &hash(id), cfg.session_idle, cfg.session_max)
        .await
        .map_err(OpError::store("session"))?;
    let tokens = cfg.api_tokens.current();
    Ok(digest.and_then(|d| tokens.find_digest_of(&d).cloned()))
}

/// Ends the session `id` (on every instance).
pub async fn sign_out(pool: &Pool, id: &str) -> Result<()> {
    let conn = pool.get().await.map_err(OpError::pool("sign-out"))?;
    sessions::end(&conn, &hash(id))
        .await
        .map_err(OpError::store("sign-out"))
}
