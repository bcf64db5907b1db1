//! The outcome of one attempt of a step's call (HTTP, AMQP publish, Kafka produce), with
//! the class the step's retry policy decides on.

use std::time::{Duration, SystemTime};

use crate::workflow::RetryPolicy;

/// What went wrong with one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallErrorKind {
    /// No connection: refused, unreachable, or the connect timeout passed.
    Connect,
    /// The connection broke during the exchange (reset, closed before the answer).
    Broken,
    /// No answer within the attempt's timeout.
    Timeout,
    /// The call waited too long for a free slot to its downstream host.
    Queued,
    /// The downstream answered with this non-2xx status.
    Status(u16),
    /// A broker could not be reached, dropped the connection or did not confirm.
    BrokerAway,
    /// A broker answered no (unroutable message, no such topic).
    Refused,
    /// The TLS handshake failed a check (a certificate not trusted, for another host,
    /// expired; a client certificate wanted or refused): permanent, as a 4xx is.
    Tls,
    /// The request's deadline passed (beyond Clamp): never tried again.
    Deadline,
    /// Anything else trying again cannot fix (a response too large or not HTTP).
    Other,
}

/// A failed attempt: its kind, the reason as recorded, and how long the downstream asked
/// to be left alone (`Retry-After`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub kind: CallErrorKind,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl CallError {
    pub fn new(kind: CallErrorKind, message: impl Into<String>) -> CallError {
        CallError {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Whether `policy` tries the call again after this failure (attempts permitting).
    /// Transport failures always are; a status only when the policy lists it (by default
    /// 429, 502, 503 and 504, never 500); a refusal or a malformed answer never.
    pub fn retryable(&self, policy: &RetryPolicy) -> bool {
        match self.kind {
            CallErrorKind::Connect
            | CallErrorKind::Broken
            | CallErrorKind::Timeout
            | CallErrorKind::Queued
            | CallErrorKind::BrokerAway => true,
            CallErrorKind::Status(s) => policy.retries_status(s),
            CallErrorKind::Refused
            | CallErrorKind::Tls
            | CallErrorKind::Deadline
            | CallErrorKind::Other => false,
        }
    }

    /// Whether the back-off applies before the next attempt. An attempt that timed out
    /// (or waited out its turn for the host) already waited its whole timeout, so the next
    /// one starts at once: a step that keeps timing out takes at most attempts × timeout.
    pub fn backs_off(&self) -> bool {
        !matches!(self.kind, CallErrorKind::Timeout | CallErrorKind::Queued)
    }

    /// The metric label of the cause (a fixed set).
    pub fn cause(&self) -> &'static str {
        match self.kind {
            CallErrorKind::Connect => "connect",
            CallErrorKind::Broken => "broken",
            CallErrorKind::Timeout => "timeout",
            CallErrorKind::Queued => "queued",
            CallErrorKind::Status(_) => "status",
            CallErrorKind::BrokerAway | CallErrorKind::Refused => "broker",
            CallErrorKind::Tls => "tls",
            CallErrorKind::Deadline => "deadline",
            CallErrorKind::Other => "other",
        }
    }
}

/// Reads a `Retry-After` value: delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_policy() {
        let p = RetryPolicy::default();
        let e = |k| CallError::new(k, "x");
        for k in [
            CallErrorKind::Connect,
            CallErrorKind::Broken,
            CallErrorKind::Timeout,
            CallErrorKind::Queued,
            CallErrorKind::BrokerAway,
            CallErrorKind::Status(429),
            CallErrorKind::Status(502),
            CallErrorKind::Status(503),
            CallErrorKind::Status(504),
        ] {
            assert!(e(k).retryable(&p), "{k:?}");
        }
        for k in [
            CallErrorKind::Status(500),
            CallErrorKind::Status(400),
            CallErrorKind::Status(404),
            CallErrorKind::Status(409),
            CallErrorKind::Refused,
            CallErrorKind::Tls,
            CallErrorKind::Other,
        ] {
            assert!(!e(k).retryable(&p), "{k:?}");
        }
        assert!(!e(CallErrorKind::Timeout).backs_off());
        assert!(e(CallErrorKind::Status(503)).backs_off());
    }

    #[test]
    fn reads_retry_after() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
