//! One flood against the real binary: a good client measured alone, then again while four kinds
//! of offender run at once; what each offender saw, what the gateway counted, and its memory.
//!
//! Invariants:
//! - Every offender is bounded in count and time (`Size`); the scenario ends when all have.
//! - The memory bound is computed from the config and the code's buffer sizes ([`bound`]), never
//!   from what was measured under the flood: its inputs are the gateway's RSS before the flood
//!   and a connection task's size as compiled ([`task_bytes`]).

use super::child::{Child, Memory};
use super::clients::{self, Cut, Open};
use crate::common::{eventually_async, Mock, Mode};
use kvgate::proxy::limits::places;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How big and how fast.
#[derive(Clone, Debug)]
pub struct Size {
    /// (c) idle keep-alive connections, open at once.
    pub idle: usize,
    /// (a) header tricklers.
    pub tricklers: usize,
    /// (b) slow readers of long streams.
    pub slow_readers: usize,
    /// (d) connect-and-close connections.
    pub flood: usize,
    /// Good client's requests before the flood.
    pub baseline: usize,
    pub header_ms: u64,
    pub write_ms: u64,
    pub idle_ms: u64,
    /// Pace of a trickler's bytes and a slow reader's reads.
    pub tick: Duration,
    /// Most time a limit may take to act beyond its value.
    pub slack: Duration,
}

impl Size {
    /// Client connections the scenario may hold at once.
    pub fn connections(&self) -> usize {
        self.idle + self.tricklers + self.slow_readers + FLOOD_PARALLEL + 1
    }
    /// The config's `max_connections`: [`Self::connections`] and every connect-and-close
    /// connection, which the client closes at once but which holds its place until the gateway
    /// reads its end (on a loaded machine the acceptor outruns the serving threads, and 256
    /// places of headroom were seen to fill). So no connection is refused.
    pub fn max_connections(&self) -> usize {
        self.connections() + self.flood
    }
}

/// Connect-and-close connections under way at once.
const FLOOD_PARALLEL: usize = 16;
/// Idle connections connecting and making their first request at once.
const RAMP_PARALLEL: usize = 64;
/// The flood upstream's stream: far beyond every socket buffer on the way.
const STREAM_CHUNKS: usize = 16 * 1024;
const STREAM_CHUNK_BYTES: usize = 1024;
/// Most time the socket buffers on a slow reader's path take to fill (the write deadline runs
/// from there), on a loaded machine: megabytes, as the kernel grows the gateway's send buffer.
pub const FILL: Duration = Duration::from_secs(10);
/// `[server.limits] body_budget_bytes` in the scenario's config.
pub const BODY_BUDGET: usize = 4 << 20;

/// What one kind of offender saw.
#[derive(Default, Debug)]
pub struct Kind {
    pub opened: usize,
    /// Closed by the server within its limit + slack (and not before the limit).
    pub closed_in_time: usize,
    /// Time from the start of its limit to the close: the slowest.
    pub slowest: Duration,
    pub fastest: Option<Duration>,
    /// What went wrong, for the others (first few).
    pub failures: Vec<String>,
    pub failed: usize,
}

impl Kind {
    fn record(&mut self, r: Result<Duration, String>, limit: Duration, slack: Duration) {
        match r {
            Ok(t) if t >= limit && t < limit + slack => {
                self.opened += 1;
                self.closed_in_time += 1;
                self.slowest = self.slowest.max(t);
                self.fastest = Some(self.fastest.map_or(t, |f| f.min(t)));
            }
            Ok(t) => self.fail(format!("closed after {t:?}, limit {limit:?}")),
            Err(e) => self.fail(e),
        }
    }
    fn fail(&mut self, e: String) {
        if !e.starts_with("connect") {
            self.opened += 1;
        }
        self.failed += 1;
        if self.failures.len() < 5 {
            self.failures.push(e);
        }
    }
}

/// Everything measured.
#[derive(Debug)]
pub struct Report {
    pub size: Size,
    /// Good client: status and latency of each request, alone and during the flood.
    pub alone: Vec<(u16, Duration)>,
    pub flooded: Vec<(u16, Duration)>,
    pub tricklers: Kind,
    pub slow_readers: Kind,
    /// Bytes the slow readers read in all, most by one.
    pub slow_read_most: usize,
    pub idle: Kind,
    pub flood_connected: usize,
    /// Most client connections open at once, as the clients counted them.
    pub most_open: usize,
    /// Gateway memory before the flood, and at the end (whose `hwm` is the peak).
    pub before: Memory,
    pub end: Memory,
    /// Client connections the gateway still held at the end.
    pub sockets_end: usize,
    /// `kvgate_connections_closed_total` by reason.
    pub closed: Vec<(String, u64)>,
    /// The flood upstream's streams cancelled.
    pub streams_dropped: usize,
    /// The memory bound and how it is made up.
    pub bound: u64,
    pub bound_terms: String,
    pub took: Duration,
}

/// What a client connection holds in the gateway, from the code (docs/limits.md, "Flood and
/// memory"): its task (the future of `h1::serve`, [`task_bytes`], rounded up by an eighth for the
/// allocator's size classes), its head buffer (`h1::READ_RESERVE`, 4 KiB, for heads smaller than
/// that) and the runtime's registration of its socket.
pub fn waiting(task: usize) -> u64 {
    (task + task / 8) as u64 + 4096 + REGISTRATION
}
/// What relaying a stream adds: the upstream body's read buffer (`client::body::READ_RESERVE`,
/// 16 KiB, at most doubled by growth), the upstream head buffer (8 KiB), the pending write
/// (`h1::answer`: under two frames of `COPY_BYTES`, 16 KiB, so at most 64 KiB of capacity) and the
/// upstream socket's registration.
pub const STREAMING: u64 = (32 + 8 + 64) * 1024 + REGISTRATION;
/// A parked upstream connection: its read buffer and registration.
pub const POOLED: u64 = 32 * 1024 + REGISTRATION;
/// A socket's registration with the runtime and the small per-connection state around it.
const REGISTRATION: u64 = 512;

/// `before.rss + max_connections × waiting + (max_connections + 256) × 64 B (the cap's
/// places) + streams × STREAMING + pooled × POOLED + body
/// budget`: as many connections as the cap admits may be open at once; upstream connections
/// parked in the pool are at most the non-streaming requests in flight at once (the idle
/// connections' first requests, the good client's).
pub fn bound(size: &Size, before: Memory, task: usize) -> (u64, String) {
    let conns = size.max_connections() as u64;
    let streams = size.slow_readers as u64;
    let pooled = (RAMP_PARALLEL + 1) as u64;
    let w = waiting(task);
    // The connection cap's table of places: a slot per place and per eviction under way.
    let places = (conns + places::EVICTING as u64) * places::SLOT_BYTES as u64;
    let b = before.rss
        + conns * w
        + places
        + streams * STREAMING
        + pooled * POOLED
        + BODY_BUDGET as u64;
    let terms = format!(
        "{:.1} MiB before + {conns} connections × {:.1} KiB (task {task} B) + {:.1} MiB places + {streams} streams × {} KiB + {pooled} pooled upstream × {} KiB + {} MiB body budget",
        before.rss as f64 / (1 << 20) as f64,
        w as f64 / 1024.0,
        places as f64 / (1 << 20) as f64,
        STREAMING >> 10,
        POOLED >> 10,
        BODY_BUDGET >> 20,
    );
    (b, terms)
}

fn toml(size: &Size, m: &Mock, f: &Mock) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"[server]
listen = "127.0.0.1:0"
# /metrics on the main listener (the default in front of instances is a fixed loopback port).
admin_listen = "main"
log_filter = "info"
shutdown_grace_ms = 1000

[server.limits]
header_read_timeout_ms = {header}
body_read_timeout_ms = {header}
idle_timeout_ms = {idle}
write_timeout_ms = {write}
max_connections = {max}
body_budget_bytes = {budget}

[health]
interval_ms = 200
timeout_ms = 1000

[load]
poll_interval_ms = 500

[[pools]]
model = "m"
[[pools.instances]]
url = "{m}"

[[pools]]
model = "f"
[[pools.instances]]
url = "{f}"
"#,
        header = size.header_ms,
        idle = size.idle_ms,
        write = size.write_ms,
        max = size.max_connections(),
        budget = BODY_BUDGET,
        m = m.url(),
        f = f.url(),
    );
    s
}

/// `kvgate_connections_closed_total` by reason, and `kvgate_connections_open`.
async fn scrape(child: &Child) -> (Vec<(String, u64)>, u64) {
    let text = reqwest::get(format!("http://{}/metrics", child.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut closed = Vec::new();
    let mut open = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kvgate_connections_closed_total{reason=\"") {
            if let Some((reason, n)) = rest.split_once("\"} ") {
                closed.push((
                    reason.to_string(),
                    n.trim().parse::<f64>().unwrap_or(0.0) as u64,
                ));
            }
        } else if let Some(n) = line.strip_prefix("kvgate_connections_open ") {
            open = n.trim().parse::<f64>().unwrap_or(0.0) as u64;
        }
    }
    (closed, open)
}

pub async fn run(size: Size) -> Report {
    let started = Instant::now();
    let m = Mock::start("m").await;
    let f = Mock::start("f").await;
    *f.state.models.lock() = vec!["f".to_string()];
    f.set_mode(Mode::Flood {
        chunks: STREAM_CHUNKS,
        bytes: STREAM_CHUNK_BYTES,
    });
    let child = Child::start(&toml(&size, &m, &f));
    let addr = child.addr;
    let per_request = Duration::from_secs(10);
    let ready = eventually_async(20, || async {
        clients::good(addr, 1, per_request, || false).await[0].0 == 200
    })
    .await;
    assert!(ready, "the gateway never answered 200");

    let alone = clients::good(addr, size.baseline, per_request, || false).await;
    let before = child.memory();

    let open = Arc::new(Open::default());
    let done = Arc::new(AtomicBool::new(false));
    let header = Duration::from_millis(size.header_ms);
    let write = Duration::from_millis(size.write_ms);
    let idle = Duration::from_millis(size.idle_ms);
    let slack = size.slack;

    let ramp = Arc::new(tokio::sync::Semaphore::new(RAMP_PARALLEL));
    let idlers: Vec<_> = (0..size.idle)
        .map(|_| {
            tokio::spawn(clients::idler(
                addr,
                ramp.clone(),
                idle + slack,
                open.clone(),
            ))
        })
        .collect();
    let tricklers: Vec<_> = (0..size.tricklers)
        .map(|_| {
            tokio::spawn(clients::trickler(
                addr,
                size.tick,
                header + slack,
                open.clone(),
            ))
        })
        .collect();
    let all_cut: Arc<dyn Fn() -> bool + Send + Sync> = {
        let (f, n) = (f.state.clone(), size.slow_readers);
        Arc::new(move || f.streams_dropped.load(Ordering::SeqCst) >= n)
    };
    let readers: Vec<_> = (0..size.slow_readers)
        .map(|_| {
            tokio::spawn(clients::slow_reader(
                addr,
                size.tick,
                all_cut.clone(),
                write + FILL + slack,
                open.clone(),
            ))
        })
        .collect();
    let flood = tokio::spawn(clients::connect_and_close(addr, size.flood, FLOOD_PARALLEL));
    let good = {
        let done = done.clone();
        tokio::spawn(async move {
            clients::good(addr, 1_000_000, per_request, move || {
                done.load(Ordering::SeqCst)
            })
            .await
        })
    };

    let mut report_idle = Kind::default();
    let mut report_tricklers = Kind::default();
    let mut report_readers = Kind::default();
    let mut slow_read_most = 0;
    for t in tricklers {
        report_tricklers.record(t.await.unwrap(), header, slack);
    }
    for r in readers {
        match r.await.unwrap() {
            Ok(Cut { read, after }) => {
                slow_read_most = slow_read_most.max(read);
                report_readers.opened += 1;
                report_readers.closed_in_time += 1;
                report_readers.slowest = report_readers.slowest.max(after);
            }
            Err(e) => report_readers.fail(e),
        }
    }
    let flood_connected = flood.await.unwrap();
    for i in idlers {
        report_idle.record(i.await.unwrap(), idle, slack);
    }
    done.store(true, Ordering::SeqCst);
    let flooded = good.await.unwrap();

    // Every connection is closed on the gateway's side too.
    let settled = eventually_async(10, || async { child.client_sockets() == 0 }).await;
    let sockets_end = child.client_sockets();
    if !settled {
        eprintln!("gateway sockets still open: {sockets_end}");
    }
    let streams_dropped = f.state.streams_dropped.load(Ordering::SeqCst);
    let (closed, _) = scrape(&child).await;
    let end = child.memory();
    let (bound, bound_terms) = bound(&size, before, task_bytes().await);
    Report {
        size,
        alone,
        flooded,
        tricklers: report_tricklers,
        slow_readers: report_readers,
        slow_read_most,
        idle: report_idle,
        flood_connected,
        most_open: open.most(),
        before,
        end,
        sockets_end,
        closed,
        streams_dropped,
        bound,
        bound_terms,
        took: started.elapsed(),
    }
}

/// The `p`th percentile latency of the answered requests.
pub fn percentile(samples: &[(u16, Duration)], p: usize) -> Duration {
    let mut l: Vec<_> = samples.iter().map(|(_, d)| *d).collect();
    l.sort();
    if l.is_empty() {
        return Duration::ZERO;
    }
    l[(l.len() * p / 100).min(l.len() - 1)]
}

impl Report {
    /// Human-readable figures.
    pub fn print(&self) {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        let s = &self.size;
        println!("flood against the kvgate binary ({:?} in all)", self.took);
        println!(
            "limits: header {} ms, write {} ms, idle {} ms; slack {:?}",
            s.header_ms, s.write_ms, s.idle_ms, s.slack
        );
        for (name, v) in [("alone", &self.alone), ("during the flood", &self.flooded)] {
            let non200 = v.iter().filter(|(c, _)| *c != 200).count();
            // Requests are sequential: the slowest began when all before it had ended.
            let worst = (0..v.len()).max_by_key(|&i| v[i].1).unwrap_or(0);
            let began: Duration = v[..worst].iter().map(|(_, d)| *d).sum();
            println!(
                "good client {name}: {} requests, {non200} not 200, p50 {}, p99 {}, max {} (begun {began:.1?} in)",
                v.len(),
                ms(percentile(v, 50)),
                ms(percentile(v, 99)),
                ms(percentile(v, 100)),
            );
        }
        for (name, k, limit) in [
            (
                "(a) header tricklers",
                &self.tricklers,
                "header_read_timeout",
            ),
            ("(c) idle keep-alive", &self.idle, "idle_timeout"),
        ] {
            println!(
                "{name}: {} opened, {} closed by {limit} in time (after {} to {}), {} failed {:?}",
                k.opened,
                k.closed_in_time,
                k.fastest.map(ms).unwrap_or_default(),
                ms(k.slowest),
                k.failed,
                k.failures
            );
        }
        let k = &self.slow_readers;
        println!(
            "(b) slow readers: {} opened, {} cut by write_timeout while reading slowly (all within {} of their request), {} failed {:?}; at most {} bytes read by one; upstream streams cancelled: {}",
            k.opened,
            k.closed_in_time,
            ms(k.slowest),
            k.failed,
            k.failures,
            self.slow_read_most,
            self.streams_dropped
        );
        println!(
            "(d) connect-and-close: {} of {} connected",
            self.flood_connected, s.flood
        );
        println!("most client connections open at once: {}", self.most_open);
        println!("gateway closed by limit: {:?}", self.closed);
        println!(
            "client connections the gateway still held at the end: {}",
            self.sockets_end
        );
        println!(
            "gateway RSS: {} before the flood, peak (VmHWM) {}, {} at the end",
            mib(self.before.rss),
            mib(self.end.hwm),
            mib(self.end.rss)
        );
        println!("memory bound: {} = {}", mib(self.bound), self.bound_terms);
    }
}

/// Bytes of one connection's task as the gateway spawns it: the future of
/// [`kvgate::proxy::h1::serve`], which holds the whole request path's state inline (it awaits
/// the handler), so it is what a connection costs waiting and serving alike.
pub async fn task_bytes() -> usize {
    use kvgate::proxy::h1::{self, Connections};
    let state = kvgate::app::AppState::new(crate::common::config_for(&[
        "http://127.0.0.1:9".to_string()
    ]))
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stream = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    let conns = Connections {
        service: kvgate::proxy::service::GatewayService::new(state.clone()),
        http1: hyper::server::conn::http1::Builder::new(),
        http2: hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new()),
        drain: tokio_util::sync::CancellationToken::new(),
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let permit = state.limits.admit(true).unwrap();
    let fut = h1::serve(stream, conns, graceful.watcher(), permit);
    std::mem::size_of_val(&fut)
}
