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
//! - With `server.admin_listen` a second acceptor serves the admin listener on the same workers:
//!   plain HTTP, or TLS with the public listener's pair and client authentication when
//!   `server.tls.admin` is set; the admin router only ([`GatewayService::admin`]), under the same
//!   `[server.limits]` with a connection cap of its own (`AppState::admin_limits`), so a flood
//!   on the main listener cannot take its places.
//! - With `server.listen` empty (picker only) there is no main acceptor: the admin listener, the
//!   background tasks and gossip run as with one, for the endpoint picker serving beside them.
//! - Shutdown: the acceptors stop accepting (the admin one too, after the same drain delay),
//!   every worker drains its connections (of both listeners) for up to
//!   `server.shutdown_grace_ms`, then drops what is left; [`run`] returns once every worker
//!   exited.

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
/// runs the acceptor and the background tasks. With `server.admin_listen` set the admin
/// listener is bound here; see [`run_with_admin`] to pass one already bound.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_with_admin(Some(listener), None, state, threads, shutdown).await
}

/// Binds `server.admin_listen`, when it is an address (not the main listener).
pub async fn bind_admin(state: &AppState) -> std::io::Result<Option<TcpListener>> {
    if !state.config.server.has_admin_listener() {
        return Ok(None);
    }
    let addr = &state.config.server.admin_listen;
    let backlog = state.config.server.limits.listen_backlog;
    super::limits::listen::bind(addr, backlog)
        .await
        .map(Some)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} (server.admin_listen): {e}"),
            )
        })
}

/// [`run`], with the admin listener (`server.admin_listen`) already bound: `admin` must be
/// given only when `server.admin_listen` is an address (`None` then binds it here). `listener`
/// is `None` exactly when `server.listen` is empty (picker only): then only the admin listener
/// and the background tasks are served.
pub async fn run_with_admin(
    listener: Option<TcpListener>,
    admin: Option<TcpListener>,
    state: AppState,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let threads = threads.max(1);
    if listener.is_some() != state.config.server.has_proxy_listener() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a proxy listener must be given exactly when server.listen is set",
        ));
    }
    let admin = match admin {
        Some(_) if !state.config.server.has_admin_listener() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an admin listener was given but server.admin_listen names none",
            ))
        }
        Some(l) => Some(l),
        None => bind_admin(&state).await?,
    };
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

    let public = async {
        match &listener {
            Some(l) => accept_loop(l, &state.limits, tls.is_some(), Surface::Main, &senders).await,
            // Picker only: no HTTP proxy listener.
            None => std::future::pending().await,
        }
    };
    let admin_tls = tls.is_some() && state.config.server.tls.as_ref().is_some_and(|t| t.admin);
    let admin_loop = async {
        match (&admin, &state.admin_limits) {
            (Some(l), Some(limits)) => {
                accept_loop(l, limits, admin_tls, Surface::Admin, &senders).await
            }
            _ => std::future::pending().await,
        }
    };
    let mut accept = Box::pin(async { tokio::join!(public, admin_loop) });
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
    drop(admin);
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

/// Which listener a connection came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Surface {
    /// `server.listen`: the proxied endpoints (and the admin surface without an admin listener).
    Main,
    /// `server.admin_listen`: the admin surface only.
    Admin,
}

/// A connection handed to a worker: its socket, its place under its listener's cap, and the
/// listener it came from.
type Handed = (std::net::TcpStream, ConnectionPermit, Surface);

/// Accepts on `listener` forever, each connection under `limits`' cap, handing them round-robin
/// to the workers.
async fn accept_loop(
    listener: &TcpListener,
    limits: &super::limits::Limits,
    tls: bool,
    surface: Surface,
    senders: &[mpsc::UnboundedSender<Handed>],
) {
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
        // A plain connection waits for its first request from now; a TLS one is busy with its
        // handshake until its serving loop begins.
        let Some(permit) = limits.admit(!tls) else {
            if tls {
                metrics::record_connection_closed(CloseReason::OverCapacity);
            } else {
                limits.refuse(stream);
            }
            continue;
        };
        limits.configure(&stream);
        let Ok(std) = stream.into_std() else { continue };
        let at = next % senders.len();
        if senders[at].send((std, permit, surface)).is_err() {
            tracing::warn!("serving thread {at} is gone");
        }
        next = next.wrapping_add(1);
    }
}

/// Shakes hands under the bound, then serves the connection: ALPN `h2` on hyper's HTTP/2,
/// anything else on the HTTP/1.1 loop. A failed or timed-out handshake is counted and closes
/// only this connection.
async fn serve_tls(
    stream: TcpStream,
    h: Handshakes,
    conns: h1::Connections,
    watcher: hyper_util::server::graceful::Watcher,
    permit: ConnectionPermit,
) {
    let stream = match tokio::time::timeout(h.timeout, h.tls.acceptor.accept(stream)).await {
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
    mut incoming: mpsc::UnboundedReceiver<Handed>,
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
    let admin_tls = state.config.server.tls.as_ref().is_some_and(|t| t.admin);
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
    let admin = h1::Connections {
        service: GatewayService::admin(state.clone()),
        ..conns.clone()
    };
    loop {
        let (std, permit, surface) = tokio::select! {
            s = incoming.recv() => match s {
                Some(s) => s,
                None => break,
            },
            _ = token.cancelled() => break,
        };
        let Ok(stream) = TcpStream::from_std(std) else {
            continue;
        };
        let (to, tls) = match surface {
            Surface::Main => (&conns, tls.as_ref()),
            Surface::Admin => (&admin, tls.as_ref().filter(|_| admin_tls)),
        };
        match tls {
            None => {
                tokio::spawn(h1::serve(stream, to.clone(), graceful.watcher(), permit));
            }
            Some(h) => {
                tokio::spawn(serve_tls(
                    stream,
                    h.clone(),
                    to.clone(),
                    graceful.watcher(),
                    permit,
                ));
            }
        }
    }
    drop((conns, admin));
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
        // Not the default admin listener (a fixed port) in front of these instances.
        c.server.admin_listen = crate::config::ADMIN_ON_MAIN.into();
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
