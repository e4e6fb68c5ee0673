//! kvgate's own HTTP/1.1 loop for the four proxied `POST` endpoints; everything else on a
//! connection is handed to hyper.
//!
//! Why: a proxied request is small and regular (a `POST` with a `Content-Length` body), and on
//! such requests hyper's general server (dispatcher, body channel, boxed service future, response
//! re-encoding) costs more CPU than kvgate's own parsing and routing. This loop parses the head
//! with httparse, reads the body into one buffer, calls the same [`super::handle`] as the hyper
//! path, and writes a small complete answer with one write.
//!
//! Invariants:
//! - A request is served here only when this loop answers it exactly as the hyper path would:
//!   `POST`, HTTP/1.1, an origin-form path of one of the four endpoints, one valid
//!   `Content-Length` within `server.body_limit_bytes`, no `Transfer-Encoding`, `Expect` or
//!   `Upgrade`, at most [`MAX_HEADERS`] fields in at most [`MAX_HEAD_BYTES`]. At the first other
//!   request the connection, with every byte read so far, goes to hyper for the rest of its life,
//!   so hyper's answers (400, 405, 413, 431, admin routes, HTTP/2 with prior knowledge) stand.
//! - Answers are framed here: `Content-Length` when the body's size is known, chunked otherwise
//!   (none for 1xx/204/304); framing and connection headers from the handler never pass through.
//! - While an answer is relayed the client socket is watched: end of file or an error drops the
//!   answer, and so the upstream request; bytes that arrive (a pipelined request) are kept, up to
//!   [`MAX_HEAD_BYTES`] beyond which the socket is no longer read until the answer ends.
//! - Between requests a cancelled drain token closes the connection; a request under way finishes.

use super::body::GatewayBody;
use super::parse::Endpoint;
use super::reply::Reply;
use super::service::GatewayService;
use super::RawRequest;
use crate::client::wire::Fields;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use http::header::HeaderValue;
use http::uri::PathAndQuery;
use http::StatusCode;
use http_body::Body;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Most header fields in a request served here (hyper's default limit).
pub const MAX_HEADERS: usize = 100;
/// Most bytes of request head served here, and most bytes kept from a client while an answer is
/// relayed.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Data frames up to this size are copied behind the pending head or chunk prefix and sent with
/// one write; larger ones are written from their own buffer.
const COPY_BYTES: usize = 16 * 1024;
/// Buffer space ensured before each read of a request head.
const READ_RESERVE: usize = 4 * 1024;
/// Most buffer space added before each read of a request body.
const BODY_READ_BYTES: usize = 64 * 1024;

/// What serving a connection needs; cloned once per connection.
#[derive(Clone)]
pub struct Connections {
    /// The service (its state for the proxied routes; the whole of it after a hand-off).
    pub service: GatewayService,
    /// hyper's connection builder, for hand-offs.
    pub builder: auto::Builder<TokioExecutor>,
    /// Cancelled when the server starts draining.
    pub drain: CancellationToken,
}

/// Where a name or value lies in the head: offset and length.
type Span = (u32, u32);

/// A request head this loop serves.
struct Head {
    endpoint: Endpoint,
    /// Bytes of head, request line to the blank line.
    len: usize,
    body_len: usize,
    /// The client asked to close the connection after this answer.
    close: bool,
    /// The query, without `?`.
    query: Option<Span>,
    content_type: Option<Span>,
    request_id: Option<Span>,
    /// Name and value of each end-to-end field (see [`RawRequest::fields`]).
    fields: Vec<(u32, u32, u32, u32)>,
}

/// Fields a proxied request never forwards (RFC 9110 §7.6.1, and what the upstream client
/// writes itself).
const NOT_FORWARDED: [&[u8]; 11] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
];

/// What the bytes at the start of the buffer are.
enum Parsed {
    /// A complete head served here.
    Serve(Head),
    /// More bytes are needed.
    Partial,
    /// Anything else: hyper takes the connection.
    HandOff,
}

/// Serves `stream` until the client closes it, an error, a drain between requests, or a
/// hand-off to hyper. `watcher` is held for the connection's whole life, so that graceful
/// shutdown waits for it, and watches it once handed off.
pub async fn serve(mut stream: TcpStream, conns: Connections, watcher: Watcher) {
    let state = conns.service.state();
    let limit = state.config.server.body_limit_bytes;
    let rid_name = state.request_id_header.clone();
    let mut buf = BytesMut::with_capacity(READ_RESERVE);
    loop {
        let head = loop {
            match parse(&buf, limit, rid_name.as_str().as_bytes()) {
                Parsed::Serve(h) => break h,
                Parsed::HandOff => return hand_off(stream, buf.freeze(), conns, watcher).await,
                Parsed::Partial if buf.len() >= MAX_HEAD_BYTES => {
                    return hand_off(stream, buf.freeze(), conns, watcher).await
                }
                Parsed::Partial => {}
            }
            buf.reserve(READ_RESERVE);
            let read = if buf.is_empty() {
                tokio::select! {
                    biased;
                    r = stream.read_buf(&mut buf) => r,
                    _ = conns.drain.cancelled() => return,
                }
            } else {
                stream.read_buf(&mut buf).await
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let total = head.len + head.body_len;
        while buf.len() < total {
            // Memory follows the bytes that arrive, not the length a client declares.
            buf.reserve((total - buf.len()).min(BODY_READ_BYTES));
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let head_bytes = buf.split_to(head.len).freeze();
        let body = buf.split_to(head.body_len).freeze();
        let endpoint = head.endpoint;
        let close = head.close;
        let req = request(head, head_bytes, body);
        let state = conns.service.state().clone();
        let reply = super::handle_raw(state, endpoint, req).await;
        let close = close || conns.drain.is_cancelled();
        if write_answer(&mut stream, &mut buf, reply, close)
            .await
            .is_err()
            || close
        {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// Classifies the head at the start of `buf`. `rid_name`: the request id field's name.
fn parse(buf: &[u8], limit: usize, rid_name: &[u8]) -> Parsed {
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
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => {
            // The query must be one `http` accepts, as hyper would require.
            if PathAndQuery::try_from(target).is_err() {
                return Parsed::HandOff;
            }
            (p, Some(q))
        }
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
        query: query.map(|q| span(q.as_bytes())),
        content_type: None,
        request_id: None,
        fields: Vec::with_capacity(req.headers.len()),
    };
    let mut body_len: Option<usize> = None;
    let mut listed = false;
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = match parse_decimal(f.value) {
                Some(n) if body_len.is_none() && n <= limit => n,
                _ => return Parsed::HandOff,
            };
            body_len = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::HandOff;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in f.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    head.close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::HandOff;
                } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                    listed = true;
                }
            }
        } else if name.eq_ignore_ascii_case(rid_name) {
            // The first one counts, as a header map's `get` would have it; none is forwarded.
            head.request_id.get_or_insert(span(f.value));
            continue;
        } else if name.eq_ignore_ascii_case(b"content-type") {
            head.content_type.get_or_insert(span(f.value));
        }
        if !NOT_FORWARDED.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            let (n, nl) = span(name);
            let (v, vl) = span(f.value);
            head.fields.push((n, nl, v, vl));
        }
    }
    if listed {
        // Fields the client named in `Connection` are connection-level too (RFC 9110 §7.6.1).
        let named: Vec<&[u8]> = req
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| h.value.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        head.fields.retain(|&(n, nl, _, _)| {
            let name = &buf[n as usize..(n + nl) as usize];
            !named.iter().any(|t| t.eq_ignore_ascii_case(name))
        });
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
fn request(head: Head, bytes: Bytes, body: Bytes) -> RawRequest {
    let cut = |(at, len): Span| bytes.slice(at as usize..(at + len) as usize);
    // httparse admits exactly the values `http` does, so these never fail.
    let value = |s: Option<Span>| s.and_then(|s| HeaderValue::from_maybe_shared(cut(s)).ok());
    RawRequest {
        query: head.query.map(cut),
        content_type: value(head.content_type),
        request_id: value(head.request_id),
        fields: Fields::from_spans(bytes.clone(), head.fields),
        body,
    }
}

/// Writes `resp` to `stream`, relaying its body frame by frame. `Err`: the client is gone or the
/// body failed; the connection must close.
async fn write_answer(
    stream: &mut TcpStream,
    pending: &mut BytesMut,
    reply: Reply,
    close: bool,
) -> io::Result<()> {
    let status = reply.status();
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let mut out = BytesMut::with_capacity(512);
    let mut body = match reply {
        Reply::Relayed {
            fields, own, body, ..
        } => {
            let framing = framing(bodiless, &body);
            let theirs = fields.iter().filter(|(n, _)| !Reply::is_own(&own, n));
            let ours = own
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            encode_head(&mut out, status, theirs.chain(ours), framing, close);
            body
        }
        Reply::Made(resp) => {
            let (parts, body) = resp.into_parts();
            let framing = framing(bodiless, &body);
            let fields = parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            encode_head(&mut out, status, fields, framing, close);
            body
        }
    };
    let framing = framing(bodiless, &body);
    if bodiless {
        return write_all(stream, &out, &[]).await;
    }
    let mut watching = true;
    loop {
        // A frame that is ready now goes out with what is pending; otherwise what is pending (the
        // head, first of all) is sent before waiting, as a streaming client expects.
        let frame = match body.frame().now_or_never() {
            Some(f) => f,
            None => {
                if !out.is_empty() {
                    write_all(stream, &out, &[]).await?;
                    out.clear();
                }
                tokio::select! {
                    biased;
                    f = body.frame() => f,
                    gone = client_gone(stream, pending), if watching => {
                        if gone {
                            return Err(io::ErrorKind::ConnectionAborted.into());
                        }
                        watching = pending.len() < MAX_HEAD_BYTES;
                        continue;
                    }
                }
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                // Trailers are not relayed.
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(format_chunk_size(data.len()).as_bytes());
        }
        if data.len() <= COPY_BYTES {
            out.extend_from_slice(&data);
            if framing == Framing::Chunked {
                out.extend_from_slice(b"\r\n");
            }
        } else {
            write_all(stream, &out, &data).await?;
            out.clear();
            if framing == Framing::Chunked {
                out.extend_from_slice(b"\r\n");
            }
        }
        if body.is_end_stream() {
            break;
        }
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() {
        write_all(stream, &out, &[]).await?;
    }
    Ok(())
}

/// Waits until the client socket is readable; `true` when the client closed it or it failed,
/// `false` after keeping what arrived in `pending`.
async fn client_gone(stream: &TcpStream, pending: &mut BytesMut) -> bool {
    if stream.readable().await.is_err() {
        return true;
    }
    pending.reserve(READ_RESERVE);
    match stream.try_read_buf(pending) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// How an answer's body is delimited.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// How `body` is delimited on the wire.
fn framing(bodiless: bool, body: &GatewayBody) -> Framing {
    if bodiless {
        return Framing::None;
    }
    match body.size_hint().exact() {
        Some(n) => Framing::Length(n),
        None => Framing::Chunked,
    }
}

/// Appends the status line, the answer's end-to-end `fields`, `date` unless among them, and the
/// framing headers.
fn encode_head<'a>(
    out: &mut BytesMut,
    status: StatusCode,
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    framing: Framing,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in fields {
        if name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"connection")
        {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        super::date::with_now(|d| out.extend_from_slice(d));
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `{len:x}\r\n`, without allocating.
fn format_chunk_size(len: usize) -> ChunkSize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 18];
    let mut i = 16;
    let mut v = len;
    loop {
        i -= 1;
        buf[i] = HEX[v & 0xf];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    buf[16] = b'\r';
    buf[17] = b'\n';
    ChunkSize { buf, start: i }
}

struct ChunkSize {
    buf: [u8; 18],
    start: usize,
}

impl ChunkSize {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Writes `a` then `b` in full, with vectored writes.
async fn write_all(stream: &mut TcpStream, a: &[u8], b: &[u8]) -> io::Result<()> {
    let (mut a, mut b) = (a, b);
    while !a.is_empty() || !b.is_empty() {
        let n = if a.is_empty() {
            stream.write(b).await?
        } else if b.is_empty() {
            stream.write(a).await?
        } else {
            stream
                .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
                .await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    Ok(())
}

/// Gives the connection, with the bytes already read from it, to hyper.
async fn hand_off(stream: TcpStream, read: Bytes, conns: Connections, watcher: Watcher) {
    let io = TokioIo::new(Prefixed {
        prefix: read,
        inner: stream,
    });
    let conn = conns
        .builder
        .serve_connection_with_upgrades(io, conns.service)
        .into_owned();
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("connection ended with an error: {e}");
    }
}

/// A stream whose reads return `prefix` first.
struct Prefixed {
    prefix: Bytes,
    inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{self, HeaderMap};

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
        assert_eq!(req.query.as_deref(), Some(&b"v=1"[..]));
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
    fn content_lengths_and_chunk_sizes() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"123"), Some(123));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"1 2"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"99999999999999999999"), None);
        assert_eq!(format_chunk_size(0).as_bytes(), b"0\r\n");
        assert_eq!(format_chunk_size(255).as_bytes(), b"ff\r\n");
        assert_eq!(
            format_chunk_size(usize::MAX).as_bytes(),
            b"ffffffffffffffff\r\n"
        );
    }

    #[test]
    fn answer_heads_carry_only_this_loops_framing() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        let mut out = BytesMut::new();
        fn fields(h: &HeaderMap) -> Vec<(&[u8], &[u8])> {
            h.iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
                .collect()
        }
        encode_head(
            &mut out,
            StatusCode::OK,
            fields(&h).into_iter(),
            Framing::Chunked,
            false,
        );
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("content-type: text/event-stream\r\n"));
        assert!(text.contains("transfer-encoding: chunked\r\n"));
        assert!(text.contains("\r\ndate: "));
        assert!(
            !text.contains("999") && !text.contains("keep-alive"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\n"));
        out.clear();
        encode_head(
            &mut out,
            StatusCode::NO_CONTENT,
            fields(&h).into_iter(),
            Framing::None,
            true,
        );
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
        assert!(!text.contains("content-length") && !text.contains("transfer-encoding"));
        assert!(text.contains("connection: close\r\n"));
    }
}
