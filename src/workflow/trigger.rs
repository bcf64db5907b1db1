//! Triggers (beyond Clamp): what starts requests of a workflow from outside the API. A
//! definition names its workflow (a version, or the latest), its source, and optionally
//! a `when` (CEL over the message), a `transform` (a shift over the message, giving the
//! payload) and `labels` (CEL per label key, giving each value). Pure: the checks that
//! need the database (the workflow exists, the secret is set) are the caller's.
//!
//! The message, as `when`, `transform` and `labels` read it: `{body, key, headers}`, the
//! body parsed as JSON, `key` the delivery's id (empty when it has none), `headers` by
//! lowercase name.
//!
//! ```json
//! {"name": "github-push", "workflow": "deploy",
//!  "source": {"webhook": {"verify": "github", "secret": "{{secret:GITHUB_HOOK}}"}},
//!  "when": "body.ref == 'refs/heads/main'",
//!  "transform": {"repo": "body.repository.full_name", "commit": "body.after"},
//!  "labels": {"repo": "body.repository.name"}}
//! ```

use std::time::Duration;

use serde_json::{Map, Value};

use super::expr::{Condition, KeyExpr};
use super::transform;

/// The names a trigger's expressions may read.
pub const MESSAGE_NAMES: [&str; 3] = ["body", "key", "headers"];

/// What those names are, as a refusal says it.
const MESSAGE_FIELDS: &str = "a field of the message (body, key, headers)";

/// Longest trigger name.
const MAX_NAME: usize = 128;

/// How far a Stripe signature's time may stand from now, by default.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// How a webhook proves it came from its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`; the delivery's id is
    /// `X-GitHub-Delivery`.
    Github,
    /// `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">`, refused when
    /// `t` is further than the tolerance from now; the delivery's id is the event's `id`.
    Stripe,
}

/// Where a trigger's messages come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `POST /hooks/{name}`.
    Webhook {
        verify: Verify,
        /// A `{{secret:NAME}}` reference: the key of the HMAC.
        secret: String,
        /// A Stripe signature's tolerance.
        tolerance: Duration,
        /// The header holding the delivery's id, over the verify kind's own.
        delivery_header: Option<String>,
    },
    /// A queue of an AMQP broker, consumed by every instance (competing consumers), at
    /// most `prefetch` messages unacknowledged per instance; a message's id (its
    /// `message_id` property) keys the request it starts.
    Amqp {
        /// `amqp://` or `amqps://`; credentials and virtual host may be `{{secret:…}}`
        /// references, the host may not (the destination policy judges it when defined).
        url: String,
        /// Where it connects (read from the URL with its references masked).
        endpoint: super::brokers::Endpoint,
        queue: String,
        prefetch: u16,
    },
    /// A Kafka topic, its partitions shared among instances (each read by one at a time,
    /// positions kept in Postgres); a record's topic, partition and offset key the
    /// request it starts.
    Kafka {
        /// A bootstrap list or a `kafka://` URL (TLS and SASL as it says, with the
        /// trigger's own credentials, which may be `{{secret:…}}` references; never the
        /// server's).
        connection: String,
        /// Its bootstrap brokers (read with its references masked), for the policy.
        brokers: Vec<super::brokers::Endpoint>,
        topic: String,
    },
}

/// The messages an AMQP trigger's instance holds unacknowledged, by default.
pub const DEFAULT_PREFETCH: u16 = 100;

/// A checked definition, as stored (`definition`) and as run.
pub struct CompiledTrigger {
    pub name: String,
    pub workflow: String,
    pub version: Option<u32>,
    pub source: Source,
    pub when: Option<Condition>,
    /// (output key, path) pairs of the shift (`transform::compile_spec`).
    pub transform: Option<Vec<(String, String)>>,
    /// Label key and the expression of its value.
    pub labels: Vec<(String, KeyExpr)>,
    /// The definition as given, `paused` taken out.
    pub definition: Value,
}

/// Why a definition was refused; the text names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerError(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, TriggerError> {
    Err(TriggerError(msg.into()))
}

/// Checks a definition. `paused` is not part of it (`paused_in` reads it).
pub fn validate(v: &Value) -> Result<CompiledTrigger, TriggerError> {
    let Some(obj) = v.as_object() else {
        return bad("the definition must be a JSON object");
    };
    for k in obj.keys() {
        if !matches!(
            k.as_str(),
            "name" | "workflow" | "version" | "source" | "when" | "transform" | "labels" | "paused"
        ) {
            return bad(format!(
                "{k}: unknown field (the fields are name, workflow, version, source, when, \
                 transform, labels and paused)"
            ));
        }
    }
    let name = text(obj, "name")?;
    if name.len() > MAX_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return bad(format!(
            "name: 1 to {MAX_NAME} letters, digits, '_', '-' and '.'"
        ));
    }
    let workflow = text(obj, "workflow")?;
    let version = match obj.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u32::MAX as u64).contains(&n) => Some(n as u32),
            _ => return bad("version: a whole number from 1"),
        },
    };
    let source = source(obj.get("source"))?;
    let known: Vec<String> = MESSAGE_NAMES.iter().map(|s| s.to_string()).collect();
    let when = match obj.get("when") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            Condition::compile_over(s, &known, MESSAGE_FIELDS)
                .map_err(|e| TriggerError(format!("when: {e}")))?,
        ),
        Some(_) => return bad("when: a CEL expression, as a string"),
    };
    let transform = match obj.get("transform") {
        None | Some(Value::Null) => None,
        Some(Value::Object(spec)) if !spec.is_empty() => Some(
            transform::compile_spec(spec)
                .map_err(|e| TriggerError(format!("transform: {}", e.0)))?,
        ),
        Some(_) => return bad("transform: an object of output keys and paths"),
    };
    let labels = labels(obj.get("labels"), &known)?;
    let mut definition = v.clone();
    if let Value::Object(o) = &mut definition {
        o.remove("paused");
    }
    Ok(CompiledTrigger {
        name,
        workflow,
        version,
        source,
        when,
        transform,
        labels,
        definition,
    })
}

/// A definition's `labels`: each key a label key, each value a CEL expression; one label
/// is left for the trigger's own (`trigger:<name>`).
fn labels(v: Option<&Value>, known: &[String]) -> Result<Vec<(String, KeyExpr)>, TriggerError> {
    let m = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return bad("labels: an object of label keys and CEL expressions"),
    };
    if m.len() >= crate::labels::MAX_LABELS {
        return bad(format!(
            "labels: at most {} (one more is the trigger's own)",
            crate::labels::MAX_LABELS - 1
        ));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, e) in m {
        let Value::String(e) = e else {
            return bad(format!("labels.{k}: a CEL expression, as a string"));
        };
        crate::labels::Labels::parse([format!("{k}:x").as_str()])
            .map_err(|e| TriggerError(format!("labels.{k}: {e}")))?;
        let expr = KeyExpr::compile_over(e, known, MESSAGE_FIELDS)
            .map_err(|err| TriggerError(format!("labels.{k}: {err}")))?;
        out.push((k.clone(), expr));
    }
    Ok(out)
}

/// The message as a trigger's expressions read it: `{body, key, headers}`.
pub fn message(body: Value, key: &str, headers: &[(String, String)]) -> Map<String, Value> {
    let mut h = Map::new();
    for (k, v) in headers {
        h.insert(k.clone(), Value::String(v.clone()));
    }
    let mut m = Map::new();
    m.insert("body".into(), body);
    m.insert("key".into(), Value::String(key.to_string()));
    m.insert("headers".into(), Value::Object(h));
    m
}

/// The `paused` a definition asks for (None: not said).
pub fn paused_in(v: &Value) -> Option<bool> {
    v.get("paused").and_then(Value::as_bool)
}

/// Whether applying `file` (a definition, checked) to a trigger stored as `stored` with
/// `paused` changes nothing: the same definition, and no other `paused` asked for.
pub fn unchanged(
    stored: &Value,
    paused: bool,
    file: &CompiledTrigger,
    asked: Option<bool>,
) -> bool {
    *stored == file.definition && asked.is_none_or(|p| p == paused)
}

fn text(obj: &Map<String, Value>, key: &str) -> Result<String, TriggerError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => bad(format!("{key}: a non-empty string")),
    }
}

fn source(v: Option<&Value>) -> Result<Source, TriggerError> {
    let Some(Value::Object(src)) = v else {
        return bad("source: an object naming one source (webhook, amqp or kafka)");
    };
    if src.len() != 1 {
        return bad("source: exactly one source (webhook, amqp or kafka)");
    }
    let (kind, settings) = src.iter().next().expect("one entry");
    match kind.as_str() {
        "webhook" => webhook(settings),
        "amqp" => amqp(settings),
        "kafka" => kafka(settings),
        other => bad(format!(
            "source.{other}: unknown source (webhook, amqp or kafka)"
        )),
    }
}

fn webhook(v: &Value) -> Result<Source, TriggerError> {
    let Some(w) = v.as_object() else {
        return bad("source.webhook: an object");
    };
    for k in w.keys() {
        if !matches!(
            k.as_str(),
            "verify" | "secret" | "toleranceSeconds" | "deliveryHeader"
        ) {
            return bad(format!(
                "source.webhook.{k}: unknown field (verify, secret, toleranceSeconds, deliveryHeader)"
            ));
        }
    }
    let verify = match w.get("verify").and_then(Value::as_str) {
        Some("github") => Verify::Github,
        Some("stripe") => Verify::Stripe,
        _ => return bad("source.webhook.verify: \"github\" or \"stripe\""),
    };
    let secret = match w.get("secret").and_then(Value::as_str) {
        Some(s) => match crate::secrets::names(s) {
            Ok(names) if names.len() == 1 && s.trim() == format!("{{{{secret:{}}}}}", names[0]) => {
                s.trim().to_string()
            }
            _ => return bad(
                "source.webhook.secret: one {{secret:NAME}} reference (the key is never stored)",
            ),
        },
        None => return bad("source.webhook.secret: a {{secret:NAME}} reference"),
    };
    let tolerance = match w.get("toleranceSeconds") {
        None => DEFAULT_TOLERANCE,
        Some(v) => match v.as_u64() {
            Some(s) if (1..=86_400).contains(&s) => Duration::from_secs(s),
            _ => return bad("source.webhook.toleranceSeconds: 1 to 86400"),
        },
    };
    let delivery_header = match w.get("deliveryHeader") {
        None => None,
        Some(Value::String(h))
            if !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
        {
            Some(h.to_ascii_lowercase())
        }
        Some(_) => return bad("source.webhook.deliveryHeader: a header name"),
    };
    Ok(Source::Webhook {
        verify,
        secret,
        tolerance,
        delivery_header,
    })
}

fn amqp(v: &Value) -> Result<Source, TriggerError> {
    let Some(a) = v.as_object() else {
        return bad("source.amqp: an object");
    };
    for k in a.keys() {
        if !matches!(k.as_str(), "url" | "queue" | "prefetch") {
            return bad(format!(
                "source.amqp.{k}: unknown field (url, queue, prefetch)"
            ));
        }
    }
    let url = match a.get("url").and_then(Value::as_str) {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => return bad("source.amqp.url: an amqp:// or amqps:// URL"),
    };
    let masked = super::brokers::for_definition(&url)
        .map_err(|e| TriggerError(format!("source.amqp.url: {e}")))?;
    let target = super::brokers::AmqpTarget::read(&masked)
        .map_err(|e| TriggerError(format!("source.amqp.url: {e}")))?;
    super::brokers::refuse_secret_host(&target.endpoint)
        .map_err(|e| TriggerError(format!("source.amqp.url: {e}")))?;
    let queue = match a.get("queue").and_then(Value::as_str) {
        Some(q) if !q.is_empty() && q.len() <= 255 => q.to_string(),
        _ => return bad("source.amqp.queue: a queue name (1 to 255 bytes)"),
    };
    let prefetch = match a.get("prefetch") {
        None => DEFAULT_PREFETCH,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=1000).contains(&n) => n as u16,
            _ => return bad("source.amqp.prefetch: 1 to 1000"),
        },
    };
    Ok(Source::Amqp {
        url,
        endpoint: target.endpoint,
        queue,
        prefetch,
    })
}

fn kafka(v: &Value) -> Result<Source, TriggerError> {
    let Some(k) = v.as_object() else {
        return bad("source.kafka: an object");
    };
    for key in k.keys() {
        if !matches!(key.as_str(), "connection" | "topic") {
            return bad(format!(
                "source.kafka.{key}: unknown field (connection, topic)"
            ));
        }
    }
    let connection = match k.get("connection").and_then(Value::as_str) {
        Some(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => return bad("source.kafka.connection: host:port[,…] or a kafka:// URL"),
    };
    let err = |e: String| TriggerError(format!("source.kafka.connection: {e}"));
    let masked = super::brokers::for_definition(&connection).map_err(err)?;
    let target = super::brokers::KafkaTarget::read(&masked).map_err(err)?;
    for b in &target.brokers {
        super::brokers::refuse_secret_host(b).map_err(err)?;
    }
    let topic = match k.get("topic").and_then(Value::as_str) {
        Some(t) if !t.is_empty() && t.len() <= 249 => t.to_string(),
        _ => return bad("source.kafka.topic: a topic name (1 to 249 bytes)"),
    };
    Ok(Source::Kafka {
        connection,
        brokers: target.brokers,
        topic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn github() -> Value {
        json!({"name": "gh", "workflow": "deploy",
               "source": {"webhook": {"verify": "github", "secret": "{{secret:HOOK}}"}}})
    }

    #[test]
    fn a_webhook_trigger_reads_with_its_defaults() {
        let t = validate(&github()).unwrap();
        assert_eq!(t.name, "gh");
        assert_eq!(t.version, None);
        assert_eq!(
            t.source,
            Source::Webhook {
                verify: Verify::Github,
                secret: "{{secret:HOOK}}".into(),
                tolerance: DEFAULT_TOLERANCE,
                delivery_header: None
            }
        );
        let mut full = github();
        full["version"] = json!(2);
        full["when"] = json!("body.ref == 'refs/heads/main'");
        full["transform"] = json!({"repo": "body.repository.full_name"});
        full["labels"] = json!({"repo": "body.repository.name"});
        full["paused"] = json!(true);
        let t = validate(&full).unwrap();
        assert_eq!(t.version, Some(2));
        assert!(t.when.is_some() && t.transform.is_some() && t.labels.len() == 1);
        assert!(t.definition.get("paused").is_none());
        assert_eq!(paused_in(&full), Some(true));
    }

    #[test]
    fn an_amqp_trigger_keeps_its_url_with_its_references() {
        let t = validate(
            &json!({"name": "orders", "workflow": "w", "source": {"amqp": {
            "url": "amqp://{{secret:U}}:{{secret:P}}@127.0.0.1:5672/%2f", "queue": "orders"}}}),
        )
        .unwrap();
        let Source::Amqp {
            url,
            endpoint,
            queue,
            prefetch,
        } = t.source
        else {
            panic!("an amqp source");
        };
        assert_eq!(url, "amqp://{{secret:U}}:{{secret:P}}@127.0.0.1:5672/%2f");
        assert_eq!(endpoint.to_string(), "127.0.0.1:5672");
        assert_eq!((queue.as_str(), prefetch), ("orders", DEFAULT_PREFETCH));
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), "JSON object"),
            (json!({"workflow": "w", "source": {}}), "name:"),
            (json!({"name": "a b", "workflow": "w"}), "name:"),
            (json!({"name": "a", "source": {}}), "workflow:"),
            (
                json!({"name": "a", "workflow": "w", "version": 0}),
                "version:",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"kafka": {}}}),
                "source.kafka.connection",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"kafka": {"connection": "h:9092"}}}),
                "source.kafka.topic",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"kafka": {"connection": "{{secret:B}}:9092", "topic": "t"}}}),
                "source.kafka.connection",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"amqp": {"url": "http://x", "queue": "q"}}}),
                "source.amqp.url",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"amqp": {"url": "amqp://{{secret:H}}/", "queue": "q"}}}),
                "source.amqp.url",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"amqp": {"url": "amqp://h/", "queue": ""}}}),
                "source.amqp.queue",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"amqp": {"url": "amqp://h/", "queue": "q", "prefetch": 0}}}),
                "source.amqp.prefetch",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"ftp": {}}}),
                "source.ftp",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"webhook": {"verify": "x"}}}),
                "verify",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"webhook": {"verify": "github", "secret": "plain"}}}),
                "secret",
            ),
            (
                json!({"name": "a", "workflow": "w", "source": {"webhook": {"verify": "github", "secret": "{{secret:A}}", "toleranceSeconds": 0}}}),
                "toleranceSeconds",
            ),
            (
                json!({"name": "a", "workflow": "w", "bogus": 1}),
                "bogus: unknown",
            ),
        ];
        for (v, want) in cases {
            let e = validate(&v).err().unwrap_or_else(|| panic!("{v} passed"));
            assert!(e.0.contains(want), "{v}: {}", e.0);
        }
        let mut t = github();
        t["when"] = json!("steps.x == 1");
        let e = validate(&t).err().unwrap().0;
        assert!(
            e.starts_with("when:") && e.contains("not a field of the message"),
            "{e}"
        );
        t = github();
        t["labels"] = json!({"bad key": "body.x"});
        assert!(validate(&t).err().unwrap().0.starts_with("labels.bad key"));
        t = github();
        t["transform"] = json!({"": "body"});
        assert!(validate(&t).err().unwrap().0.starts_with("transform:"));
    }
}
