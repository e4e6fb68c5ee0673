//! Agent loops: plan → act (tool call + tool output) → reflect, repeated, with growing history.
//!
//! Reuse: every step's prompt extends the previous one, and all sessions share a long system
//! prompt with the tool definitions. Steps follow each other quickly, so the history is hot.

use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::{around, check_rate, next_arrival, Draft, SegIds, SynthError, MAX_PROMPT_TOKENS};

/// Parameters (lengths in tokens, times in seconds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentParams {
    /// Number of agent sessions.
    pub sessions: usize,
    /// Session start rate, per second.
    pub rate: f64,
    /// Mean plan/act/reflect iterations per session.
    pub steps: u32,
    /// System prompt with tool definitions (shared by all sessions).
    pub system_tokens: u32,
    /// Mean task description length.
    pub task_tokens: u32,
    /// Mean plan output.
    pub plan_tokens: u32,
    /// Mean tool-call output.
    pub act_tokens: u32,
    /// Mean tool result appended to the history.
    pub tool_output_tokens: u32,
    /// Mean reflection output.
    pub reflect_tokens: u32,
    /// Mean gap between consecutive calls of a session (model + tool time).
    pub gap_s: f64,
}

impl Default for AgentParams {
    fn default() -> Self {
        AgentParams {
            sessions: 20,
            rate: 0.25,
            steps: 4,
            system_tokens: 3000,
            task_tokens: 400,
            plan_tokens: 150,
            act_tokens: 60,
            tool_output_tokens: 800,
            reflect_tokens: 120,
            gap_s: 4.0,
        }
    }
}

impl AgentParams {
    pub(crate) fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        check_rate(self.rate)?;
        if !(self.gap_s.is_finite() && self.gap_s >= 0.0) {
            return Err(SynthError::Parameter("gap_s must be >= 0".into()));
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut ids = SegIds::new(ns);
        let system = ids.fresh();
        let mut start = 0.0;
        let mut out = Vec::new();
        for _ in 0..self.sessions.min(super::MAX_REQUESTS) {
            start = next_arrival(&mut rng, start, self.rate);
            let mut t = start;
            let task = around(&mut rng, self.task_tokens);
            let mut history = vec![(system, self.system_tokens), (ids.fresh(), task)];
            let mut len = self.system_tokens.saturating_add(task);
            'session: for _ in 0..around(&mut rng, self.steps) {
                // (output mean, extra history appended after the output)
                for (mean, extra) in [
                    (self.plan_tokens, 0),
                    (self.act_tokens, self.tool_output_tokens),
                    (self.reflect_tokens, 0),
                ] {
                    let output = around(&mut rng, mean);
                    out.push(Draft {
                        timestamp_ms: t as u64,
                        segments: history.clone(),
                        output_length: output,
                    });
                    history.push((ids.fresh(), output));
                    len = len.saturating_add(output);
                    if extra > 0 {
                        let tool = around(&mut rng, extra);
                        history.push((ids.fresh(), tool));
                        len = len.saturating_add(tool);
                    }
                    t += 1000.0 * self.gap_s * rand::Rng::gen_range(&mut rng, 0.5..1.5);
                    if len > MAX_PROMPT_TOKENS || out.len() > super::MAX_REQUESTS {
                        break 'session;
                    }
                }
            }
        }
        Ok(out)
    }
}
