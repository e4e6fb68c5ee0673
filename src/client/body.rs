//! The body of an upstream response, read straight from its connection as the caller polls it.
//!
//! Invariants:
//! - Every byte is yielded as soon as it is read: a chunk is passed on in pieces as they arrive,
//!   never held back until the chunk is complete (SSE events stay live).
//! - The connection is parked for reuse only once the body ended exactly where its framing says
//!   and the response allowed keep-alive; dropping the body earlier closes the connection, which
//!   tells the engine that the client is gone.
//! - Chunk-size lines and trailers are bounded ([`MAX_LINE_BYTES`], [`MAX_TRAILER_BYTES`]); a
//!   malformed or truncated body is an error, never a panic.
//! - Framing is decoded by [`Decoder`], which does no I/O: the same bytes decode the same way
//!   however the reads split them (fuzzed in `fuzz/fuzz_targets/chunked_body.rs`).

use super::pool::Conn;
use super::wire::Framing;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// Longest chunk-size line accepted (the size plus any extensions).
pub const MAX_LINE_BYTES: usize = 4096;
/// Most trailer bytes accepted after the last chunk (they are read and dropped).
pub const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// Free buffer space ensured before each read from the socket.
const READ_RESERVE: usize = 16 * 1024;

/// Why a response body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The socket failed.
    #[error("upstream connection failed mid-body: {0}")]
    Io(#[from] std::io::Error),
    /// The connection closed before the framing said the body ends.
    #[error("upstream closed the connection mid-body")]
    Truncated,
    /// The chunked encoding is malformed or exceeds its bounds.
    #[error("invalid chunked body: {0}")]
    Chunked(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// `remaining` bytes of a fixed-length body, or of the current chunk.
    Data {
        remaining: u64,
        chunked: bool,
    },
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// A chunk-size line.
    ChunkSize,
    /// Trailer lines after the last chunk; `seen` bytes so far.
    Trailers {
        seen: usize,
    },
    /// Everything until the server closes.
    UntilClose,
    Done,
}

/// What one decoding step found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Body bytes, passed on as they are.
    Data(Bytes),
    /// The buffer holds no complete next unit: read more.
    NeedMore,
    /// Framing bytes were consumed: step again.
    Again,
    /// The body ended where its framing says.
    End,
}

/// The framing state machine over a read buffer, without I/O: what [`UpstreamBody`] runs over its
/// connection's buffer, and what the fuzz targets run over arbitrary splits of a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoder {
    state: State,
}

impl Decoder {
    /// A decoder for a body framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Data {
                remaining: n,
                chunked: false,
            },
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        Self { state }
    }

    /// The body ended (or failed): nothing more is decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body ends only when the server closes the connection.
    pub fn until_close(&self) -> bool {
        self.state == State::UntilClose
    }

    fn stop(&mut self) {
        self.state = State::Done;
    }

    /// Decodes what `buf` holds, consuming what it decodes.
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Step, BodyError> {
        match self.state {
            State::Done => Ok(Step::End),
            State::UntilClose => {
                if buf.is_empty() {
                    Ok(Step::NeedMore)
                } else {
                    Ok(Step::Data(buf.split().freeze()))
                }
            }
            State::Data { remaining, chunked } => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                let data = buf.split_to(n).freeze();
                let left = remaining - n as u64;
                self.state = match (left, chunked) {
                    (0, true) => State::ChunkEnd,
                    (0, false) => State::Done,
                    (left, chunked) => State::Data {
                        remaining: left,
                        chunked,
                    },
                };
                Ok(Step::Data(data))
            }
            State::ChunkEnd => {
                if buf.len() < 2 {
                    return Ok(Step::NeedMore);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(BodyError::Chunked("missing CRLF after chunk data"));
                }
                buf.advance(2);
                self.state = State::ChunkSize;
                Ok(Step::Again)
            }
            State::ChunkSize => {
                let Some(end) = find_crlf(buf, MAX_LINE_BYTES)? else {
                    return Ok(Step::NeedMore);
                };
                let size = parse_chunk_size(&buf[..end])?;
                buf.advance(end + 2);
                self.state = if size == 0 {
                    State::Trailers { seen: 0 }
                } else {
                    State::Data {
                        remaining: size,
                        chunked: true,
                    }
                };
                Ok(Step::Again)
            }
            State::Trailers { seen } => {
                let room = MAX_TRAILER_BYTES.saturating_sub(seen);
                let Some(end) = find_crlf(buf, room)? else {
                    return Ok(Step::NeedMore);
                };
                buf.advance(end + 2);
                if end == 0 {
                    self.state = State::Done;
                    return Ok(Step::End);
                }
                self.state = State::Trailers {
                    seen: seen + end + 2,
                };
                Ok(Step::Again)
            }
        }
    }
}

/// A response body read from an upstream connection.
pub struct UpstreamBody {
    conn: Option<Conn>,
    decoder: Decoder,
    reusable: bool,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("decoder", &self.decoder)
            .field("reusable", &self.reusable)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// The body following a response head on `conn` (its buffer holds any bytes already read).
    pub(super) fn new(conn: Conn, framing: Framing, reusable: bool) -> Self {
        let decoder = Decoder::new(framing);
        let mut body = Self {
            conn: Some(conn),
            decoder,
            reusable,
        };
        if decoder.is_done() {
            body.finish();
        }
        body
    }

    /// A body with no bytes and no connection.
    pub fn empty() -> Self {
        Self {
            conn: None,
            decoder: Decoder { state: State::Done },
            reusable: false,
        }
    }

    /// The body ended where its framing says: park the connection if it may be reused.
    fn finish(&mut self) {
        self.decoder.stop();
        if let Some(conn) = self.conn.take() {
            if self.reusable {
                conn.park();
            }
        }
    }

    /// Decodes what the buffer holds.
    fn step(&mut self) -> Result<Step, BodyError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Step::End);
        };
        self.decoder.step(&mut conn.buf)
    }
}

/// Position of the first CRLF in `buf`, if within `limit` bytes.
fn find_crlf(buf: &[u8], limit: usize) -> Result<Option<usize>, BodyError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(i) if i <= limit => Ok(Some(i)),
        Some(_) => Err(BodyError::Chunked("line too long")),
        // A CRLF may still start at `limit` when the buffer's last byte is its CR: only a longer
        // buffer proves the line too long, however the reads split it.
        None if buf.len() > limit + 1 => Err(BodyError::Chunked("line too long")),
        None => Ok(None),
    }
}

/// The hexadecimal size at the start of a chunk-size line (extensions after `;` ignored).
fn parse_chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(BodyError::Chunked("bad chunk size"));
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        let d = (b as char)
            .to_digit(16)
            .ok_or(BodyError::Chunked("bad chunk size"))?;
        Ok(acc << 4 | u64::from(d))
    })
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            let step = match self.step() {
                Ok(s) => s,
                Err(e) => {
                    self.decoder.stop();
                    self.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            match step {
                Step::Data(data) => {
                    if self.decoder.is_done() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Step::Again => continue,
                Step::End => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Step::NeedMore => {}
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if conn.buf.capacity() - conn.buf.len() < READ_RESERVE / 4 {
                conn.buf.reserve(READ_RESERVE);
            }
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut conn.stream),
                cx,
                &mut conn.buf
            ));
            match read {
                Ok(0) if self.decoder.until_close() => {
                    self.decoder.stop();
                    self.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    self.decoder.stop();
                    self.conn = None;
                    return Poll::Ready(Some(Err(BodyError::Truncated)));
                }
                Ok(_) => {}
                Err(e) => {
                    self.decoder.stop();
                    self.conn = None;
                    return Poll::Ready(Some(Err(BodyError::Io(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.state {
            State::Done => SizeHint::with_exact(0),
            State::Data {
                remaining,
                chunked: false,
            } => SizeHint::with_exact(remaining),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::pool::Home;
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A body of `framing` whose server side writes `parts` one by one, 10 ms apart, then
    /// closes if `close`.
    async fn body(framing: Framing, parts: Vec<&'static [u8]>, close: bool) -> UpstreamBody {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        tokio::spawn(async move {
            for p in parts {
                s.write_all(p).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if !close {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        let home = Home {
            client: u64::MAX,
            authority: "t:1".into(),
            max_idle: 0,
            idle_timeout: Duration::from_secs(1),
        };
        UpstreamBody::new(
            Conn::new(crate::client::stream::Stream::Plain(c), home),
            framing,
            true,
        )
    }

    async fn frames(mut b: UpstreamBody) -> (Vec<Vec<u8>>, Option<String>) {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            match f {
                Ok(f) => out.push(f.into_data().unwrap().to_vec()),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
        assert!(b.is_end_stream());
        (out, None)
    }

    #[tokio::test]
    async fn chunked_pieces_are_yielded_as_they_arrive() {
        let b = body(
            Framing::Chunked,
            vec![
                b"8\r\ndata: ",
                b"1\n\r\n",
                b"8;ext=1\r\ndata: 2\n\r\n",
                b"0\r\ntrailer: x\r\n\r\n",
            ],
            false,
        )
        .await;
        let (f, err) = frames(b).await;
        assert_eq!(err, None);
        assert_eq!(
            f,
            vec![b"data: ".to_vec(), b"1\n".to_vec(), b"data: 2\n".to_vec()]
        );
    }

    #[tokio::test]
    async fn length_and_close_delimited_bodies_end_where_they_should() {
        let (f, err) = frames(body(Framing::Length(5), vec![b"he", b"llo"], false).await).await;
        assert_eq!((f.concat(), err), (b"hello".to_vec(), None));
        let (f, err) = frames(body(Framing::UntilClose, vec![b"a", b"b"], true).await).await;
        assert_eq!((f.concat(), err), (b"ab".to_vec(), None));
    }

    #[tokio::test]
    async fn truncated_and_malformed_bodies_are_errors() {
        let (f, err) = frames(body(Framing::Length(10), vec![b"short"], true).await).await;
        assert_eq!(f.concat(), b"short");
        assert!(err.unwrap().contains("mid-body"));
        let (_, err) = frames(body(Framing::Chunked, vec![b"zz\r\n"], false).await).await;
        assert!(err.unwrap().contains("bad chunk size"));
        let (_, err) = frames(body(Framing::Chunked, vec![b"2\r\nabXY"], false).await).await;
        assert!(err.unwrap().contains("CRLF"));
        let (_, err) = frames(body(Framing::Chunked, vec![b"4\r\nab"], true).await).await;
        assert!(err.unwrap().contains("mid-body"));
        let long: &'static [u8] = Box::leak(vec![b'1'; MAX_LINE_BYTES + 10].into_boxed_slice());
        let (_, err) = frames(body(Framing::Chunked, vec![long], false).await).await;
        assert!(err.unwrap().contains("too long"));
    }

    /// Decodes `body` fed in two reads cut at `cut`: the data, and whether it ended.
    fn decode_cut(body: &[u8], cut: usize) -> Result<(Vec<u8>, bool), BodyError> {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&body[..cut]);
        let mut rest = Some(&body[cut..]);
        let mut data = Vec::new();
        for _ in 0..100 {
            match d.step(&mut buf)? {
                Step::Data(b) => data.extend_from_slice(&b),
                Step::Again => {}
                Step::End => return Ok((data, true)),
                Step::NeedMore => match rest.take() {
                    Some(r) => buf.extend_from_slice(r),
                    None => return Ok((data, false)),
                },
            }
        }
        panic!("no progress");
    }

    #[test]
    fn lines_at_the_limit_decode_however_their_crlf_is_split() {
        // A chunk-size line (size, then an extension) and a trailer line of exactly the limit.
        let mut line = b"5;".to_vec();
        line.resize(MAX_LINE_BYTES, b'x');
        let mut trailer = b"t: ".to_vec();
        trailer.resize(MAX_TRAILER_BYTES, b'y');
        let cases = [
            (
                [&line[..], b"\r\nhello\r\n0\r\n\r\n"].concat(),
                0,
                MAX_LINE_BYTES,
            ),
            (
                [b"5\r\nhello\r\n0\r\n", &trailer[..], b"\r\n\r\n"].concat(),
                13,
                MAX_TRAILER_BYTES,
            ),
        ];
        for (body, line_at, line_len) in cases {
            // The first read ends just after the long line's CR.
            let cr_at_end = line_at + line_len + 1;
            for cut in [cr_at_end, cr_at_end - 1, body.len()] {
                let got = decode_cut(&body, cut).map_err(|e| e.to_string());
                assert_eq!(got, Ok((b"hello".to_vec(), true)), "cut at {cut}");
            }
            // One byte longer is too long, split or not.
            let mut long = body.clone();
            long.insert(line_at + 3, b'z');
            assert!(decode_cut(&long, cr_at_end + 1).is_err());
            assert!(decode_cut(&long, long.len()).is_err());
        }
    }

    #[test]
    fn chunk_sizes_parse_as_hex() {
        assert_eq!(parse_chunk_size(b"1A").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"ff ; name=value").unwrap(), 255);
        assert!(parse_chunk_size(b"").is_err());
        assert!(parse_chunk_size(b"-1").is_err());
        assert!(parse_chunk_size(b"1234567890abcdef0").is_err());
    }
}
