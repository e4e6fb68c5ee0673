//! HTTP/1.1 on the wire: encoding a request head, parsing a response head, and deciding how the
//! response body is framed (RFC 9112 §6).
//!
//! Invariants:
//! - The encoded head carries exactly one `content-length` (the body's real length) and never
//!   `transfer-encoding` or `connection`: the body is always sent whole, and connection
//!   management is this client's, not the original caller's.
//! - Parsing never panics and never buffers more than [`MAX_HEAD_BYTES`] of head or
//!   [`MAX_HEADERS`] header fields; anything else is a [`WireError`].
//! - Hop-by-hop response fields ([`HOP_BY_HOP`] and whatever `Connection` names) are consumed
//!   here and never reach the caller's [`Fields`].
//! - A response is reusable (its connection may carry the next request) only if it is HTTP/1.1
//!   without `connection: close` and its body has a known end (length or chunked).

use super::OutHeaders;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

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
    /// Status code.
    pub status: StatusCode,
    /// The end-to-end header fields.
    pub fields: Fields,
    /// How the body is framed.
    pub framing: Framing,
    /// Whether the connection may carry another request after this body.
    pub reusable: bool,
}

/// The end-to-end header fields of a response head as they arrived (names in their original
/// case, in order, repeats kept), sharing the head's bytes. Both names and values passed
/// httparse's checks: names are tokens, values hold no control bytes but tab.
#[derive(Clone, Debug, Default)]
pub struct Fields {
    head: Bytes,
    /// Offset and length of each field's name and value in `head`.
    spans: Vec<(u32, u32, u32, u32)>,
}

impl Fields {
    /// Fields at `spans` (offset and length of name, then of value) in `head`. Every span must
    /// lie within `head` and hold what httparse accepted as a name or a value.
    pub fn from_spans(head: Bytes, spans: Vec<(u32, u32, u32, u32)>) -> Self {
        debug_assert!(spans
            .iter()
            .all(|&(n, nl, v, vl)| (n + nl) as usize <= head.len()
                && (v + vl) as usize <= head.len()));
        Self { head, spans }
    }

    /// Each field's name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.spans.iter().map(|&(n, nl, v, vl)| {
            (
                &self.head[n as usize..(n + nl) as usize],
                &self.head[v as usize..(v + vl) as usize],
            )
        })
    }

    /// Keeps only the fields whose name `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let head = &self.head;
        self.spans
            .retain(|&(n, nl, _, _)| keep(&head[n as usize..(n + nl) as usize]));
    }

    /// The fields as a header map; values share the head's bytes.
    pub fn to_header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.spans.len() + SPARE_HEADERS);
        for &(n, nl, v, vl) in &self.spans {
            let name = HeaderName::from_bytes(&self.head[n as usize..(n + nl) as usize]);
            let value =
                HeaderValue::from_maybe_shared(self.head.slice(v as usize..(v + vl) as usize));
            // httparse admits exactly what `http` does, so neither fails.
            if let (Ok(name), Ok(value)) = (name, value) {
                map.append(name, value);
            }
        }
        map
    }
}

/// Appends `method path HTTP/1.1`, `host`, the end-to-end headers, `extra` and a
/// `content-length` for `body_len` to `out`.
pub fn encode_head(
    out: &mut BytesMut,
    method: &Method,
    path_and_query: &str,
    host: &HeaderValue,
    headers: OutHeaders<'_>,
    extra: Option<(&HeaderName, &HeaderValue)>,
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
    let mut field = |name: &[u8], value: &[u8]| {
        out.put_slice(name);
        out.put_slice(b": ");
        out.put_slice(value);
        out.put_slice(b"\r\n");
    };
    match headers {
        OutHeaders::Map(map) => {
            for (name, value) in map {
                if name == CONTENT_LENGTH
                    || name == TRANSFER_ENCODING
                    || name == CONNECTION
                    || name == HOST
                {
                    continue;
                }
                field(name.as_str().as_bytes(), value.as_bytes());
            }
        }
        OutHeaders::Fields(fields) => {
            for (name, value) in fields.iter() {
                if name.eq_ignore_ascii_case(b"content-length")
                    || name.eq_ignore_ascii_case(b"transfer-encoding")
                    || name.eq_ignore_ascii_case(b"connection")
                    || name.eq_ignore_ascii_case(b"host")
                {
                    continue;
                }
                field(name, value);
            }
        }
    }
    if let Some((name, value)) = extra {
        field(name.as_str().as_bytes(), value.as_bytes());
    }
    if body_len > 0 || !matches!(*method, Method::GET | Method::HEAD) {
        out.put_slice(b"content-length: ");
        let mut digits = itoa::Buffer::new();
        out.put_slice(digits.format(body_len).as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// The fields that only concern one connection (RFC 9110 §7.6.1) or one proxy hop, lowercase:
/// never relayed in either direction.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether the field `name` (any case) is one of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    // Every field of every request and response passes here: the length picks the one or two
    // names worth comparing.
    let candidates: &[&str] = match name.len() {
        2 => &["te"],
        7 => &["trailer", "upgrade"],
        10 => &["connection", "keep-alive"],
        16 => &["proxy-connection"],
        17 => &["transfer-encoding"],
        18 => &["proxy-authenticate"],
        19 => &["proxy-authorization"],
        _ => return false,
    };
    candidates
        .iter()
        .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
}

/// What the tokens of a head's `Connection` fields say (RFC 9110 §7.6.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// `close`.
    pub close: bool,
    /// `keep-alive`.
    pub keep_alive: bool,
    /// `upgrade`.
    pub upgrade: bool,
    /// Some other token: a field name, that field then being connection-level too.
    pub names_fields: bool,
}

impl ConnectionOptions {
    /// Adds the tokens of one `Connection` field value.
    pub fn add(&mut self, value: &[u8]) {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else if !token.is_empty() {
                self.names_fields = true;
            }
        }
    }
}

/// Removes from `spans` (name and value spans over `buf`) every field that a `Connection` field
/// among `fields` names: those are connection-level too (RFC 9110 §7.6.1).
pub fn drop_named_in_connection(
    fields: &[httparse::Header<'_>],
    buf: &[u8],
    spans: &mut Vec<(u32, u32, u32, u32)>,
) {
    let named: Vec<&[u8]> = fields
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .collect();
    spans.retain(|&(n, nl, _, _)| {
        let name = &buf[n as usize..(n + nl) as usize];
        !named.iter().any(|t| t.eq_ignore_ascii_case(name))
    });
}

/// Parses a response head at the start of `buf` and, when it is complete, removes it from `buf`
/// (what follows stays: the start of the body). `Ok(None)`: more bytes are needed. Fields share
/// the head's bytes rather than copying them. Interim 1xx responses (other than 101) are
/// returned like any other and the caller skips them.
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, WireError> {
    // Where each name and value lies in `buf`, so they can be cut from the head once it is
    // split off (the parser's borrow of `buf` ends first).
    let mut spans: Vec<(u32, u32, u32, u32)>;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut encoded = false;
    let mut connection = ConnectionOptions::default();
    let (len, code, minor) = {
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
        spans = Vec::with_capacity(parsed.headers.len());
        for h in parsed.headers.iter() {
            let name = h.name.as_bytes();
            let value = h.value;
            if name.eq_ignore_ascii_case(b"content-length") {
                let n = content_length(value)
                    .ok_or_else(|| WireError::Invalid("content-length".into()))?;
                if length.is_some_and(|l| l != n) {
                    return Err(WireError::Invalid("conflicting content-length".into()));
                }
                length = Some(n);
            } else if is_hop_by_hop(name) {
                if name.eq_ignore_ascii_case(b"transfer-encoding") {
                    encoded = true;
                    // Only the last coding decides whether the body is chunked.
                    chunked = value
                        .rsplit(|&b| b == b',')
                        .next()
                        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                } else if name.eq_ignore_ascii_case(b"connection") {
                    connection.add(value);
                }
                // Connection-level fields end here: the body is decoded by this client and the
                // connection is this client's to manage.
                continue;
            }
            // Both slices point into `buf` (httparse never copies), within MAX_HEAD_BYTES.
            spans.push((
                (name.as_ptr() as usize - base) as u32,
                name.len() as u32,
                (value.as_ptr() as usize - base) as u32,
                value.len() as u32,
            ));
        }
        if connection.names_fields {
            drop_named_in_connection(parsed.headers, buf, &mut spans);
        }
        (len, parsed.code, parsed.version)
    };
    let head = buf.split_to(len).freeze();
    let code = code.ok_or_else(|| WireError::Invalid("no status".into()))?;
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Invalid(format!("status {code}")))?;
    // HTTP/1.0 closes unless asked to keep the connection alive.
    let close = if minor == Some(1) {
        connection.close
    } else {
        !connection.keep_alive || connection.close
    };
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
    Ok(Some(Head {
        status,
        fields: Fields { head, spans },
        framing,
        // After 101 the connection speaks another protocol.
        reusable: !close
            && framing != Framing::UntilClose
            && status != StatusCode::SWITCHING_PROTOCOLS,
    }))
}

/// A `Content-Length` value: `1*DIGIT` (RFC 9110 §8.6) between optional blanks. Not
/// `str::parse`, which also takes a leading `+`.
fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
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
    fn content_lengths_are_digits_only() {
        let with = |v: &str| {
            head(
                format!("HTTP/1.1 200 OK\r\ncontent-length: {v}\r\n\r\n").as_bytes(),
                &Method::POST,
            )
        };
        assert_eq!(with("13").unwrap().unwrap().framing, Framing::Length(13));
        assert_eq!(with(" 7 ").unwrap().unwrap().framing, Framing::Length(7));
        // Found by fuzz/fuzz_targets/response_head.rs: `str::parse` took the sign.
        for bad in ["+13", "-1", "1_0", "0x10", "", "18446744073709551616"] {
            assert!(matches!(with(bad), Err(WireError::Invalid(_))), "{bad:?}");
        }
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
        encode_head(
            &mut out,
            &Method::POST,
            path,
            &host,
            OutHeaders::Map(&h),
            Some((
                &HeaderName::from_static("x-request-id"),
                &HeaderValue::from_static("r1"),
            )),
            12,
        );
        assert_eq!(
            &out[..],
            b"POST /v1/chat/completions?a=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\n\
              content-type: application/json\r\nx-unknown: kept\r\nx-request-id: r1\r\n\
              content-length: 12\r\n\r\n"
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
            OutHeaders::Map(&HeaderMap::new()),
            None,
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
        assert_eq!(h.status, StatusCode::TOO_MANY_REQUESTS);
        let map = h.fields.to_header_map();
        assert_eq!(map.get_all("x-a").iter().count(), 2);
        assert_eq!(map["retry-after"], "2");
        let raw: Vec<_> = h.fields.iter().collect();
        assert_eq!(raw[0], (&b"retry-after"[..], &b"2"[..]));
        assert_eq!(raw.len(), 4);
    }

    #[test]
    fn connection_level_fields_are_consumed() {
        let h = parse(
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\nkeep-alive: timeout=5\r\n\
             transfer-encoding: chunked\r\nx-hop: 1\r\nx-end: 2\r\ncontent-type: text/event-stream\r\n\r\n",
        );
        let names: Vec<&[u8]> = h.fields.iter().map(|(n, _)| n).collect();
        assert_eq!(names, [&b"x-end"[..], b"content-type"]);
        assert_eq!(h.framing, Framing::Chunked);
        let h = parse(
            "HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nx-hop: 1\r\nTE: trailers\r\nProxy-Authenticate: Basic\r\ncontent-length: 0\r\n\r\n",
        );
        let names: Vec<&[u8]> = h.fields.iter().map(|(n, _)| n).collect();
        assert_eq!(names, [&b"content-length"[..]]);
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn connection_options_read_every_token_of_every_value() {
        let mut c = ConnectionOptions::default();
        c.add(b" Keep-Alive ,, ");
        assert_eq!(
            c,
            ConnectionOptions {
                keep_alive: true,
                ..Default::default()
            }
        );
        c.add(b"x-hop,CLOSE, upgrade");
        assert_eq!(
            c,
            ConnectionOptions {
                close: true,
                keep_alive: true,
                upgrade: true,
                names_fields: true,
            }
        );
    }

    #[test]
    fn hop_by_hop_is_exactly_the_list_in_any_case() {
        for name in HOP_BY_HOP {
            assert!(is_hop_by_hop(name.as_bytes()), "{name}");
            assert!(
                is_hop_by_hop(name.to_ascii_uppercase().as_bytes()),
                "{name}"
            );
            let mut longer = name.to_string();
            longer.push('s');
            assert!(!is_hop_by_hop(longer.as_bytes()), "{longer}");
            assert!(
                !is_hop_by_hop(&name.as_bytes()[1..]),
                "{name} without its first byte"
            );
        }
        for other in ["host", "content-type", "x-upgrade", "connectiom", "", "tf"] {
            assert!(!is_hop_by_hop(other.as_bytes()), "{other}");
        }
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
