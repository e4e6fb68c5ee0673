//! HTTP/1.1 on the wire: encoding a request head, parsing a response head, and deciding how the
//! response body is framed (RFC 9112 §6).
//!
//! Invariants:
//! - The encoded head carries exactly one `content-length` (the body's real length) and never
//!   `transfer-encoding` or `connection`: the body is always sent whole, and connection
//!   management is this client's, not the original caller's.
//! - Parsing never panics and never buffers more than [`MAX_HEAD_BYTES`] of head or
//!   [`MAX_HEADERS`] header fields; anything else is a [`WireError`].
//! - A response is reusable (its connection may carry the next request) only if it is HTTP/1.1
//!   without `connection: close` and its body has a known end (length or chunked).

use bytes::{BufMut, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Uri, Version};

/// Largest response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in a response head.
pub const MAX_HEADERS: usize = 128;

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

/// Appends `method path HTTP/1.1`, the headers and a `content-length` for `body_len` to `out`.
/// `host` is used when `headers` has none.
pub fn encode_head(
    out: &mut BytesMut,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body_len: usize,
) {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(if path.is_empty() {
        b"/"
    } else {
        path.as_bytes()
    });
    out.put_slice(b" HTTP/1.1\r\n");
    if !headers.contains_key(HOST) {
        if let Some(a) = uri.authority() {
            out.put_slice(b"host: ");
            out.put_slice(a.as_str().as_bytes());
            out.put_slice(b"\r\n");
        }
    }
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
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

/// Parses a response head at the start of `buf`. `Ok(None)`: more bytes are needed. On success
/// returns the head and its length in bytes; interim 1xx responses (other than 101) are returned
/// like any other and the caller skips them.
pub fn parse_head(buf: &[u8], method: &Method) -> Result<Option<(Head, usize)>, WireError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let len = match parsed.parse(buf) {
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
    let code = parsed
        .code
        .ok_or_else(|| WireError::Invalid("no status".into()))?;
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Invalid(format!("status {code}")))?;
    let version = if parsed.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut encoded = false;
    let mut close = version == Version::HTTP_10;
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| WireError::Invalid(format!("header name {:?}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| WireError::Invalid(format!("value of {name}")))?;
        if name == CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value)
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
            chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == CONNECTION {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    close = false;
                }
            }
        }
        headers.append(name, value);
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
    Ok(Some((
        Head {
            response,
            framing,
            // After 101 the connection speaks another protocol.
            reusable: !close
                && framing != Framing::UntilClose
                && status != StatusCode::SWITCHING_PROTOCOLS,
        },
        len,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Head {
        parse_head(s.as_bytes(), &Method::POST).unwrap().unwrap().0
    }

    #[test]
    fn encodes_one_content_length_and_no_connection_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(CONNECTION, HeaderValue::from_static("close"));
        h.insert("x-unknown", HeaderValue::from_static("kept"));
        let uri: Uri = "http://10.0.0.1:8000/v1/chat/completions?a=1"
            .parse()
            .unwrap();
        let mut out = BytesMut::new();
        encode_head(&mut out, &Method::POST, &uri, &h, 12);
        assert_eq!(
            &out[..],
            b"POST /v1/chat/completions?a=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\n\
              content-type: application/json\r\nx-unknown: kept\r\ncontent-length: 12\r\n\r\n"
        );
    }

    #[test]
    fn get_without_body_has_no_content_length() {
        let uri: Uri = "http://h:1/health".parse().unwrap();
        let mut out = BytesMut::new();
        encode_head(&mut out, &Method::GET, &uri, &HeaderMap::new(), 0);
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
        let h = parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn keeps_status_and_every_header() {
        let h = parse("HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(h.response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h.response.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(h.response.headers()["retry-after"], "2");
    }

    #[test]
    fn partial_heads_ask_for_more_and_bad_ones_fail() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::POST)
            .unwrap()
            .is_none());
        assert!(parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            &Method::POST
        )
        .is_err());
        assert!(parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            &Method::POST
        )
        .is_err());
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n", &Method::POST).is_err());
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() < MAX_HEAD_BYTES {
            big.extend_from_slice(b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(matches!(
            parse_head(&big, &Method::POST),
            Err(WireError::TooLarge)
        ));
    }
}
