//! Live progress line on stderr: sent, done, errors, rejections, recent TTFT p50/p99.
//!
//! Counters are atomics updated by request tasks; recent TTFTs live in a ring of
//! [`WINDOW`] samples. The line is redrawn about twice a second with plain ANSI, and only when
//! stderr is a terminal.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::stats::percentile_sorted;

/// Recent TTFT samples kept for the live percentiles.
pub const WINDOW: usize = 512;

/// Shared live counters.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Requests finished (any outcome).
    pub done: AtomicU64,
    /// Requests failed.
    pub errors: AtomicU64,
    /// Requests rejected (429/503).
    pub rejected: AtomicU64,
    /// Most recent TTFTs, seconds.
    recent: Mutex<VecDeque<f64>>,
}

impl Progress {
    /// Records a first-token time.
    pub fn ttft(&self, s: f64) {
        if let Ok(mut r) = self.recent.lock() {
            if r.len() >= WINDOW {
                r.pop_front();
            }
            r.push_back(s);
        }
    }

    /// The progress line (without control characters).
    pub fn line(&self, total: usize, elapsed: Duration) -> String {
        let mut v: Vec<f64> = self
            .recent
            .lock()
            .map(|r| r.iter().copied().collect())
            .unwrap_or_default();
        v.sort_by(f64::total_cmp);
        let p = |q| percentile_sorted(&v, q).map_or("-".to_string(), |x| format!("{x:.3}s"));
        format!(
            "[{:>6.1}s] sent {}/{} done {} errors {} rejected {} | TTFT p50 {} p99 {}",
            elapsed.as_secs_f64(),
            self.sent.load(Ordering::Relaxed),
            total,
            self.done.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
            p(50.0),
            p(99.0),
        )
    }
}

/// Redraws the progress line until `stop` fires; does nothing unless stderr is a terminal.
pub async fn render(
    progress: Arc<Progress>,
    total: usize,
    label: String,
    stop: tokio_util::sync::CancellationToken,
) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let line = progress.line(total, start.elapsed());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{label}{line}");
        let _ = err.flush();
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "\r\x1b[2K{label}{}",
        progress.line(total, start.elapsed())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_counts_and_window() {
        let p = Progress::default();
        p.sent.store(3, Ordering::Relaxed);
        for i in 0..(WINDOW + 10) {
            p.ttft(i as f64);
        }
        assert_eq!(p.recent.lock().unwrap().len(), WINDOW);
        let l = p.line(10, Duration::from_secs(1));
        assert!(l.contains("sent 3/10"), "{l}");
        assert!(l.contains("p99"), "{l}");
    }
}
