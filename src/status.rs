//! The statuses of service requests and of their steps: one definition of each, their
//! spelling (Clamp's, in answers and in Postgres), what "final" and "finished" mean, and
//! their Postgres form (`text`). No status is spelled anywhere else: SQL takes them from
//! `status_sql!`.

use std::fmt;

use postgres_types::{accepts, to_sql_checked, FromSql, IsNull, ToSql, Type};

/// Where a service request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestStatus {
    /// Created, no step written yet; also the stored status between steps (the update
    /// after a step leaves it, so that update is HOT).
    New,
    /// Running: never stored, derived by reads from a live lease or a step past the first.
    InProgress,
    /// Waiting for an ASYNC step's answer (or a child request).
    Paused,
    /// Answered, and running again from the next step.
    Resumed,
    Completed,
    Failed,
    Cancelled,
}

use RequestStatus as R;

impl RequestStatus {
    /// Every status a request can show, in the order lists show them.
    pub const ALL: [RequestStatus; 7] = [
        R::New,
        R::InProgress,
        R::Paused,
        R::Resumed,
        R::Completed,
        R::Failed,
        R::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            R::New => "NEW",
            R::InProgress => "IN_PROGRESS",
            R::Paused => "PAUSED",
            R::Resumed => "RESUMED",
            R::Completed => "COMPLETED",
            R::Failed => "FAILED",
            R::Cancelled => "CANCELLED",
        }
    }

    /// The status spelled `s`, if it is one.
    pub fn parse(s: &str) -> Option<RequestStatus> {
        R::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// COMPLETED or FAILED: the run ended, and its answer does not change on its own (a
    /// FAILED one only by a retry). A CANCELLED one may still record the outcome of a
    /// step that was in flight.
    pub const fn is_final(self) -> bool {
        matches!(self, R::Completed | R::Failed)
    }

    /// COMPLETED, FAILED or CANCELLED: no step of it starts any more (unless a retry
    /// continues it).
    pub const fn is_finished(self) -> bool {
        matches!(self, R::Completed | R::Failed | R::Cancelled)
    }

    /// COMPLETED: nothing changes it any more, so its answer may be kept as it is.
    pub const fn never_changes(self) -> bool {
        matches!(self, R::Completed)
    }

    /// FAILED or CANCELLED: what a retry (or a bulk retry) takes.
    pub const fn is_retryable(self) -> bool {
        matches!(self, R::Failed | R::Cancelled)
    }
}

/// The status an idempotent create answers for its original request when retention has
/// deleted that request since (beyond Clamp).
pub const DELETED: &str = "DELETED";

/// What one step attempt came to, as its record holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepStatus {
    /// Sent, its outcome not known yet (an ASYNC step waiting for its answer).
    Started,
    Completed,
    Failed,
    /// Its `when` was false.
    Skipped,
}

use StepStatus as S;

impl StepStatus {
    pub const ALL: [StepStatus; 4] = [S::Started, S::Completed, S::Failed, S::Skipped];

    pub const fn as_str(self) -> &'static str {
        match self {
            S::Started => "STARTED",
            S::Completed => "COMPLETED",
            S::Failed => "FAILED",
            S::Skipped => "SKIPPED",
        }
    }

    pub fn parse(s: &str) -> Option<StepStatus> {
        S::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// COMPLETED or SKIPPED: the step is behind the request (a rerun may copy it).
    pub const fn is_done(self) -> bool {
        matches!(self, S::Completed | S::Skipped)
    }
}

impl fmt::Display for RequestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status column that holds something no release writes.
#[derive(Debug, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(String);

macro_rules! text_sql {
    ($t:ty) => {
        impl ToSql for $t {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut bytes::BytesMut,
            ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }
            accepts!(TEXT, VARCHAR);
            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $t {
            fn from_sql(
                ty: &Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                let s = <&str as FromSql>::from_sql(ty, raw)?;
                Ok(<$t>::parse(s).ok_or_else(|| UnknownStatus(s.to_string()))?)
            }
            accepts!(TEXT, VARCHAR);
        }
    };
}

text_sql!(RequestStatus);
text_sql!(StepStatus);

/// A status as a quoted SQL literal, for statements built with `concat!`:
/// `status_sql!(Completed)` is `'COMPLETED'`.
macro_rules! status_sql {
    (New) => {
        "'NEW'"
    };
    (InProgress) => {
        "'IN_PROGRESS'"
    };
    (Paused) => {
        "'PAUSED'"
    };
    (Resumed) => {
        "'RESUMED'"
    };
    (Completed) => {
        "'COMPLETED'"
    };
    (Failed) => {
        "'FAILED'"
    };
    (Cancelled) => {
        "'CANCELLED'"
    };
    (Started) => {
        "'STARTED'"
    };
    (Skipped) => {
        "'SKIPPED'"
    };
    // The statuses a request ends in, as a list for `IN (…)`.
    (Finished) => {
        "'COMPLETED', 'FAILED', 'CANCELLED'"
    };
    // The statuses of a request not yet finished, as a list for `IN (…)`.
    (Unfinished) => {
        "'NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED'"
    };
}
pub(crate) use status_sql;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in RequestStatus::ALL {
            assert_eq!(RequestStatus::parse(s.as_str()), Some(s));
        }
        for s in StepStatus::ALL {
            assert_eq!(StepStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(RequestStatus::parse("STARTED"), None);
        assert_eq!(StepStatus::parse("PAUSED"), None);
        let quoted = |s: &str| format!("'{s}'");
        assert_eq!(status_sql!(New), quoted(R::New.as_str()));
        assert_eq!(status_sql!(InProgress), quoted(R::InProgress.as_str()));
        assert_eq!(status_sql!(Paused), quoted(R::Paused.as_str()));
        assert_eq!(status_sql!(Resumed), quoted(R::Resumed.as_str()));
        assert_eq!(status_sql!(Completed), quoted(R::Completed.as_str()));
        assert_eq!(status_sql!(Failed), quoted(R::Failed.as_str()));
        assert_eq!(status_sql!(Cancelled), quoted(R::Cancelled.as_str()));
        assert_eq!(status_sql!(Started), quoted(S::Started.as_str()));
        assert_eq!(status_sql!(Skipped), quoted(S::Skipped.as_str()));
        let finished: Vec<String> = R::ALL
            .into_iter()
            .filter(|s| s.is_finished())
            .map(|s| quoted(s.as_str()))
            .collect();
        assert_eq!(status_sql!(Finished), finished.join(", "));
    }

    #[test]
    fn final_finished_and_kept_are_apart() {
        let pick = |f: fn(RequestStatus) -> bool| -> Vec<&str> {
            R::ALL
                .into_iter()
                .filter(|s| f(*s))
                .map(R::as_str)
                .collect()
        };
        assert_eq!(pick(R::is_final), ["COMPLETED", "FAILED"]);
        assert_eq!(pick(R::is_finished), ["COMPLETED", "FAILED", "CANCELLED"]);
        assert_eq!(pick(R::never_changes), ["COMPLETED"]);
        assert_eq!(pick(R::is_retryable), ["FAILED", "CANCELLED"]);
    }
}
