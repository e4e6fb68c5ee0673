//! kvgate's own HTTP/1.1 loop for the four proxied `POST` endpoints; everything else on a
//! connection is handed to hyper.
//!
//! Why: a proxied request is small and regular (a `POST` with a `Content-Length` body), and on
//! such requests hyper's general server (dispatcher, body channel, boxed service future, response
//! re-encoding) costs more CPU than kvgate's own parsing and routing. This loop parses the head
//! with httparse (`head`), reads the body into one buffer, calls the same handler as the hyper
//! path ([`super::handle_raw`]), and writes a small complete answer with one write (`answer`).
//!
//! Invariants:
//! - A request is served here only when this loop answers it exactly as the hyper path would:
//!   `POST`, HTTP/1.1, an origin-form path of one of the four endpoints, one valid
//!   `Content-Length` within `server.body_limit_bytes`, no `Transfer-Encoding`, `Expect` or
//!   `Upgrade`, at most [`MAX_HEADERS`] fields in at most [`MAX_HEAD_BYTES`]. At the first other
//!   request the connection, with every byte read so far, goes to hyper for the rest of its life,
//!   so hyper's answers (400, 405, 413, 431, admin routes, HTTP/2 with prior knowledge) stand.
//! - Answers are framed here: `Content-Length` when the body's size is known, chunked otherwise
//!   (none for 1xx/204/304); framing and connection headers from the handler never pass through.
//! - While an answer is relayed the client socket is watched: end of file or an error drops the
//!   answer, and so the upstream request; bytes that arrive (a pipelined request) are kept, up to
//!   [`MAX_HEAD_BYTES`] beyond which the socket is no longer read until the answer ends.
//! - Between requests a cancelled drain token closes the connection; a request under way finishes.

mod answer;
pub mod head;
mod prefixed;

use super::service::GatewayService;
use bytes::{Bytes, BytesMut};
use head::Parsed;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use prefixed::Prefixed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Most header fields in a request served here (hyper's default limit).
pub const MAX_HEADERS: usize = 100;
/// Most bytes of request head served here, and most bytes kept from a client while an answer is
/// relayed.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Buffer space ensured before each read of a request head.
const READ_RESERVE: usize = 4 * 1024;
/// Most buffer space added before each read of a request body.
const BODY_READ_BYTES: usize = 64 * 1024;

/// What serving a connection needs; cloned once per connection.
#[derive(Clone)]
pub struct Connections {
    /// The service (its state for the proxied routes; the whole of it after a hand-off).
    pub service: GatewayService,
    /// hyper's connection builder, for hand-offs.
    pub builder: auto::Builder<TokioExecutor>,
    /// Cancelled when the server starts draining.
    pub drain: CancellationToken,
}

/// Serves `stream` until the client closes it, an error, a drain between requests, or a
/// hand-off to hyper. `watcher` is held for the connection's whole life, so that graceful
/// shutdown waits for it, and watches it once handed off.
pub async fn serve(mut stream: TcpStream, conns: Connections, watcher: Watcher) {
    let state = conns.service.state();
    let limit = state.config.server.body_limit_bytes;
    let rid_name = state.request_id_header.clone();
    let mut buf = BytesMut::with_capacity(READ_RESERVE);
    loop {
        let head = loop {
            match head::parse(&buf, limit, rid_name.as_str().as_bytes()) {
                Parsed::Serve(h) => break h,
                Parsed::HandOff => return hand_off(stream, buf.freeze(), conns, watcher).await,
                Parsed::Partial if buf.len() >= MAX_HEAD_BYTES => {
                    return hand_off(stream, buf.freeze(), conns, watcher).await
                }
                Parsed::Partial => {}
            }
            buf.reserve(READ_RESERVE);
            let read = if buf.is_empty() {
                tokio::select! {
                    biased;
                    r = stream.read_buf(&mut buf) => r,
                    _ = conns.drain.cancelled() => return,
                }
            } else {
                stream.read_buf(&mut buf).await
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let total = head.len + head.body_len;
        while buf.len() < total {
            // Memory follows the bytes that arrive, not the length a client declares.
            buf.reserve((total - buf.len()).min(BODY_READ_BYTES));
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let head_bytes = buf.split_to(head.len).freeze();
        let body = buf.split_to(head.body_len).freeze();
        let endpoint = head.endpoint;
        let close = head.close;
        let req = head::request(head, head_bytes, body);
        let reply = super::handle_raw(conns.service.state(), endpoint, req).await;
        let close = close || conns.drain.is_cancelled();
        if answer::write(&mut stream, &mut buf, reply, close)
            .await
            .is_err()
            || close
        {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// Gives the connection, with the bytes already read from it, to hyper.
async fn hand_off(stream: TcpStream, read: Bytes, conns: Connections, watcher: Watcher) {
    let io = TokioIo::new(Prefixed {
        prefix: read,
        inner: stream,
    });
    let conn = conns
        .builder
        .serve_connection_with_upgrades(io, conns.service)
        .into_owned();
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("connection ended with an error: {e}");
    }
}
