//! Writing an answer: head, framing and body, relayed frame by frame.
//!
//! Invariants:
//! - Answers are framed here: `Content-Length` when the body's size is known, chunked otherwise
//!   (none for 1xx/204/304); framing and connection fields from the reply never pass through.
//! - What is ready is written together; nothing ready is waited for while something is pending,
//!   so a streaming client gets the head, then each event, as soon as they exist. What is
//!   pending stays under two frames of [`COPY_BYTES`]: frames that keep being ready are written
//!   as they come, so a client slower than its upstream costs the socket buffers, not memory.
//! - A write that makes no progress for the write timeout fails with `TimedOut` (a client that
//!   stopped reading); the caller closes the connection, dropping the body and the upstream
//!   request with it.
//! - While the body is awaited the client socket is watched: end of file or an error drops the
//!   answer (and with it the upstream request); bytes that arrive are kept, up to
//!   [`MAX_HEAD_BYTES`], beyond which the socket is not read until the answer ends.

use super::wire::Wire;
use super::MAX_HEAD_BYTES;
use crate::proxy::body::GatewayBody;
use crate::proxy::reply::Reply;
use bytes::BytesMut;
use futures_util::FutureExt;
use http::StatusCode;
use http_body::Body;
use http_body_util::BodyExt;
use std::io;
use std::time::Duration;

/// Data frames up to this size are copied behind the pending head or chunk prefix and sent with
/// one write; larger ones are written from their own buffer.
const COPY_BYTES: usize = 16 * 1024;

/// Writes `reply` to `stream`, relaying its body frame by frame, each write stalling at most
/// `stall`. `Err`: the client is gone or stopped reading, or the body failed; the connection
/// must close.
pub async fn write<S: Wire>(
    stream: &mut S,
    pending: &mut BytesMut,
    reply: Reply,
    close: bool,
    stall: Duration,
) -> io::Result<()> {
    let status = reply.status();
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let mut out = BytesMut::with_capacity(512);
    let (framing, mut body) = match reply {
        Reply::Relayed {
            fields, own, body, ..
        } => {
            let framing = framing(bodiless, &body);
            let theirs = fields.iter().filter(|(n, _)| !Reply::is_own(&own, n));
            let ours = own
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            encode_head(&mut out, status, theirs.chain(ours), framing, close);
            (framing, body)
        }
        Reply::Made(resp) => {
            let (parts, body) = resp.into_parts();
            let framing = framing(bodiless, &body);
            let fields = parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            encode_head(&mut out, status, fields, framing, close);
            (framing, body)
        }
    };
    if bodiless {
        return stream.send(&out, &[], stall).await;
    }
    let mut watching = true;
    loop {
        // A frame that is ready now goes out with what is pending; otherwise what is pending (the
        // head, first of all) is sent before waiting, as a streaming client expects.
        let frame = match body.frame().now_or_never() {
            Some(f) => f,
            None => {
                if !out.is_empty() {
                    stream.send(&out, &[], stall).await?;
                    out.clear();
                }
                tokio::select! {
                    biased;
                    f = body.frame() => f,
                    gone = stream.client_gone(pending), if watching => {
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
        } else {
            stream.send(&out, &data, stall).await?;
            out.clear();
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(b"\r\n");
        }
        // Frames that keep being ready (a fast upstream) are still written as they come: the
        // pending bytes stay under two frames, and a stalled client is found by the write
        // deadline instead of being buffered for.
        if out.len() >= COPY_BYTES {
            stream.send(&out, &[], stall).await?;
            out.clear();
        }
        if body.is_end_stream() {
            break;
        }
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() {
        stream.send(&out, &[], stall).await?;
    }
    Ok(())
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
        crate::proxy::date::with_now(|d| out.extend_from_slice(d));
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{self, HeaderMap, HeaderValue};

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        assert_eq!(format_chunk_size(0).as_bytes(), b"0\r\n");
        assert_eq!(format_chunk_size(255).as_bytes(), b"ff\r\n");
        assert_eq!(
            format_chunk_size(usize::MAX).as_bytes(),
            b"ffffffffffffffff\r\n"
        );
    }

    /// A body whose frames are all ready at once (an upstream faster than the client) to a
    /// client that reads nothing: the write fails at the stall deadline having taken from the
    /// body about what the socket buffers hold, not the whole body into memory.
    #[tokio::test]
    async fn frames_that_keep_being_ready_are_written_as_they_come() {
        use futures_util::StreamExt;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        const FRAMES: usize = 4096;
        const FRAME: usize = 1024;
        let taken = Arc::new(AtomicUsize::new(0));
        let counted = taken.clone();
        let frames = futures_util::stream::iter(0..FRAMES).map(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, io::Error>(bytes::Bytes::from(vec![b'x'; FRAME]))
        });
        let body = GatewayBody::plain(axum::body::Body::from_stream(frames));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let _client = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&server)
            .set_send_buffer_size(16 * 1024)
            .unwrap();
        let mut pending = BytesMut::new();
        let reply = Reply::Made(http::Response::new(body));
        let stall = Duration::from_millis(200);
        let written = write(&mut server, &mut pending, reply, false, stall).await;
        assert_eq!(written.unwrap_err().kind(), io::ErrorKind::TimedOut);
        let taken = taken.load(Ordering::SeqCst) * FRAME;
        assert!(
            taken < 1 << 20,
            "{taken} bytes of the body taken for a client that read nothing"
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
        let head = |status, framing, close| {
            let mut out = BytesMut::new();
            let fields = h.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            encode_head(&mut out, status, fields, framing, close);
            String::from_utf8(out.to_vec()).unwrap()
        };
        let text = head(StatusCode::OK, Framing::Chunked, false);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("content-type: text/event-stream\r\n"));
        assert!(text.contains("transfer-encoding: chunked\r\n"));
        assert!(text.contains("\r\ndate: "));
        assert!(
            !text.contains("999") && !text.contains("keep-alive"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\n"));
        let text = head(StatusCode::NO_CONTENT, Framing::None, true);
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
        assert!(!text.contains("content-length") && !text.contains("transfer-encoding"));
        assert!(text.contains("connection: close\r\n"));
    }
}
