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

use super::pool::Conn;
use super::wire::Framing;
use bytes::{Buf, Bytes};
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
enum Step {
    Data(Bytes),
    NeedMore,
    Again,
    End,
}

/// A response body read from an upstream connection.
pub struct UpstreamBody {
    conn: Option<Conn>,
    state: State,
    reusable: bool,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("state", &self.state)
            .field("reusable", &self.reusable)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// The body following a response head on `conn` (its buffer holds any bytes already read).
    pub(super) fn new(conn: Conn, framing: Framing, reusable: bool) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Data {
                remaining: n,
                chunked: false,
            },
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        let mut body = Self {
            conn: Some(conn),
            state,
            reusable,
        };
        if state == State::Done {
            body.finish();
        }
        body
    }

    /// A body with no bytes and no connection.
    pub fn empty() -> Self {
        Self {
            conn: None,
            state: State::Done,
            reusable: false,
        }
    }

    /// The body ended where its framing says: park the connection if it may be reused.
    fn finish(&mut self) {
        self.state = State::Done;
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
        let buf = &mut conn.buf;
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

/// Position of the first CRLF in `buf`, if within `limit` bytes.
fn find_crlf(buf: &[u8], limit: usize) -> Result<Option<usize>, BodyError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(i) if i <= limit => Ok(Some(i)),
        Some(_) => Err(BodyError::Chunked("line too long")),
        None if buf.len() > limit => Err(BodyError::Chunked("line too long")),
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
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            match step {
                Step::Data(data) => {
                    if self.state == State::Done {
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
                Ok(0) if self.state == State::UntilClose => {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(Some(Err(BodyError::Truncated)));
                }
                Ok(_) => {}
                Err(e) => {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(Some(Err(BodyError::Io(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
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
        UpstreamBody::new(Conn::new(c, home), framing, true)
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

    #[test]
    fn chunk_sizes_parse_as_hex() {
        assert_eq!(parse_chunk_size(b"1A").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"ff ; name=value").unwrap(), 255);
        assert!(parse_chunk_size(b"").is_err());
        assert!(parse_chunk_size(b"-1").is_err());
        assert!(parse_chunk_size(b"1234567890abcdef0").is_err());
    }
}
