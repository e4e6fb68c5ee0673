//! Request bodies of the sizing driver: unique prompts, multi-turn conversations, index fill.
//!
//! Invariants:
//! - prompt text is made of single-token words ([`PromptBuilder::words`]), so a message's content
//!   is exactly as many tokens as words under the built-in tokenizer; the words are lowercase ASCII
//!   letters with a leading space, so bodies are assembled by concatenation without JSON escaping;
//! - a unique prompt (and a conversation's first message) starts with [`HEAD_WORDS`] words drawn
//!   from its own id: one token block, and inside the first text block, so no two of them share a
//!   first block in either hash mode and their chained block hashes never meet;
//! - a conversation's request at turn `k + 1` carries exactly the messages of its request at turn
//!   `k` plus one assistant answer and one new user message (the content of a message depends only
//!   on the conversation id and the turn), so its rendered prompt extends the previous one.

use super::HashKind;
use crate::prompt::PromptBuilder;

/// Words at the start of each unique prompt that only it has.
pub const HEAD_WORDS: u32 = 16;
/// Words in the shared corpus that prompt bodies are cut from.
const CORPUS_WORDS: usize = 1 << 17;
/// Token ids (token mode) or words (text mode) per index-fill request.
pub const FILL_TOKENS: u32 = 1 << 16;

/// A long run of words with their offsets, cut into prompt text at varying places.
#[derive(Debug, Clone)]
struct Corpus {
    text: String,
    /// Byte offset of each word's start, plus the end of the text.
    starts: Vec<usize>,
}

impl Corpus {
    fn new(builder: &PromptBuilder, seed: u64) -> Self {
        let mut text = String::with_capacity(CORPUS_WORDS * 8);
        let mut starts = Vec::with_capacity(CORPUS_WORDS + 1);
        let mut chunk = 0u64;
        while starts.len() < CORPUS_WORDS {
            let part = builder.words(seed ^ (0xc0de_0000_0000 + chunk), 4096);
            for word in part.split(' ').filter(|w| !w.is_empty()) {
                if starts.len() == CORPUS_WORDS {
                    break;
                }
                starts.push(text.len());
                text.push(' ');
                text.push_str(word);
            }
            chunk += 1;
        }
        starts.push(text.len());
        Corpus { text, starts }
    }

    fn words(&self) -> usize {
        self.starts.len() - 1
    }

    /// Appends `n` words starting at word `offset` (wrapping around the corpus).
    fn push(&self, offset: usize, mut n: usize, out: &mut String) {
        let len = self.words();
        let mut at = offset % len;
        while n > 0 {
            let take = n.min(len - at);
            out.push_str(&self.text[self.starts[at]..self.starts[at + take]]);
            n -= take;
            at = 0;
        }
    }
}

/// Builds the bodies of one driver run.
#[derive(Debug, Clone)]
pub struct Bodies {
    builder: PromptBuilder,
    corpus: Corpus,
    model: String,
    max_tokens: u32,
    seed: u64,
}

impl Bodies {
    /// Bodies for `model` asking for `max_tokens` output tokens, text drawn from `builder`.
    pub fn new(builder: PromptBuilder, model: &str, max_tokens: u32, seed: u64) -> Self {
        let corpus = Corpus::new(&builder, seed);
        Bodies {
            builder,
            corpus,
            model: model.to_string(),
            max_tokens,
            seed,
        }
    }

    fn offset(&self, a: u64, b: u64) -> usize {
        (mix(self.seed ^ mix(a) ^ b.rotate_left(17)) % self.corpus.words() as u64) as usize
    }

    /// `words` words of content that begin with a head only `id` has.
    fn unique_text(&self, id: u64, words: u32, out: &mut String) {
        let head = HEAD_WORDS.min(words);
        out.push_str(&self.builder.words(self.seed ^ mix(id), head));
        self.corpus
            .push(self.offset(id, 0), (words - head) as usize, out);
    }

    fn head(&self, extra: usize) -> String {
        let mut b = String::with_capacity(extra + 96);
        b.push_str("{\"model\":\"");
        b.push_str(&self.model);
        b.push_str("\",\"max_tokens\":");
        b.push_str(&self.max_tokens.to_string());
        b
    }

    /// A chat completion with one user message of `words` words, unique to `id`.
    pub fn unique(&self, id: u64, words: u32) -> Vec<u8> {
        let mut b = self.head(words as usize * 8);
        b.push_str(",\"messages\":[{\"role\":\"user\",\"content\":\"");
        self.unique_text(id, words, &mut b);
        b.push_str("\"}]}");
        b.into_bytes()
    }

    /// A completion that only adds index entries: [`FILL_TOKENS`] token ids (token mode) or words
    /// (text mode), unique to `id` from the first block on.
    pub fn fill(&self, mode: HashKind, id: u64) -> Vec<u8> {
        let mut b = self.head(FILL_TOKENS as usize * 8);
        b.push_str(",\"prompt\":");
        match mode {
            HashKind::Token => {
                b.push('[');
                let h = mix(self.seed ^ id);
                // The id itself in the first ids: unique from the first block on.
                let head = [id as u32, (id >> 32) as u32, h as u32, (h >> 32) as u32];
                for (i, v) in head.iter().enumerate() {
                    if i > 0 {
                        b.push(',');
                    }
                    b.push_str(&v.to_string());
                }
                for i in head.len() as u32..FILL_TOKENS {
                    b.push(',');
                    b.push_str(&(1000 + (i * 7919) % 50_000).to_string());
                }
                b.push(']');
            }
            HashKind::Text => {
                b.push('"');
                self.unique_text(id, FILL_TOKENS, &mut b);
                b.push('"');
            }
        }
        b.push('}');
        b.into_bytes()
    }

    /// The content of a conversation's message: the first user message, then per turn an answer
    /// and a new user message.
    fn message(&self, conv: u64, turn: u32, assistant: bool, words: u32, out: &mut String) {
        out.push_str(if assistant {
            "{\"role\":\"assistant\",\"content\":\""
        } else {
            "{\"role\":\"user\",\"content\":\""
        });
        if turn == 0 && !assistant {
            self.unique_text(conv, words, out);
        } else {
            let which = u64::from(turn) * 2 + u64::from(assistant);
            self.corpus
                .push(self.offset(conv, which), words as usize, out);
        }
        out.push_str("\"}");
    }
}

/// How one multi-turn conversation grows: a first user message, then per turn an answer and a
/// new user message, for a mean prompt of the cell's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TurnShape {
    /// Words of the first user message.
    pub first: u32,
    /// Words of each assistant answer.
    pub answer: u32,
    /// Words of each new user message.
    pub new: u32,
    /// Requests per conversation.
    pub turns: u32,
}

/// Most requests per conversation.
pub const MAX_TURNS: u32 = 40;

impl TurnShape {
    /// A conversation whose requests average `words` content words: new user messages of
    /// min(1024, words / 8) words, answers an eighth of that, as many turns (up to
    /// [`MAX_TURNS`]) as keep the first message at least a quarter of the mean.
    pub fn for_mean(words: u32) -> Self {
        let new = (words / 8).clamp(1, 1024);
        let answer = (new / 8).max(1);
        let g = u64::from(new + answer);
        // (turns − 1) · g / 2 ≤ 3 · words / 4
        let span = (3 * u64::from(words) / 2 / g) as u32;
        let turns = (span + 1).clamp(1, MAX_TURNS);
        let first = words
            .saturating_sub(((u64::from(turns - 1) * g) / 2) as u32)
            .max(1);
        TurnShape {
            first,
            answer,
            new,
            turns,
        }
    }

    /// Content words of the request at `turn` (0-based).
    pub fn words_at(&self, turn: u32) -> u32 {
        self.first + turn * (self.answer + self.new)
    }
}

/// One conversation slot: the conversation it holds and its messages so far.
#[derive(Debug, Clone)]
struct Slot {
    conv: u64,
    /// Turn of the next request.
    turn: u32,
    /// The JSON objects of the messages up to the next request's, comma-separated (empty until
    /// the slot's first request builds them).
    messages: String,
}

/// Conversations interleaved round robin, staggered so that a steady share of requests (one in
/// `turns`) opens a new conversation.
#[derive(Debug, Clone)]
pub struct Conversations {
    shape: TurnShape,
    slots: Vec<Slot>,
    cursor: usize,
    next_conv: u64,
}

impl Conversations {
    /// `slots` conversations at once, ids from `first_conv` on; slot `s` starts at turn
    /// `s · turns / slots` (its first request then carries the earlier turns too, cold).
    pub fn new(shape: TurnShape, slots: usize, first_conv: u64) -> Self {
        let n = slots.max(1);
        let slots = (0..n)
            .map(|s| Slot {
                conv: first_conv + s as u64,
                turn: ((s as u64 * u64::from(shape.turns)) / n as u64) as u32,
                messages: String::new(),
            })
            .collect();
        Conversations {
            shape,
            slots,
            cursor: 0,
            next_conv: first_conv + n as u64,
        }
    }

    /// The next request's body (and its turn), advancing its conversation.
    pub fn next(&mut self, bodies: &Bodies) -> (Vec<u8>, u32) {
        let shape = self.shape;
        let i = self.cursor;
        self.cursor = (self.cursor + 1) % self.slots.len();
        let slot = &mut self.slots[i];
        if slot.messages.is_empty() {
            bodies.message(slot.conv, 0, false, shape.first, &mut slot.messages);
            for t in 1..=slot.turn {
                slot.messages.push(',');
                bodies.message(slot.conv, t, true, shape.answer, &mut slot.messages);
                slot.messages.push(',');
                bodies.message(slot.conv, t, false, shape.new, &mut slot.messages);
            }
        }
        let mut b = bodies.head(slot.messages.len() + 16);
        b.push_str(",\"messages\":[");
        b.push_str(&slot.messages);
        b.push_str("]}");
        let turn = slot.turn;
        slot.turn += 1;
        if slot.turn >= shape.turns {
            slot.conv = self.next_conv;
            self.next_conv += 1;
            slot.turn = 0;
            slot.messages.clear();
        } else {
            slot.messages.push(',');
            bodies.message(slot.conv, slot.turn, true, shape.answer, &mut slot.messages);
            slot.messages.push(',');
            bodies.message(slot.conv, slot.turn, false, shape.new, &mut slot.messages);
        }
        (b.into_bytes(), turn)
    }
}

/// SplitMix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::ApiKind;
    use kvgate_tokenizer::{ChatMessage, TokenMode};
    use std::sync::OnceLock;

    fn bodies() -> &'static (Bodies, TokenMode) {
        static B: OnceLock<(Bodies, TokenMode)> = OnceLock::new();
        B.get_or_init(|| {
            let mode = TokenMode::builtin().unwrap();
            let b = PromptBuilder::new(mode.clone(), ApiKind::Chat, 16, 3).unwrap();
            (Bodies::new(b, "m", 16, 3), mode)
        })
    }

    fn messages(body: &[u8]) -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_string(),
                    m["content"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn content_tokens(mode: &TokenMode, text: &str) -> usize {
        mode.tokenizer.count(text)
    }

    #[test]
    fn unique_prompts_have_exactly_their_words_as_tokens_and_distinct_heads() {
        let (b, mode) = bodies();
        let one = messages(&b.unique(1, 3000));
        let two = messages(&b.unique(2, 3000));
        assert_eq!(one.len(), 1);
        assert_eq!(content_tokens(mode, &one[0].1), 3000);
        assert_eq!(one[0].1.split(' ').filter(|w| !w.is_empty()).count(), 3000);
        // Different from the first block on (16 tokens; the first 256 bytes).
        let t1 = mode.tokenizer.encode(&one[0].1, false).unwrap();
        let t2 = mode.tokenizer.encode(&two[0].1, false).unwrap();
        assert_ne!(t1[..16], t2[..16]);
        assert_ne!(one[0].1.as_bytes()[..256], two[0].1.as_bytes()[..256]);
        // Longer than the corpus: wraps, still exact.
        let long = messages(&b.unique(3, (CORPUS_WORDS + 1000) as u32));
        assert_eq!(
            long[0].1.split(' ').filter(|w| !w.is_empty()).count(),
            CORPUS_WORDS + 1000
        );
        let m = [ChatMessage::new("user", &one[0].1)];
        let n = mode.chat_tokens(&m).unwrap().len();
        assert!((3000..3016).contains(&n), "{n}");
    }

    #[test]
    fn fill_bodies_parse_and_differ_from_the_first_block() {
        let (b, _) = bodies();
        for mode in [HashKind::Token, HashKind::Text] {
            let x: serde_json::Value = serde_json::from_slice(&b.fill(mode, 7)).unwrap();
            let y: serde_json::Value = serde_json::from_slice(&b.fill(mode, 8)).unwrap();
            match mode {
                HashKind::Token => {
                    let (x, y) = (
                        x["prompt"].as_array().unwrap(),
                        y["prompt"].as_array().unwrap(),
                    );
                    assert_eq!(x.len(), FILL_TOKENS as usize);
                    assert_ne!(x[..16], y[..16]);
                }
                HashKind::Text => {
                    let (x, y) = (x["prompt"].as_str().unwrap(), y["prompt"].as_str().unwrap());
                    assert_ne!(x.as_bytes()[..256], y.as_bytes()[..256]);
                }
            }
        }
    }

    #[test]
    fn turn_shapes_average_the_length() {
        for words in [1024u32, 8192, 32768, 102_400] {
            let s = TurnShape::for_mean(words);
            assert!(s.turns >= 2 && s.turns <= MAX_TURNS, "{s:?}");
            assert!(s.first >= words / 4, "{s:?}");
            let mean =
                (0..s.turns).map(|t| f64::from(s.words_at(t))).sum::<f64>() / f64::from(s.turns);
            assert!(
                (mean / f64::from(words) - 1.0).abs() < 0.02,
                "{words}: {mean} {s:?}"
            );
        }
        let s = TurnShape::for_mean(102_400);
        assert_eq!((s.new, s.answer, s.turns), (1024, 128, 40));
    }

    /// Each request of a conversation carries the previous one's messages and one answer and one
    /// new user message more; staggered slots open new conversations one request in `turns`.
    #[test]
    fn conversations_extend_their_previous_request() {
        let (b, mode) = bodies();
        let shape = TurnShape::for_mean(2048);
        let slots = 4;
        let mut c = Conversations::new(shape, slots, 100);
        let mut last: Vec<Option<Vec<(String, String)>>> = vec![None; slots];
        let mut firsts = 0usize;
        let total = slots * shape.turns as usize * 3;
        for i in 0..total {
            let (body, turn) = c.next(b);
            let m = messages(&body);
            assert_eq!(m.len(), 1 + 2 * turn as usize);
            assert_eq!(m[0].0, "user");
            let slot = i % slots;
            match (&last[slot], turn) {
                (_, 0) => firsts += 1,
                (Some(prev), t) if t > 0 && i >= slots => {
                    assert_eq!(&m[..prev.len()], &prev[..], "request {i}");
                    assert_eq!(m.len(), prev.len() + 2);
                    assert_eq!(m[m.len() - 2].0, "assistant");
                    assert_eq!(
                        content_tokens(mode, &m[m.len() - 2].1),
                        shape.answer as usize
                    );
                    assert_eq!(content_tokens(mode, &m[m.len() - 1].1), shape.new as usize);
                }
                _ => {}
            }
            let words: usize = m.iter().map(|(_, t)| content_tokens(mode, t)).sum();
            assert_eq!(words, shape.words_at(turn) as usize);
            last[slot] = Some(m);
        }
        // Staggered: one request in `turns` (after the first round) opens a conversation.
        let expected = total / shape.turns as usize;
        assert!(firsts.abs_diff(expected) <= slots, "{firsts} vs {expected}");
    }
}
