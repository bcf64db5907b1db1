//! W3C Trace Context: reading and writing `traceparent`, and the trace a service request
//! keeps in its row (`service_requests.trace`) so that every step, on any instance and
//! after any restart or retry, continues the same trace.

use std::fmt::Write as _;

/// A `traceparent` header: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The span the receiver of this header is a child of.
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// The `sampled` bit of the trace flags.
pub const SAMPLED: u8 = 0x01;

/// Length of a version-00 `traceparent`.
pub const TRACEPARENT_LEN: usize = 55;

impl TraceParent {
    /// Parses a `traceparent` value as the specification says a receiver must: version
    /// `ff` and all-zero ids are invalid, hex is lower case, a version-00 value is exactly
    /// 55 characters, and a later version may carry more after a `-`. None for anything
    /// invalid: the header is then ignored, never an error.
    pub fn parse(v: &[u8]) -> Option<TraceParent> {
        if v.len() < TRACEPARENT_LEN || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != TRACEPARENT_LEN) {
            return None;
        }
        if version > 0 && v.len() > TRACEPARENT_LEN && v[TRACEPARENT_LEN] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The version-00 header value (flags other than `sampled` are not passed on, as the
    /// specification asks of a version-00 writer).
    pub fn encode(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [0u8; TRACEPARENT_LEN];
        out[..3].copy_from_slice(b"00-");
        put_hex(&mut out[3..35], &self.trace_id);
        out[35] = b'-';
        put_hex(&mut out[36..52], &self.span_id);
        out[52] = b'-';
        put_hex(&mut out[53..55], &[self.flags & SAMPLED]);
        out
    }

    /// The same trace, with `span_id` as the parent.
    pub fn child(&self, span_id: [u8; 8]) -> TraceParent {
        TraceParent { span_id, ..*self }
    }
}

/// The trace id of a valid `traceparent` among stored headers (`[["name","value"],…]`),
/// found by scanning their text: for log lines, without parsing the headers.
pub fn trace_id_in(headers: &str) -> Option<&str> {
    const KEY: &str = "[\"traceparent\",\"";
    let at = headers.find(KEY)? + KEY.len();
    let value = headers.get(at..at + TRACEPARENT_LEN)?;
    TraceParent::parse(value.as_bytes())?;
    value.get(3..35)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn put_hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[(b >> 4) as usize];
        out[2 * i + 1] = DIGITS[(b & 0xf) as usize];
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(hex_digit(two[0])? << 4 | hex_digit(two[1])?)
}

/// Longest `tracestate` kept: the specification's 32 members of at most 256 characters
/// each would be 8 kB; propagators must pass at least 512 characters on.
pub const MAX_TRACESTATE: usize = 512;

/// The trace a service request belongs to. It is kept as the request's stored
/// `traceparent` and `tracestate` headers: the caller's, or, when clamp traced the create,
/// its server span's. The request's own span is a child of that span; its id is derived
/// (`telemetry::request_span_id`), so any instance that runs or ends the request names it
/// alike without storing more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTrace {
    /// The span the request's span is a child of.
    pub parent: TraceParent,
    pub tracestate: Option<String>,
}

impl RequestTrace {
    /// Spans of this request are exported (when tracing is on).
    pub fn sampled(&self) -> bool {
        self.parent.sampled()
    }
}

/// A `tracestate` worth passing on: printable ASCII (with spaces and tabs) of bounded
/// length; anything else is dropped, as the specification allows.
pub fn valid_tracestate(v: &[u8]) -> Option<&str> {
    if v.is_empty() || v.len() > MAX_TRACESTATE {
        return None;
    }
    if !v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        return None;
    }
    std::str::from_utf8(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_writes_the_specifications_example() {
        let tp = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(hex(&tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&tp.span_id), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(&tp.encode()[..], GOOD.as_bytes());
    }

    #[test]
    fn ignores_what_the_specification_calls_invalid() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-the-future-holds";
        let tp = TraceParent::parse(later.as_bytes()).unwrap();
        assert_eq!(tp.flags, 0x09);
        // Written back as version 00 with only the flags version 00 knows.
        assert_eq!(&tp.encode()[..], GOOD.as_bytes());
        assert!(TraceParent::parse(&later.as_bytes()[..TRACEPARENT_LEN]).is_some());
    }

    #[test]
    fn finds_the_trace_id_among_stored_headers() {
        let h = format!(r#"[["x-a","1"],["traceparent","{GOOD}"]]"#);
        assert_eq!(trace_id_in(&h), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id_in(r#"[["traceparent","junk"]]"#), None);
        assert_eq!(trace_id_in("[]"), None);
    }

    #[test]
    fn tracestate_is_kept_only_when_it_can_be_passed_on() {
        assert_eq!(
            valid_tracestate(b"rojo=00f067aa0ba902b7"),
            Some("rojo=00f067aa0ba902b7")
        );
        assert_eq!(valid_tracestate(b""), None);
        assert_eq!(valid_tracestate(b"a=\n"), None);
        assert_eq!(valid_tracestate(&[b'a'; MAX_TRACESTATE + 1]), None);
    }
}
