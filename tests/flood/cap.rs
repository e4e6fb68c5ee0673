//! A flood at the connection cap against the real binary: the cap filled with idle connections
//! (half accepted and silent, half kept alive after one request), then connect-and-close churn
//! while legitimate clients each open a new connection for every request. With
//! `evict_idle_at_capacity` on, every legitimate request must be served, quickly, and the idle
//! connections that made room are counted in `kvgate_connections_evicted_total`.
//!
//! Invariants:
//! - The idle connections' limits never act during the run (idle timeout far beyond it): every
//!   one the gateway closes was evicted.
//! - Every client is bounded in count and time; the scenario ends when all have.

use super::child::Child;
use super::clients;
use super::scenario::percentile;
use crate::common::{eventually_async, Mock};
use futures::StreamExt;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// How big.
#[derive(Clone, Debug)]
pub struct CapSize {
    /// `max_connections`, filled with idle connections before the churn.
    pub cap: usize,
    /// Connect-and-close connections (every other one after part of a head).
    pub churn: usize,
    /// Legitimate requests, each on a new connection.
    pub requests: usize,
    /// Legitimate clients at once.
    pub clients: usize,
}

/// What was measured.
#[derive(Debug)]
pub struct CapReport {
    pub size: CapSize,
    /// Status and latency (connect to answer) of each legitimate request.
    pub served: Vec<(u16, Duration)>,
    /// Idle connections open when the churn began, and those the gateway closed by the end.
    pub idle_open: usize,
    pub idle_closed: usize,
    pub churn_connected: usize,
    /// `kvgate_connections_evicted_total` by reason, and `over_capacity` refusals.
    pub evicted: Vec<(String, u64)>,
    pub refused: u64,
    pub took: Duration,
}

/// Connect-and-close connections under way at once.
const CHURN_PARALLEL: usize = 16;
/// Idle connections connecting at once while the cap fills.
const FILL_PARALLEL: usize = 64;

fn toml(cap: usize, m: &Mock) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
# /metrics on the main listener (the default in front of instances is a fixed loopback port).
admin_listen = "main"
log_filter = "info"
shutdown_grace_ms = 1000

[server.limits]
idle_timeout_ms = 600000
header_read_timeout_ms = 2000
max_connections = {cap}
evict_idle_at_capacity = true

[health]
interval_ms = 200
timeout_ms = 1000

[[pools]]
model = "m"
[[pools.instances]]
url = "{m}"
"#,
        m = m.url()
    )
}

/// An idle connection: accepted and silent (`kept` false), or kept alive after one answer.
async fn idle_connection(addr: SocketAddr, kept: bool) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    if kept {
        s.write_all(&clients::chat("m", false)).await.ok()?;
        let mut buf = Vec::new();
        clients::answer(&mut s, &mut buf, Instant::now() + Duration::from_secs(10)).await?;
    }
    Some(s)
}

/// One legitimate request on a new connection: its status (0: none) and latency.
async fn legitimate(addr: SocketAddr) -> (u16, Duration) {
    let t = Instant::now();
    let status = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(&clients::chat("m", false)).await.ok()?;
        let mut buf = Vec::new();
        clients::answer(&mut s, &mut buf, t + Duration::from_secs(10)).await
    }
    .await;
    (status.unwrap_or(0), t.elapsed())
}

/// `kvgate_connections_evicted_total` by reason, and `..._closed_total{reason="over_capacity"}`.
async fn scrape(addr: SocketAddr) -> (Vec<(String, u64)>, u64) {
    let text = match reqwest::get(format!("http://{addr}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let value = |n: &str| n.trim().parse::<f64>().unwrap_or(0.0) as u64;
    let mut evicted = Vec::new();
    let mut refused = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kvgate_connections_evicted_total{reason=\"") {
            if let Some((reason, n)) = rest.split_once("\"} ") {
                evicted.push((reason.to_string(), value(n)));
            }
        } else if let Some(n) =
            line.strip_prefix("kvgate_connections_closed_total{reason=\"over_capacity\"} ")
        {
            refused = value(n);
        }
    }
    (evicted, refused)
}

pub async fn run(size: CapSize) -> CapReport {
    let started = Instant::now();
    let m = Mock::start("m").await;
    let child = Child::start(&toml(size.cap, &m));
    let addr = child.addr;
    let ready = eventually_async(20, || async { legitimate(addr).await.0 == 200 }).await;
    assert!(ready, "the gateway never answered 200");

    // The cap filled: half silent, half kept alive after an answer.
    let idle: Vec<TcpStream> = futures::stream::iter(0..size.cap)
        .map(|i| idle_connection(addr, i % 2 == 1))
        .buffer_unordered(FILL_PARALLEL)
        .filter_map(|s| async { s })
        .collect()
        .await;
    let idle_open = idle.len();

    let churn = tokio::spawn(clients::connect_and_close(addr, size.churn, CHURN_PARALLEL));
    let served: Vec<(u16, Duration)> = futures::stream::iter(0..size.requests)
        .map(|_| legitimate(addr))
        .buffer_unordered(size.clients)
        .collect()
        .await;
    let churn_connected = churn.await.unwrap_or(0);

    // Which idle connections the gateway closed (evicted): end of file within a second.
    let idle_closed = futures::stream::iter(idle)
        .map(|mut s| async move {
            let mut b = [0u8; 64];
            matches!(
                timeout(Duration::from_secs(1), s.read(&mut b)).await,
                Ok(Ok(0)) | Ok(Err(_))
            )
        })
        .buffer_unordered(1024)
        .filter(|closed| std::future::ready(*closed))
        .count()
        .await;
    let (evicted, refused) = scrape(addr).await;
    CapReport {
        size,
        served,
        idle_open,
        idle_closed,
        churn_connected,
        evicted,
        refused,
        took: started.elapsed(),
    }
}

impl CapReport {
    pub fn print(&self) {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        let s = &self.size;
        let ok = self.served.iter().filter(|(c, _)| *c == 200).count();
        println!("flood at the connection cap ({:?} in all)", self.took);
        println!(
            "cap {} filled with {} idle connections (half silent, half kept alive); {} of {} connect-and-close connected",
            s.cap, self.idle_open, self.churn_connected, s.churn
        );
        println!(
            "legitimate clients ({} at once, a new connection per request): {ok} of {} served 200, p50 {}, p99 {}, max {}",
            s.clients,
            self.served.len(),
            ms(percentile(&self.served, 50)),
            ms(percentile(&self.served, 99)),
            ms(percentile(&self.served, 100)),
        );
        println!(
            "idle connections closed by the gateway: {} of {}; evicted {:?}; refused over capacity {}",
            self.idle_closed, self.idle_open, self.evicted, self.refused
        );
    }

    /// The checks every run must pass.
    pub fn check(&self) {
        let s = &self.size;
        let non200: Vec<_> = self.served.iter().filter(|(c, _)| *c != 200).collect();
        assert!(non200.is_empty(), "legitimate clients got {non200:?}");
        assert_eq!(self.served.len(), s.requests);
        assert_eq!(self.idle_open, s.cap, "the cap was not filled");
        assert_eq!(self.churn_connected, s.churn);
        // Legitimate and churn connections took idle ones' places (or places their own closes
        // freed): the idle connections the gateway closed were all evicted, and some were.
        let evicted: u64 = self.evicted.iter().map(|(_, n)| n).sum();
        assert!(
            self.idle_closed > 0 && self.idle_closed as u64 <= evicted,
            "{} idle closed, {evicted} evicted",
            self.idle_closed
        );
        let p99 = percentile(&self.served, 99);
        assert!(p99 < Duration::from_secs(1), "legitimate p99 {p99:?}");
    }
}
