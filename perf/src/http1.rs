//! Minimal HTTP/1.1 client codec: request encoding into a reused buffer and
//! incremental response parsing (Content-Length, chunked, read-to-close).
//!
//! A general-purpose client spends several microseconds per request on
//! header maps, channels and task hand-offs; on a 2-core machine shared
//! with the server that CPU is taken straight from the server, so the
//! generator speaks just enough HTTP/1.1 itself.

use std::io::Write;

/// How the response body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    Length(usize),
    Chunked,
    /// No length given: the body runs until the server closes.
    UntilClose,
}

/// A parsed status line and the headers that matter to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    /// Bytes of status line plus headers, including the blank line.
    pub len: usize,
    pub body: BodyKind,
    pub keep_alive: bool,
    /// `Retry-After` in whole seconds, when given in that form (an HTTP date
    /// is ignored: neither clamp nor the mock sends one).
    pub retry_after: Option<u64>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

const MAX_HEADERS: usize = 64;

/// Encodes a request into `out` (cleared first), with one extra header if given. A body
/// is always sent as JSON with an explicit length.
pub fn encode_request(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    host: &str,
    extra: Option<(&str, &str)>,
    body: &[u8],
) {
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    if let Some((name, value)) = extra {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        let _ = write!(
            out,
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// Parses the response head from the start of `buf`; `Ok(None)` if more
/// bytes are needed.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, Malformed> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Malformed),
    };
    let status = resp.code.ok_or(Malformed)?;
    let mut keep_alive = resp.version == Some(1);
    let mut length = None;
    let mut chunked = false;
    let mut retry_after = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).map_err(|_| Malformed)?;
            length = Some(text.trim().parse::<usize>().map_err(|_| Malformed)?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked")
                || h.value.to_ascii_lowercase().ends_with(b"chunked");
        } else if h.name.eq_ignore_ascii_case("retry-after") {
            retry_after = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = h.value.to_ascii_lowercase();
            if v.windows(5).any(|w| w == b"close") {
                keep_alive = false;
            } else if v.windows(10).any(|w| w == b"keep-alive") {
                keep_alive = true;
            }
        }
    }
    // 1xx, 204 and 304 never carry a body.
    let body = if (100..200).contains(&status) || status == 204 || status == 304 {
        BodyKind::Length(0)
    } else if chunked {
        BodyKind::Chunked
    } else if let Some(n) = length {
        BodyKind::Length(n)
    } else {
        keep_alive = false;
        BodyKind::UntilClose
    };
    Ok(Some(Head {
        status,
        len,
        body,
        keep_alive,
        retry_after,
    }))
}

/// Decodes a chunked body from the start of `buf` into `out`; returns the
/// bytes consumed, or `Ok(None)` if the body is not complete yet (`out` is
/// then left in an unspecified state and the call must be repeated).
pub fn decode_chunked(buf: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, Malformed> {
    out.clear();
    let mut pos = 0;
    loop {
        let Some(eol) = find_crlf(&buf[pos..]) else {
            return Ok(None);
        };
        let line = &buf[pos..pos + eol];
        let size_text = line.split(|&b| b == b';').next().unwrap_or(line);
        let size_text = std::str::from_utf8(size_text).map_err(|_| Malformed)?;
        let size = usize::from_str_radix(size_text.trim(), 16).map_err(|_| Malformed)?;
        pos += eol + 2;
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                let Some(eol) = find_crlf(&buf[pos..]) else {
                    return Ok(None);
                };
                pos += eol + 2;
                if eol == 0 {
                    return Ok(Some(pos));
                }
            }
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&buf[pos..pos + size]);
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err(Malformed);
        }
        pos += size + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_get_and_post() {
        let mut out = Vec::new();
        encode_request(&mut out, "GET", "/health", "h:1", None, b"");
        assert_eq!(out, b"GET /health HTTP/1.1\r\nHost: h:1\r\n\r\n");
        encode_request(
            &mut out,
            "POST",
            "/x",
            "h",
            Some(("Idempotency-Key", "k1")),
            b"{}",
        );
        assert_eq!(
            out,
            &b"POST /x HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"[..]
        );
    }

    #[test]
    fn content_length_response() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_head(&r[..10]), Ok(None));
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.body, BodyKind::Length(2));
        assert_eq!(h.len, r.len() - 2);
        assert!(h.keep_alive);
        assert_eq!(h.retry_after, None);
    }

    #[test]
    fn connection_close_and_http10() {
        let r = b"HTTP/1.1 503 Busy\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n";
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!(
            (h.status, h.keep_alive, h.retry_after),
            (503, false, Some(1))
        );
        let r = b"HTTP/1.0 200 OK\r\n\r\nbody";
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!((h.body, h.keep_alive), (BodyKind::UntilClose, false));
        let r = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(parse_head(r).unwrap().unwrap().body, BodyKind::Length(0));
    }

    #[test]
    fn chunked_body() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse_head(r).unwrap().unwrap().body, BodyKind::Chunked);
        let body = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\n";
        let mut out = Vec::new();
        assert_eq!(decode_chunked(body, &mut out), Ok(Some(body.len())));
        assert_eq!(out, b"Wikipedia ");
        for cut in 0..body.len() {
            assert_eq!(
                decode_chunked(&body[..cut], &mut out),
                Ok(None),
                "cut {cut}"
            );
        }
        assert_eq!(decode_chunked(b"zz\r\n", &mut out), Err(Malformed));
    }

    #[test]
    fn garbage_is_malformed() {
        assert_eq!(parse_head(b"NOT HTTP\r\n\r\n"), Err(Malformed));
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Err(Malformed)
        );
    }
}
