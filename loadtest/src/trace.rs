//! Mooncake-format request traces: parse, write, slice, speed up, spread ties, summarise.
//!
//! One JSON object per line: `{"timestamp": ms, "input_length": tokens, "output_length": tokens,
//! "hash_ids": [block ids]}`. `hash_ids` are prefix-chained ids of `block_tokens`-token blocks
//! (512 in the Mooncake release): two requests share a prompt prefix exactly as far as their ids
//! agree, and `hash_ids.len() == ceil(input_length / block_tokens)`.
//!
//! Invariants kept by every constructor in this module:
//! - requests are sorted by `timestamp_ms` (a stable sort on load, so ties keep file order);
//! - every request satisfies the block-count rule above and has `input_length >= 1`;
//! - parsing is bounded: lines longer than [`MAX_LINE_BYTES`] and files with more than
//!   [`MAX_REQUESTS`] requests are rejected with an error naming the line.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Block size of the Mooncake traces, in tokens.
pub const DEFAULT_BLOCK_TOKENS: u32 = 512;
/// Longest accepted line (a 1 M-token prompt at 512-token blocks is ~20 KB of ids).
pub const MAX_LINE_BYTES: usize = 4 << 20;
/// Most requests accepted in one trace.
pub const MAX_REQUESTS: usize = 10_000_000;

/// Why a trace could not be read, written or transformed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("reading trace {path}: {source}")]
    Io {
        /// Path of the trace file.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// A line is not a valid trace record.
    #[error("trace line {line}: {msg}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        msg: String,
    },
    /// The trace exceeds a size bound.
    #[error("trace too large: more than {0} requests")]
    TooManyRequests(usize),
    /// A transformation parameter is out of range.
    #[error("invalid trace parameter: {0}")]
    Parameter(String),
    /// Writing the trace failed.
    #[error("writing trace: {0}")]
    Write(std::io::Error),
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival time in milliseconds since the start of the trace.
    #[serde(rename = "timestamp")]
    pub timestamp_ms: u64,
    /// Prompt length in tokens.
    pub input_length: u32,
    /// Number of tokens to generate.
    pub output_length: u32,
    /// Prefix-chained block ids, one per `block_tokens` of prompt (last block may be partial).
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Number of blocks that are completely filled by the prompt (engines cache only these).
    pub fn full_blocks(&self, block_tokens: u32) -> usize {
        (self.input_length / block_tokens.max(1)) as usize
    }
}

/// How [`Trace::spread_ties`] places the requests of one timestamp within its tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TieSpread {
    /// At independent uniform offsets (sorted, so the trace order holds): arrivals within a
    /// tick cluster and gap as a random population's do.
    Uniform,
    /// At equal intervals, the first at the tick's start.
    Even,
}

/// A whole trace: requests sorted by arrival plus the block size their ids refer to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Requests in arrival order.
    pub requests: Vec<TraceRequest>,
    /// Tokens per hash id block.
    pub block_tokens: u32,
}

/// Summary figures of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStats {
    /// Number of requests.
    pub requests: usize,
    /// Time from first to last arrival, seconds.
    pub duration_s: f64,
    /// Mean arrival rate, requests per second (0 when the duration is 0).
    pub mean_rate: f64,
    /// Mean prompt length, tokens.
    pub input_mean: f64,
    /// Median prompt length, tokens.
    pub input_p50: u32,
    /// 99th percentile prompt length, tokens.
    pub input_p99: u32,
    /// Longest prompt, tokens.
    pub input_max: u32,
    /// Mean output length, tokens.
    pub output_mean: f64,
    /// Median output length, tokens.
    pub output_p50: u32,
    /// 99th percentile output length, tokens.
    pub output_p99: u32,
    /// Longest output, tokens.
    pub output_max: u32,
    /// Fraction of requests whose first full block appeared in an earlier request (they share a
    /// prefix with something seen before).
    pub prefix_reuse_requests: f64,
    /// Total prompt tokens.
    pub total_input_tokens: u64,
    /// Number of distinct block ids (the working set in blocks).
    pub distinct_blocks: usize,
    /// Best possible prefix hit ratio over blocks with an infinite single cache.
    pub infinite_hit_ratio_blocks: f64,
    /// Best possible prefix hit ratio over prompt tokens with an infinite single cache.
    pub infinite_hit_ratio_tokens: f64,
}

impl Trace {
    /// Loads a trace with the Mooncake block size (512 tokens).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        Self::load_with(path, DEFAULT_BLOCK_TOKENS)
    }

    /// Loads a trace whose ids refer to `block_tokens`-token blocks.
    pub fn load_with(path: impl AsRef<Path>, block_tokens: u32) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(BufReader::new(file), block_tokens).map_err(|e| match e {
            TraceError::Io { source, .. } => TraceError::Io {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Parses JSONL from a reader. Blank lines are skipped.
    pub fn parse(reader: impl BufRead, block_tokens: u32) -> Result<Self, TraceError> {
        if block_tokens == 0 {
            return Err(TraceError::Parameter(
                "block size must be at least 1 token".into(),
            ));
        }
        let mut requests = Vec::new();
        let mut reader = reader;
        let mut buf = Vec::with_capacity(4096);
        let mut line_no = 0usize;
        loop {
            buf.clear();
            line_no += 1;
            // Read at most MAX_LINE_BYTES + 1 so an endless line cannot exhaust memory.
            let n = (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| TraceError::Io {
                    path: PathBuf::new(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            if buf.len() > MAX_LINE_BYTES {
                return Err(TraceError::Line {
                    line: line_no,
                    msg: format!("line longer than {MAX_LINE_BYTES} bytes"),
                });
            }
            let text = std::str::from_utf8(&buf).map_err(|_| TraceError::Line {
                line: line_no,
                msg: "not valid UTF-8".into(),
            })?;
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let req: TraceRequest = serde_json::from_str(text).map_err(|e| TraceError::Line {
                line: line_no,
                msg: e.to_string(),
            })?;
            validate(&req, block_tokens).map_err(|msg| TraceError::Line { line: line_no, msg })?;
            if requests.len() >= MAX_REQUESTS {
                return Err(TraceError::TooManyRequests(MAX_REQUESTS));
            }
            requests.push(req);
        }
        requests.sort_by_key(|r| r.timestamp_ms);
        Ok(Trace {
            requests,
            block_tokens,
        })
    }

    /// Builds a trace from requests, checking each one and sorting by arrival.
    pub fn from_requests(
        mut requests: Vec<TraceRequest>,
        block_tokens: u32,
    ) -> Result<Self, TraceError> {
        if block_tokens == 0 {
            return Err(TraceError::Parameter(
                "block size must be at least 1 token".into(),
            ));
        }
        for (i, r) in requests.iter().enumerate() {
            validate(r, block_tokens).map_err(|msg| TraceError::Line { line: i + 1, msg })?;
        }
        requests.sort_by_key(|r| r.timestamp_ms);
        Ok(Trace {
            requests,
            block_tokens,
        })
    }

    /// Writes the trace as JSONL (the Mooncake format).
    pub fn write(&self, mut w: impl Write) -> Result<(), TraceError> {
        for r in &self.requests {
            serde_json::to_writer(&mut w, r).map_err(|e| TraceError::Write(e.into()))?;
            w.write_all(b"\n").map_err(TraceError::Write)?;
        }
        w.flush().map_err(TraceError::Write)
    }

    /// Writes the trace to a file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TraceError> {
        let f = File::create(path.as_ref()).map_err(|source| TraceError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        })?;
        self.write(std::io::BufWriter::new(f))
    }

    /// Drops the first `n` requests and moves the rest so the first left arrives at 0: a later
    /// window of a trace replays as if it were the trace's start (its requests still name the
    /// dropped ones' blocks, which start cold). `skip(0)` is the trace as it is.
    pub fn skip(mut self, n: usize) -> Trace {
        if n == 0 {
            return self;
        }
        let mut rest = self.requests.split_off(n.min(self.requests.len()));
        let start = rest.first().map_or(0, |r| r.timestamp_ms);
        for r in &mut rest {
            r.timestamp_ms = r.timestamp_ms.saturating_sub(start);
        }
        self.requests = rest;
        self
    }

    /// Keeps at most `max_requests` requests arriving within `max_duration` of the first one.
    pub fn slice(&self, max_requests: Option<usize>, max_duration: Option<Duration>) -> Trace {
        let start = self.requests.first().map_or(0, |r| r.timestamp_ms);
        let limit_ms = max_duration.map(|d| d.as_millis().min(u64::MAX as u128) as u64);
        let requests = self
            .requests
            .iter()
            .take(max_requests.unwrap_or(usize::MAX))
            .take_while(|r| limit_ms.is_none_or(|l| r.timestamp_ms - start <= l))
            .cloned()
            .collect();
        Trace {
            requests,
            block_tokens: self.block_tokens,
        }
    }

    /// Divides every timestamp by `factor` (2.0 replays twice as fast).
    pub fn speed_up(&self, factor: f64) -> Result<Trace, TraceError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(TraceError::Parameter(format!(
                "speed-up must be a positive finite number, got {factor}"
            )));
        }
        let requests = self
            .requests
            .iter()
            .map(|r| TraceRequest {
                timestamp_ms: (r.timestamp_ms as f64 / factor).round() as u64,
                ..r.clone()
            })
            .collect();
        Ok(Trace {
            requests,
            block_tokens: self.block_tokens,
        })
    }

    /// Spreads requests that share a timestamp over the interval to the next distinct one, in
    /// their trace order: at uniform offsets drawn from `seed` (sorted), or evenly.
    ///
    /// Mooncake traces record arrivals on a coarse clock (the conversation trace's timestamps are
    /// multiples of ~3 s, ~9 requests each): replayed as written, every group reaches the router
    /// in the same instant, which no real client population does. Spreading keeps each request
    /// inside its own clock tick, so the mean rate and the order are the trace's. A group on the
    /// last timestamp spreads over the gap before it (the trace says nothing past its end); a
    /// trace with one timestamp has no interval to spread over and is returned unchanged.
    pub fn spread_ties(&self, how: TieSpread, seed: u64) -> Trace {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut requests = self.requests.clone();
        let mut start = 0;
        let mut previous_gap = None;
        while start < requests.len() {
            let t = requests[start].timestamp_ms;
            let end = start + requests[start..].partition_point(|r| r.timestamp_ms == t);
            let gap = requests
                .get(end)
                .map(|r| r.timestamp_ms - t)
                .or(previous_gap);
            let k = (end - start) as u64;
            if let (Some(gap), true) = (gap, k > 1) {
                let mut offsets: Vec<u64> = match how {
                    TieSpread::Uniform => (0..k).map(|_| rng.gen_range(0..gap)).collect(),
                    // In u128: a trace's timestamps are outside input, and `i × gap` may not
                    // fit in u64 where `i × gap / k < gap` does.
                    TieSpread::Even => (0..k)
                        .map(|i| (u128::from(i) * u128::from(gap) / u128::from(k)) as u64)
                        .collect(),
                };
                offsets.sort_unstable();
                for (r, o) in requests[start..end].iter_mut().zip(offsets) {
                    r.timestamp_ms = t.saturating_add(o);
                }
            }
            if end < requests.len() {
                previous_gap = gap;
            }
            start = end;
        }
        Trace {
            requests,
            block_tokens: self.block_tokens,
        }
    }

    /// Time from the first to the last arrival.
    pub fn duration(&self) -> Duration {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => Duration::from_millis(b.timestamp_ms - a.timestamp_ms),
            _ => Duration::ZERO,
        }
    }

    /// Computes summary figures, including the infinite-cache hit bound.
    pub fn stats(&self) -> TraceStats {
        let n = self.requests.len();
        let mut inputs: Vec<u32> = self.requests.iter().map(|r| r.input_length).collect();
        inputs.sort_unstable();
        let mut outputs: Vec<u32> = self.requests.iter().map(|r| r.output_length).collect();
        outputs.sort_unstable();
        let total_in: u64 = inputs.iter().map(|&x| u64::from(x)).sum();
        let total_out: u64 = outputs.iter().map(|&x| u64::from(x)).sum();
        let mut seen = ahash::AHashSet::new();
        let (mut blocks_total, mut blocks_hit) = (0u64, 0u64);
        let (mut tokens_hit, mut reusing) = (0u64, 0u64);
        for r in &self.requests {
            let full = r.full_blocks(self.block_tokens);
            // Ids are prefix-chained, so the hit is the longest prefix of already-seen full blocks.
            let hit = r.hash_ids[..full]
                .iter()
                .take_while(|id| seen.contains(*id))
                .count();
            reusing += u64::from(hit > 0);
            blocks_total += r.hash_ids.len() as u64;
            blocks_hit += hit as u64;
            tokens_hit += hit as u64 * u64::from(self.block_tokens);
            seen.extend(r.hash_ids.iter().copied());
        }
        let duration_s = self.duration().as_secs_f64();
        let pick = |sorted: &[u32], q: f64| -> u32 {
            if sorted.is_empty() {
                0
            } else {
                sorted[((q * (n - 1) as f64).round() as usize).min(n - 1)]
            }
        };
        TraceStats {
            requests: n,
            duration_s,
            mean_rate: if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            },
            input_mean: ratio(total_in, n as u64),
            input_p50: pick(&inputs, 0.5),
            input_p99: pick(&inputs, 0.99),
            input_max: inputs.last().copied().unwrap_or(0),
            output_mean: ratio(total_out, n as u64),
            output_p50: pick(&outputs, 0.5),
            output_p99: pick(&outputs, 0.99),
            output_max: outputs.last().copied().unwrap_or(0),
            prefix_reuse_requests: ratio(reusing, n as u64),
            total_input_tokens: total_in,
            distinct_blocks: seen.len(),
            infinite_hit_ratio_blocks: ratio(blocks_hit, blocks_total),
            infinite_hit_ratio_tokens: ratio(tokens_hit, total_in),
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn validate(r: &TraceRequest, block_tokens: u32) -> Result<(), String> {
    if r.input_length == 0 {
        return Err("input_length must be at least 1".into());
    }
    let expect = r.input_length.div_ceil(block_tokens) as usize;
    if r.hash_ids.len() != expect {
        return Err(format!(
            "{} hash_ids for input_length {} (expected {expect} blocks of {block_tokens} tokens; \
             is the block size right?)",
            r.hash_ids.len(),
            r.input_length
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Trace, TraceError> {
        Trace::parse(s.as_bytes(), 4)
    }

    fn at(times: &[u64]) -> Trace {
        let requests = times
            .iter()
            .enumerate()
            .map(|(i, &t)| TraceRequest {
                timestamp_ms: t,
                input_length: 4,
                output_length: 1,
                hash_ids: vec![i as u64],
            })
            .collect();
        Trace {
            requests,
            block_tokens: 4,
        }
    }

    #[test]
    fn ties_spread_within_their_tick_in_trace_order() {
        let times = [0, 0, 0, 0, 3000, 6000, 6000, 6000, 9000, 9000];
        let t = at(&times).spread_ties(TieSpread::Uniform, 7);
        let got: Vec<u64> = t.requests.iter().map(|r| r.timestamp_ms).collect();
        // Order and identities kept, every request inside its own tick.
        let ids: Vec<u64> = t.requests.iter().map(|r| r.hash_ids[0]).collect();
        assert_eq!(ids, (0..10).collect::<Vec<u64>>());
        assert!(got.windows(2).all(|w| w[0] <= w[1]), "{got:?}");
        for (i, (&g, &w)) in got.iter().zip(&times).enumerate() {
            let tick_end = if w == 9000 {
                12_000
            } else {
                times[i..]
                    .iter()
                    .copied()
                    .find(|&x| x > w)
                    .unwrap_or(u64::MAX)
            };
            assert!(
                g >= w && g < tick_end,
                "request {i}: {g} outside [{w}, {tick_end})"
            );
        }
        // A request alone on its timestamp stays there; groups no longer arrive at one instant.
        assert_eq!(got[4], 3000);
        assert!(got[..4].windows(2).any(|w| w[0] != w[1]), "{got:?}");
        assert!(got[5..8].windows(2).any(|w| w[0] != w[1]), "{got:?}");
        // The same seed draws the same arrivals, another seed others.
        assert_eq!(at(&times).spread_ties(TieSpread::Uniform, 7), t);
        assert_ne!(at(&times).spread_ties(TieSpread::Uniform, 8), t);
    }

    #[test]
    fn a_trace_without_ties_or_interval_is_unchanged() {
        let distinct = at(&[0, 5, 9, 20]);
        for how in [TieSpread::Uniform, TieSpread::Even] {
            assert_eq!(distinct.spread_ties(how, 1), distinct);
            let one_instant = at(&[4, 4, 4]);
            assert_eq!(one_instant.spread_ties(how, 1), one_instant);
            assert_eq!(at(&[]).spread_ties(how, 1), at(&[]));
        }
    }

    #[test]
    fn timestamps_near_the_end_of_the_clock_spread_without_overflow() {
        let far = u64::MAX - 10;
        for how in [TieSpread::Uniform, TieSpread::Even] {
            let t = at(&[0, 0, 0, far, far, far]).spread_ties(how, 3);
            let got: Vec<u64> = t.requests.iter().map(|r| r.timestamp_ms).collect();
            assert!(got.windows(2).all(|w| w[0] <= w[1]), "{got:?}");
            assert!(got[..3].iter().all(|&g| g < far) && got[3..].iter().all(|&g| g >= far));
        }
    }

    #[test]
    fn even_spreading_places_a_tick_s_requests_at_equal_intervals() {
        let t = at(&[0, 0, 0, 0, 3000, 3000, 3000]).spread_ties(TieSpread::Even, 99);
        let got: Vec<u64> = t.requests.iter().map(|r| r.timestamp_ms).collect();
        // The last tick borrows the gap before it.
        assert_eq!(got, [0, 750, 1500, 2250, 3000, 4000, 5000]);
    }

    #[test]
    fn parses_and_sorts() {
        let t = parse(
            "{\"timestamp\": 5, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, 2]}\n\n\
             {\"timestamp\": 1, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}\n",
        )
        .unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].timestamp_ms, 1);
        assert_eq!(t.requests[1].hash_ids, vec![1, 2]);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(
            "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n\
             {\"timestamp\": 1, \"input_length\": 4, \"output_length\": 1}\n",
        )
        .unwrap_err();
        assert!(matches!(e, TraceError::Line { line: 2, .. }), "{e}");
        assert!(e.to_string().contains("hash_ids"), "{e}");
        let e = parse("not json\n").unwrap_err();
        assert!(matches!(e, TraceError::Line { line: 1, .. }));
    }

    #[test]
    fn block_count_is_checked() {
        let e = parse(
            "{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("expected 3 blocks"), "{e}");
        let e = parse(
            "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n",
        )
        .unwrap_err();
        assert!(matches!(e, TraceError::Line { line: 1, .. }));
    }

    #[test]
    fn overlong_line_rejected() {
        let mut s = String::from("{\"timestamp\": 0, \"pad\": \"");
        s.push_str(&"x".repeat(MAX_LINE_BYTES + 10));
        s.push_str("\"}\n");
        let e = parse(&s).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    #[test]
    fn write_roundtrip_slice_speed_up() {
        let reqs = (0..10)
            .map(|i| TraceRequest {
                timestamp_ms: i * 1000,
                input_length: 6,
                output_length: 3,
                hash_ids: vec![0, i + 1],
            })
            .collect();
        let t = Trace::from_requests(reqs, 4).unwrap();
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let back = Trace::parse(out.as_slice(), 4).unwrap();
        assert_eq!(back, t);
        assert_eq!(t.slice(Some(3), None).requests.len(), 3);
        assert_eq!(
            t.slice(None, Some(Duration::from_millis(4500)))
                .requests
                .len(),
            5
        );
        let later = t.clone().skip(4);
        assert_eq!(later.requests.len(), 6);
        assert_eq!(later.requests[0].timestamp_ms, 0);
        assert_eq!(later.requests[5].timestamp_ms, 5000);
        assert_eq!(later.requests[0].hash_ids, vec![0, 5]);
        assert_eq!(later.block_tokens, t.block_tokens);
        assert_eq!(later.slice(Some(2), None).requests[1].hash_ids, vec![0, 6]);
        assert_eq!(t.clone().skip(0), t);
        // Nothing skipped, nothing moved: a trace that starts late keeps its start.
        let late = (0..3)
            .map(|i| TraceRequest {
                timestamp_ms: 3000 + i * 1000,
                input_length: 6,
                output_length: 3,
                hash_ids: vec![0, i + 1],
            })
            .collect();
        let late = Trace::from_requests(late, 4).unwrap();
        assert_eq!(late.clone().skip(0).requests[0].timestamp_ms, 3000);
        assert_eq!(late.skip(1).requests[0].timestamp_ms, 0);
        assert!(t.clone().skip(10).requests.is_empty());
        assert!(t.clone().skip(usize::MAX).requests.is_empty());
        let fast = t.speed_up(4.0).unwrap();
        assert_eq!(fast.requests[9].timestamp_ms, 2250);
        assert!(t.speed_up(0.0).is_err());
        assert!(t.speed_up(f64::NAN).is_err());
    }

    #[test]
    fn stats_infinite_cache_bound() {
        // Block size 4: r1 = [a b] (8 tokens, 2 full), r2 = [a c] -> hits a only.
        let reqs = vec![
            TraceRequest {
                timestamp_ms: 0,
                input_length: 8,
                output_length: 1,
                hash_ids: vec![1, 2],
            },
            TraceRequest {
                timestamp_ms: 1000,
                input_length: 8,
                output_length: 3,
                hash_ids: vec![1, 3],
            },
        ];
        let s = Trace::from_requests(reqs, 4).unwrap().stats();
        assert_eq!(s.requests, 2);
        assert_eq!(s.distinct_blocks, 3);
        assert!((s.infinite_hit_ratio_blocks - 0.25).abs() < 1e-9);
        assert!((s.infinite_hit_ratio_tokens - 0.25).abs() < 1e-9);
        assert!((s.output_mean - 2.0).abs() < 1e-9);
        assert_eq!((s.output_p50, s.output_max), (3, 3));
        assert!((s.prefix_reuse_requests - 0.5).abs() < 1e-9);
        assert!((s.mean_rate - 2.0).abs() < 1e-9);
    }
}
