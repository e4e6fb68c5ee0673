//! The streams kvgate's HTTP/1.1 loop serves: plain TCP, and TLS over TCP.
//!
//! Why a trait: on plain TCP the loop writes with `try_write` straight from its buffers and
//! watches the client with readiness alone (no copy, no timer unless the socket is full); TLS
//! has to encrypt through rustls' buffers, so it writes through `AsyncWrite` with a timer per
//! write. The loop is generic over this trait, so the plain path is the same code as before.
//!
//! Invariants (both implementations):
//! - [`Wire::send`] writes all of `a` then all of `b`, or fails; `TimedOut` when the stream
//!   accepts nothing for `stall`.
//! - [`Wire::client_gone`] waits for the client: `true` when it closed or failed, `false` after
//!   keeping what arrived in `pending`. Cancelling it loses no byte.
//! - [`Wire::bytes_waiting`] never consumes a byte.

use super::READ_RESERVE;
use bytes::BytesMut;
use std::future::Future;
use std::io::{self, IoSlice};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// A client stream the loop can serve.
pub trait Wire: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Writes `a` then `b`; fails with `TimedOut` when nothing is accepted for `stall`.
    fn send<'a>(
        &'a mut self,
        a: &'a [u8],
        b: &'a [u8],
        stall: Duration,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Waits for the client: `true` when it closed the stream or it failed, `false` after
    /// keeping what arrived in `pending`.
    fn client_gone<'a>(
        &'a mut self,
        pending: &'a mut BytesMut,
    ) -> impl Future<Output = bool> + Send + 'a;

    /// Whether bytes from the client wait in the socket, unread by the runtime yet (a request
    /// that arrived as the connection was evicted). Never reads them.
    fn bytes_waiting(&self) -> bool;
}

impl Wire for TcpStream {
    fn send<'a>(
        &'a mut self,
        a: &'a [u8],
        b: &'a [u8],
        stall: Duration,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        send(self, a, b, stall)
    }

    fn client_gone<'a>(
        &'a mut self,
        pending: &'a mut BytesMut,
    ) -> impl Future<Output = bool> + Send + 'a {
        client_gone(self, pending)
    }

    fn bytes_waiting(&self) -> bool {
        // The socket itself, not the runtime's readiness, which may not have seen them yet.
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        matches!(socket2::SockRef::from(self).peek(&mut byte), Ok(n) if n > 0)
    }
}

impl Wire for TlsStream<TcpStream> {
    async fn send(&mut self, a: &[u8], b: &[u8], stall: Duration) -> io::Result<()> {
        for part in [a, b] {
            let mut rest = part;
            while !rest.is_empty() {
                let n = match tokio::time::timeout(stall, self.write(rest)).await {
                    Ok(r) => r?,
                    Err(_) => return Err(io::ErrorKind::TimedOut.into()),
                };
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                rest = &rest[n..];
            }
        }
        // rustls keeps what the socket did not take; the answer is out only once it drained.
        match tokio::time::timeout(stall, self.flush()).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }

    async fn client_gone(&mut self, pending: &mut BytesMut) -> bool {
        pending.reserve(READ_RESERVE);
        // Cancel-safe: records read but not yet returned stay decrypted inside rustls.
        !matches!(self.read_buf(pending).await, Ok(n) if n > 0)
    }

    fn bytes_waiting(&self) -> bool {
        // Records in the socket are not a request until decrypted: not looked at.
        false
    }
}

/// Writes `a` then `b`; fails with `TimedOut` when the socket accepts nothing for `stall`.
async fn send(stream: &TcpStream, a: &[u8], b: &[u8], stall: Duration) -> io::Result<()> {
    let (mut a, mut b) = (a, b);
    while !a.is_empty() || !b.is_empty() {
        let tried = if a.is_empty() {
            stream.try_write(b)
        } else if b.is_empty() {
            stream.try_write(a)
        } else {
            stream.try_write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
        };
        let n = match tried {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The socket buffer is full: the timer exists only then.
                match tokio::time::timeout(stall, stream.writable()).await {
                    Ok(r) => r?,
                    Err(_) => return Err(io::ErrorKind::TimedOut.into()),
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
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
