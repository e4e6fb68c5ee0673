//! The benchmark's workload: multi-turn conversations of token-id prompts, each request sent to a
//! random live replica (as a Kubernetes Service would).
//!
//! Invariants:
//! - Bounded: at most `max_open` conversations are kept for follow-up turns (the oldest retire);
//!   a conversation retires after `turns` turns.
//! - Prompts are token-id arrays (`"prompt": [ids]`), so neither the gateway nor the simulator
//!   tokenizes 8K-token texts: the gateway hashes 16-token blocks of the ids, as in token mode.
//! - Probe conversations (sampled first turns) are single-turn: nothing but gossip can put their
//!   prefix into another replica's index, so convergence is measured cleanly.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

/// Workload shape.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Shared system prompts.
    pub system_prompts: usize,
    /// Tokens of each shared system prompt.
    pub system_tokens: usize,
    /// Tokens of a conversation's first user part (system + this ≈ the prompt size).
    pub first_tokens: usize,
    /// Tokens appended per follow-up turn.
    pub turn_tokens: usize,
    /// Turns per conversation before it retires.
    pub turns: usize,
    /// Probability that a request starts a new conversation.
    pub new_fraction: f64,
    /// Conversations kept open for follow-ups.
    pub max_open: usize,
}

/// One request to send.
pub struct Request {
    /// JSON body.
    pub body: String,
    /// Conversation id (follow-ups share it).
    pub conversation: u64,
    /// The instance and replica of the previous turn, if any.
    pub previous: Option<(String, usize)>,
    /// A single-turn probe: its first routing is measured for convergence.
    pub probe: bool,
}

struct Conversation {
    id: u64,
    /// Comma-separated token ids so far (the prompt of the next turn, minus the new part).
    ids: String,
    turns_done: usize,
    last: Option<(String, usize)>,
    in_flight: bool,
}

/// Generates requests; the caller reports completions back with [`Workload::completed`].
pub struct Workload {
    shape: Shape,
    rng: SmallRng,
    systems: Vec<String>,
    open: VecDeque<Conversation>,
    next_id: u64,
    model: String,
}

fn push_ids(rng: &mut SmallRng, n: usize, out: &mut String) {
    use std::fmt::Write;
    for _ in 0..n {
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{}", rng.gen_range(100u32..30_000));
    }
}

impl Workload {
    /// A workload for `model`, seeded.
    pub fn new(shape: Shape, model: &str, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let systems = (0..shape.system_prompts.max(1))
            .map(|_| {
                let mut s = String::new();
                push_ids(&mut rng, shape.system_tokens, &mut s);
                s
            })
            .collect();
        Self {
            shape,
            rng,
            systems,
            open: VecDeque::new(),
            next_id: 0,
            model: model.to_string(),
        }
    }

    fn body(&self, ids: &str) -> String {
        format!(
            r#"{{"model":"{}","prompt":[{}],"max_tokens":1}}"#,
            self.model, ids
        )
    }

    fn fresh(&mut self) -> (u64, String) {
        let id = self.next_id;
        self.next_id += 1;
        let sys = self.rng.gen_range(0..self.systems.len());
        let mut ids = self.systems[sys].clone();
        push_ids(&mut self.rng, self.shape.first_tokens, &mut ids);
        (id, ids)
    }

    /// The next request; `probe` asks for a single-turn probe conversation.
    pub fn next(&mut self, probe: bool) -> Request {
        if probe {
            let (id, ids) = self.fresh();
            return Request {
                body: self.body(&ids),
                conversation: id,
                previous: None,
                probe: true,
            };
        }
        let follow = !self.rng.gen_bool(self.shape.new_fraction.clamp(0.0, 1.0));
        if follow {
            // A conversation whose previous turn has completed.
            let n = self.open.len();
            let start = if n > 0 { self.rng.gen_range(0..n) } else { 0 };
            for k in 0..n.min(8) {
                let i = (start + k) % n;
                if self.open[i].in_flight {
                    continue;
                }
                let mut new = String::new();
                push_ids(&mut self.rng, self.shape.turn_tokens, &mut new);
                let c = &mut self.open[i];
                c.ids.push(',');
                c.ids.push_str(&new);
                c.in_flight = true;
                let (id, previous) = (c.id, c.last.clone());
                let body = self.body(&self.open[i].ids);
                return Request {
                    body,
                    conversation: id,
                    previous,
                    probe: false,
                };
            }
        }
        let (id, ids) = self.fresh();
        let body = self.body(&ids);
        if self.open.len() >= self.shape.max_open {
            self.open.pop_front();
        }
        self.open.push_back(Conversation {
            id,
            ids,
            turns_done: 0,
            last: None,
            in_flight: true,
        });
        Request {
            body,
            conversation: id,
            previous: None,
            probe: false,
        }
    }

    /// Records that a turn of `conversation` finished on `instance` via `replica` (None = failed).
    pub fn completed(&mut self, conversation: u64, outcome: Option<(String, usize)>) {
        let turns = self.shape.turns;
        if let Some(i) = self.open.iter().position(|c| c.id == conversation) {
            let c = &mut self.open[i];
            c.in_flight = false;
            c.turns_done += 1;
            c.last = outcome;
            if c.turns_done >= turns || c.last.is_none() {
                self.open.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversations_grow_and_retire() {
        let shape = Shape {
            system_prompts: 2,
            system_tokens: 10,
            first_tokens: 20,
            turn_tokens: 5,
            turns: 2,
            new_fraction: 0.0,
            max_open: 4,
        };
        let mut w = Workload::new(shape, "m", 1);
        let r = w.next(false);
        assert!(r.previous.is_none());
        w.completed(r.conversation, Some(("i0".into(), 0)));
        let f = w.next(false);
        assert_eq!(f.conversation, r.conversation);
        assert_eq!(f.previous, Some(("i0".into(), 0)));
        assert!(f.body.len() > r.body.len());
        w.completed(f.conversation, Some(("i1".into(), 1)));
        assert!(w.open.is_empty(), "retired after its turns");
        assert!(w.next(true).probe);
    }
}
