//! Waiting for a condition: tests wait for the event they need, within a bound, never for
//! a fixed time. `wait_for` polls an async check; `wait_for_seen` also names what was
//! seen instead when the time runs out; `wait_for_blocking` is for plain threads that
//! cannot await (a broker started from a `std::thread`, say).

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a check is made again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Some` or `within` passes (then panics, naming `what`):
/// tests wait for the event they need, not for a fixed time.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_seen(what, within, || {
        let seen = check();
        async move { seen.await.ok_or("") }
    })
    .await
}

/// Polls `check` until it returns `Ok` or `within` passes; then panics naming `what` and
/// the last `Err`, which says what was seen instead (the last answer, a count so far).
pub async fn wait_for_seen<T, E, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            timed_out(what, within, &last);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `wait_for` for code that cannot await: blocks the calling thread between checks.
pub fn wait_for_blocking<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            timed_out(what, within, &"");
        }
        std::thread::sleep(POLL);
    }
}

fn timed_out(what: &str, within: Duration, last: &dyn Display) -> ! {
    let last = last.to_string();
    if last.is_empty() {
        panic!("timed out after {within:?} waiting for {what}");
    }
    panic!("timed out after {within:?} waiting for {what}; last seen: {last}");
}
