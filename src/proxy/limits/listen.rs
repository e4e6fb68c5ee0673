//! Binding a listener with the configured accept backlog (`server.limits.listen_backlog`).
//!
//! `tokio::net::TcpListener::bind` (and std's) listens with a backlog of 128. Under a burst of
//! new connections (a connect flood, a client pool reconnecting after a restart) a full accept
//! queue drops SYNs, and each dropped client waits out a retransmit of a second or more although
//! the gateway has room. The kernel caps the value at `net.core.somaxconn`.
//!
//! Invariants: the address is resolved like `TcpListener::bind` does (every address tried in
//! order, the first that binds is used); `SO_REUSEADDR` is set as tokio sets it, so a restart
//! binds while old connections sit in TIME_WAIT.

use std::io;
use tokio::net::{lookup_host, TcpListener, TcpSocket};

/// Binds `addr` (`host:port`) and listens with `backlog`.
pub async fn bind(addr: &str, backlog: u32) -> io::Result<TcpListener> {
    let mut last = None;
    for a in lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(backlog)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections the acceptor has not taken yet stay queued up to the backlog: more than
    /// std's 128 complete their handshake without a single accept.
    #[tokio::test]
    async fn a_burst_beyond_128_completes_without_accepting() {
        let l = bind("127.0.0.1:0", 1024).await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..300 {
            let c = tokio::time::timeout(
                std::time::Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr),
            )
            .await;
            held.push(c.expect("a connect waited for a SYN retransmit").unwrap());
        }
        assert_eq!(held.len(), 300);
    }

    #[tokio::test]
    async fn an_unresolvable_address_is_an_error() {
        assert!(bind("no-such-host.invalid:80", 16).await.is_err());
        assert!(bind("127.0.0.1:notaport", 16).await.is_err());
    }
}
