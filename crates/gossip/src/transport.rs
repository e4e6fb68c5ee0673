//! Datagram transport behind a trait, so the protocol runs over real UDP in production and over a
//! fault-injecting wrapper in tests.
//!
//! Invariants:
//! - `send` is best-effort (datagram semantics): an error is counted by the caller, never retried
//!   here; gossip tolerates loss (resends, snapshots, TTLs).
//! - `recv` fills the caller's buffer and never returns more than its length.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A boxed future, for object-safe async methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A datagram socket.
pub trait Transport: Send + Sync + 'static {
    /// Sends one datagram to `to`.
    fn send_to<'a>(&'a self, data: &'a [u8], to: SocketAddr) -> BoxFuture<'a, io::Result<()>>;
    /// Receives one datagram into `buf`: (length, source).
    fn recv_from<'a>(&'a self, buf: &'a mut [u8])
        -> BoxFuture<'a, io::Result<(usize, SocketAddr)>>;
    /// The bound address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Real UDP.
pub struct UdpTransport {
    socket: tokio::net::UdpSocket,
}

/// Socket buffer size requested (the kernel may cap it); large enough to absorb a burst of
/// full-size datagrams while the receive loop applies one.
const SOCKET_BUFFER: usize = 8 * 1024 * 1024;

impl UdpTransport {
    /// Binds `addr` (port 0 = any free port).
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let domain = socket2::Domain::for_address(addr);
        let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        // Best-effort: a smaller kernel cap only means more loss under bursts, which the protocol
        // repairs.
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        let std_sock: std::net::UdpSocket = s.into();
        Ok(Self {
            socket: tokio::net::UdpSocket::from_std(std_sock)?,
        })
    }
}

impl Transport for UdpTransport {
    fn send_to<'a>(&'a self, data: &'a [u8], to: SocketAddr) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move { self.socket.send_to(data, to).await.map(|_| ()) })
    }
    fn recv_from<'a>(
        &'a self,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<(usize, SocketAddr)>> {
        Box::pin(self.socket.recv_from(buf))
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }
}

/// Wraps a transport with a switch that silently drops all traffic both ways: a network partition
/// of this replica, for tests and drills.
pub struct PartitionableTransport<T> {
    inner: T,
    cut: Arc<AtomicBool>,
}

impl<T: Transport> PartitionableTransport<T> {
    /// Wraps `inner`; returns the wrapper and its switch (true = partitioned).
    pub fn new(inner: T) -> (Self, Arc<AtomicBool>) {
        let cut = Arc::new(AtomicBool::new(false));
        (
            Self {
                inner,
                cut: cut.clone(),
            },
            cut,
        )
    }
}

impl<T: Transport> Transport for PartitionableTransport<T> {
    fn send_to<'a>(&'a self, data: &'a [u8], to: SocketAddr) -> BoxFuture<'a, io::Result<()>> {
        if self.cut.load(Ordering::Relaxed) {
            return Box::pin(async { Ok(()) });
        }
        self.inner.send_to(data, to)
    }
    fn recv_from<'a>(
        &'a self,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<(usize, SocketAddr)>> {
        Box::pin(async move {
            loop {
                let r = self.inner.recv_from(buf).await?;
                if !self.cut.load(Ordering::Relaxed) {
                    return Ok(r);
                }
            }
        })
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
