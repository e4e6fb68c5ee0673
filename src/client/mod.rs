//! The upstream HTTP client: HTTP/1.1 over pooled keep-alive connections, with connect,
//! first-byte and body-size bounds.
//!
//! The exchange runs on the calling task: the request is written, the response head read and the
//! body streamed from the socket by whoever polls it, with no connection task, channel or pool
//! lock in between (on a busy proxy those hops cost more than the HTTP work itself).
//!
//! Invariants:
//! - Connect failures are reported as [`SendError::Connect`] and nothing else is: only they (and
//!   502/503 answers) make a request safe to retry elsewhere, since the instance never saw it.
//! - A connection that closed (or was reset) before any byte of a response arrived, and was not
//!   replaced below, is reported as [`SendError::Closed`]: the instance died or dropped the
//!   request, and may or may not have acted on it, so the caller retries it elsewhere only when
//!   requests are idempotent. A connection broken once response bytes arrived is
//!   [`SendError::Protocol`].
//! - A parked connection that turns out to be closed when reused (no byte of a response read) is
//!   replaced by a fresh one to the same instance, at most [`MAX_STALE`] times per request, when
//!   the close came before the whole request was written (the server cannot have acted on it), or
//!   after it when requests are configured idempotent (`upstream.idempotent_requests`): a server
//!   that closed an idle connection while the request was in flight may or may not have read it.
//!   The pool's idle timeout sits below engines' keep-alive (uvicorn's 5 s in vLLM and SGLang) so
//!   that such closes are rare.
//! - Every wait is bounded by a configured timeout; bodies read into memory have a size cap;
//!   response heads are bounded (see [`wire`]).
//! - Each thread has its own pool of idle connections per client (see [`pool`]).

pub mod body;
pub mod deadline;
pub mod pool;
pub mod stream;
pub mod wire;

use body::UpstreamBody;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use pool::{Conn, Home};
use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stream::Stream;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use wire::{Fields, WireError};

use crate::config::UpstreamConfig;

/// Most parked connections found closed and replaced during one request.
pub const MAX_STALE: usize = 4;
/// Bodies up to this size are copied behind the head and sent with one write.
const INLINE_BODY_BYTES: usize = 16 * 1024;
/// Buffer space ensured before each read of a response head.
const HEAD_READ_RESERVE: usize = 8 * 1024;

/// Why a request to an instance failed before a response arrived.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// TCP connect failed or timed out: the instance never saw the request.
    #[error("connect failed: {0}")]
    Connect(String),
    /// No response headers within the timeout.
    #[error("timed out")]
    Timeout,
    /// The connection closed or was reset before any byte of a response: the instance went away
    /// (killed, restarted) or dropped the request, possibly after starting on it.
    #[error("connection closed before a response: {0}")]
    Closed(String),
    /// The connection broke or the answer was not valid HTTP.
    #[error("{0}")]
    Protocol(String),
    /// A body read into memory exceeded its cap.
    #[error("response body too large")]
    TooLarge,
}

impl SendError {
    /// Bounded metric label for the cause.
    pub fn cause(&self) -> &'static str {
        match self {
            SendError::Connect(_) => "connect",
            SendError::Timeout => "timeout",
            SendError::Closed(_) => "closed",
            SendError::Protocol(_) => "protocol",
            SendError::TooLarge => "body",
        }
    }
}

/// How an exchange on one connection failed.
enum Failed {
    /// Nothing of a response arrived and the connection was closed or reset: on a reused
    /// connection, the server had closed it while it was parked. `written`: the whole request
    /// had been written first.
    Closed {
        written: bool,
        error: std::io::Error,
    },
    /// Anything else.
    Other(SendError),
}

/// The end-to-end header fields of an outgoing request.
#[derive(Clone, Copy)]
pub enum OutHeaders<'a> {
    /// From a header map.
    Map(&'a HeaderMap),
    /// As received from a client (see [`Fields`]), already free of connection-level fields.
    Fields(&'a Fields),
}

/// One request to an instance, borrowing everything it sends.
pub struct Outgoing<'a> {
    /// `host:port` to connect to (also the pool key).
    pub authority: &'a str,
    /// Over TLS (an `https://` instance): the client needs `[upstream.tls]`.
    pub tls: bool,
    /// The `Host` header sent (any `host` in `headers` is ignored).
    pub host: &'a HeaderValue,
    /// Method.
    pub method: &'a Method,
    /// Path and query, starting with `/`.
    pub path_and_query: &'a str,
    /// End-to-end headers; `content-length`, `transfer-encoding`, `connection` and `host` in
    /// them are ignored (this client frames the body and manages the connection).
    pub headers: OutHeaders<'a>,
    /// One more field, sent after `headers` (which must not hold a field of that name).
    pub extra: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// The whole body.
    pub body: &'a Bytes,
}

/// A response head from an instance, with its body still on the connection.
pub struct UpstreamResponse {
    /// Status code.
    pub status: StatusCode,
    /// End-to-end header fields, as received.
    pub fields: Fields,
    /// The body, read from the connection as it is polled.
    pub body: UpstreamBody,
}

/// Pooled client shared by the proxy and the background checkers. Cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    settings: Arc<Settings>,
}

struct Settings {
    /// Distinguishes this client's parked connections from other clients' on the same thread.
    id: u64,
    connect_timeout: Duration,
    max_idle_per_host: usize,
    idle_timeout: Duration,
    /// Whether a request fully written on a connection that then closed unanswered is sent again.
    resend_written: bool,
    /// Connects `https://` instances (`[upstream.tls]`, reloaded); `None`: they cannot be
    /// reached.
    tls: Option<Arc<crate::tls::upstream::UpstreamTls>>,
}

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

impl HttpClient {
    /// A client with `cfg`'s connect timeout and pool settings, for `http://` instances only.
    pub fn new(cfg: &UpstreamConfig) -> Self {
        Self::with_tls(cfg, None)
    }

    /// A client that also reaches `https://` instances with `tls` (see [`crate::tls::upstream`]).
    pub fn with_tls(
        cfg: &UpstreamConfig,
        tls: Option<Arc<crate::tls::upstream::UpstreamTls>>,
    ) -> Self {
        Self {
            settings: Arc::new(Settings {
                id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
                connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
                max_idle_per_host: cfg.pool_max_idle_per_host,
                idle_timeout: Duration::from_millis(cfg.pool_idle_timeout_ms),
                resend_written: cfg.idempotent_requests,
                tls,
            }),
        }
    }

    /// Sends `out`, waiting at most `first_byte` for the response head. The body is then read
    /// from the connection as it is polled.
    pub async fn send_to(
        &self,
        out: Outgoing<'_>,
        first_byte: Duration,
    ) -> Result<UpstreamResponse, SendError> {
        let body = out.body;
        let inline = body.len() <= INLINE_BODY_BYTES;
        let mut head = BytesMut::with_capacity(256 + if inline { body.len() } else { 0 });
        wire::encode_head(
            &mut head,
            out.method,
            out.path_and_query,
            out.host,
            out.headers,
            out.extra,
            body.len(),
        );
        if inline {
            head.put_slice(body);
        }
        let rest = if inline { &[][..] } else { &body[..] };
        // TLS connections park apart from plain ones to the same `host:port`.
        let tls_key;
        let key = if out.tls {
            tls_key = format!("tls:{}", out.authority);
            tls_key.as_str()
        } else {
            out.authority
        };
        let exchange = async {
            let mut stale = 0;
            loop {
                let parked = if stale < MAX_STALE {
                    pool::checkout(self.settings.id, key, self.settings.idle_timeout)
                } else {
                    None
                };
                let reused = parked.is_some();
                let conn = match parked {
                    Some(c) => c,
                    None => self.connect(out.authority, out.tls, key).await?,
                };
                match exchange(conn, &head, rest, out.method).await {
                    Ok(resp) => return Ok(resp),
                    Err(Failed::Closed { written, .. })
                        if reused && (!written || self.settings.resend_written) =>
                    {
                        stale += 1
                    }
                    Err(Failed::Closed { error: e, .. }) => {
                        return Err(SendError::Closed(e.to_string()))
                    }
                    Err(Failed::Other(e)) => return Err(e),
                }
            }
        };
        match deadline::within(first_byte, exchange).await {
            Err(deadline::Elapsed) => Err(SendError::Timeout),
            Ok(r) => r,
        }
    }

    /// A fresh connection to `authority` (`host:port`), over TLS with `tls`, parked under `key`
    /// when idle; TCP connect and TLS handshake together bounded by the connect timeout. A
    /// failed handshake is a connect failure too: the instance never saw the request.
    async fn connect(&self, authority: &str, tls: bool, key: &str) -> Result<Conn, SendError> {
        let s = &self.settings;
        let fail = |m: String| SendError::Connect(format!("{authority}: {m}"));
        let connect = async {
            let stream = TcpStream::connect(authority)
                .await
                .map_err(|e| fail(e.to_string()))?;
            // Latency over packet count: heads and SSE events are small and must leave at once.
            let _ = stream.set_nodelay(true);
            let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
            let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
            if !tls {
                return Ok(Stream::Plain(stream));
            }
            let Some(tls) = &s.tls else {
                return Err(fail("an https:// instance, but no [upstream.tls]".into()));
            };
            let connector = tls.connector();
            let host = tls.server_name().unwrap_or_else(|| {
                authority
                    .rsplit_once(':')
                    .map_or(authority, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']')
            });
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| fail(format!("not a TLS server name: {e}")))?;
            // Boxed: the handshake's state is large, and every request's future would carry
            // it inline (idle connections' tasks included).
            let t = Box::pin(connector.connect(name, stream))
                .await
                .map_err(|e| fail(format!("TLS handshake: {e}")))?;
            Ok(Stream::Tls(Box::new(t)))
        };
        let stream = match tokio::time::timeout(s.connect_timeout, connect).await {
            Err(_) => {
                return Err(fail(format!(
                    "no connection within {} ms",
                    s.connect_timeout.as_millis()
                )))
            }
            Ok(r) => r?,
        };
        Ok(Conn::new(
            stream,
            Home {
                client: s.id,
                authority: key.into(),
                max_idle: s.max_idle_per_host,
                idle_timeout: s.idle_timeout,
            },
        ))
    }

    /// The upstream TLS in force (reloaded by [`crate::tls::upstream::watch`]), if any.
    pub fn tls(&self) -> Option<&Arc<crate::tls::upstream::UpstreamTls>> {
        self.settings.tls.as_ref()
    }

    /// `GET path` on `authority` (over TLS with `tls`; sent with `host`), reading at most
    /// `limit` body bytes, the whole exchange bounded by `timeout`.
    pub async fn get_bytes(
        &self,
        (authority, tls): (&str, bool),
        host: &HeaderValue,
        path: &str,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), SendError> {
        let (headers, body) = (HeaderMap::new(), Bytes::new());
        let out = Outgoing {
            authority,
            tls,
            host,
            method: &Method::GET,
            path_and_query: path,
            headers: OutHeaders::Map(&headers),
            extra: None,
            body: &body,
        };
        let fut = async {
            let resp = self.send_to(out, timeout).await?;
            let status = resp.status;
            let body = Limited::new(resp.body, limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        SendError::TooLarge
                    } else {
                        SendError::Protocol(e.to_string())
                    }
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or(Err(SendError::Timeout))
    }
}

/// Writes the request on `conn` and reads the response head; the body stays on the connection.
async fn exchange(
    mut conn: Conn,
    head: &[u8],
    rest: &[u8],
    method: &Method,
) -> Result<UpstreamResponse, Failed> {
    write_all(&mut conn.stream, head, rest)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted => Failed::Closed {
                written: false,
                error: e,
            },
            _ => Failed::Other(SendError::Protocol(format!("writing the request: {e}"))),
        })?;
    let mut received = false;
    loop {
        match wire::parse_head(&mut conn.buf, method) {
            Ok(Some(h)) => {
                received = true;
                let status = h.status;
                // Interim answers (100 Continue, 103 Early Hints) precede the real one.
                if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                    continue;
                }
                let body = UpstreamBody::new(conn, h.framing, h.reusable);
                return Ok(UpstreamResponse {
                    status,
                    fields: h.fields,
                    body,
                });
            }
            Ok(None) => {}
            Err(e @ WireError::TooLarge) | Err(e @ WireError::Invalid(_)) => {
                return Err(Failed::Other(SendError::Protocol(e.to_string())))
            }
        }
        if conn.buf.capacity() - conn.buf.len() < HEAD_READ_RESERVE / 4 {
            conn.buf.reserve(HEAD_READ_RESERVE);
        }
        match conn.stream.read_buf(&mut conn.buf).await {
            Ok(0) if !received && conn.buf.is_empty() => {
                return Err(Failed::Closed {
                    written: true,
                    error: std::io::ErrorKind::UnexpectedEof.into(),
                })
            }
            Ok(0) => {
                return Err(Failed::Other(SendError::Protocol(
                    "connection closed inside the response head".into(),
                )))
            }
            Ok(_) => received = true,
            Err(e) if !received && e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(Failed::Closed {
                    written: true,
                    error: e,
                })
            }
            Err(e) => {
                return Err(Failed::Other(SendError::Protocol(format!(
                    "reading the response: {e}"
                ))))
            }
        }
    }
}

/// Writes `a` then `b` in full, with vectored writes (a plain write once either is done), to an
/// instance or, for the HTTP/1.1 loop, to a client; then flushes (a no-op on TCP; on TLS it
/// sends the records still buffered).
pub(crate) async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    a: &[u8],
    b: &[u8],
) -> std::io::Result<()> {
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
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::TcpListener;

    /// A keep-alive HTTP/1.1 server answering `ok`; each connection answers `answers` requests,
    /// then closes on the next one without answering. Returns its address and connection count.
    async fn server(answers: usize, delay: Duration) -> (String, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let counter = conns.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut s = BufReader::new(s);
                    for _ in 0..answers {
                        let mut len = 0usize;
                        loop {
                            let mut line = String::new();
                            if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) =
                                line.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                len = v.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0u8; len];
                        s.read_exact(&mut body).await.unwrap();
                        tokio::time::sleep(delay).await;
                        s.get_mut()
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await
                            .unwrap();
                    }
                    // Read the next request, then close without answering.
                    let mut line = String::new();
                    let _ = s.read_line(&mut line).await;
                });
            }
        });
        (addr.to_string(), conns)
    }

    fn client() -> HttpClient {
        HttpClient::new(&UpstreamConfig::default())
    }

    /// `POST /v1/completions` with `body` to `authority`, waiting `first_byte` for the head.
    async fn post_with(
        c: &HttpClient,
        authority: &str,
        body: Bytes,
        first_byte: Duration,
    ) -> Result<UpstreamResponse, SendError> {
        let host = HeaderValue::from_str(authority).unwrap();
        let headers = HeaderMap::new();
        let out = Outgoing {
            authority,
            tls: false,
            host: &host,
            method: &Method::POST,
            path_and_query: "/v1/completions",
            headers: OutHeaders::Map(&headers),
            extra: None,
            body: &body,
        };
        c.send_to(out, first_byte).await
    }

    async fn post(c: &HttpClient, authority: &str) -> Result<(StatusCode, Bytes), SendError> {
        let body = Bytes::from_static(b"{\"prompt\":\"x\"}");
        let resp = post_with(c, authority, body, Duration::from_secs(5)).await?;
        let body = resp.body.collect().await.unwrap().to_bytes();
        Ok((resp.status, body))
    }

    #[tokio::test]
    async fn keep_alive_connections_are_reused() {
        let (addr, conns) = server(usize::MAX, Duration::ZERO).await;
        let c = client();
        for _ in 0..5 {
            assert_eq!(
                post(&c, &addr).await.unwrap(),
                (StatusCode::OK, "ok".into())
            );
        }
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    }

    /// A server whose every connection answers one request and is then reset (closed with
    /// linger 0) at once; each reset is reported on the returned channel.
    async fn resetting_server() -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut s = BufReader::new(s);
                    let mut len = 0usize;
                    loop {
                        let mut line = String::new();
                        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; len];
                    s.read_exact(&mut body).await.unwrap();
                    let mut s = s.into_inner();
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    drop(s);
                    let _ = tx.send(());
                });
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn a_connection_closed_while_parked_is_replaced() {
        // The instance resets every connection after one answer, before the next request: the
        // parked connection is found closed (or fails the write) and a fresh one serves.
        let (addr, mut resets) = resetting_server().await;
        let c = client();
        for _ in 0..3 {
            assert_eq!(
                post(&c, &addr).await.unwrap(),
                (StatusCode::OK, "ok".into())
            );
            resets.recv().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_request_written_before_the_close_is_sent_again_only_when_idempotent() {
        // Every connection serves one request, then reads the next whole request and closes
        // without answering: the instance may have acted on it.
        let (addr, conns) = server(1, Duration::ZERO).await;
        let c = client();
        assert_eq!(
            post(&c, &addr).await.unwrap(),
            (StatusCode::OK, "ok".into())
        );
        let err = post(&c, &addr).await.unwrap_err();
        assert!(matches!(err, SendError::Closed(_)), "{err:?}");

        let (addr, conns_idem) = server(1, Duration::ZERO).await;
        let idem = HttpClient::new(&UpstreamConfig {
            idempotent_requests: true,
            ..UpstreamConfig::default()
        });
        for _ in 0..3 {
            assert_eq!(
                post(&idem, &addr).await.unwrap(),
                (StatusCode::OK, "ok".into())
            );
        }
        assert_eq!(conns_idem.load(Ordering::SeqCst), 3);
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_fresh_connection_closed_without_answer_is_an_error() {
        let (addr, _) = server(0, Duration::ZERO).await;
        let err = post(&client(), &addr).await.unwrap_err();
        assert!(matches!(err, SendError::Closed(_)), "{err:?}");
        assert_eq!(err.cause(), "closed");
        // Also when requests are idempotent: a fresh connection is not replaced, the caller
        // decides where to send the request again.
        let idem = HttpClient::new(&UpstreamConfig {
            idempotent_requests: true,
            ..UpstreamConfig::default()
        });
        let err = post(&idem, &addr).await.unwrap_err();
        assert!(matches!(err, SendError::Closed(_)), "{err:?}");
    }

    /// A server that reads one request, answers `answer` and closes.
    async fn answering_then_closing(answer: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut s = BufReader::new(s);
                    loop {
                        let mut line = String::new();
                        if s.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                    }
                    let _ = s.get_mut().write_all(answer).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_close_after_response_bytes_is_a_protocol_error_not_a_close() {
        let addr = answering_then_closing(b"HTTP/1.1 200 OK\r\ncontent-le").await;
        let err = post_with(&client(), &addr, Bytes::new(), Duration::from_secs(5))
            .await
            .map(|r| r.status)
            .unwrap_err();
        assert!(matches!(err, SendError::Protocol(_)), "{err:?}");
    }

    #[tokio::test]
    async fn refused_connections_and_slow_heads_are_told_apart() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = l.local_addr().unwrap().to_string();
        drop(l);
        let err = post(&client(), &closed).await.unwrap_err();
        assert!(matches!(err, SendError::Connect(_)), "{err:?}");

        let (addr, _) = server(1, Duration::from_secs(10)).await;
        let err = post_with(&client(), &addr, Bytes::new(), Duration::from_millis(100))
            .await
            .map(|r| r.status)
            .unwrap_err();
        assert!(matches!(err, SendError::Timeout), "{err:?}");
    }

    #[tokio::test]
    async fn large_bodies_arrive_whole() {
        let (addr, _) = server(usize::MAX, Duration::ZERO).await;
        let big = Bytes::from(vec![b'a'; 1 << 20]);
        let resp = post_with(&client(), &addr, big, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(resp.status, StatusCode::OK);
    }

    #[tokio::test]
    async fn get_bytes_caps_the_body() {
        let (addr, _) = server(usize::MAX, Duration::ZERO).await;
        let host = HeaderValue::from_str(&addr).unwrap();
        let c = client();
        let get = |limit| {
            c.get_bytes(
                (&addr, false),
                &host,
                "/metrics",
                Duration::from_secs(2),
                limit,
            )
        };
        let (s, b) = get(64).await.unwrap();
        assert_eq!((s, &b[..]), (StatusCode::OK, &b"ok"[..]));
        let err = get(1).await.unwrap_err();
        assert!(matches!(err, SendError::TooLarge), "{err:?}");
    }
}
