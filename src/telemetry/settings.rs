//! Tracing and log settings: the OpenTelemetry SDK's standard variables, each with a flag.

use std::time::Duration;

use clap::{Args, ValueEnum};
use opentelemetry_sdk::trace::Sampler;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// The flags, as parsed (flattened into the server's `Args`).
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// OTLP base URL (`/v1/traces` is appended); setting it (or the traces endpoint) turns
    /// tracing on.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// OTLP traces URL, used as given (wins over `--otlp-endpoint`).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,

    /// OTLP protocol: http/protobuf or http/json.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: String,

    /// Time one export may take, in milliseconds.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TIMEOUT", default_value_t = 10_000)]
    pub otlp_timeout_ms: u64,

    /// `none` turns tracing off whatever the endpoint (`otlp`: on when an endpoint is set).
    #[arg(long, env = "OTEL_TRACES_EXPORTER", default_value = "otlp")]
    pub traces_exporter: String,

    /// The `service.name` of exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "clamp")]
    pub service_name: String,

    /// always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off
    /// or parentbased_traceidratio.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        default_value = "parentbased_always_on"
    )]
    pub traces_sampler: String,

    /// The ratio of the traceidratio samplers, from 0 to 1.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG")]
    pub traces_sampler_arg: Option<String>,

    /// Finished spans waiting for export at most; more are dropped (and counted).
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = 2048)]
    pub trace_queue_size: usize,

    /// Spans per export at most.
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value_t = 512)]
    pub trace_batch_size: usize,

    /// Longest wait, in milliseconds, before queued spans are exported.
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value_t = 5000)]
    pub trace_schedule_delay_ms: u64,

    /// Log lines as text or as one JSON object per line.
    #[arg(long, env = "CLAMP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// OTLP over HTTP, as protobuf or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Protobuf,
    Json,
}

/// Validated tracing settings; present only when tracing is on.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    /// Where spans are sent (the whole URL).
    pub endpoint: String,
    pub protocol: Protocol,
    pub timeout: Duration,
    pub service_name: String,
    pub sampler: SamplerSpec,
    pub queue_size: usize,
    pub batch_size: usize,
    pub schedule_delay: Duration,
}

/// The configured sampler, kept as data (the SDK's `Sampler` is not `Debug`-comparable).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerSpec {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
    ParentBasedOn,
    ParentBasedOff,
    ParentBasedRatio(f64),
}

impl SamplerSpec {
    pub fn build(self) -> Sampler {
        match self {
            SamplerSpec::AlwaysOn => Sampler::AlwaysOn,
            SamplerSpec::AlwaysOff => Sampler::AlwaysOff,
            SamplerSpec::Ratio(r) => Sampler::TraceIdRatioBased(r),
            SamplerSpec::ParentBasedOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerSpec::ParentBasedOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            SamplerSpec::ParentBasedRatio(r) => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
            }
        }
    }
}

impl TraceArgs {
    /// The tracing settings (None: tracing off), or why the flags do not make sense.
    pub fn settings(&self) -> Result<Option<TraceSettings>, String> {
        let endpoint = match (&self.otlp_traces_endpoint, &self.otlp_endpoint) {
            (Some(full), _) if !full.is_empty() => full.clone(),
            (_, Some(base)) if !base.is_empty() => {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
            _ => return Ok(None),
        };
        match self.traces_exporter.as_str() {
            "none" => return Ok(None),
            "otlp" => {}
            other => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER (--traces-exporter): {other:?} is not supported; \
                     use otlp or none"
                ))
            }
        }
        if endpoint.parse::<hyper::Uri>().is_err() || !endpoint.starts_with("http://") {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_ENDPOINT (--otlp-endpoint): {endpoint:?} is not an \
                 http:// URL"
            ));
        }
        let protocol = match self.otlp_protocol.as_str() {
            "http/protobuf" => Protocol::Protobuf,
            "http/json" => Protocol::Json,
            other => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL (--otlp-protocol): {other:?} is not \
                     supported; use http/protobuf or http/json"
                ))
            }
        };
        let ratio = || -> Result<f64, String> {
            let Some(arg) = &self.traces_sampler_arg else {
                return Ok(1.0);
            };
            match arg.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(format!(
                    "OTEL_TRACES_SAMPLER_ARG (--traces-sampler-arg): {arg:?} is not a ratio \
                     from 0 to 1"
                )),
            }
        };
        let sampler = match self.traces_sampler.as_str() {
            "always_on" => SamplerSpec::AlwaysOn,
            "always_off" => SamplerSpec::AlwaysOff,
            "traceidratio" => SamplerSpec::Ratio(ratio()?),
            "parentbased_always_on" => SamplerSpec::ParentBasedOn,
            "parentbased_always_off" => SamplerSpec::ParentBasedOff,
            "parentbased_traceidratio" => SamplerSpec::ParentBasedRatio(ratio()?),
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER (--traces-sampler): {other:?} is not one of \
                     always_on, always_off, traceidratio, parentbased_always_on, \
                     parentbased_always_off, parentbased_traceidratio"
                ))
            }
        };
        if self.trace_queue_size == 0 || self.trace_batch_size == 0 {
            return Err(
                "OTEL_BSP_MAX_QUEUE_SIZE and OTEL_BSP_MAX_EXPORT_BATCH_SIZE must be \
                        at least 1"
                    .into(),
            );
        }
        Ok(Some(TraceSettings {
            endpoint,
            protocol,
            timeout: Duration::from_millis(self.otlp_timeout_ms.max(1)),
            service_name: self.service_name.clone(),
            sampler,
            queue_size: self.trace_queue_size,
            batch_size: self.trace_batch_size.min(self.trace_queue_size),
            schedule_delay: Duration::from_millis(self.trace_schedule_delay_ms.max(1)),
        }))
    }
}
