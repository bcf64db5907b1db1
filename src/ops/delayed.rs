//! Delayed creates (beyond Clamp): `POST /serviceRequest/{workflow}?startAt=<RFC 3339>` or
//! `?delayMs=N` asks for a NEW request that nothing runs before its time (`ops::create`
//! stores it; any instance's sweeper claims it then). Judged here from the query's two
//! texts; a time already past starts at once, as a plain create.

use std::time::{Duration, SystemTime};

use super::{OpError, Result};

/// The furthest ahead a request may be asked to start.
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 86_400);

/// When the create asks to start, from its `startAt` and `delayMs`: None for at once
/// (neither, or a time already past); 400 for a time that cannot be read, both, or one
/// beyond `MAX_DELAY`.
pub fn start_time(
    at: Option<&str>,
    delay: Option<&str>,
    now: SystemTime,
) -> Result<Option<SystemTime>> {
    let bad = |m: &str| Err(OpError::BadRequest(m.to_string()));
    let start =
        match (at, delay) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => return bad("startAt and delayMs: give one of them, not both"),
            (Some(at), None) => match chrono::DateTime::parse_from_rfc3339(at) {
                Ok(t) => SystemTime::from(t),
                Err(_) => return bad(
                    "startAt: must be an RFC 3339 time with its offset, like 2026-12-24T18:00:00Z",
                ),
            },
            (None, Some(ms)) => match ms.parse::<u64>() {
                Ok(ms) if Duration::from_millis(ms) <= MAX_DELAY => now + Duration::from_millis(ms),
                _ => {
                    return bad(&format!(
                        "delayMs: must be a whole number of milliseconds from 0 to {}",
                        MAX_DELAY.as_millis()
                    ))
                }
            },
        };
    if start.duration_since(now).is_ok_and(|d| d > MAX_DELAY) {
        return bad("startAt: at most 366 days ahead");
    }
    Ok((start > now).then_some(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(q: &str) -> std::result::Result<Option<SystemTime>, u16> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let param = |k: &str| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.into_owned())
        };
        let (a, d) = (param("startAt"), param("delayMs"));
        start_time(a.as_deref(), d.as_deref(), now).map_err(|e| e.status())
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
