//! Multi-turn chat: each turn's prompt carries the whole conversation so far.
//!
//! Reuse: turn k+1 extends turn k's prompt (its user message and the model's answer appended),
//! so routing a conversation back to the instance that served its previous turn saves the
//! history's prefill. All conversations share one system prompt.

use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::{around, check_rate, next_arrival, Draft, SegIds, SynthError, MAX_PROMPT_TOKENS};

/// Parameters (lengths in tokens, times in seconds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ChatParams {
    /// Number of conversations.
    pub conversations: usize,
    /// Conversation start rate, per second.
    pub rate: f64,
    /// Mean turns per conversation.
    pub turns: u32,
    /// Mean pause between a turn's arrival and the next (reading + typing).
    pub think_s: f64,
    /// Shared system prompt length.
    pub system_tokens: u32,
    /// Mean user message length.
    pub user_tokens: u32,
    /// Mean answer length (the output, appended to the history).
    pub output_tokens: u32,
}

impl Default for ChatParams {
    fn default() -> Self {
        ChatParams {
            conversations: 40,
            rate: 0.5,
            turns: 5,
            think_s: 15.0,
            system_tokens: 400,
            user_tokens: 150,
            output_tokens: 250,
        }
    }
}

impl ChatParams {
    pub(crate) fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        check_rate(self.rate)?;
        if !(self.think_s.is_finite() && self.think_s >= 0.0) {
            return Err(SynthError::Parameter("think_s must be >= 0".into()));
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut ids = SegIds::new(ns);
        let system = ids.fresh();
        let mut start = 0.0;
        let mut out = Vec::new();
        for _ in 0..self.conversations.min(super::MAX_REQUESTS) {
            start = next_arrival(&mut rng, start, self.rate);
            let mut t = start;
            let mut history = vec![(system, self.system_tokens)];
            let mut len = self.system_tokens;
            for _ in 0..around(&mut rng, self.turns) {
                let user = around(&mut rng, self.user_tokens);
                history.push((ids.fresh(), user));
                let answer = around(&mut rng, self.output_tokens);
                out.push(Draft {
                    timestamp_ms: t as u64,
                    segments: history.clone(),
                    output_length: answer,
                });
                history.push((ids.fresh(), answer));
                len = len.saturating_add(user + answer);
                if len > MAX_PROMPT_TOKENS || out.len() > super::MAX_REQUESTS {
                    break;
                }
                t += 1000.0 * self.think_s * rand::Rng::gen_range(&mut rng, 0.5..1.5);
            }
        }
        Ok(out)
    }
}
