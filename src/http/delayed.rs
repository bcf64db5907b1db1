//! Delayed creates (beyond Clamp): `POST /serviceRequest/{workflow}?startAt=<RFC 3339>` or
//! `?delayMs=N` asks for a NEW request that nothing runs before its time (`ops::create`
//! stores it; any instance's sweeper claims it then). Read here from the query; a time
//! already past starts at once, as a plain create.

use std::time::{Duration, SystemTime};

use hyper::StatusCode;

use super::response::{error, Resp};

/// The furthest ahead a request may be asked to start.
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 86_400);

/// When the create asks to start: None for at once (no parameter, or a time already past);
/// 400 for a time that cannot be read, both parameters, or one beyond `MAX_DELAY`.
pub fn start_time(q: &str, now: SystemTime) -> Result<Option<SystemTime>, Resp> {
    let at = super::query_param(Some(q), "startAt");
    let delay = super::query_param(Some(q), "delayMs");
    let start =
        match (at, delay) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "startAt and delayMs: give one of them, not both",
                ))
            }
            (Some(at), None) => match chrono::DateTime::parse_from_rfc3339(&at) {
                Ok(t) => SystemTime::from(t),
                Err(_) => return Err(error(
                    StatusCode::BAD_REQUEST,
                    "startAt: must be an RFC 3339 time with its offset, like 2026-12-24T18:00:00Z",
                )),
            },
            (None, Some(ms)) => match ms.parse::<u64>() {
                Ok(ms) if Duration::from_millis(ms) <= MAX_DELAY => now + Duration::from_millis(ms),
                _ => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "delayMs: must be a whole number of milliseconds from 0 to {}",
                            MAX_DELAY.as_millis()
                        ),
                    ))
                }
            },
        };
    if start.duration_since(now).is_ok_and(|d| d > MAX_DELAY) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "startAt: at most 366 days ahead",
        ));
    }
    Ok((start > now).then_some(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(q: &str) -> Result<Option<SystemTime>, u16> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        start_time(q, now).map_err(|r| r.status().as_u16())
    }

    #[test]
    fn reads_the_start_a_create_asks_for() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(at("version=2"), Ok(None));
        assert_eq!(at("delayMs=0"), Ok(None));
        assert_eq!(
            at("delayMs=1500"),
            Ok(Some(now + Duration::from_millis(1500)))
        );
        // 1_800_000_000 s is 2027-01-15T08:00:00Z; an offset is honoured.
        assert_eq!(
            at("startAt=2027-01-15T09:00:01%2B01:00"),
            Ok(Some(now + Duration::from_secs(1)))
        );
        assert_eq!(
            at("startAt=2020-01-01T00:00:00Z"),
            Ok(None),
            "past: at once"
        );
    }

    #[test]
    fn refuses_what_cannot_be_read_or_is_too_far() {
        assert_eq!(at("startAt=tomorrow"), Err(400));
        assert_eq!(at("startAt=2027-01-15T09:00:00"), Err(400), "no offset");
        assert_eq!(at("delayMs=-5"), Err(400));
        assert_eq!(at("delayMs=soon"), Err(400));
        assert_eq!(at("delayMs=1&startAt=2027-01-15T09:00:00Z"), Err(400));
        assert_eq!(
            at(&format!("delayMs={}", MAX_DELAY.as_millis() + 1)),
            Err(400)
        );
        assert_eq!(at("startAt=2029-01-15T09:00:00Z"), Err(400));
    }
}
