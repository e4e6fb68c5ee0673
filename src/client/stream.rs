//! An upstream connection's byte stream: plain TCP, or TLS over TCP for `https://` instances.
//!
//! Invariants:
//! - Both variants are the same to the HTTP code above ([`AsyncRead`] + [`AsyncWrite`]); only
//!   connecting and the idle check differ.
//! - The idle check never consumes a byte: on TLS, bytes are peeked at the TCP level (reading
//!   them would desynchronize the TLS record stream).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection to an instance.
pub enum Stream {
    /// `http://`.
    Plain(TcpStream),
    /// `https://` (boxed: the TLS state is large, and plain connections are the common case).
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Whether a parked connection is still usable: no end-of-stream, error or stray bytes
    /// seen. Costs no system call while the socket is quiet.
    pub fn is_open(&self) -> bool {
        match self {
            Stream::Plain(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Tls(t) => {
                // Anything arriving on an idle TLS connection (a close_notify, a reset) means it
                // is not worth reusing; peek, so that nothing is taken from the record stream.
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                matches!(t.get_ref().0.poll_peek(&mut cx, &mut buf), Poll::Pending)
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
