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
//!   On the admin listener nothing is served here: every request is handed to hyper (the admin
//!   router), and the connection keeps the admin listener's limits.
//! - Answers are framed here: `Content-Length` when the body's size is known, chunked otherwise
//!   (none for 1xx/204/304); framing and connection headers from the handler never pass through.
//! - While a request is handled (queued, routed, waiting for its answer's head) and while its
//!   answer is relayed the client socket is watched: end of file or an error drops the request
//!   or the answer, and so the upstream request (as hyper drops a closed connection's handler);
//!   bytes that arrive (a pipelined request) are kept, up to [`MAX_HEAD_BYTES`] beyond which the
//!   socket is no longer read until the answer ends.
//! - Between requests a cancelled drain token closes the connection; a request under way finishes.
//! - Waiting for a request's first byte (and only then) the connection's place is idle: at the
//!   connection cap it may be evicted, which closes it with nothing sent (see
//!   [`super::limits::places`]). From the first byte of a head it is busy. Evicted as its
//!   request arrives (bytes already in the socket, or read), it answers that request with
//!   `connection: close` and ends, instead of dropping it.
//! - `[server.limits]` hold here as on hyper (see [`super::limits`]): idle and header deadlines
//!   while waiting for a head, the body deadline and the body budget before a body is buffered
//!   (both answer and close: the rest of the body is not read), the write deadline while
//!   answering; a complete head beyond [`MAX_HEAD_BYTES`] is handed to hyper for its 431.

mod answer;
pub mod head;
mod prefixed;
pub mod wire;

use super::limits::io::{Counted, Deadlines, Guarded, Requests};
use super::limits::{self, ConnectionPermit};
use super::parse::Endpoint;
use super::service::GatewayService;
use crate::app::AppState;
use crate::error::GatewayError;
use crate::metrics::{self, CloseReason};
use bytes::{Bytes, BytesMut};
use head::Parsed;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use prefixed::Prefixed;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wire::Wire;

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
    /// hyper's HTTP/1 connection builder, for hand-offs.
    pub http1: hyper::server::conn::http1::Builder,
    /// hyper's HTTP/2 connection builder, for hand-offs of HTTP/2 with prior knowledge.
    pub http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    /// Cancelled when the server starts draining.
    pub drain: CancellationToken,
}

/// Serves `stream` until the client closes it, an error, a drain between requests, or a
/// hand-off to hyper. `watcher` is held for the connection's whole life, so that graceful
/// shutdown waits for it, and watches it once handed off; `permit`, its place under the
/// connection cap, likewise.
pub async fn serve<S: Wire>(
    mut stream: S,
    conns: Connections,
    watcher: Watcher,
    mut permit: ConnectionPermit,
) {
    let state = conns.service.state();
    let limits = conns.service.limits();
    let limit = limits.body_limit;
    // The admin listener's connections serve nothing here: every request goes to hyper.
    let direct = conns.service.proxies();
    let rid_name = state.request_id_header.clone();
    let mut buf = BytesMut::with_capacity(READ_RESERVE);
    // The hand-off (hyper's whole connection) and the refusals are boxed where awaited: inline,
    // their state would be part of every connection's task for its whole life, idle or not
    // (about 3 KiB of task instead of 10; `tests/flood.rs` holds it under 4 KiB).
    // A request was served: a wait for the next one is a keep-alive wait.
    let mut used = false;
    // Evicted while its request was arriving (bytes in the socket or read): that request is
    // answered, with `connection: close`, and the connection ends.
    let mut spared = false;
    loop {
        // Until a request's first byte the idle timeout runs, from there the header timeout.
        let mut idle = buf.is_empty();
        let now = Instant::now();
        let mut deadline = now + if idle { limits.idle } else { limits.header };
        // Waiting for a request, the connection may be evicted at the connection cap (closed,
        // its place given to a new one); from a request's first byte it may not.
        if idle && !spared && !permit.idle(now, used) {
            if !stream.bytes_waiting() {
                return;
            }
            spared = true;
        }
        let head = loop {
            let to_hyper = match head::parse(&buf, limit, rid_name.as_str().as_bytes()) {
                // A complete head beyond the cap goes to hyper too, which answers 431 for it
                // as for a partial one.
                Parsed::Serve(h) if direct && h.len <= MAX_HEAD_BYTES => break h,
                Parsed::Serve(_) | Parsed::HandOff => true,
                Parsed::Partial => buf.len() >= MAX_HEAD_BYTES,
            };
            if to_hyper {
                // The loop hands off an HTTP/2 preface once its method is read.
                let h2 = buf.starts_with(b"PRI ");
                return Box::pin(hand_off(
                    stream,
                    buf.freeze(),
                    conns,
                    watcher,
                    permit,
                    (!h2).then_some(deadline),
                ))
                .await;
            }
            buf.reserve(READ_RESERVE);
            let read = tokio::select! {
                biased;
                r = stream.read_buf(&mut buf) => r,
                _ = conns.drain.cancelled(), if idle => return,
                _ = permit.evicted(), if idle && !spared => {
                    if !stream.bytes_waiting() {
                        return;
                    }
                    spared = true;
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    metrics::record_connection_closed(if idle {
                        CloseReason::IdleTimeout
                    } else {
                        CloseReason::HeaderTimeout
                    });
                    return;
                }
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if idle {
                idle = false;
                deadline = Instant::now() + limits.header;
                if !spared && !permit.busy() {
                    spared = true;
                }
            }
        };
        let endpoint = head.endpoint;
        // Room in the body budget before the body is buffered.
        let reserved = match limits.budget.reserve(head.body_len).await {
            Ok(r) => r,
            Err(e) => return Box::pin(refuse(&mut stream, state, limits, endpoint, e)).await,
        };
        let total = head.len + head.body_len;
        if buf.len() < total {
            let deadline = Instant::now() + limits.body;
            while buf.len() < total {
                // Memory follows the bytes that arrive, not the length a client declares.
                buf.reserve((total - buf.len()).min(BODY_READ_BYTES));
                let read = tokio::select! {
                    biased;
                    r = stream.read_buf(&mut buf) => r,
                    _ = tokio::time::sleep_until(deadline) => {
                        metrics::record_connection_closed(CloseReason::BodyTimeout);
                        let e = GatewayError::BodyTimeout {
                            timeout_ms: limits.body.as_millis() as u64,
                        };
                        return Box::pin(refuse(&mut stream, state, limits, endpoint, e)).await;
                    }
                };
                match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        }
        let head_bytes = buf.split_to(head.len).freeze();
        let body = buf.split_to(head.body_len).freeze();
        let close = head.close;
        let req = head::request(head, head_bytes, body);
        // Scoped, so that the handler's state and the answer's share the task's memory.
        let reply = {
            let handling = super::handle_raw(conns.service.state(), endpoint, req);
            tokio::pin!(handling);
            let mut watching = true;
            loop {
                tokio::select! {
                    biased;
                    reply = &mut handling => break reply,
                    gone = stream.client_gone(&mut buf), if watching => {
                        if gone {
                            // Dropping the handler takes the request out of the admission
                            // queue (or off its instance) and gives back what it was charged
                            // while no engine held it.
                            return;
                        }
                        watching = buf.len() < MAX_HEAD_BYTES;
                    }
                }
            }
        };
        // The body was forwarded (or refused) and is dropped with the request.
        drop(reserved);
        let close = close || spared || conns.drain.is_cancelled();
        let written = answer::write(&mut stream, &mut buf, reply, close, limits.write).await;
        if let Err(e) = &written {
            if e.kind() == io::ErrorKind::TimedOut {
                metrics::record_connection_closed(CloseReason::WriteTimeout);
            }
        }
        if written.is_err() || close {
            let _ = stream.shutdown().await;
            return;
        }
        used = true;
    }
}

/// Answers `e` to a request whose body is not (all) read, and closes the connection.
async fn refuse<S: Wire>(
    stream: &mut S,
    state: &AppState,
    limits: &limits::Limits,
    endpoint: Endpoint,
    e: GatewayError,
) {
    let reply = super::refusal(state, endpoint, e);
    let mut kept = BytesMut::new();
    if answer::write(stream, &mut kept, reply, true, limits.write)
        .await
        .is_ok()
    {
        limits::linger(stream).await;
    }
}

/// Serves `stream`, whose client chose HTTP/2 by ALPN, with hyper under the same limits.
pub async fn serve_h2<S: Wire>(
    stream: S,
    conns: Connections,
    watcher: Watcher,
    permit: ConnectionPermit,
) {
    hand_off(stream, Bytes::new(), conns, watcher, permit, None).await
}

/// Gives the connection, with the bytes already read from it, to hyper, under the same limits:
/// HTTP/1.1 when `deadline` is that of a head begun (or of the first head), HTTP/2 when it is
/// `None` (a preface read, or chosen by ALPN).
async fn hand_off<S: Wire>(
    stream: S,
    read: Bytes,
    conns: Connections,
    watcher: Watcher,
    permit: ConnectionPermit,
    deadline: Option<Instant>,
) {
    let limits = conns.service.limits();
    let deadlines = Deadlines {
        idle: limits.idle,
        header: limits.header,
        write: limits.write,
    };
    let h2 = deadline.is_none();
    let requests = Arc::new(Requests::default());
    let prefixed = Prefixed {
        prefix: read,
        inner: stream,
    };
    // The place goes with the IO: evicted while idle, it ends hyper's connection as an end of
    // file would; it is given back when hyper drops the connection.
    let io = TokioIo::new(Guarded::new(
        prefixed,
        requests.clone(),
        deadlines,
        h2,
        // HTTP/2 waits for its first stream under the idle timeout, as between streams.
        deadline,
        permit,
    ));
    let stall = h2.then_some(limits.write);
    let service = Counted {
        inner: conns.service,
        requests,
        stall,
    };
    let ended = if h2 {
        watcher
            .watch(conns.http2.serve_connection(io, service))
            .await
    } else {
        watcher
            .watch(conns.http1.serve_connection(io, service))
            .await
    };
    if let Err(e) = ended {
        tracing::debug!("connection ended with an error: {e}");
    }
}
