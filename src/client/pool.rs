//! Upstream connections and the per-thread pool of idle ones.
//!
//! Invariants:
//! - A connection is parked only between exchanges: its previous response was read to its end and
//!   no byte beyond it arrived. A connection dropped mid-exchange is closed, never parked.
//! - Each thread parks its own connections (a connection's socket is registered with the runtime
//!   of the thread that opened it, so a request and its upstream socket never wake each other
//!   across threads), at most `max_idle` per (client, authority), each for at most `idle_timeout`.
//!   The number of (client, authority) keys per thread is capped at [`MAX_KEYS`].
//! - Checkout never returns a connection the server has already closed if the close was seen by
//!   the runtime (the readiness check costs no system call while the socket is quiet).

use super::stream::Stream;
use ahash::AHashMap;
use bytes::BytesMut;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Most (client, authority) pairs with parked connections on one thread.
pub const MAX_KEYS: usize = 4096;

/// One keep-alive connection to an instance, with the bytes read beyond the last parsed item.
pub struct Conn {
    pub(super) stream: Stream,
    pub(super) buf: BytesMut,
    home: Home,
}

/// Where a connection is parked when idle.
pub(super) struct Home {
    pub client: u64,
    pub authority: Box<str>,
    pub max_idle: usize,
    pub idle_timeout: Duration,
}

impl Conn {
    /// Wraps a freshly connected stream.
    pub(super) fn new(stream: Stream, home: Home) -> Self {
        Self {
            stream,
            buf: BytesMut::new(),
            home,
        }
    }

    /// Parks this connection for the next request to the same instance on this thread (or drops
    /// it when the pool is full or it carries unread bytes).
    pub(super) fn park(self) {
        if !self.buf.is_empty() || self.home.max_idle == 0 {
            return;
        }
        // A thread being torn down has no pool left; the connection just closes.
        let _ = IDLE.try_with(|idle| idle.borrow_mut().park(self));
    }
}

struct Parked {
    since: Instant,
    conn: Conn,
}

#[derive(Default)]
struct Idle {
    keys: usize,
    by_client: AHashMap<u64, AHashMap<Box<str>, Vec<Parked>>>,
}

thread_local! {
    static IDLE: RefCell<Idle> = RefCell::new(Idle::default());
}

impl Idle {
    fn park(&mut self, conn: Conn) {
        let now = Instant::now();
        let home = &conn.home;
        if let Some(list) = self
            .by_client
            .get_mut(&home.client)
            .and_then(|m| m.get_mut(&*home.authority))
        {
            // Oldest first: drop what expired while parked.
            let expired = list
                .iter()
                .take_while(|p| now.duration_since(p.since) > home.idle_timeout)
                .count();
            list.drain(..expired);
            if list.len() < home.max_idle {
                list.push(Parked { since: now, conn });
            }
            return;
        }
        self.sweep(now);
        if self.keys >= MAX_KEYS {
            return;
        }
        self.keys += 1;
        let (client, authority) = (home.client, home.authority.clone());
        self.by_client
            .entry(client)
            .or_default()
            .insert(authority, vec![Parked { since: now, conn }]);
    }

    /// Drops expired connections and keys left empty (run only when a new key is added).
    fn sweep(&mut self, now: Instant) {
        for per_client in self.by_client.values_mut() {
            per_client.retain(|_, list| {
                list.retain(|p| now.duration_since(p.since) <= p.conn.home.idle_timeout);
                !list.is_empty()
            });
        }
        self.by_client.retain(|_, m| !m.is_empty());
        self.keys = self.by_client.values().map(|m| m.len()).sum();
    }

    fn take(&mut self, client: u64, authority: &str, idle_timeout: Duration) -> Option<Conn> {
        let list = self.by_client.get_mut(&client)?.get_mut(authority)?;
        // Newest first: the most recently used connection is the least likely to have been
        // closed by the server's own keep-alive timeout.
        while let Some(p) = list.pop() {
            if p.since.elapsed() > idle_timeout {
                // Everything older expired too.
                list.clear();
                return None;
            }
            if p.conn.stream.is_open() {
                return Some(p.conn);
            }
        }
        None
    }
}

/// A parked connection of `client` to `authority` on this thread, if one is still open.
pub(super) fn checkout(client: u64, authority: &str, idle_timeout: Duration) -> Option<Conn> {
    IDLE.try_with(|idle| idle.borrow_mut().take(client, authority, idle_timeout))
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    fn home(client: u64, max_idle: usize, idle_ms: u64) -> Home {
        Home {
            client,
            authority: "a:1".into(),
            max_idle,
            idle_timeout: Duration::from_millis(idle_ms),
        }
    }

    #[tokio::test]
    async fn parks_reuses_and_bounds_idle_connections() {
        let mut servers = Vec::new();
        for _ in 0..3 {
            let (c, s) = pair().await;
            servers.push(s);
            Conn::new(Stream::Plain(c), home(1, 2, 60_000)).park();
        }
        // Two parked (max_idle 2), the third closed.
        assert!(checkout(1, "a:1", Duration::from_secs(60)).is_some());
        assert!(checkout(1, "a:1", Duration::from_secs(60)).is_some());
        assert!(checkout(1, "a:1", Duration::from_secs(60)).is_none());
        // Other clients and authorities do not share.
        let (c, _s) = pair().await;
        Conn::new(Stream::Plain(c), home(2, 2, 60_000)).park();
        assert!(checkout(1, "a:1", Duration::from_secs(60)).is_none());
        assert!(checkout(2, "b:1", Duration::from_secs(60)).is_none());
        assert!(checkout(2, "a:1", Duration::from_secs(60)).is_some());
    }

    #[tokio::test]
    async fn closed_expired_or_dirty_connections_are_not_reused() {
        // Closed by the server while parked.
        let (c, s) = pair().await;
        Conn::new(Stream::Plain(c), home(3, 4, 60_000)).park();
        drop(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(checkout(3, "a:1", Duration::from_secs(60)).is_none());
        // Stray bytes from the server while parked.
        let (c, mut s) = pair().await;
        Conn::new(Stream::Plain(c), home(4, 4, 60_000)).park();
        s.write_all(b"junk").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(checkout(4, "a:1", Duration::from_secs(60)).is_none());
        // Parked longer than the idle timeout.
        let (c, _s) = pair().await;
        Conn::new(Stream::Plain(c), home(5, 4, 1)).park();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(checkout(5, "a:1", Duration::from_millis(1)).is_none());
        // Unread bytes at park time: never parked.
        let (c, _s) = pair().await;
        let mut conn = Conn::new(Stream::Plain(c), home(6, 4, 60_000));
        conn.buf.extend_from_slice(b"HTTP/1.1 200");
        conn.park();
        assert!(checkout(6, "a:1", Duration::from_secs(60)).is_none());
    }
}
