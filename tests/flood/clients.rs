//! The clients of the flood: a well-behaved one, and four kinds of offender, each over raw TCP
//! and each bounded in bytes and time. Every offender reports how its connection ended, as seen
//! from the client side.
//!
//! Invariants:
//! - No client waits without a deadline; sleeps only pace a slow client (they are the behaviour
//!   under test, never synchronisation).
//! - [`Open`] counts client connections from connect until the client saw them closed (or gave
//!   up), and keeps the most at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{sleep, timeout, Instant};

/// Client connections open now, and the most at once.
#[derive(Default)]
pub struct Open {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Open {
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
    fn enter(self: &Arc<Self>) -> Held {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        Held(self.clone())
    }
}

/// One connection counted in [`Open`] until dropped.
struct Held(Arc<Open>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A `POST /v1/chat/completions` for `model` with a `Content-Length` body (kvgate's own loop).
pub fn chat(model: &str, stream: bool) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hello"}}]}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one answer with a `Content-Length` body off `s`, `buf` holding what was read beyond
/// it; its status. `None`: closed, failed or not complete by `deadline`.
pub async fn answer(s: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Option<u16> {
    let mut chunk = [0u8; 4096];
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        if let Ok(httparse::Status::Complete(n)) = resp.parse(buf) {
            let len = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())?;
            let status = resp.code?;
            if buf.len() >= n + len {
                buf.drain(..n + len);
                return Some(status);
            }
        }
        match timeout(
            deadline.saturating_duration_since(Instant::now()),
            s.read(&mut chunk),
        )
        .await
        {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// Waits for the server to close `s` (end of file or reset) until `deadline`; `false` when it
/// is still open then or sent bytes instead.
async fn closed_by(s: &mut TcpStream, deadline: Instant) -> bool {
    let mut chunk = [0u8; 256];
    matches!(
        timeout(
            deadline.saturating_duration_since(Instant::now()),
            s.read(&mut chunk)
        )
        .await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// The well-behaved client: `requests` sequential requests on one keep-alive connection (a new
/// one if the gateway closes it), until `until` returns true; each answer's status (0: none) and
/// latency.
pub async fn good(
    addr: SocketAddr,
    requests: usize,
    per_request: Duration,
    until: impl Fn() -> bool,
) -> Vec<(u16, Duration)> {
    let req = chat("m", false);
    let mut out = Vec::with_capacity(requests.min(100_000));
    let mut conn: Option<(TcpStream, Vec<u8>)> = None;
    while out.len() < requests && !until() {
        let t = Instant::now();
        if conn.is_none() {
            conn = TcpStream::connect(addr).await.ok().map(|s| (s, Vec::new()));
        }
        let status = match conn.as_mut() {
            Some((s, buf)) => match s.write_all(&req).await {
                Ok(()) => answer(s, buf, t + per_request).await,
                Err(_) => None,
            },
            None => None,
        };
        if status.is_none() {
            conn = None;
        }
        out.push((status.unwrap_or(0), t.elapsed()));
    }
    out
}

/// (a) Sends a request head one byte per `tick`, for ever (the head has no end): `Ok(time from
/// the first byte to the server's close)`, or what went wrong.
pub async fn trickler(
    addr: SocketAddr,
    tick: Duration,
    give_up: Duration,
    open: Arc<Open>,
) -> Result<Duration, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _held = open.enter();
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-pad: ";
    let started = Instant::now();
    let deadline = started + give_up;
    let mut chunk = [0u8; 256];
    for i in 0.. {
        let b = head.get(i).copied().unwrap_or(b'p');
        if s.write_all(&[b]).await.is_err() {
            return Ok(started.elapsed());
        }
        match timeout(tick, s.read(&mut chunk)).await {
            Err(_) => {}
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(started.elapsed()),
            Ok(Ok(_)) => return Err("answered".into()),
        }
        if Instant::now() > deadline {
            break;
        }
    }
    Err(format!("still open after {give_up:?}"))
}

/// How a slow reader's stream ended.
pub struct Cut {
    /// Bytes of answer the client read in all.
    pub read: usize,
    /// From the request until the client saw every slow reader's stream cut upstream.
    pub after: Duration,
}

/// (b) Asks for a long stream on a socket with a small receive buffer and reads one byte every
/// `every` until `all_cut` (every slow reader's upstream stream was dropped) or `give_up`; then
/// reads the rest as fast as it can. `Ok` when that rest ends short of the stream's end (the
/// server cut this connection while the client was slow), what went wrong otherwise.
///
/// The server's cut is not visible to the client while it reads slowly: its last bytes and
/// FIN wait behind the megabytes queued in the socket buffers; hence `all_cut`.
pub async fn slow_reader(
    addr: SocketAddr,
    every: Duration,
    all_cut: Arc<dyn Fn() -> bool + Send + Sync>,
    give_up: Duration,
    open: Arc<Open>,
) -> Result<Cut, String> {
    let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .set_recv_buffer_size(4096)
        .map_err(|e| e.to_string())?;
    let mut s = socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _held = open.enter();
    let started = Instant::now();
    s.write_all(&chat("f", true))
        .await
        .map_err(|e| e.to_string())?;
    let mut read = 0;
    let mut one = [0u8; 1];
    while !all_cut() {
        if started.elapsed() > give_up {
            return Err(format!("not cut within {give_up:?}"));
        }
        sleep(every).await;
        match timeout(every, s.read(&mut one)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Err("closed before its stream was cut".into()),
            Ok(Ok(n)) => read += n,
            Err(_) => {}
        }
    }
    let after = started.elapsed();
    let mut rest = Vec::new();
    match timeout(give_up, s.read_to_end(&mut rest)).await {
        Err(_) => Err("still streaming".into()),
        Ok(_) if rest.ends_with(b"0\r\n\r\n") => Err("the whole stream arrived".into()),
        Ok(_) => Ok(Cut {
            read: read + rest.len(),
            after,
        }),
    }
}

/// (c) One request, then silence: `Ok(time from the request to the server's close)`.
pub async fn idler(
    addr: SocketAddr,
    ramp: Arc<tokio::sync::Semaphore>,
    give_up: Duration,
    open: Arc<Open>,
) -> Result<Duration, String> {
    // Connects and first requests go a bounded number at a time.
    let permit = ramp.acquire_owned().await.map_err(|e| e.to_string())?;
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _held = open.enter();
    let mut buf = Vec::new();
    // Before the request: the server's idle wait starts later, at the end of its answer.
    let asked = Instant::now();
    s.write_all(&chat("m", false))
        .await
        .map_err(|e| e.to_string())?;
    match answer(&mut s, &mut buf, Instant::now() + give_up).await {
        Some(200) => {}
        other => return Err(format!("first answer: {other:?}")),
    }
    drop(permit);
    if closed_by(&mut s, asked + give_up).await {
        Ok(asked.elapsed())
    } else {
        Err(format!("still open after {give_up:?}"))
    }
}

/// (d) `count` connections opened and closed at once, `parallel` at a time, every other one
/// after half a request head (so the server reads a partial head, then end of file). Returns
/// how many connected.
pub async fn connect_and_close(addr: SocketAddr, count: usize, parallel: usize) -> usize {
    use futures::StreamExt;
    futures::stream::iter(0..count)
        .map(|i| async move {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                return 0;
            };
            if i % 2 == 1 {
                let _ = s
                    .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost")
                    .await;
            }
            1
        })
        .buffer_unordered(parallel)
        .fold(0, |n, c| async move { n + c })
        .await
}
