//! The two plots, drawn on the server as SVG (no script): a request's step timeline to
//! scale, and requests created per minute by status.

use maud::{html, Markup};

use super::layout::{css_status, ms_time};
use crate::ops::lists::Bucket;
use crate::status::{RequestStatus, StepStatus};

/// One bar of a timeline: a step attempt from its start to its end.
pub struct Bar {
    pub label: String,
    pub status: StepStatus,
    pub start_ms: f64,
    /// None: still running (drawn to `now`).
    pub end_ms: Option<f64>,
    /// A record copied from the request a rerun reruns (drawn faint).
    pub copied: bool,
}

const W: f64 = 1000.0;
const LEFT: f64 = 210.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 26.0;
const TOP: f64 = 28.0;

fn f(x: f64) -> String {
    format!("{x:.1}")
}

/// A duration for people: `0.4 ms`, `850 ms`, `2.4 s`, `3 min 5 s`.
pub fn duration(ms: f64) -> String {
    if ms < 10.0 && ms.fract() != 0.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{} ms", ms.round() as i64)
    } else if ms < 60_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        let s = (ms / 1000.0).round() as i64;
        format!("{} min {} s", s / 60, s % 60)
    }
}

/// The steps of a request on one time axis, from its first start.
pub fn timeline(bars: &[Bar], now_ms: f64) -> Markup {
    if bars.is_empty() {
        return html! { p.muted { "No step has run yet." } };
    }
    let t0 = bars
        .iter()
        .map(|b| b.start_ms)
        .fold(f64::INFINITY, f64::min);
    let t1 = bars
        .iter()
        .map(|b| b.end_ms.unwrap_or(now_ms).max(b.start_ms))
        .fold(t0, f64::max);
    let span = (t1 - t0).max(1.0);
    let scale = (W - LEFT - RIGHT) / span;
    let h = TOP + ROW * bars.len() as f64 + 8.0;
    let ticks = 4;
    html! {
        div.scroll { svg.chart.timeline viewBox={ "0 0 " (W) " " (f(h)) } role="img"
            aria-label="Step timeline" {
            @for i in 0..=ticks {
                @let x = LEFT + (W - LEFT - RIGHT) * i as f64 / ticks as f64;
                line x1=(f(x)) x2=(f(x)) y1="18" y2=(f(h - 4.0)) {}
                text x=(f(x)) y="13" text-anchor="middle" {
                    (duration(span * i as f64 / ticks as f64))
                }
            }
            @for (i, b) in bars.iter().enumerate() {
                @let y = TOP + ROW * i as f64;
                @let x = LEFT + (b.start_ms - t0) * scale;
                @let end = b.end_ms.unwrap_or(now_ms).max(b.start_ms);
                @let w = ((end - b.start_ms) * scale).max(2.0);
                text.label x=(f(LEFT - 8.0)) y=(f(y + 15.0)) text-anchor="end" {
                    (truncate(&b.label, 28))
                }
                rect x=(f(x)) y=(f(y + 3.0)) width=(f(w)) height=(f(ROW - 8.0)) rx="3"
                    class={ "st-" (css_status(b.status.as_str())) @if b.copied { " copied" } } {
                    title {
                        (b.label) ": " (b.status.as_str()) ", " (duration(end - b.start_ms))
                        ", from " (ms_time(b.start_ms))
                        @if b.copied { " (copied, not called)" }
                        @if b.end_ms.is_none() { " (not finished)" }
                    }
                }
            }
        } }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// The order statuses stack in, bottom up.
const STACK: [RequestStatus; 7] = [
    RequestStatus::Completed,
    RequestStatus::InProgress,
    RequestStatus::Resumed,
    RequestStatus::New,
    RequestStatus::Paused,
    RequestStatus::Cancelled,
    RequestStatus::Failed,
];

/// Requests created per minute, stacked by status, over `minutes` minutes starting at
/// `first_minute` (seconds since the epoch, a whole minute).
pub fn per_minute(buckets: &[Bucket], first_minute: i64, minutes: usize) -> Markup {
    let minutes = minutes.max(1);
    let mut cols = vec![[0i64; STACK.len()]; minutes];
    for b in buckets {
        let i = (b.minute - first_minute) / 60;
        if i < 0 || i as usize >= minutes {
            continue;
        }
        let k = STACK.iter().position(|s| *s == b.status).unwrap_or(3);
        cols[i as usize][k] += b.count;
    }
    let max = nice_max(
        cols.iter()
            .map(|c| c.iter().sum::<i64>())
            .max()
            .unwrap_or(0),
    );
    let (h, left, bottom) = (220.0, 56.0, 24.0);
    let plot_h = h - bottom - 12.0;
    let col_w = (W - left - RIGHT) / minutes as f64;
    let minute_label = |i: usize| {
        chrono::DateTime::<chrono::Utc>::from_timestamp(first_minute + 60 * i as i64, 0)
            .map(|t| t.format("%H:%M").to_string())
            .unwrap_or_default()
    };
    // Each status's block of each minute, stacked bottom up: (x, y, w, h, status, title).
    let mut rects = Vec::new();
    for (i, col) in cols.iter().enumerate() {
        let x = left + col_w * i as f64;
        let mut base = 0i64;
        for (k, &n) in col.iter().enumerate() {
            if n == 0 {
                continue;
            }
            base += n;
            let y = 12.0 + plot_h * (1.0 - base as f64 / max as f64);
            let bh = (plot_h * n as f64 / max as f64).max(0.5);
            let title = format!("{} UTC: {n} {}", minute_label(i), STACK[k].as_str());
            rects.push((
                x + col_w * 0.1,
                y,
                (col_w * 0.8).max(1.0),
                bh,
                STACK[k].as_str(),
                title,
            ));
        }
    }
    html! {
        div.scroll { svg.chart.per-minute viewBox={ "0 0 " (W) " " (h) } role="img"
            aria-label="Requests per minute by status" {
            @for frac in [0.0, 0.5, 1.0] {
                @let y = 12.0 + plot_h * (1.0 - frac);
                line x1=(left) x2=(f(W - RIGHT)) y1=(f(y)) y2=(f(y)) {}
                text x=(f(left - 6.0)) y=(f(y + 4.0)) text-anchor="end" {
                    (((max as f64) * frac) as i64)
                }
            }
            @for r in &rects {
                rect x=(f(r.0)) y=(f(r.1)) width=(f(r.2)) height=(f(r.3)) class={ "st-" (r.4) } {
                    title { (r.5) }
                }
            }
            @for i in [0, minutes / 2, minutes - 1] {
                text x=(f(left + col_w * (i as f64 + 0.5))) y=(f(h - 6.0)) text-anchor="middle" {
                    (minute_label(i))
                }
            }
        } }
    }
}

/// The top of the count axis: 2, 4, 10, 20, 40, 100, … at or above `n`, so that the
/// half-way line is a whole number too.
fn nice_max(n: i64) -> i64 {
    let mut unit = 1i64;
    loop {
        for m in [2, 4, 10] {
            if m * unit >= n {
                return m * unit;
            }
        }
        unit = unit.saturating_mul(10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_is_to_scale() {
        let bars = [
            Bar {
                label: "a".into(),
                status: StepStatus::Completed,
                start_ms: 1000.0,
                end_ms: Some(1100.0),
                copied: false,
            },
            Bar {
                label: "<b>".into(),
                status: StepStatus::Failed,
                start_ms: 1100.0,
                end_ms: Some(1400.0),
                copied: true,
            },
        ];
        let s = timeline(&bars, 2000.0).into_string();
        // 400 ms over 770 units: the first bar is a quarter of the second's width... in order.
        assert!(s.contains(r#"x="210.0" y="31.0" width="192.5""#), "{s}");
        assert!(s.contains(r#"x="402.5" y="57.0" width="577.5""#), "{s}");
        assert!(s.contains("st-FAILED copied"));
        assert!(s.contains("&lt;b&gt;") && !s.contains("<b>"));
    }

    #[test]
    fn minutes_stack_by_status() {
        let b = |minute, status, count| Bucket {
            minute,
            status,
            count,
        };
        let s = per_minute(
            &[
                b(600, RequestStatus::Completed, 3),
                b(600, RequestStatus::Failed, 1),
                b(660, RequestStatus::Completed, 4),
            ],
            600,
            2,
        )
        .into_string();
        assert_eq!(s.matches("<rect").count(), 3);
        assert!(s.contains("00:10 UTC: 1 FAILED"), "{s}");
        assert!(
            s.contains(">4<") && s.contains(">2<"),
            "the axis tops at the fullest minute: {s}"
        );
        let tops = [0, 3, 5, 41, 1000].map(nice_max);
        assert_eq!(tops, [2, 4, 10, 100, 1000]);
    }
}
