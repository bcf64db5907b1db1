//! Console sessions (beyond Clamp): a random id kept in Postgres, never derived from the
//! token, so what the tokens file holds (a digest) signs no one in; sessions end after
//! their idle and absolute expiry, at sign-out on every instance, and when their token
//! leaves the tokens file; sign-ins are limited per client address, and refusals are
//! counted rather than written to the audit trail.

use std::time::Duration;

use hyper::Method;
use sha2::{Digest, Sha256};

use crate::support::*;

const TOKEN: &str = "session-token-0123456789abcdef";
const OTHER: &str = "other-token-0123456789abcdef";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
        .into_bytes()
}

/// A browser at the console of `s`: its forgery cookie and the form value.
struct Browser {
    addr: std::net::SocketAddr,
    csrf: String,
    value: String,
}

impl Browser {
    async fn at(addr: std::net::SocketAddr) -> Browser {
        let login = send(addr, Method::GET, "/console/login", None, &[]).await;
        assert_eq!(login.status, 200, "{}", login.text());
        let csrf = cookie_of(&login, "clamp_csrf").expect("a forgery cookie");
        let value = csrf.split('=').nth(1).unwrap().to_string();
        Browser { addr, csrf, value }
    }

    /// Signs in with `token`: the answer.
    async fn sign_in(&self, token: &str) -> Resp {
        send(
            self.addr,
            Method::POST,
            "/console/login",
            Some(form(&[("csrf", &self.value), ("token", token)])),
            &[("cookie", &self.csrf)],
        )
        .await
    }

    /// A page with `session` as the session cookie: its status.
    async fn page(&self, session: &str) -> u16 {
        let cookies = format!("{session}; {}", self.csrf);
        send(
            self.addr,
            Method::GET,
            "/console/workflows",
            None,
            &[("cookie", &cookies)],
        )
        .await
        .status
        .as_u16()
    }
}

fn cookie_of(r: &Resp, name: &str) -> Option<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap().to_string())
}

/// A server whose tokens come from a file (returned, to be rewritten).
async fn with_tokens(db: &TestDb, text: &str) -> (TestServer, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("clamp-sessions-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens");
    std::fs::write(&file, text).unwrap();
    let mut cfg = config(&db.url);
    cfg.api_tokens = std::sync::Arc::new(
        clamp::tokens::ApiTokens::new(clamp::tokens::Tokens::default(), Some(file.clone()))
            .unwrap(),
    );
    cfg.session_idle = Duration::from_secs(2);
    cfg.session_max = Duration::from_secs(6);
    (TestServer::start(cfg).await, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_a_random_id_that_a_digest_cannot_stand_in_for() {
    let db = TestDb::new();
    let digest = hex(&Sha256::digest(TOKEN.as_bytes()));
    let (s, file) = with_tokens(&db, &format!("ops:admin:sha256:{digest}\n")).await;
    let b = Browser::at(s.addr).await;
    let ok = b.sign_in(TOKEN).await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    let session = cookie_of(&ok, "clamp_console").unwrap();
    assert_eq!(b.page(&session).await, 200);
    let id = session.split('=').nth(1).unwrap();
    assert_eq!(id.len(), 64);
    assert!(!id.contains(&digest));
    // What the tokens file holds, and anything derived from it as the console once did,
    // signs no one in; nor does what the session table holds.
    let mut h = Sha256::new();
    h.update(b"clamp console session\0");
    h.update(Sha256::digest(TOKEN.as_bytes()));
    let derived = hex(&h.finalize());
    let stored = hex(&Sha256::digest(id.as_bytes()));
    for forged in [&digest, &derived, &stored] {
        assert_eq!(
            b.page(&format!("clamp_console={forged}")).await,
            303,
            "{forged} was let in"
        );
    }
    // Sign-out ends the session on the server, not only in this browser.
    let out = send(
        s.addr,
        Method::POST,
        "/console/logout",
        Some(form(&[("csrf", &b.value)])),
        &[("cookie", &format!("{session}; {}", b.csrf))],
    )
    .await;
    assert_eq!(out.status, 303);
    assert_eq!(
        b.page(&session).await,
        303,
        "a signed-out session still works"
    );
    // A session ends when its token leaves the tokens file.
    std::fs::write(
        &file,
        format!("ops:admin:sha256:{digest}\nother:read:{OTHER}\n"),
    )
    .unwrap();
    let again = cookie_of(&b.sign_in(TOKEN).await, "clamp_console").unwrap();
    assert_eq!(b.page(&again).await, 200);
    std::fs::write(&file, format!("other:read:{OTHER}\n")).unwrap();
    s.server
        .as_ref()
        .unwrap()
        .app()
        .config
        .api_tokens
        .reload()
        .unwrap();
    assert_eq!(b.page(&again).await, 303, "its token is gone");
    s.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_when_idle_and_at_their_absolute_expiry() {
    let db = TestDb::new();
    let (s, file) = with_tokens(&db, &format!("ops:admin:{TOKEN}\n")).await;
    let b = Browser::at(s.addr).await;
    // Idle for longer than 2 s: gone.
    let idle = cookie_of(&b.sign_in(TOKEN).await, "clamp_console").unwrap();
    assert_eq!(b.page(&idle).await, 200);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert_eq!(
        b.page(&idle).await,
        303,
        "an idle session outlived its expiry"
    );
    // Used every half second: alive until 6 s after sign-in, then gone. The clock starts
    // before the sign-in is sent, so the server's starts no earlier: a 303 it reads after
    // 6 s of its own clock is at least 6 s on this one.
    let signed_in = std::time::Instant::now();
    let busy = cookie_of(&b.sign_in(TOKEN).await, "clamp_console").unwrap();
    while signed_in.elapsed() < Duration::from_millis(4_500) {
        assert_eq!(b.page(&busy).await, 200, "a used session ended early");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_for_seen("the absolute expiry", Duration::from_secs(10), || async {
        match b.page(&busy).await {
            303 => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert!(signed_in.elapsed() >= Duration::from_secs(6));
    s.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_sign_ins_are_limited_and_counted_not_written_to_the_audit_trail() {
    let db = TestDb::new();
    let (s, file) = with_tokens(&db, &format!("ops:admin:{TOKEN}\n")).await;
    let b = Browser::at(s.addr).await;
    let (mut refused, mut limited) = (0, 0);
    for i in 0..1_000 {
        let r = b.sign_in(&format!("guess-{i:020}")).await;
        match r.status.as_u16() {
            401 => refused += 1,
            429 => {
                limited += 1;
                assert!(r.headers.contains_key("retry-after"));
            }
            other => panic!("{other}: {}", r.text()),
        }
    }
    // The first ten of a minute are looked at; the rest are refused unlooked at.
    assert!((10..=12).contains(&refused), "{refused} looked at");
    assert_eq!(refused + limited, 1_000);
    // Even the right token waits now: the address is limited, not the token.
    assert_eq!(b.sign_in(TOKEN).await.status, 429);
    let rows = db.count("SELECT count(*) FROM audit_log").await;
    assert_eq!(rows, 0, "refused sign-ins wrote {rows} audit rows");
    let m = s.get("/metrics").await;
    let auth = format!("Bearer {TOKEN}");
    let m = if m.status == 200 {
        m
    } else {
        send(
            s.addr,
            Method::GET,
            "/metrics",
            None,
            &[("authorization", &auth)],
        )
        .await
    };
    let text = m.text();
    assert_eq!(
        metric(&text, "clamp_console_sign_ins_refused_total"),
        refused as f64
    );
    assert_eq!(
        metric(&text, "clamp_console_sign_ins_limited_total"),
        (limited + 1) as f64
    );
    s.shutdown().await;
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}
