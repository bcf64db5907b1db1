//! Waiting for a condition: tests wait for the event they need, within a bound, never for
//! a fixed time.

use std::time::Duration;

/// Polls `check` until it returns `Some` or `within` passes (then panics, naming `what`):
/// tests wait for the event they need, not for a fixed time.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
