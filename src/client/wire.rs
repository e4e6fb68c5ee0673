//! HTTP/1.1 on the wire: encoding a request head, parsing a response head, and deciding how the
//! response body is framed (RFC 9112 §6).
//!
//! Invariants:
//! - The encoded head carries exactly one `content-length` (the body's real length) and never
//!   `transfer-encoding` or `connection`: the body is always sent whole, and connection
//!   management is this client's, not the original caller's.
//! - Parsing never panics and never buffers more than [`MAX_HEAD_BYTES`] of head or
//!   [`MAX_HEADERS`] header fields; anything else is a [`WireError`].
//! - Connection-level response fields (`Connection`, `Keep-Alive`, `Transfer-Encoding`, `TE`,
//!   `Trailer`, `Upgrade`, `Proxy-Connection` and whatever `Connection` names) are consumed here
//!   and never reach the caller's header map.
//! - A response is reusable (its connection may carry the next request) only if it is HTTP/1.1
//!   without `connection: close` and its body has a known end (length or chunked).

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};

/// Largest response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in a response head.
pub const MAX_HEADERS: usize = 128;
/// Header slots reserved beyond a response's own.
const SPARE_HEADERS: usize = 6;

/// A response that is not valid HTTP/1.x, or exceeds the bounds.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The head does not parse.
    #[error("invalid response head: {0}")]
    Invalid(String),
    /// The head is larger than [`MAX_HEAD_BYTES`] or has more than [`MAX_HEADERS`] fields.
    #[error("response head too large")]
    TooLarge,
}

/// How the body after a response head ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD request, 1xx, 204, 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// A parsed response head.
pub struct Head {
    /// Status, version and headers, with an empty body.
    pub response: Response<()>,
    /// How the body is framed.
    pub framing: Framing,
    /// Whether the connection may carry another request after this body.
    pub reusable: bool,
}

/// Appends `method path HTTP/1.1`, `host`, the end-to-end headers and a `content-length` for
/// `body_len` to `out`.
pub fn encode_head(
    out: &mut BytesMut,
    method: &Method,
    path_and_query: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
    body_len: usize,
) {
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(if path_and_query.is_empty() {
        b"/"
    } else {
        path_and_query.as_bytes()
    });
    out.put_slice(b" HTTP/1.1\r\nhost: ");
    out.put_slice(host.as_bytes());
    out.put_slice(b"\r\n");
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION || name == HOST
        {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    if body_len > 0 || !matches!(*method, Method::GET | Method::HEAD) {
        out.put_slice(b"content-length: ");
        let mut digits = itoa::Buffer::new();
        out.put_slice(digits.format(body_len).as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// Whether `name` only concerns one connection (RFC 9110 §7.6.1), `Connection` and
/// `Transfer-Encoding` aside.
fn is_connection_level(name: &HeaderName) -> bool {
    name == TE
        || name == UPGRADE
        || name == TRAILER
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Parses a response head at the start of `buf` and, when it is complete, removes it from `buf`
/// (what follows stays: the start of the body). `Ok(None)`: more bytes are needed. Header values
/// share the head's bytes rather than copying them. Interim 1xx responses (other than 101) are
/// returned like any other and the caller skips them.
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, WireError> {
    // Where each name and value lies in `buf`, so they can be cut from the head once it is
    // split off (the parser's borrow of `buf` ends first).
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let (len, code, minor, count) = {
        let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut fields) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return if buf.len() >= MAX_HEAD_BYTES {
                    Err(WireError::TooLarge)
                } else {
                    Ok(None)
                };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::TooLarge),
            Err(e) => return Err(WireError::Invalid(e.to_string())),
        };
        if len > MAX_HEAD_BYTES {
            return Err(WireError::TooLarge);
        }
        let base = buf.as_ptr() as usize;
        for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
            // Both slices point into `buf` (httparse never copies), within MAX_HEAD_BYTES.
            let name_at = h.name.as_ptr() as usize - base;
            let value_at = h.value.as_ptr() as usize - base;
            *span = (
                name_at as u32,
                h.name.len() as u32,
                value_at as u32,
                h.value.len() as u32,
            );
        }
        (len, parsed.code, parsed.version, parsed.headers.len())
    };
    let head = buf.split_to(len).freeze();
    let code = code.ok_or_else(|| WireError::Invalid("no status".into()))?;
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Invalid(format!("status {code}")))?;
    let version = if minor == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // Room for the few headers a proxy adds to a relayed answer, so adding them does not regrow
    // the map.
    let mut headers = HeaderMap::with_capacity(count + SPARE_HEADERS);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut encoded = false;
    let mut close = version == Version::HTTP_10;
    let mut listed: Option<Bytes> = None;
    for &(name_at, name_len, value_at, value_len) in &spans[..count] {
        let (name_at, value_at) = (name_at as usize, value_at as usize);
        let raw_name = &head[name_at..name_at + name_len as usize];
        let raw_value = head.slice(value_at..value_at + value_len as usize);
        let name = HeaderName::from_bytes(raw_name).map_err(|_| {
            WireError::Invalid(format!(
                "header name {:?}",
                String::from_utf8_lossy(raw_name)
            ))
        })?;
        if name == CONTENT_LENGTH {
            let n = std::str::from_utf8(&raw_value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| WireError::Invalid("content-length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::Invalid("conflicting content-length".into()));
            }
            length = Some(n);
        } else if name == TRANSFER_ENCODING {
            encoded = true;
            // Only the last coding decides whether the body is chunked.
            chunked = raw_value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == CONNECTION {
            for token in raw_value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    close = false;
                }
            }
            listed = Some(raw_value);
            continue;
        }
        // Connection-level fields end here: the body is decoded by this client and the
        // connection is this client's to manage.
        if name == TRANSFER_ENCODING || is_connection_level(&name) {
            continue;
        }
        let value = HeaderValue::from_maybe_shared(raw_value)
            .map_err(|_| WireError::Invalid(format!("value of {name}")))?;
        headers.append(name, value);
    }
    // Fields the server named in `Connection` are connection-level too (RFC 9110 §7.6.1).
    if let Some(list) = listed {
        for token in list.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") || token.eq_ignore_ascii_case(b"keep-alive") {
                continue;
            }
            if let Ok(n) = HeaderName::from_bytes(token) {
                headers.remove(n);
            }
        }
    }
    let framing = if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Empty
    } else if encoded {
        // Transfer-Encoding overrides Content-Length; a final coding other than chunked can only
        // end at close.
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    Ok(Some(Head {
        response,
        framing,
        // After 101 the connection speaks another protocol.
        reusable: !close
            && framing != Framing::UntilClose
            && status != StatusCode::SWITCHING_PROTOCOLS,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &[u8], method: &Method) -> Result<Option<Head>, WireError> {
        parse_head(&mut BytesMut::from(s), method)
    }

    fn parse(s: &str) -> Head {
        head(s.as_bytes(), &Method::POST).unwrap().unwrap()
    }

    #[test]
    fn encodes_one_content_length_and_no_connection_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(CONNECTION, HeaderValue::from_static("close"));
        h.insert(HOST, HeaderValue::from_static("client.example"));
        h.insert("x-unknown", HeaderValue::from_static("kept"));
        let host = HeaderValue::from_static("10.0.0.1:8000");
        let mut out = BytesMut::new();
        let path = "/v1/chat/completions?a=1";
        encode_head(&mut out, &Method::POST, path, &host, &h, 12);
        assert_eq!(
            &out[..],
            b"POST /v1/chat/completions?a=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\n\
              content-type: application/json\r\nx-unknown: kept\r\ncontent-length: 12\r\n\r\n"
        );
    }

    #[test]
    fn get_without_body_has_no_content_length() {
        let mut out = BytesMut::new();
        let host = HeaderValue::from_static("h:1");
        encode_head(
            &mut out,
            &Method::GET,
            "/health",
            &host,
            &HeaderMap::new(),
            0,
        );
        assert_eq!(&out[..], b"GET /health HTTP/1.1\r\nhost: h:1\r\n\r\n");
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = parse("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
        assert_eq!((h.framing, h.reusable), (Framing::Length(5), true));
        let h = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
        assert_eq!((h.framing, h.reusable), (Framing::Chunked, true));
        let h = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        let h = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!((h.framing, h.reusable), (Framing::UntilClose, false));
        let h = parse("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.reusable), (Framing::UntilClose, false));
        let h = parse("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n");
        assert_eq!((h.framing, h.reusable), (Framing::Empty, true));
        let h = parse("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nConnection: Close\r\n\r\n");
        assert_eq!((h.framing, h.reusable), (Framing::Length(5), false));
        let h = parse("HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n");
        assert!(!h.reusable);
        let h = parse("HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n");
        assert!(h.reusable);
        let h = head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn keeps_status_and_every_header_and_leaves_the_body() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 4\r\n\r\nbody"[..],
        );
        let h = parse_head(&mut buf, &Method::POST).unwrap().unwrap();
        assert_eq!(&buf[..], b"body");
        assert_eq!(h.response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h.response.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(h.response.headers()["retry-after"], "2");
    }

    #[test]
    fn connection_level_fields_are_consumed() {
        let h = parse(
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\nkeep-alive: timeout=5\r\n\
             transfer-encoding: chunked\r\nx-hop: 1\r\nx-end: 2\r\ncontent-type: text/event-stream\r\n\r\n",
        );
        let mut names: Vec<&str> = h.response.headers().keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "x-end"]);
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn partial_heads_ask_for_more_and_bad_ones_fail() {
        assert!(head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::POST)
            .unwrap()
            .is_none());
        assert!(head(
            b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            &Method::POST
        )
        .is_err());
        assert!(head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            &Method::POST
        )
        .is_err());
        assert!(head(b"SSH-2.0-OpenSSH\r\n\r\n", &Method::POST).is_err());
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() < MAX_HEAD_BYTES {
            big.extend_from_slice(b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(matches!(
            head(&big, &Method::POST),
            Err(WireError::TooLarge)
        ));
    }
}
