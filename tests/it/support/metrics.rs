//! Reading the server's metrics: one value out of a Prometheus text exposition.

/// The value of the first line of a metrics exposition that starts with `line_start`
/// (0 when there is none).
pub fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}
