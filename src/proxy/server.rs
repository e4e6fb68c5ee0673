//! Thread-per-core serving (the binary's, and [`crate::app::run`]'s with one thread): one acceptor hands every accepted connection to one of
//! N single-threaded runtimes, which serve it to its end.
//!
//! Why: on a connection's thread the request, its routing, the upstream exchange (the upstream
//! client keeps one connection pool per thread, see [`crate::client`]) and the relayed response
//! all run without cross-thread wake-ups or work stealing, which on a small machine cost more than
//! the proxy's own work.
//!
//! Invariants:
//! - A connection is assigned to a worker once, round-robin at accept, and never migrates.
//! - Background tasks and gossip run on the caller's runtime.
//! - Every accepted connection takes a place under `server.limits.max_connections` before it is
//!   handed to a worker, and holds it until it closes; at the cap it takes the place of the
//!   longest-idle connection (evicted), and when none is idle it is answered a 503 on the
//!   acceptor's runtime and closed (see [`super::limits`]).
//! - With `[server.tls]` every connection is a TLS one: its handshake runs on its worker under
//!   `server.tls.handshake_timeout_ms`, holding its place under the cap; a failed handshake is
//!   counted and logged at debug, and closes only that connection. Over the cap a TLS
//!   connection is closed unanswered (a plaintext 503 means nothing to a TLS client). After
//!   the handshake, ALPN `h2` goes to hyper's HTTP/2, anything else to the HTTP/1.1 loop.
//! - Certificates are re-read on `server.tls.reload_interval_ms` by a task on the caller's
//!   runtime (see [`crate::tls::reload`]); open connections keep the pair they shook hands with.
//! - Shutdown: the acceptor stops accepting, every worker drains its connections for up to
//!   `server.shutdown_grace_ms`, then drops what is left; [`run`] returns once every worker exited.

use super::h1;
use super::limits::ConnectionPermit;
use super::service::GatewayService;
use crate::app::{self, AppState};
use crate::metrics::{self, CloseReason};
use crate::tls::server::{ServerTls, ALPN_H2};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Serves `state` on `listener` with `threads` single-threaded worker runtimes until `shutdown`
/// resolves, then drains for the grace period. Must be called from within a Tokio runtime, which
/// runs the acceptor and the background tasks.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let threads = threads.max(1);
    let tls = match &state.config.server.tls {
        Some(c) => Some(Handshakes {
            tls: ServerTls::new(c).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server.tls: {e}"))
            })?,
            timeout: Duration::from_millis(c.handshake_timeout_ms),
        }),
        None => None,
    };
    let token = CancellationToken::new();
    let reload = match (&tls, &state.config.server.tls) {
        (Some(h), Some(c)) => Some(tokio::spawn(crate::tls::reload::watch(
            h.tls.pair.clone(),
            Duration::from_millis(c.reload_interval_ms),
            token.clone(),
        ))),
        _ => None,
    };
    let gossip = app::start_gossip(&state).await?;
    let background = app::spawn_background(&state, token.clone());
    let grace = Duration::from_millis(state.config.server.shutdown_grace_ms);

    let mut senders = Vec::with_capacity(threads);
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (state, stop, tls) = (state.clone(), token.clone(), tls.clone());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("kvgate-io-{i}"))
            .spawn(move || {
                rt.block_on(worker(rx, state, stop, grace, tls));
                // Connections still open after the grace period are dropped with the runtime.
                drop(rt);
                let _ = done_tx.send(());
            })?;
        workers.push(done_rx);
    }

    let mut accept = Box::pin(async {
        let mut next = 0usize;
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // A plain connection waits for its first request from now; a TLS one is busy with
            // its handshake until its serving loop begins.
            let Some(permit) = state.limits.admit(tls.is_none()) else {
                if tls.is_some() {
                    metrics::record_connection_closed(CloseReason::OverCapacity);
                } else {
                    state.limits.refuse(stream);
                }
                continue;
            };
            state.limits.configure(&stream);
            let Ok(std) = stream.into_std() else { continue };
            if senders[next % threads].send((std, permit)).is_err() {
                tracing::warn!("serving thread {} is gone", next % threads);
            }
            next = next.wrapping_add(1);
        }
    });
    tokio::select! {
        _ = &mut accept => {}
        _ = shutdown => {}
    }
    state.start_draining();
    let delay = Duration::from_millis(state.config.server.drain_delay_ms);
    if !delay.is_zero() {
        // Taken out of rotation first: /ready fails while new connections are still served.
        tracing::info!(
            "shutdown requested: failing /ready for {} ms before closing the listener",
            delay.as_millis()
        );
        tokio::select! {
            _ = &mut accept => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }
    tracing::info!("shutdown requested: no new connections; draining in-flight requests");
    drop(accept);
    drop(listener);
    drop(senders);
    token.cancel();
    for done in workers {
        let _ = done.await;
    }
    for h in background.into_iter().chain(reload) {
        h.abort();
    }
    if let Some(g) = gossip {
        g.shutdown().await;
    }
    Ok(())
}

/// The listener's TLS and its handshake bound.
#[derive(Clone)]
struct Handshakes {
    tls: ServerTls,
    timeout: Duration,
}

/// One worker: serves the connections handed to it until shutdown, then drains for `grace`.
/// Each connection starts on kvgate's HTTP/1.1 loop ([`super::h1`]), which hands it to hyper
/// (HTTP/1.1, or HTTP/2 with prior knowledge) at its first request that loop does not serve;
/// under TLS, after its handshake, unless ALPN chose HTTP/2 (straight to hyper).
async fn worker(
    mut incoming: mpsc::UnboundedReceiver<(std::net::TcpStream, ConnectionPermit)>,
    state: AppState,
    token: CancellationToken,
    grace: Duration,
    tls: Option<Handshakes>,
) {
    // The upstream client's first-byte deadlines on this thread are swept by this task. Its own
    // timer, always due within a sweep period, also keeps arming the (minutes away) idle timers
    // of streamed answers from waking the I/O driver: Tokio wakes it (an eventfd write and a
    // spurious `epoll_wait`) whenever a new timer is due before every pending one.
    let sweep = tokio::spawn(crate::client::deadline::sweep_forever());
    let graceful = GracefulShutdown::new();
    let limits = &state.limits;
    let mut http1 = http1::Builder::new();
    // Without a timer hyper silently runs no header timeout. Its own runs from the end of the
    // previous answer, so it would also cut idle connections: the connection's IO enforces the
    // idle and header deadlines (see `limits::io`), and this one is a backstop at their sum.
    // The head cap is kvgate's loop's, on complete heads (`max_header_size`) as on partial ones
    // (`max_buf_size`), so that both answer 431 beyond it.
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle + limits.header)
        .max_header_size(h1::MAX_HEAD_BYTES)
        .max_buf_size(h1::MAX_HEAD_BYTES);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2.timer(TokioTimer::new());
    let conns = h1::Connections {
        service: GatewayService::new(state.clone()),
        http1,
        http2,
        drain: token.clone(),
    };
    loop {
        let (std, permit) = tokio::select! {
            s = incoming.recv() => match s {
                Some(s) => s,
                None => break,
            },
            _ = token.cancelled() => break,
        };
        let Ok(stream) = TcpStream::from_std(std) else {
            continue;
        };
        match &tls {
            None => {
                tokio::spawn(h1::serve(stream, conns.clone(), graceful.watcher(), permit));
            }
            Some(h) => {
                let handshake = tokio::time::timeout(h.timeout, h.tls.acceptor.accept(stream));
                let (conns, watcher) = (conns.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let stream = match handshake.await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            metrics::record_tls_handshake_failure(false);
                            tracing::debug!("TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            metrics::record_tls_handshake_failure(true);
                            tracing::debug!("TLS handshake timed out");
                            return;
                        }
                    };
                    if stream.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
                        h1::serve_h2(stream, conns, watcher, permit).await;
                    } else {
                        h1::serve(stream, conns, watcher, permit).await;
                    }
                });
            }
        }
    }
    drop(conns);
    // Every connection holds a watcher until it ends, so this waits for all of them.
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!("shutdown grace period of {} ms elapsed; dropping remaining requests", grace.as_millis());
        }
    }
    sweep.abort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, InstanceConfig, PoolConfig};
    use axum::body::Body;
    use futures::StreamExt;

    /// An upstream answering every chat request with three SSE events 100 ms apart.
    async fn upstream() -> String {
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                axum::routing::post(|| async {
                    let events = futures::stream::iter(0..3).then(|i| async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>(bytes::Bytes::from(format!("data: {i}\n\n")))
                    });
                    http::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Body::from_stream(events))
                        .unwrap()
                }),
            )
            .route("/health", axum::routing::get(|| async { "ok" }));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    }

    fn config(url: String) -> Config {
        let mut c = Config::default();
        c.server.shutdown_grace_ms = 5_000;
        c.pools = vec![PoolConfig::serving("m", vec![InstanceConfig::at("u", url)])];
        c
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_on_worker_threads_and_drains_streams_on_shutdown() {
        let state = AppState::new(config(upstream().await)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(listener, state, 2, async {
            let _ = stopped.await;
        }));
        let url = format!("http://{addr}/v1/chat/completions");
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let post = |c: &reqwest::Client| {
            c.post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
        };

        // Four connections: round-robin puts two on each serving thread; all answer in full.
        let clients: Vec<reqwest::Client> = (0..4).map(|_| reqwest::Client::new()).collect();
        let answers = futures::future::join_all(clients.iter().map(|c| async {
            let resp = post(c).await.unwrap();
            assert_eq!(resp.status(), 200);
            assert!(resp.headers().contains_key("x-request-id"));
            resp.text().await.unwrap()
        }))
        .await;
        for a in answers {
            assert_eq!(a, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
        }

        // A stream under way when shutdown starts is relayed to its end.
        let c = reqwest::Client::new();
        let mut resp = post(&c).await.unwrap();
        let first = resp.chunk().await.unwrap().unwrap();
        assert_eq!(&first[..], b"data: 0\n\n");
        stop.send(()).unwrap();
        let mut rest = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            rest.extend_from_slice(&chunk);
        }
        assert_eq!(rest, b"data: 1\n\ndata: 2\n\n");
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("server stops after draining")
            .unwrap()
            .unwrap();
        // Stopped: no new connections.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
