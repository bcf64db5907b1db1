//! `--plot`: self-contained SVG line charts, written by hand so the tool
//! needs no font or image libraries (text is left to the viewer's fonts).

use crate::findmax::Step;
use std::fmt::Write;

const W: f64 = 820.0;
const H: f64 = 480.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// About five round-numbered ticks (1, 2 or 5 times a power of ten)
/// covering `[lo, hi]`.
pub fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::EPSILON);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut ticks = Vec::new();
    let mut t = first;
    while t <= hi + step * 1e-9 {
        ticks.push(t);
        t += step;
    }
    ticks
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

pub fn render(c: &Chart) -> String {
    let pts = c.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        if !c.log_y || y > 0.0 {
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if y0 > y1 {
        (y0, y1) = (1.0, 10.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    // Axes: linear x from 0 when data is positive; y linear from 0 or log
    // over whole decades.
    let x0 = if x0 >= 0.0 { 0.0 } else { x0 };
    let (ylo, yhi, yticks) = if c.log_y {
        let lo = y0.max(1e-3).log10().floor();
        let hi = y1.max(1e-3).log10().ceil().max(lo + 1.0);
        // Over a short span whole decades alone leave the axis unreadable.
        let steps: &[f64] = if hi - lo <= 2.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let ticks = (lo as i32..=hi as i32)
            .flat_map(|e| steps.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|t| t.log10() <= hi + 1e-9)
            .collect();
        (lo, hi, ticks)
    } else {
        let hi = if y1 <= 0.0 { 1.0 } else { y1 * 1.05 };
        (0.0, hi, nice_ticks(0.0, hi))
    };
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| {
        let v = if c.log_y { y.max(1e-3).log10() } else { y };
        TOP + ph - (v - ylo) / (yhi - ylo) * ph
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        escape(&c.title)
    );
    for t in nice_ticks(x0, x1) {
        let x = sx(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            label(t)
        );
    }
    for t in yticks {
        let y = sy(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            label(t)
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 14.0,
        escape(&c.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        escape(&c.y_label)
    );
    for (i, series) in c.series.iter().enumerate() {
        let coords: Vec<String> = series
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let dash = if series.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            series.color,
            coords.join(" ")
        );
        if !series.dashed && series.points.len() <= 60 {
            for &(x, y) in &series.points {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                    sx(x),
                    sy(y),
                    series.color
                );
            }
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            series.color,
            lx + 26.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// find-max: latency percentiles (ms, log scale) against offered rate,
/// with the SLO and the rate found marked.
pub fn latency_vs_rate(title: &str, steps: &[Step], slo_us: u64, max_rate: Option<f64>) -> String {
    let mut sorted: Vec<&Step> = steps.iter().collect();
    sorted.sort_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
    let line = |f: fn(&Step) -> u64| -> Vec<(f64, f64)> {
        sorted
            .iter()
            .map(|s| (s.offered_rate, f(s) as f64 / 1e3))
            .collect()
    };
    let (lo, hi) = sorted
        .first()
        .zip(sorted.last())
        .map_or((0.0, 1.0), |(a, b)| (a.offered_rate, b.offered_rate));
    let slo = slo_us as f64 / 1e3;
    let mut all = vec![
        series("p50", "#1f77b4", line(|s| s.p50_us)),
        series("p99", "#d62728", line(|s| s.p99_us)),
        series("p99.9", "#9467bd", line(|s| s.p999_us)),
        Series {
            name: "p99 SLO".into(),
            color: "#555555",
            points: vec![(lo, slo), (hi, slo)],
            dashed: true,
        },
    ];
    if let Some(rate) = max_rate {
        // Spans the plotted latencies so it does not stretch the y axis.
        let lats = sorted.iter().flat_map(|s| [s.p50_us, s.p999_us, slo_us]);
        let (min, max) = lats.fold((u64::MAX, 0), |(a, b), v| (a.min(v), b.max(v)));
        all.push(Series {
            name: format!("max {rate:.0}/s"),
            color: "#2ca02c",
            points: vec![(rate, min.max(1) as f64 / 1e3), (rate, max as f64 / 1e3)],
            dashed: true,
        });
    }
    render(&Chart {
        title: title.to_string(),
        x_label: "offered rate (req/s)".into(),
        y_label: "latency (ms, log scale)".into(),
        log_y: true,
        series: all,
    })
}

/// Fixed-rate run: successful operations per second over the window.
pub fn throughput_over_time(title: &str, per_second: &[u64], offered: Option<f64>) -> String {
    let points: Vec<(f64, f64)> = per_second
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as f64 + 1.0, n as f64))
        .collect();
    let mut all = vec![series("achieved", "#1f77b4", points)];
    if let Some(rate) = offered {
        all.push(Series {
            name: "offered".into(),
            color: "#555555",
            points: vec![(1.0, rate), (per_second.len().max(1) as f64, rate)],
            dashed: true,
        });
    }
    render(&Chart {
        title: title.to_string(),
        x_label: "time (s)".into(),
        y_label: "operations per second".into(),
        log_y: false,
        series: all,
    })
}

fn series(name: &str, color: &'static str, points: Vec<(f64, f64)>) -> Series {
    Series {
        name: name.into(),
        color,
        points,
        dashed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: f64, p99: u64) -> Step {
        Step {
            offered_rate: rate,
            achieved_rate: rate,
            errors: 0,
            p50_us: p99 / 4,
            p99_us: p99,
            p999_us: p99 * 2,
            pass: true,
            reason: String::new(),
        }
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(0.0, 23_000.0).len(), 5);
        assert_eq!(nice_ticks(0.0, 23_000.0)[1], 5_000.0);
    }

    #[test]
    fn find_max_chart_has_three_percentiles_and_slo() {
        let steps = [step(2000.0, 900), step(1000.0, 500)];
        let svg = latency_vs_rate("a < b", &steps, 10_000, Some(2000.0));
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert!(svg.contains("max 2000/s"));
        assert!(svg.contains("a &lt; b"));
        assert!(svg.contains("p99.9"));
    }

    #[test]
    fn throughput_chart_plots_each_second() {
        let svg = throughput_over_time("t", &[10, 12, 11], Some(12.0));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("<polyline").count(), 2);
        let empty = throughput_over_time("t", &[], None);
        assert!(empty.contains("</svg>"));
    }
}
