//! One shared system prompt in front of unique user questions (single turn).
//!
//! Reuse: every request shares the system prompt; nothing else. A router that only follows the
//! longest match sends everything to one instance — load must decide.

use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::{around, check_rate, next_arrival, Draft, SegIds, SynthError};

/// Parameters (lengths in tokens).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SystemPromptParams {
    /// Number of requests.
    pub requests: usize,
    /// Arrival rate, requests per second.
    pub rate: f64,
    /// Length of the shared system prompt.
    pub system_tokens: u32,
    /// Mean length of a user question.
    pub user_tokens: u32,
    /// Mean output length.
    pub output_tokens: u32,
}

impl Default for SystemPromptParams {
    fn default() -> Self {
        SystemPromptParams {
            requests: 200,
            rate: 2.0,
            system_tokens: 2000,
            user_tokens: 300,
            output_tokens: 150,
        }
    }
}

impl SystemPromptParams {
    pub(crate) fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        check_rate(self.rate)?;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut ids = SegIds::new(ns);
        let system = ids.fresh();
        let mut t = 0.0;
        let mut out = Vec::with_capacity(self.requests.min(super::MAX_REQUESTS));
        for _ in 0..self.requests.min(super::MAX_REQUESTS + 1) {
            t = next_arrival(&mut rng, t, self.rate);
            out.push(Draft {
                timestamp_ms: t as u64,
                segments: vec![
                    (system, self.system_tokens),
                    (ids.fresh(), around(&mut rng, self.user_tokens)),
                ],
                output_length: around(&mut rng, self.output_tokens),
            });
        }
        Ok(out)
    }
}
