//! Step retry policies: the `retry` object of a step definition (Temporal's vocabulary),
//! the server default it falls back on, and the back-off between attempts.
//!
//! Pure arithmetic: which failures a policy retries is decided by the engine from the
//! failure's class; here is only how many attempts, how long to wait, and which HTTP
//! statuses count as "try again".

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// A step's `retry` object as written in a workflow definition. Every field is optional:
/// what is left out comes from the server's default policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included (1: never retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Wait before the second attempt, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval_ms: Option<u64>,
    /// Each further wait is the previous one times this (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_coefficient: Option<f64>,
    /// The longest wait between attempts, in milliseconds; also the most a `Retry-After`
    /// is honoured for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval_ms: Option<u64>,
    /// HTTP statuses that are retried (replacing the default 429, 502, 503, 504).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable_status_codes: Option<Vec<u16>>,
}

/// A complete policy: a step's `RetrySpec` over the server default.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_interval: Duration,
    pub backoff_coefficient: f64,
    pub max_interval: Duration,
    pub retryable_status_codes: Vec<u16>,
}

/// Statuses retried unless a step says otherwise: too many requests and the gateway
/// family. 500 is not among them, so a step answered 500 is called once (Clamp's
/// behaviour), then its `onFailure` steps run.
pub const DEFAULT_RETRYABLE_STATUSES: [u16; 4] = [429, 502, 503, 504];

/// Most attempts a policy may ask for.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;

/// Longest interval a policy may ask for: a day.
pub const MAX_INTERVAL_LIMIT_MS: u64 = 86_400_000;

impl Default for RetryPolicy {
    /// A failing step's verdict stays prompt: a downstream that refuses every connection
    /// fails the step after about 0.6 s (three attempts), one that keeps timing out after
    /// three timeouts.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval: Duration::from_millis(200),
            backoff_coefficient: 2.0,
            max_interval: Duration::from_secs(2),
            retryable_status_codes: DEFAULT_RETRYABLE_STATUSES.to_vec(),
        }
    }
}

impl RetrySpec {
    /// Checks the values; `at` names the step in the message.
    pub fn check(&self, at: &str) -> Result<(), ValidationError> {
        let bad = |m: String| Err(ValidationError(m));
        if let Some(n) = self.max_attempts {
            if !(1..=MAX_ATTEMPTS_LIMIT).contains(&n) {
                return bad(format!(
                    "{at}.retry.maxAttempts must be 1 to {MAX_ATTEMPTS_LIMIT}"
                ));
            }
        }
        for (name, v) in [
            ("initialIntervalMs", self.initial_interval_ms),
            ("maxIntervalMs", self.max_interval_ms),
        ] {
            if v.is_some_and(|v| v > MAX_INTERVAL_LIMIT_MS) {
                return bad(format!(
                    "{at}.retry.{name} must be at most {MAX_INTERVAL_LIMIT_MS}"
                ));
            }
        }
        if let Some(c) = self.backoff_coefficient {
            if !(1.0..=100.0).contains(&c) {
                return bad(format!(
                    "{at}.retry.backoffCoefficient must be from 1 to 100"
                ));
            }
        }
        if let (Some(i), Some(m)) = (self.initial_interval_ms, self.max_interval_ms) {
            if m < i {
                return bad(format!(
                    "{at}.retry.maxIntervalMs must not be less than initialIntervalMs"
                ));
            }
        }
        if let Some(codes) = &self.retryable_status_codes {
            if let Some(c) = codes.iter().find(|c| !(100..=599).contains(*c)) {
                return bad(format!(
                    "{at}.retry.retryableStatusCodes: {c} is not an HTTP status"
                ));
            }
        }
        Ok(())
    }

    /// This spec with what it leaves out taken from `default`.
    pub fn over(&self, default: &RetryPolicy) -> RetryPolicy {
        let initial_interval = self
            .initial_interval_ms
            .map_or(default.initial_interval, Duration::from_millis);
        let max_interval = self
            .max_interval_ms
            .map_or(default.max_interval, Duration::from_millis)
            .max(initial_interval);
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(default.max_attempts),
            initial_interval,
            backoff_coefficient: self
                .backoff_coefficient
                .unwrap_or(default.backoff_coefficient),
            max_interval,
            retryable_status_codes: self
                .retryable_status_codes
                .clone()
                .unwrap_or_else(|| default.retryable_status_codes.clone()),
        }
    }
}

impl RetryPolicy {
    /// Whether an answer with this HTTP status is tried again.
    pub fn retries_status(&self, status: u16) -> bool {
        self.retryable_status_codes.contains(&status)
    }

    /// The wait before the next attempt, after `attempts_made` attempts (≥ 1) failed.
    ///
    /// Exponential (`initial × coefficient^(attempts_made − 1)`, capped at the maximum
    /// interval) with "equal jitter": uniformly between half and all of it (`jitter` in
    /// [0, 1)), so that requests failed together by one outage do not come back together.
    /// A `Retry-After` the downstream sent is honoured up to the maximum interval.
    pub fn backoff(
        &self,
        attempts_made: u32,
        jitter: f64,
        retry_after: Option<Duration>,
    ) -> Duration {
        let exp = attempts_made.saturating_sub(1).min(64) as i32;
        let max = self.max_interval.as_secs_f64();
        let base =
            (self.initial_interval.as_secs_f64() * self.backoff_coefficient.powi(exp)).min(max);
        let jittered = Duration::from_secs_f64(base * (0.5 + 0.5 * jitter.clamp(0.0, 1.0)));
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.max_interval)),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = RetryPolicy::default();
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(p.backoff(1, 1.0, None)), 200);
        assert_eq!(ms(p.backoff(1, 0.0, None)), 100);
        assert_eq!(ms(p.backoff(2, 1.0, None)), 400);
        assert_eq!(ms(p.backoff(5, 1.0, None)), 2000);
        assert_eq!(ms(p.backoff(50, 1.0, None)), 2000);
        assert_eq!(ms(p.backoff(50, 0.0, None)), 1000);
        // Retry-After is honoured up to the maximum interval, never shortens the wait.
        assert_eq!(ms(p.backoff(1, 1.0, Some(Duration::from_secs(1)))), 1000);
        assert_eq!(ms(p.backoff(1, 1.0, Some(Duration::from_secs(60)))), 2000);
        assert_eq!(ms(p.backoff(2, 1.0, Some(Duration::ZERO))), 400);
    }

    #[test]
    fn the_default_gives_up_on_a_refusing_downstream_within_ten_seconds() {
        let p = RetryPolicy::default();
        let waits: Duration = (1..p.max_attempts).map(|n| p.backoff(n, 1.0, None)).sum();
        assert!(waits < Duration::from_secs(10), "{waits:?}");
        assert!(!p.retries_status(500) && p.retries_status(503));
    }

    #[test]
    fn a_spec_overrides_only_what_it_names() {
        let spec: RetrySpec =
            serde_json::from_str(r#"{"maxAttempts": 5, "retryableStatusCodes": [500]}"#).unwrap();
        let p = spec.over(&RetryPolicy::default());
        assert_eq!(p.max_attempts, 5);
        assert_eq!(p.initial_interval, Duration::from_millis(200));
        assert!(p.retries_status(500) && !p.retries_status(503));
        assert!(serde_json::from_str::<RetrySpec>(r#"{"attempts": 5}"#).is_err());
    }

    #[test]
    fn checks_values() {
        let bad = |json: &str| {
            serde_json::from_str::<RetrySpec>(json)
                .unwrap()
                .check("steps[0]")
                .unwrap_err()
                .0
        };
        assert!(bad(r#"{"maxAttempts": 0}"#).contains("maxAttempts"));
        assert!(bad(r#"{"backoffCoefficient": 0.5}"#).contains("backoffCoefficient"));
        assert!(
            bad(r#"{"initialIntervalMs": 500, "maxIntervalMs": 100}"#).contains("maxIntervalMs")
        );
        assert!(bad(r#"{"retryableStatusCodes": [99]}"#).contains("99"));
        assert!(serde_json::from_str::<RetrySpec>(r#"{"maxAttempts": 1}"#)
            .unwrap()
            .check("s")
            .is_ok());
    }
}
