//! The limits one client connection, and all of them together, may hold of the gateway:
//! `[server.limits]` made into deadlines, a connection cap and a body budget, applied alike on
//! kvgate's own HTTP/1.1 loop ([`super::h1`]) and on hyper (through [`io::Guarded`]).
//!
//! Invariants:
//! - Waiting for a request: from accept, or from the end of the previous answer, the first byte
//!   must come within `idle_timeout_ms`; from that byte the complete head within
//!   `header_read_timeout_ms`. Both close the connection without an answer.
//! - A complete head's declared body must arrive within `body_read_timeout_ms` (408, close).
//! - A write that makes no progress for `write_timeout_ms` cuts the connection, which drops the
//!   answer's body and with it the upstream request. On HTTP/2 the same bound holds per stream
//!   (an answer whose client shut its window), and cuts only that stream ([`io::Counted`]).
//! - Every served connection holds one place of the connection cap for its whole life
//!   ([`places::Place`]). At the cap a new connection takes the place of the connection idle the
//!   longest, which closes (`evict_idle_at_capacity`, see [`places`]); when none is idle the
//!   acceptor answers a fixed 503 itself and closes; those refusals are themselves capped
//!   ([`REFUSALS`]), past which a connection is closed unanswered. Nothing queues.
//! - Request bodies are reserved in the [`budget::BodyBudget`] before they are read (the
//!   declared length) or as they arrive (chunked), and released once forwarded or dropped.

pub mod budget;
pub mod io;
pub mod listen;
pub mod places;

use crate::config::ServerConfig;
use crate::error::GatewayError;
use crate::metrics::{self, CloseReason};
use budget::BodyBudget;
use bytes::Bytes;
use places::Places;
use socket2::{SockRef, TcpKeepalive};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Most over-cap connections being answered their 503 at once; beyond, they are closed
/// unanswered, so a flood costs the gateway a bounded number of sockets and tasks.
pub const REFUSALS: usize = 256;
/// Longest a refused or failed connection is drained after its answer, so that the client reads
/// the answer instead of a reset (closing a socket with unread bytes sends RST).
const LINGER: Duration = Duration::from_secs(1);
/// Most bytes read and discarded while lingering.
const LINGER_BYTES: usize = 1 << 20;

/// A connection's place under the cap, held until it closes.
pub type ConnectionPermit = places::Place;

/// `[server.limits]` in force.
pub struct Limits {
    /// First byte of a head to its end.
    pub header: Duration,
    /// Complete head to complete body.
    pub body: Duration,
    /// Accept, or end of an answer, to the next request's first byte.
    pub idle: Duration,
    /// Longest write stall.
    pub write: Duration,
    /// Largest body a request may have: `server.body_limit_bytes`, or the whole body budget
    /// when that is smaller (a larger body could never be admitted).
    pub body_limit: usize,
    /// Request bodies held at once.
    pub budget: BodyBudget,
    /// One place per open connection.
    connections: Arc<Places>,
    /// One permit per refusal under way.
    refusals: Arc<Semaphore>,
    /// The over-cap answer, encoded once.
    refusal: Bytes,
    keepalive: TcpKeepalive,
}

impl Limits {
    /// The limits of a validated `[server]`.
    pub fn new(server: &ServerConfig) -> Self {
        let l = &server.limits;
        let ms = Duration::from_millis;
        Self {
            header: ms(l.header_read_timeout_ms),
            body: ms(l.body_read_timeout_ms),
            idle: ms(l.idle_timeout_ms),
            write: ms(l.write_timeout_ms),
            body_limit: server.body_limit_bytes.min(l.body_budget_bytes),
            budget: BodyBudget::new(l.body_budget_bytes, ms(l.body_budget_wait_ms)),
            connections: Places::new(l.max_connections, l.evict_idle_at_capacity),
            refusals: Arc::new(Semaphore::new(REFUSALS)),
            refusal: refusal(l.max_connections),
            keepalive: TcpKeepalive::new()
                .with_time(keepalive_secs(l.tcp_keepalive_idle_ms))
                .with_interval(keepalive_secs(l.tcp_keepalive_interval_ms)),
        }
    }

    /// A place for a new connection, if the cap allows one (evicting the longest-idle
    /// connection at the cap, when configured). `idle`: it waits for a request from now (plain
    /// TCP); otherwise it is busy until its serving loop begins (a TLS handshake).
    pub fn admit(&self, idle: bool) -> Option<ConnectionPermit> {
        self.connections.admit(idle)
    }

    /// Client connections open now (evicted ones not yet closed included).
    pub fn open_connections(&self) -> usize {
        self.connections.open()
    }

    /// Socket options of an accepted connection: no Nagle delay (answers are written whole),
    /// TCP keepalive (a peer that vanished without a FIN is found and its connection freed).
    pub fn configure(&self, stream: &TcpStream) {
        let _ = stream.set_nodelay(true);
        if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&self.keepalive) {
            tracing::debug!("cannot set TCP keepalive: {e}");
        }
    }

    /// Answers an over-cap connection its 503 and closes it, on a task of the caller's runtime;
    /// closes it at once when [`REFUSALS`] are already under way.
    pub fn refuse(&self, mut stream: TcpStream) {
        metrics::record_connection_closed(CloseReason::OverCapacity);
        let Ok(permit) = self.refusals.clone().try_acquire_owned() else {
            return;
        };
        let (answer, write) = (self.refusal.clone(), self.write.min(LINGER));
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(write, stream.write_all(&answer)).await {
                linger(&mut stream).await;
            }
            drop(permit);
        });
    }
}

/// A TCP keepalive time of `ms` as the kernel takes it: whole seconds, rounded up, at least one.
/// (Linux's `TCP_KEEPIDLE` and `TCP_KEEPINTVL` are in seconds and refuse 0; socket2 truncates,
/// so 500 ms would ask for 0 s, fail, and leave the kernel's two-hour default in force.)
fn keepalive_secs(ms: u64) -> Duration {
    Duration::from_secs(ms.div_ceil(1000).max(1))
}

/// After an answer that ends the connection with part of the request unread: sends FIN, then
/// reads and discards for a bounded time and size, so the client reads the answer instead of a
/// reset.
pub async fn linger<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let _ = stream.shutdown().await;
    let discard = async {
        let mut scratch = [0u8; 8192];
        let mut read = 0;
        while read < LINGER_BYTES {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, discard).await;
}

/// The complete HTTP/1.1 503 an over-cap connection gets.
fn refusal(max: usize) -> Bytes {
    let e = GatewayError::TooManyConnections { max };
    let body = e.body();
    Bytes::from(format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_connections_until_their_permits_drop() {
        let mut c = ServerConfig::default();
        c.limits.max_connections = 2;
        let l = Limits::new(&c);
        // Busy (a TLS handshake): never evicted.
        let a = l.admit(false).unwrap();
        let _b = l.admit(false).unwrap();
        assert!(l.admit(true).is_none());
        assert_eq!(l.open_connections(), 2);
        drop(a);
        assert_eq!(l.open_connections(), 1);
        assert!(l.admit(true).is_some());
    }

    #[test]
    fn the_body_limit_is_the_smaller_of_limit_and_budget() {
        let mut c = ServerConfig {
            body_limit_bytes: 100,
            ..Default::default()
        };
        assert_eq!(Limits::new(&c).body_limit, 100);
        c.limits.body_budget_bytes = 50;
        assert_eq!(Limits::new(&c).body_limit, 50);
    }

    /// Linux: what [`Limits::configure`] sets on an accepted socket reads back from the kernel.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn keepalive_is_set_on_accepted_sockets_in_whole_seconds() {
        for (idle_ms, interval_ms, want) in [
            (7_000, 3_000, (7, 3)),
            // Below a second, and between seconds: rounded up, never 0 (which the kernel
            // refuses).
            (500, 1_500, (1, 2)),
        ] {
            let mut c = ServerConfig::default();
            c.limits.tcp_keepalive_idle_ms = idle_ms;
            c.limits.tcp_keepalive_interval_ms = interval_ms;
            let l = Limits::new(&c);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            let before = SockRef::from(&accepted);
            assert!(!before.keepalive().unwrap(), "off until configured");
            l.configure(&accepted);
            let s = SockRef::from(&accepted);
            assert!(s.keepalive().unwrap(), "{idle_ms} ms");
            assert!(s.tcp_nodelay().unwrap());
            let got = (
                s.tcp_keepalive_time().unwrap().as_secs(),
                s.tcp_keepalive_interval().unwrap().as_secs(),
            );
            assert_eq!(got, want, "{idle_ms} ms, {interval_ms} ms");
            drop(client);
        }
    }

    #[test]
    fn the_refusal_is_a_complete_openai_style_503() {
        let r = refusal(7);
        let text = std::str::from_utf8(&r).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
