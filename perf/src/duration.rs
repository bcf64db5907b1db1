//! Parsing of human durations on the command line (`15s`, `500ms`, `2m`).

use std::time::Duration;

/// Parses `N`, `Nus`, `Nms`, `Ns`, `Nm` (fractions allowed); a bare number
/// means seconds because that is what run lengths are usually given in.
pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?} (try 15s, 500ms, 2m)"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        other => return Err(format!("unknown duration unit {other:?} in {text:?}")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {text:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse("15").unwrap(), Duration::from_secs(15));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("250us").unwrap(), Duration::from_micros(250));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("").is_err());
        assert!(parse("fast").is_err());
        assert!(parse("10h").is_err());
    }
}
