//! Reading a request head: whether the loop serves it, and the request it describes.
//!
//! Invariants:
//! - [`parse`] answers `Serve` only for `POST`, HTTP/1.1, an origin-form path of one of the four
//!   endpoints with a query `http` accepts, one valid `Content-Length` within the limit, no
//!   `Transfer-Encoding`, `Expect` or `Upgrade`, at most [`MAX_HEADERS`] fields.
//! - A served request's forwarded fields are its end-to-end ones: never connection-level fields,
//!   those named in `Connection`, `Host`, `Content-Length` or the request id field.
//! - Spans are offsets into the buffer parsed, which the head is later cut from unchanged.

use super::MAX_HEADERS;
use crate::client::wire::{drop_named_in_connection, is_hop_by_hop, ConnectionOptions, Fields};
use crate::proxy::parse::Endpoint;
use crate::proxy::RawRequest;
use bytes::Bytes;
use http::header::HeaderValue;
use http::uri::PathAndQuery;
use std::mem::MaybeUninit;

/// Where a name or value lies in the head: offset and length.
type Span = (u32, u32);

/// A request head this loop serves.
pub struct Head {
    pub endpoint: Endpoint,
    /// Bytes of head, request line to the blank line.
    pub len: usize,
    /// Bytes of body.
    pub body_len: usize,
    /// The client asked to close the connection after this answer.
    pub close: bool,
    /// The request target, when it has a query (validated by `http`).
    target: Option<PathAndQuery>,
    content_type: Option<Span>,
    request_id: Option<Span>,
    /// Name and value of each end-to-end field (see [`RawRequest::fields`]).
    fields: Vec<(u32, u32, u32, u32)>,
}

/// What the bytes at the start of the buffer are.
pub enum Parsed {
    /// A complete head served here.
    Serve(Head),
    /// More bytes are needed.
    Partial,
    /// Anything else: hyper takes the connection.
    HandOff,
}

/// Classifies the head at the start of `buf`. `rid_name`: the request id field's name.
pub fn parse(buf: &[u8], limit: usize, rid_name: &[u8]) -> Parsed {
    if buf.is_empty() {
        return Parsed::Partial;
    }
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut raw)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            // A request line that cannot be served here is known before the head is complete.
            return match req.method {
                Some(m) if m != "POST" => Parsed::HandOff,
                _ => Parsed::Partial,
            };
        }
        Err(_) => return Parsed::HandOff,
    };
    if req.method != Some("POST") || req.version != Some(1) {
        return Parsed::HandOff;
    }
    let Some(target) = req.path else {
        return Parsed::HandOff;
    };
    let (path, target) = match target.split_once('?') {
        Some((p, _)) => match PathAndQuery::try_from(target) {
            Ok(t) => (p, Some(t)),
            // The query must be one `http` accepts, as hyper would require.
            Err(_) => return Parsed::HandOff,
        },
        None => (target, None),
    };
    let Some(endpoint) = Endpoint::for_path(path) else {
        return Parsed::HandOff;
    };
    let base = buf.as_ptr() as usize;
    // Every slice points into `buf` (httparse never copies), within MAX_HEAD_BYTES.
    let span = |s: &[u8]| ((s.as_ptr() as usize - base) as u32, s.len() as u32);
    let mut head = Head {
        endpoint,
        len,
        body_len: 0,
        close: false,
        target,
        content_type: None,
        request_id: None,
        fields: Vec::with_capacity(req.headers.len()),
    };
    let mut body_len: Option<usize> = None;
    let mut connection = ConnectionOptions::default();
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = match parse_decimal(f.value) {
                Some(n) if body_len.is_none() && n <= limit => n,
                _ => return Parsed::HandOff,
            };
            body_len = Some(n);
            // The upstream client writes its own.
            continue;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::HandOff;
        } else if name.eq_ignore_ascii_case(b"connection") {
            connection.add(f.value);
            if connection.upgrade {
                return Parsed::HandOff;
            }
        } else if name.eq_ignore_ascii_case(rid_name) {
            // The first one counts, as a header map's `get` would have it; none is forwarded.
            head.request_id.get_or_insert(span(f.value));
            continue;
        } else if name.eq_ignore_ascii_case(b"content-type") {
            head.content_type.get_or_insert(span(f.value));
        }
        if !is_hop_by_hop(name) && !name.eq_ignore_ascii_case(b"host") {
            let (n, nl) = span(name);
            let (v, vl) = span(f.value);
            head.fields.push((n, nl, v, vl));
        }
    }
    head.close = connection.close;
    if connection.names_fields {
        drop_named_in_connection(req.headers, buf, &mut head.fields);
    }
    match body_len {
        Some(n) => {
            head.body_len = n;
            Parsed::Serve(head)
        }
        None => Parsed::HandOff,
    }
}

/// A `Content-Length` value: ASCII digits only, no sign, no overflow.
fn parse_decimal(v: &[u8]) -> Option<usize> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0usize, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + usize::from(b - b'0'))
    })
}

/// The request `head` describes, its fields sharing `bytes` (the head's).
pub fn request(head: Head, bytes: Bytes, body: Bytes) -> RawRequest {
    let cut = |(at, len): Span| bytes.slice(at as usize..(at + len) as usize);
    // httparse admits exactly the values `http` does, so these never fail.
    let value = |s: Option<Span>| s.and_then(|s| HeaderValue::from_maybe_shared(cut(s)).ok());
    let (content_type, request_id) = (value(head.content_type), value(head.request_id));
    RawRequest {
        target: head.target,
        content_type,
        request_id,
        fields: Fields::from_spans(bytes, head.fields),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(wire: &str) -> &'static str {
        match parse(wire.as_bytes(), 1000, b"x-request-id") {
            Parsed::Serve(h) if h.close => "serve+close",
            Parsed::Serve(_) => "serve",
            Parsed::Partial => "partial",
            Parsed::HandOff => "hand-off",
        }
    }

    #[test]
    fn serves_only_plain_proxied_posts() {
        let ok = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        let cases = [
            (ok, "serve"),
            ("POST /v1/embeddings?x=1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "serve"),
            ("POST /v1/responses HTTP/1.1\r\ncontent-length: 9\r\nConnection: keep-alive, Close\r\n\r\n", "serve+close"),
            ("", "partial"),
            ("POST /v1/chat/compl", "partial"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n", "partial"),
            ("GET /he", "hand-off"),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "hand-off"),
            ("POST /v1/models HTTP/1.1\r\nContent-Length: 2\r\n\r\n", "hand-off"),
            ("POST http://x/v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: +2\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", "hand-off"),
            ("POST /v1/chat/completions HTTP/1.1\r\nBad Header\r\n\r\n", "hand-off"),
        ];
        for (wire, want) in cases {
            assert_eq!(classify(wire), want, "{wire:?}");
        }
    }

    #[test]
    fn served_heads_keep_only_end_to_end_fields() {
        let wire = "POST /v1/chat/completions?v=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nx-a: 2\r\n\
            Content-Type: application/json\r\nConnection: keep-alive, X-Hop\r\nX-Hop: h\r\n\
            TE: trailers\r\nProxy-Authorization: p\r\nX-Request-Id: r1\r\nx-request-id: r2\r\n\
            Content-Length: 2\r\n\r\n{}";
        let Parsed::Serve(head) = parse(wire.as_bytes(), 100, b"x-request-id") else {
            panic!("not served");
        };
        assert_eq!(head.endpoint, Endpoint::Chat);
        assert_eq!(head.body_len, 2);
        let bytes = Bytes::from(wire);
        let len = head.len;
        let req = request(head, bytes.slice(..len), bytes.slice(len..));
        assert_eq!(req.target.unwrap().query(), Some("v=1"));
        assert_eq!(req.content_type.unwrap(), "application/json");
        assert_eq!(req.request_id.unwrap(), "r1");
        assert_eq!(&req.body[..], b"{}");
        let kept: Vec<_> = req.fields.iter().collect();
        assert_eq!(
            kept,
            [
                (&b"X-A"[..], &b"1"[..]),
                (b"x-a", b"2"),
                (b"Content-Type", b"application/json")
            ]
        );
    }

    #[test]
    fn queries_http_refuses_are_handed_off() {
        let ok = "POST /v1/completions?a=1&b=%20 HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(classify(ok), "serve");
        let bad = "POST /v1/completions?a=\x7f HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(classify(bad), "hand-off");
    }

    #[test]
    fn content_lengths_are_plain_decimals() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"123"), Some(123));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"1 2"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"99999999999999999999"), None);
    }
}
