//! Replay of missed batches from an engine's ROUTER replay socket, and splicing the answer into
//! the stream.
//!
//! Invariants: a replay is bounded in time ([`ZmqReplayer`] timeout), in frames
//! ([`MAX_REPLAY_FRAMES`]) and in bytes per frame; [`splice`] only ever returns a contiguous run
//! ending right before the live message, so applying it cannot reorder the stream.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Most frames accepted from one replay (vLLM buffers 10,000 batches).
pub const MAX_REPLAY_FRAMES: usize = 20_000;

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The replay socket did not answer in time.
    #[error("replay timed out")]
    Timeout,
    /// ZMQ error.
    #[error("replay socket: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    /// The answer was not `[seq, payload]` frames.
    #[error("malformed replay answer: {0}")]
    Malformed(&'static str),
}

/// Something that can answer "every buffered message from `from` on".
pub trait Replayer: Send {
    /// Buffered messages with sequence ≥ `from`, in order.
    fn replay(
        &mut self,
        from: u64,
    ) -> impl Future<Output = Result<Vec<(u64, Bytes)>, ReplayError>> + Send;
}

/// Replays over a ZMQ DEALER connected to the engine's ROUTER replay endpoint.
pub struct ZmqReplayer {
    endpoint: String,
    timeout: Duration,
    max_payload: usize,
}

impl ZmqReplayer {
    /// A replayer for `endpoint`, giving up after `timeout`; larger payloads end the replay.
    pub fn new(endpoint: String, timeout: Duration, max_payload: usize) -> Self {
        Self {
            endpoint,
            timeout,
            max_payload,
        }
    }

    async fn run(&self, from: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let mut sock = DealerSocket::new();
        sock.connect(&self.endpoint).await?;
        // ROUTER sees [identity, "", start]; the empty delimiter is what vLLM's REQ-style
        // protocol expects.
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .map_err(|_| ReplayError::Malformed("empty request"))?;
        sock.send(req).await?;
        let mut out = Vec::new();
        loop {
            let msg = sock.recv().await?;
            let frames: Vec<Bytes> = msg
                .into_vec()
                .into_iter()
                .skip_while(|f| f.is_empty())
                .collect();
            let (seq, payload) = match frames.as_slice() {
                [seq, payload] => (seq, payload.clone()),
                [seq] => (seq, Bytes::new()),
                _ => return Err(ReplayError::Malformed("expected [seq, payload]")),
            };
            let seq: [u8; 8] = seq
                .as_ref()
                .try_into()
                .map_err(|_| ReplayError::Malformed("sequence frame is not 8 bytes"))?;
            let seq = i64::from_be_bytes(seq);
            if seq < 0 {
                break;
            }
            if payload.len() > self.max_payload || out.len() >= MAX_REPLAY_FRAMES {
                // Whatever came so far is still a valid prefix; the splice decides coverage.
                break;
            }
            out.push((seq as u64, payload));
        }
        let _ = sock.close().await;
        Ok(out)
    }
}

impl Replayer for ZmqReplayer {
    async fn replay(&mut self, from: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        match tokio::time::timeout(self.timeout, self.run(from)).await {
            Ok(r) => r,
            Err(_) => Err(ReplayError::Timeout),
        }
    }
}

/// Result of matching a replay against the gap `from..until`.
#[derive(Debug, Default)]
pub struct Splice {
    /// True when the frames cover the whole gap.
    pub covered: bool,
    /// The frames to apply, in order: the longest contiguous run ending at `until - 1`.
    pub frames: Vec<(u64, Bytes)>,
}

/// Picks from `frames` the contiguous run `k..until` with the smallest `k ≥ from`.
pub fn splice(from: u64, until: u64, mut frames: Vec<(u64, Bytes)>) -> Splice {
    frames.retain(|(s, _)| *s >= from && *s < until);
    frames.sort_by_key(|(s, _)| *s);
    frames.dedup_by_key(|(s, _)| *s);
    // Walk back from the end while sequence numbers are consecutive and end at until - 1.
    let mut start = frames.len();
    let mut expect = until;
    while start > 0 && frames[start - 1].0.wrapping_add(1) == expect {
        start -= 1;
        expect = frames[start].0;
    }
    let run = frames.split_off(start);
    Splice {
        covered: expect == from,
        frames: run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(seqs: &[u64]) -> Vec<(u64, Bytes)> {
        seqs.iter().map(|&s| (s, Bytes::new())).collect()
    }

    fn seqs(s: &Splice) -> Vec<u64> {
        s.frames.iter().map(|(q, _)| *q).collect()
    }

    #[test]
    fn splice_cases() {
        let s = splice(3, 6, f(&[1, 2, 3, 4, 5, 6, 7]));
        assert!(s.covered);
        assert_eq!(seqs(&s), vec![3, 4, 5]);
        let s = splice(3, 6, f(&[4, 5]));
        assert!(!s.covered);
        assert_eq!(seqs(&s), vec![4, 5]);
        let s = splice(3, 6, f(&[3, 5]));
        assert!(!s.covered);
        assert_eq!(seqs(&s), vec![5]);
        let s = splice(3, 6, f(&[3, 4]));
        assert!(!s.covered);
        assert!(s.frames.is_empty());
        let s = splice(0, 0, vec![]);
        assert!(s.covered);
        let s = splice(2, 4, f(&[3, 2, 3]));
        assert!(s.covered);
        assert_eq!(seqs(&s), vec![2, 3]);
    }
}
