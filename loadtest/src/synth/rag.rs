//! RAG / few-shot: prompts combine a few documents (or examples) from a pool, then a question.
//!
//! Reuse: documents are drawn with a Zipf-like popularity, and the retrieved set is placed in
//! popularity order after a shared system prompt, so popular documents form shared prefixes.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{around, check_rate, next_arrival, Draft, SegIds, SynthError};

/// Parameters (lengths in tokens).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RagParams {
    /// Number of requests.
    pub requests: usize,
    /// Arrival rate, requests per second.
    pub rate: f64,
    /// Documents in the pool.
    pub documents: usize,
    /// Mean document length.
    pub document_tokens: u32,
    /// Documents per prompt.
    pub documents_per_prompt: usize,
    /// Zipf exponent of document popularity (0 = uniform).
    pub zipf: f64,
    /// Shared system prompt length.
    pub system_tokens: u32,
    /// Mean question length.
    pub question_tokens: u32,
    /// Mean output length.
    pub output_tokens: u32,
}

impl Default for RagParams {
    fn default() -> Self {
        RagParams {
            requests: 200,
            rate: 2.0,
            documents: 100,
            document_tokens: 800,
            documents_per_prompt: 3,
            zipf: 1.1,
            system_tokens: 300,
            question_tokens: 60,
            output_tokens: 200,
        }
    }
}

impl RagParams {
    pub(crate) fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        check_rate(self.rate)?;
        if self.documents == 0 || self.documents > 1_000_000 {
            return Err(SynthError::Parameter(
                "documents must be in 1..=1000000".into(),
            ));
        }
        if !(self.zipf.is_finite() && self.zipf >= 0.0) {
            return Err(SynthError::Parameter("zipf must be >= 0".into()));
        }
        let k = self.documents_per_prompt.min(self.documents);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut ids = SegIds::new(ns);
        let system = ids.fresh();
        let docs: Vec<(u64, u32)> = (0..self.documents)
            .map(|_| (ids.fresh(), around(&mut rng, self.document_tokens)))
            .collect();
        // Cumulative popularity weights: document i has weight 1 / (i+1)^zipf.
        let mut cdf = Vec::with_capacity(self.documents);
        let mut acc = 0.0;
        for i in 0..self.documents {
            acc += 1.0 / ((i + 1) as f64).powf(self.zipf);
            cdf.push(acc);
        }
        let mut t = 0.0;
        let mut out = Vec::with_capacity(self.requests.min(super::MAX_REQUESTS));
        for _ in 0..self.requests.min(super::MAX_REQUESTS + 1) {
            t = next_arrival(&mut rng, t, self.rate);
            let mut picked: Vec<usize> = Vec::with_capacity(k);
            // Bounded rejection sampling of k distinct documents.
            let mut tries = 0;
            while picked.len() < k && tries < 100 * k {
                tries += 1;
                let u = rng.gen::<f64>() * acc;
                let i = cdf.partition_point(|&c| c < u).min(self.documents - 1);
                if !picked.contains(&i) {
                    picked.push(i);
                }
            }
            picked.sort_unstable();
            let mut segments = vec![(system, self.system_tokens)];
            segments.extend(picked.iter().map(|&i| docs[i]));
            segments.push((ids.fresh(), around(&mut rng, self.question_tokens)));
            out.push(Draft {
                timestamp_ms: t as u64,
                segments,
                output_length: around(&mut rng, self.output_tokens),
            });
        }
        Ok(out)
    }
}
