//! `[server.limits]` on both serving paths, over raw TCP: each test runs once on kvgate's own
//! HTTP/1.1 loop (plain `POST`s with `Content-Length`) and once on hyper (the connection handed
//! off by a first chunked request, every later request chunked too). Then a flood of slow and
//! abrupt clients against the real serving code while a well-behaved client is served.
//!
//! Timing: limits are a few hundred ms; every wait polls with a deadline. Lower bounds
//! ("closed no earlier than the limit") hold because timers never fire early.

mod common;

use common::*;
use kvgate::config::Config;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout, Instant};

const HEADER_MS: u64 = 300;
const BODY_MS: u64 = 300;
const IDLE_MS: u64 = 600;
const WRITE_MS: u64 = 300;
/// Pace of a trickling client, and of its checks for an answer or a close.
const TICK: Duration = Duration::from_millis(25);
/// Most time any limit may take to act beyond its value (a loaded CI machine).
const SLACK: Duration = Duration::from_secs(4);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// kvgate's own loop.
    H1,
    /// hyper, after a hand-off.
    Hyper,
}

/// Runs the test body once per serving path.
macro_rules! both_paths {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn h1() {
                super::$name(super::Path::H1).await
            }
            #[tokio::test]
            async fn hyper() {
                super::$name(super::Path::Hyper).await
            }
        }
    )*};
}

both_paths!(
    header_trickle_is_cut,
    body_trickle_gets_408,
    idle_connection_is_closed,
    client_that_stops_reading_is_cut_and_upstream_cancelled,
    connection_cap_answers_503_fast,
    body_budget_answers_503_then_413,
    complete_head_over_64_kib_gets_431,
    at_the_cap_the_longest_idle_connection_is_evicted,
    at_the_cap_busy_and_mid_head_connections_are_not_evicted,
    peer_closed_connections_free_their_places_promptly,
    connect_and_close_churn_at_the_cap_does_not_block_a_client,
    tcp_keepalive_is_set_on_accepted_connections,
);

fn config(mock: &Mock) -> Config {
    let mut c = config_for(&[mock.url()]);
    let l = &mut c.server.limits;
    l.header_read_timeout_ms = HEADER_MS;
    l.body_read_timeout_ms = BODY_MS;
    l.idle_timeout_ms = IDLE_MS;
    l.write_timeout_ms = WRITE_MS;
    c
}

/// The head of a `POST /v1/chat/completions` with a body of `len` bytes, framed for `path`
/// (for hyper: the head and the one chunk's size line).
fn head(path: Path, len: usize, extra: &str) -> String {
    let start =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n";
    match path {
        Path::H1 => format!("{start}{extra}content-length: {len}\r\n\r\n"),
        Path::Hyper => format!("{start}{extra}transfer-encoding: chunked\r\n\r\n{len:x}\r\n"),
    }
}

/// A whole request with `body`, framed for `path`.
fn request(path: Path, body: &str) -> String {
    let end = match path {
        Path::H1 => "",
        Path::Hyper => "\r\n0\r\n\r\n",
    };
    format!("{}{body}{end}", head(path, body.len(), ""))
}

/// A chat body of about `len` bytes.
fn chat_of(len: usize, stream: bool) -> String {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(len.saturating_sub(70))
    );
    assert!(body.len() >= len.min(70));
    body
}

/// A client connection and the bytes read from it not yet consumed.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

/// What the bytes in `buf` hold.
enum Parsed {
    Answer(Answer, usize),
    Partial,
}

/// One complete non-1xx answer at the start of `buf` (Content-Length or chunked).
fn parse(buf: &[u8]) -> Parsed {
    let mut at = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut fields);
        let n = match resp.parse(&buf[at..]).expect("valid answer head") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => return Parsed::Partial,
        };
        let status = resp.code.unwrap();
        let headers: Vec<(String, String)> = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into(),
                )
            })
            .collect();
        at += n;
        if (100..200).contains(&status) {
            continue;
        }
        let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let rest = &buf[at..];
        if let Some(len) = get("content-length") {
            let len: usize = len.parse().unwrap();
            if rest.len() < len {
                return Parsed::Partial;
            }
            let body = rest[..len].to_vec();
            return Parsed::Answer(
                Answer {
                    status,
                    headers,
                    body,
                },
                at + len,
            );
        }
        if get("transfer-encoding").as_deref() == Some("chunked") {
            let mut body = Vec::new();
            let mut i = 0;
            loop {
                let Some(eol) = rest[i..].windows(2).position(|w| w == b"\r\n") else {
                    return Parsed::Partial;
                };
                let size = std::str::from_utf8(&rest[i..i + eol]).unwrap();
                let size = usize::from_str_radix(size.trim(), 16).unwrap();
                i += eol + 2;
                if rest.len() < i + size + 2 {
                    return Parsed::Partial;
                }
                body.extend_from_slice(&rest[i..i + size]);
                i += size + 2;
                if size == 0 {
                    return Parsed::Answer(
                        Answer {
                            status,
                            headers,
                            body,
                        },
                        at + i,
                    );
                }
            }
        }
        return Parsed::Answer(
            Answer {
                status,
                headers,
                body: Vec::new(),
            },
            at,
        );
    }
}

impl Conn {
    async fn connect(gw: &Gateway) -> Conn {
        Conn {
            s: TcpStream::connect(gw.addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    /// A connection already on `path`, its first answer read (so it now waits, idle, for the
    /// next request).
    async fn on(gw: &Gateway, path: Path) -> Conn {
        let mut c = Conn::connect(gw).await;
        let a = c.exchange(&request(path, CHAT)).await;
        assert_eq!(a.status, 200, "{a:?}");
        c
    }

    async fn send(&mut self, bytes: &str) {
        self.s.write_all(bytes.as_bytes()).await.unwrap();
    }

    async fn exchange(&mut self, req: &str) -> Answer {
        self.send(req).await;
        self.answer().await.expect("an answer")
    }

    /// Reads until one answer is complete (`None`: closed first).
    async fn answer(&mut self) -> Option<Answer> {
        let deadline = Instant::now() + SLACK;
        loop {
            if let Parsed::Answer(a, n) = parse(&self.buf) {
                self.buf.drain(..n);
                return Some(a);
            }
            if !self.fill(deadline).await {
                return None;
            }
        }
    }

    /// Appends what arrives before `deadline`; `false` on end of file or reset.
    async fn fill(&mut self, deadline: Instant) -> bool {
        let mut chunk = [0u8; 8192];
        match timeout(deadline - Instant::now(), self.s.read(&mut chunk)).await {
            Err(_) => panic!("nothing arrived in time"),
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Sends `bytes` one per [`TICK`], checking after each for an answer or a close. Returns
    /// the answer (if any), how many bytes went out, and whether the connection closed.
    async fn trickle(&mut self, bytes: &[u8]) -> (Option<Answer>, usize, bool) {
        let mut chunk = [0u8; 8192];
        for (i, b) in bytes.iter().enumerate() {
            if self.s.write_all(&[*b]).await.is_err() {
                return (None, i, true);
            }
            match timeout(TICK, self.s.read(&mut chunk)).await {
                Err(_) => {}
                Ok(Ok(0)) | Ok(Err(_)) => return (self.answer_now(), i + 1, true),
                Ok(Ok(n)) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if let Some(a) = self.answer_now() {
                        return (Some(a), i + 1, false);
                    }
                }
            }
        }
        (None, bytes.len(), false)
    }

    fn answer_now(&mut self) -> Option<Answer> {
        match parse(&self.buf) {
            Parsed::Answer(a, n) => {
                self.buf.drain(..n);
                Some(a)
            }
            Parsed::Partial => None,
        }
    }

    /// Waits for the gateway to close the connection; `true` if it did within [`SLACK`] of
    /// `limit`, with no bytes sent first.
    async fn closed_quietly(&mut self, limit: Duration) -> bool {
        let mut chunk = [0u8; 1024];
        match timeout(limit + SLACK, self.s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(n)) => panic!(
                "unexpected bytes: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            ),
            Err(_) => false,
        }
    }
}

async fn header_trickle_is_cut(path: Path) {
    let mock = Mock::start("a").await;
    let mut cfg = config(&mock);
    // Far beyond the bound below: hyper's own header timeout (idle + header) cannot be the one
    // that acts.
    cfg.server.limits.idle_timeout_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let mut c = Conn::on(&gw, path).await;
    let req = request(path, CHAT);
    let started = Instant::now();
    let (answer, sent, closed) = c.trickle(req.as_bytes()).await;
    assert!(closed && answer.is_none(), "{path:?}: {answer:?}");
    assert!(sent < req.len(), "{path:?}: the whole head went out");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(HEADER_MS),
        "{path:?}: cut after {took:?}"
    );
    assert!(
        took < Duration::from_millis(HEADER_MS) + SLACK,
        "{path:?}: {took:?}"
    );
    assert_eq!(
        mock.count(),
        1,
        "{path:?}: only the first request went upstream"
    );
}

async fn body_trickle_gets_408(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    let mut c = Conn::on(&gw, path).await;
    let body = chat_of(400, false);
    // Before the head: the gateway's clock starts later.
    let started = Instant::now();
    c.send(&head(path, body.len(), "")).await;
    let (answer, sent, _) = c.trickle(body.as_bytes()).await;
    let a = answer.unwrap_or_else(|| panic!("{path:?}: no answer"));
    assert!(sent < body.len());
    assert_eq!(a.status, 408, "{path:?}: {a:?}");
    assert_eq!(a.code(), "body_read_timeout");
    assert_eq!(a.header("connection"), Some("close"), "{path:?}");
    assert!(started.elapsed() >= Duration::from_millis(BODY_MS));
    assert!(
        c.closed_quietly(Duration::ZERO).await,
        "{path:?}: kept open"
    );
    assert_eq!(mock.count(), 1);
}

async fn idle_connection_is_closed(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    // Accepted and never used: the idle timeout runs from accept.
    let mut fresh = Conn::connect(&gw).await;
    // Before the first request: the idle wait starts after its answer.
    let started = Instant::now();
    let mut used = Conn::on(&gw, path).await;
    assert!(
        used.closed_quietly(Duration::from_millis(IDLE_MS)).await,
        "{path:?}"
    );
    let took = started.elapsed();
    // Longer than the header timeout: idle waits are not cut by it.
    assert!(
        took >= Duration::from_millis(IDLE_MS),
        "{path:?}: closed after {took:?}"
    );
    assert!(fresh.closed_quietly(Duration::ZERO).await);
}

async fn client_that_stops_reading_is_cut_and_upstream_cancelled(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    // A small receive window, so the gateway's writes stall soon.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let s = socket.connect(gw.addr).await.unwrap();
    let mut c = Conn { s, buf: Vec::new() };
    let a = c.exchange(&request(path, CHAT)).await;
    assert_eq!(a.status, 200);
    // 64 MiB at most, far beyond every socket buffer on the way.
    mock.set_mode(Mode::Flood {
        chunks: 16 * 1024,
        bytes: 4096,
    });
    c.send(&request(path, &chat_of(100, true))).await;
    let dropped = || {
        mock.state
            .streams_dropped
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    assert!(
        eventually(10, || dropped() == 1).await,
        "{path:?}: the upstream stream was not cancelled"
    );
    assert_eq!(
        mock.state
            .streams_completed
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // What the client finally reads ends short of the stream's end.
    let mut got = Vec::new();
    let _ = timeout(SLACK, c.s.read_to_end(&mut got)).await;
    assert!(
        !got.ends_with(b"0\r\n\r\n"),
        "{path:?}: the answer was complete"
    );
}

async fn connection_cap_answers_503_fast(path: Path) {
    let mock = Mock::start("a").await;
    let mut cfg = config(&mock);
    cfg.server.limits.max_connections = 3;
    cfg.server.limits.idle_timeout_ms = 60_000;
    // Without eviction the cap refuses even idle connections' newcomers.
    cfg.server.limits.evict_idle_at_capacity = false;
    let gw = Gateway::start(cfg).await;
    let mut served = Vec::new();
    for _ in 0..3 {
        served.push(Conn::on(&gw, path).await);
    }
    let mut extra = Conn::connect(&gw).await;
    let started = Instant::now();
    let a = extra.exchange(&request(path, CHAT)).await;
    assert_eq!(a.status, 503, "{path:?}: {a:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{path:?}: not fast"
    );
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.code(), "too_many_connections");
    assert!(extra.closed_quietly(Duration::ZERO).await);
    for c in &mut served {
        assert_eq!(
            c.exchange(&request(path, CHAT)).await.status,
            200,
            "{path:?}"
        );
    }
    // A closed connection's place is free again.
    drop(served.pop());
    let ok = eventually_async(2, || async {
        let mut c = Conn::connect(&gw).await;
        c.exchange(&request(path, CHAT)).await.status == 200
    })
    .await;
    assert!(ok, "{path:?}: the freed place was not reused");
}

async fn body_budget_answers_503_then_413(path: Path) {
    let mock = Mock::start("a").await;
    let mut cfg = config(&mock);
    cfg.server.limits.body_budget_bytes = 1000;
    cfg.server.limits.body_budget_wait_ms = 200;
    let gw = Gateway::start(cfg).await;
    let mut holder = Conn::on(&gw, path).await;
    let mut waiter = Conn::on(&gw, path).await;
    let mut big = Conn::on(&gw, path).await;
    mock.set_mode(Mode::Held);
    // 800 bytes held in the budget while the upstream holds the request.
    holder.send(&request(path, &chat_of(800, false))).await;
    assert!(eventually(5, || mock.count() == 4).await);
    let started = Instant::now();
    let a = waiter.exchange(&request(path, &chat_of(300, false))).await;
    assert_eq!(a.status, 503, "{path:?}: {a:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{path:?}: did not wait"
    );
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.code(), "body_budget_exhausted");
    assert!(waiter.closed_quietly(Duration::ZERO).await, "{path:?}");
    // Larger than the whole budget: never admissible.
    let a = big.exchange(&request(path, &chat_of(1500, false))).await;
    assert_eq!(a.status, 413, "{path:?}: {a:?}");
    // Released once forwarded and answered: the same body now fits.
    mock.set_mode(Mode::Json);
    mock.release(1);
    assert_eq!(holder.answer().await.unwrap().status, 200);
    let mut again = Conn::connect(&gw).await;
    let a = again.exchange(&request(path, &chat_of(300, false))).await;
    assert_eq!(a.status, 200, "{path:?}: {a:?}");
}

async fn complete_head_over_64_kib_gets_431(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    let mut c = Conn::on(&gw, path).await;
    let pad = format!("x-pad: {}\r\n", "p".repeat(64 * 1024));
    let req = format!("{}{CHAT}", head(path, CHAT.len(), &pad)).replace("\r\n\r\n", "\r\n\r\n");
    let req = match path {
        Path::H1 => req,
        Path::Hyper => format!("{req}\r\n0\r\n\r\n"),
    };
    // Most of the head, then the rest: the loop may see the head complete beyond the cap.
    let (first, rest) = req.split_at(60 * 1024);
    c.send(first).await;
    c.send(rest).await;
    let a = c
        .answer()
        .await
        .unwrap_or_else(|| panic!("{path:?}: no answer"));
    assert_eq!(a.status, 431, "{path:?}: {a:?}");
    assert_eq!(mock.count(), 1);
}

/// The value of `kvgate_connections_evicted_total{reason}` (counters are process-wide: tests
/// running beside this one may add to it).
async fn evicted(gw: &Gateway, reason: &str) -> u64 {
    let text = gw.get_text("/metrics").await;
    let key = format!(r#"kvgate_connections_evicted_total{{reason="{reason}"}} "#);
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A config whose cap is `max` places and whose idle timeout never acts in the test.
fn capped(mock: &Mock, max: usize) -> Config {
    let mut cfg = config(mock);
    cfg.server.limits.max_connections = max;
    cfg.server.limits.idle_timeout_ms = 60_000;
    cfg.server.limits.header_read_timeout_ms = 30_000;
    cfg
}

/// At the cap, filled with idle connections (one accepted that never sent a byte, two kept alive
/// after an answer): each new client is served, and the connection that waited longest is closed
/// quietly, the fresh one first, then the oldest keep-alive one.
async fn at_the_cap_the_longest_idle_connection_is_evicted(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(capped(&mock, 3)).await;
    let (fresh0, keep0) = (
        evicted(&gw, "fresh").await,
        evicted(&gw, "keep_alive").await,
    );
    let mut fresh = Conn::connect(&gw).await;
    // Its place is held (idle) before the others begin.
    assert!(eventually(5, || gw.state.limits.open_connections() == 1).await);
    let mut older = Conn::on(&gw, path).await;
    let mut newer = Conn::on(&gw, path).await;
    assert_eq!(gw.state.limits.open_connections(), 3);

    let mut first = Conn::connect(&gw).await;
    let a = first.exchange(&request(path, CHAT)).await;
    assert_eq!(a.status, 200, "{path:?}: {a:?}");
    assert!(fresh.closed_quietly(Duration::ZERO).await, "{path:?}");

    let mut second = Conn::connect(&gw).await;
    let a = second.exchange(&request(path, CHAT)).await;
    assert_eq!(a.status, 200, "{path:?}: {a:?}");
    assert!(older.closed_quietly(Duration::ZERO).await, "{path:?}");

    // The survivors still serve, and never more than the cap (plus those closing) are open.
    assert_eq!(newer.exchange(&request(path, CHAT)).await.status, 200);
    assert_eq!(first.exchange(&request(path, CHAT)).await.status, 200);
    assert!(eventually(5, || gw.state.limits.open_connections() == 3).await);
    assert!(evicted(&gw, "fresh").await > fresh0);
    assert!(evicted(&gw, "keep_alive").await > keep0);
}

/// At the cap, filled with connections whose requests are under way (held by the engine) and one
/// that has sent part of a head: none is idle, so the cap refuses as without eviction, and every
/// request under way is answered in full.
async fn at_the_cap_busy_and_mid_head_connections_are_not_evicted(path: Path) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(capped(&mock, 3)).await;
    let mut held = vec![Conn::on(&gw, path).await, Conn::on(&gw, path).await];
    let mut partial = Conn::on(&gw, path).await;
    // Part of a head: busy, bounded by the header timeout rather than evicted. Sent first, so
    // that the gateway has read it by the time the later requests reach the engine.
    let wire = request(path, CHAT);
    partial.send(&wire[..20]).await;
    mock.set_mode(Mode::Held);
    for c in &mut held {
        c.send(&request(path, CHAT)).await;
    }
    assert!(
        eventually(5, || mock
            .state
            .held
            .load(std::sync::atomic::Ordering::SeqCst)
            == 2)
        .await
    );
    let refused = eventually_async(5, || async {
        let mut c = Conn::connect(&gw).await;
        c.send(&request(path, CHAT)).await;
        matches!(c.answer().await, Some(a) if a.status == 503 && a.code() == "too_many_connections")
    })
    .await;
    assert!(
        refused,
        "{path:?}: a newcomer was admitted over busy connections"
    );
    mock.set_mode(Mode::Json);
    mock.release(2);
    for c in &mut held {
        assert_eq!(c.answer().await.expect("answered").status, 200, "{path:?}");
    }
    partial.send(&wire[20..]).await;
    let a = partial.answer().await.expect("the partial head's answer");
    assert_eq!(a.status, 200, "{path:?}: {a:?}");
}

/// Connections whose clients close (idle, after an answer) give their places back as soon as the
/// gateway reads their end: measured from the last close to no connection open.
async fn peer_closed_connections_free_their_places_promptly(path: Path) {
    const N: usize = 50;
    let mock = Mock::start("a").await;
    let mut cfg = capped(&mock, N);
    // Without eviction: a place must come back by the close alone.
    cfg.server.limits.evict_idle_at_capacity = false;
    let gw = Gateway::start(cfg).await;
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        conns.push(Conn::on(&gw, path).await);
    }
    assert_eq!(gw.state.limits.open_connections(), N);
    let closed = Instant::now();
    drop(conns);
    assert!(
        eventually(5, || gw.state.limits.open_connections() == 0).await,
        "{path:?}: {} still open",
        gw.state.limits.open_connections()
    );
    let took = closed.elapsed();
    eprintln!("{path:?}: {N} closed connections' places freed in {took:?}");
    assert!(took < Duration::from_secs(1), "{path:?}: {took:?}");
    // The cap is whole again.
    let mut again = Vec::with_capacity(N);
    for _ in 0..N {
        again.push(Conn::on(&gw, path).await);
    }
}

/// At a cap of 64, 2,000 connect-and-close connections from four loops while a client opens a
/// new connection for each of its requests: every one of its requests is served (the churn's
/// connections are idle: evicted, or closed by their client), each within a bound.
async fn connect_and_close_churn_at_the_cap_does_not_block_a_client(path: Path) {
    const CHURN: usize = 2000;
    const REQUESTS: usize = 100;
    let mock = Mock::start("a").await;
    let gw = Gateway::start(capped(&mock, 64)).await;
    let addr = gw.addr;
    let churn: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut n = 0;
                for _ in 0..CHURN / 4 {
                    if let Ok(s) = TcpStream::connect(addr).await {
                        drop(s);
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let mut c = Conn::connect(&gw).await;
        let a = c.exchange(&request(path, CHAT)).await;
        assert_eq!(a.status, 200, "{path:?}: {a:?}");
        latencies.push(t.elapsed());
    }
    let mut connected = 0;
    for c in churn {
        connected += c.await.unwrap();
    }
    assert_eq!(
        connected, CHURN,
        "{path:?}: churn connections refused by the kernel"
    );
    latencies.sort();
    let (p99, max) = (latencies[REQUESTS * 99 / 100 - 1], latencies[REQUESTS - 1]);
    eprintln!("{path:?}: new-connection requests during churn: p99 {p99:?}, max {max:?}");
    assert!(
        max < Duration::from_secs(2),
        "{path:?}: a request took {max:?}"
    );
    assert!(eventually(5, || gw.state.limits.open_connections() == 0).await);
}

/// SO_KEEPALIVE, TCP_KEEPIDLE and TCP_KEEPINTVL of the gateway's end of a connection: the socket
/// of this process (the gateway runs in it) whose address is `server` and whose peer is `client`.
/// `None` when no such socket is open.
#[cfg(target_os = "linux")]
fn gateway_keepalive(
    server: std::net::SocketAddr,
    client: std::net::SocketAddr,
) -> Option<(bool, u64, u64)> {
    use std::os::fd::{BorrowedFd, RawFd};
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is only read (getsockname, getpeername, getsockopt), never
        // closed or kept. If a test on another thread closes it meanwhile, the calls fail
        // (EBADF), or read whatever reused the number, whose addresses do not match.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = socket2::SockRef::from(&fd);
        let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
            continue;
        };
        if local.as_socket() == Some(server) && peer.as_socket() == Some(client) {
            return Some((
                s.keepalive().ok()?,
                s.tcp_keepalive_time().ok()?.as_secs(),
                s.tcp_keepalive_interval().ok()?.as_secs(),
            ));
        }
    }
    None
}

/// TCP keepalive as configured, read back from the gateway's end of a connection served on
/// `path`, and of one on the admin listener (the same acceptor code, under its own limits).
/// Whole seconds, as the kernel keeps them.
async fn tcp_keepalive_is_set_on_accepted_connections(path: Path) {
    let mock = Mock::start("a").await;
    let mut cfg = config(&mock);
    // Not the kernel's defaults (7200 s, 75 s), so that only the gateway can have set them.
    cfg.server.limits.tcp_keepalive_idle_ms = 7_000;
    cfg.server.limits.tcp_keepalive_interval_ms = 3_000;
    cfg.server.admin_listen = "127.0.0.1:0".into();
    let gw = Gateway::start(cfg).await;
    // Answered: accepted and configured before its request was read.
    let c = Conn::on(&gw, path).await;
    let client = c.s.local_addr().unwrap();
    #[cfg(target_os = "linux")]
    assert_eq!(
        gateway_keepalive(gw.addr, client),
        Some((true, 7, 3)),
        "{path:?}"
    );
    let admin_addr = gw.admin_addr.unwrap();
    let mut admin = TcpStream::connect(admin_addr).await.unwrap();
    admin
        .write_all(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut got = [0u8; 64];
    let n = timeout(SLACK, admin.read(&mut got)).await.unwrap().unwrap();
    assert!(got[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &got[..n]);
    #[cfg(target_os = "linux")]
    assert_eq!(
        gateway_keepalive(admin_addr, admin.local_addr().unwrap()),
        Some((true, 7, 3)),
        "admin listener"
    );
}

/// 200 clients trickling heads (half on each path), a flood of connect-and-close, and a client
/// making ordinary requests throughout: the tricklers are all cut by the header timeout, the
/// good client's every request succeeds quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_and_a_connect_flood_do_not_hurt_a_good_client() {
    const TRICKLERS: usize = 200;
    const FLOOD: usize = 500;
    const REQUESTS: usize = 100;
    let mock = Mock::start("a").await;
    let mut cfg = config(&mock);
    cfg.server.limits.header_read_timeout_ms = 500;
    cfg.server.limits.idle_timeout_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let started = Instant::now();
    let addr = gw.addr;

    let tricklers: Vec<_> = (0..TRICKLERS)
        .map(|i| {
            tokio::spawn(async move {
                let Ok(s) = TcpStream::connect(addr).await else {
                    return None;
                };
                let mut c = Conn { s, buf: Vec::new() };
                // Even: a POST head, kept by kvgate's loop; odd: a GET, handed to hyper.
                let wire = if i % 2 == 0 {
                    request(Path::H1, CHAT)
                } else {
                    "GET /v1/models HTTP/1.1\r\nhost: gw\r\nx-slow: ........................................................................................................................................................................................................................................\r\n\r\n".to_string()
                };
                let t = Instant::now();
                let (answer, _, closed) = c.trickle(wire.as_bytes()).await;
                (closed && answer.is_none()).then(|| t.elapsed())
            })
        })
        .collect();
    let flood = tokio::spawn(async move {
        let mut n = 0;
        for _ in 0..FLOOD {
            if let Ok(s) = TcpStream::connect(addr).await {
                drop(s);
                n += 1;
            }
        }
        n
    });

    let mut good = Conn::connect(&gw).await;
    let mut latencies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let a = good.exchange(&request(Path::H1, CHAT)).await;
        assert_eq!(a.status, 200, "{a:?}");
        latencies.push(t.elapsed());
    }
    latencies.sort();
    let p99 = latencies[REQUESTS * 99 / 100 - 1];
    assert!(p99 < Duration::from_secs(1), "good client's p99 {p99:?}");

    assert!(flood.await.unwrap() > 0);
    for t in tricklers {
        let cut = t.await.unwrap().expect("a trickler was not cut");
        assert!(cut >= Duration::from_millis(500), "cut after {cut:?}");
        assert!(
            cut < Duration::from_millis(500) + SLACK,
            "cut after {cut:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    let metrics = gw.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"kvgate_connections_closed_total{reason="header_timeout"}"#),
        "{metrics}"
    );
    assert!(metrics.contains("kvgate_connections_open"), "{metrics}");
    eprintln!(
        "good client: p99 {p99:?}, max {:?}",
        latencies.last().unwrap()
    );
}

/// HTTP/2 with prior knowledge (hyper's): a connection with no stream open closes after the
/// idle timeout, not the header timeout, frames or not.
#[tokio::test]
async fn http2_connection_without_streams_closes_after_idle() {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    let started = Instant::now();
    let mut c = Conn::connect(&gw).await;
    // The preface and an empty SETTINGS frame.
    c.s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = timeout(
        Duration::from_millis(IDLE_MS) + SLACK,
        c.s.read_to_end(&mut got),
    )
    .await;
    assert!(read.is_ok(), "still open");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(IDLE_MS),
        "closed after {took:?}"
    );
    // hyper's SETTINGS frame came first: this was served as HTTP/2.
    assert!(got.len() >= 9 && got[3] == 0x4, "{got:?}");
}

/// An HTTP/2 client (prior knowledge) with small flow-control windows.
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(65_535)
        .http2_initial_connection_window_size(65_535)
        .timeout(Duration::from_millis(BODY_MS) + 2 * SLACK)
        .build()
        .unwrap()
}

/// HTTP/2: a request stream whose body stops arriving (part of it sent, then nothing, the
/// stream left open) gets `408 body_read_timeout` after the body timeout, and nothing reaches
/// the engine.
#[tokio::test]
async fn http2_body_that_stops_arriving_gets_408() {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    let part = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
        &CHAT.as_bytes()[..20],
    ))]);
    let body = futures::StreamExt::chain(part, futures::stream::pending());
    let started = Instant::now();
    let resp = h2_client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("an answer before the body ended");
    let took = started.elapsed();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 408);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_read_timeout", "{v}");
    assert!(
        took >= Duration::from_millis(BODY_MS),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_millis(BODY_MS) + SLACK, "{took:?}");
    assert_eq!(mock.count(), 0);
}

/// HTTP/2: a client that stops reading a long stream (its flow-control window, 64 KiB, never
/// reopened) is cut within the write timeout, and the upstream stream is cancelled, as on
/// HTTP/1.1 (`client_that_stops_reading_is_cut_and_upstream_cancelled`).
///
/// Such a client does not stall the gateway's socket writes, it closes its window; the answer's
/// own deadline (`limits::io::Stall`) is what cuts it.
#[tokio::test]
async fn http2_client_that_stops_reading_is_cut_and_upstream_cancelled() {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    // 64 MiB at most, far beyond every window and buffer on the way.
    mock.set_mode(Mode::Flood {
        chunks: 16 * 1024,
        bytes: 4096,
    });
    let client = h2_client();
    let resp = client
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_of(100, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    // The answer's body is not read: the window closes after 64 KiB.
    let dropped = || {
        mock.state
            .streams_dropped
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    assert!(
        eventually(10, || dropped() == 1).await,
        "the upstream stream was not cancelled"
    );
    assert_eq!(
        mock.state
            .streams_completed
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    drop(resp);
}

/// HTTP/2: an answer whose upstream pauses longer than the write timeout between events, read
/// by its client as it comes, is relayed whole: waiting on the upstream is not a stalled client.
#[tokio::test]
async fn http2_slow_upstream_is_not_a_stalled_client() {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(config(&mock)).await;
    mock.set_mode(Mode::Stream {
        chunks: 3,
        delay: Duration::from_millis(2 * WRITE_MS),
    });
    let resp = h2_client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_of(100, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("the whole stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(
        mock.state
            .streams_completed
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}
