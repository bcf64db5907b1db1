//! The run report: the JSON document described in the crate docs and the
//! human-readable summary table.

use crate::engine::Plan;
use crate::findmax::Step;
use crate::histogram::Summary;
use crate::recorder::Recorder;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

#[derive(Clone, Debug, Serialize)]
pub struct MixedReport {
    pub creates: u64,
    pub reads: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct E2eReport {
    pub created: u64,
    pub completed: u64,
    pub failed: u64,
    pub created_rate: f64,
    pub completed_rate: f64,
    pub overhead_ms: Summary,
    pub negative_overhead: u64,
    /// Calls the in-process mock received (whole process, warm-up
    /// included); null when `--downstream` pointed elsewhere.
    pub downstream_calls: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FindMaxReport {
    pub slo_p99_us: u64,
    pub max_rate: Option<f64>,
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub mode: &'static str,
    pub connections: usize,
    pub threads: usize,
    pub offered_rate: Option<f64>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub requests: u64,
    pub ok: u64,
    pub http_requests: u64,
    pub errors: BTreeMap<String, u64>,
    pub achieved_rate: f64,
    pub latency_us: Summary,
    pub per_second: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mixed: Option<MixedReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e: Option<E2eReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub find_max: Option<FindMaxReport>,
}

impl Report {
    pub fn new(scenario: &str, plan: &Plan, rec: &Recorder) -> Self {
        let secs = plan.duration.as_secs_f64().max(1e-9);
        let e2e = scenario == "e2e";
        Self {
            scenario: scenario.to_string(),
            mode: if plan.rate.is_some() {
                "open"
            } else {
                "closed"
            },
            connections: plan.connections,
            threads: plan.threads,
            offered_rate: plan.rate,
            duration_s: plan.duration.as_secs_f64(),
            warmup_s: plan.warmup.as_secs_f64(),
            requests: rec.requests,
            ok: rec.ok,
            http_requests: rec.http_requests,
            errors: rec.errors_by_key(),
            achieved_rate: rec.requests as f64 / secs,
            latency_us: rec.latency.summary(),
            per_second: rec.per_second.clone(),
            mixed: (scenario == "mixed").then(|| MixedReport {
                creates: rec.requests - rec.reads,
                reads: rec.reads,
            }),
            e2e: e2e.then(|| E2eReport {
                created: rec.created,
                completed: rec.completed,
                failed: rec.failed,
                created_rate: rec.created as f64 / secs,
                completed_rate: rec.completed as f64 / secs,
                overhead_ms: rec.overhead_ms.summary(),
                negative_overhead: rec.negative_overhead,
                downstream_calls: None,
            }),
            find_max: None,
        }
    }

    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Writes the human summary.
    pub fn print_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let offered = self
            .offered_rate
            .map_or("-".to_string(), |r| format!("{r:.0}/s"));
        writeln!(out)?;
        writeln!(
            out,
            "scenario {}  mode {}  connections {}  threads {}  offered {}  duration {:.1}s (+{:.1}s warm-up)",
            self.scenario, self.mode, self.connections, self.threads, offered, self.duration_s, self.warmup_s
        )?;
        writeln!(
            out,
            "  requests {:>10}   ok {:>10}   errors {:>8}   achieved {:>10.1}/s   http requests {}",
            self.requests,
            self.ok,
            self.error_total(),
            self.achieved_rate,
            self.http_requests
        )?;
        let l = &self.latency_us;
        writeln!(
            out,
            "  latency      p50 {}   p90 {}   p99 {}   p99.9 {}   max {}   mean {}",
            fmt_us(l.p50),
            fmt_us(l.p90),
            fmt_us(l.p99),
            fmt_us(l.p999),
            fmt_us(l.max),
            fmt_us(l.mean.round() as u64)
        )?;
        if !self.errors.is_empty() {
            let kinds: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            writeln!(out, "  errors       {}", kinds.join(", "))?;
        }
        if let Some(m) = &self.mixed {
            writeln!(
                out,
                "  mixed        creates {}   reads {}",
                m.creates, m.reads
            )?;
        }
        if let Some(e) = &self.e2e {
            writeln!(
                out,
                "  e2e          created {} ({:.1}/s)   completed {} ({:.1}/s)   failed {}",
                e.created, e.created_rate, e.completed, e.completed_rate, e.failed
            )?;
            let o = &e.overhead_ms;
            writeln!(
                out,
                "  overhead ms  p50 {}   p90 {}   p99 {}   p99.9 {}   max {}   mean {:.1}",
                o.p50, o.p90, o.p99, o.p999, o.max, o.mean
            )?;
            if let Some(calls) = &e.downstream_calls {
                writeln!(out, "  downstream   {calls}")?;
            }
        }
        if let Some(f) = &self.find_max {
            match f.max_rate {
                Some(r) => writeln!(
                    out,
                    "  find-max     highest sustained rate {r:.0}/s (p99 SLO {})",
                    fmt_us(f.slo_p99_us)
                )?,
                None => writeln!(out, "  find-max     no step met the SLO")?,
            }
        }
        Ok(())
    }
}

/// One line per find-max step, printed as the search goes.
pub fn step_line(s: &Step) -> String {
    format!(
        "step offered {:>9.0}/s  achieved {:>9.1}/s  errors {:>6}  p50 {:>9}  p99 {:>9}  p99.9 {:>9}  {}",
        s.offered_rate,
        s.achieved_rate,
        s.errors,
        fmt_us(s.p50_us),
        fmt_us(s.p99_us),
        fmt_us(s.p999_us),
        if s.pass {
            "PASS".to_string()
        } else {
            format!("FAIL ({})", s.reason)
        }
    )
}

/// Microseconds with a readable unit.
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{:.2}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RuntimeKind;
    use crate::recorder::{ErrorKind, Op};
    use std::time::Duration;

    fn plan(rate: Option<f64>) -> Plan {
        Plan {
            label: "t".into(),
            connections: 4,
            threads: 1,
            runtime: RuntimeKind::PerThread,
            rate,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(2),
            progress: false,
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let mut rec = Recorder::new(2);
        rec.record(&Op::new(Ok(())), Duration::from_micros(300), Duration::ZERO);
        rec.record(
            &Op::new(Err(ErrorKind::Status(503))),
            Duration::ZERO,
            Duration::ZERO,
        );
        let r = Report::new("health", &plan(Some(100.0)), &rec);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["mode"], "open");
        assert_eq!(v["offered_rate"], 100.0);
        assert_eq!(v["errors"]["status_503"], 1);
        assert_eq!(v["achieved_rate"], 1.0);
        assert_eq!(v["latency_us"]["p50"], 300);
        assert!(v.get("e2e").is_none() && v.get("find_max").is_none());
        let closed = serde_json::to_value(Report::new("e2e", &plan(None), &rec)).unwrap();
        assert_eq!(closed["mode"], "closed");
        assert!(closed["offered_rate"].is_null());
        assert!(closed["e2e"]["overhead_ms"]["p99"].is_u64());
    }

    #[test]
    fn table_mentions_errors() {
        let mut rec = Recorder::new(2);
        rec.record(
            &Op::new(Err(ErrorKind::Timeout)),
            Duration::ZERO,
            Duration::ZERO,
        );
        let mut out = Vec::new();
        Report::new("create", &plan(None), &rec)
            .print_table(&mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("timeout 1"), "{text}");
    }

    #[test]
    fn units() {
        assert_eq!(fmt_us(999), "999us");
        assert_eq!(fmt_us(1_500), "1.50ms");
        assert_eq!(fmt_us(2_000_000), "2.00s");
    }
}
