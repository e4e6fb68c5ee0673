//! Token-mode hashing of large prompts off the serving threads.
//!
//! A serving thread runs every connection assigned to it; tokenizing a long prompt and rendering
//! its chat template there (tens of milliseconds for a 100K-token prompt) would stall all of them.
//! Bodies of at least `routing.tokenize.offload_min_bytes` to a token-mode pool are therefore
//! parsed and hashed on Tokio's blocking threads, at most `routing.tokenize.threads` at once.
//!
//! Invariants:
//! - At most `threads` prompts are tokenized at once and at most `max_queued` wait for a thread;
//!   a prompt beyond that, or one that waited `max_wait_ms`, gets `503 tokenizer_busy` with
//!   `Retry-After`, never an unbounded queue.
//! - The result is the same [`Ready`] the serving thread would have computed: the same parse,
//!   pool lookup and [`crate::routing::Routing::prepare`] ([`ready`]), only elsewhere.

use crate::app::AppState;
use crate::config::{HashMode, TokenizeSection};
use crate::error::GatewayError;
use crate::proxy::parse::{self, Endpoint};
use crate::routing::Prepared;

/// A request parsed and hashed for its pool: what routing needs of its body.
pub struct Ready {
    /// Its pool's index.
    pub pool: usize,
    /// Its prompt, hashed for that pool.
    pub prep: Prepared,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// Its body's `priority` field, if any.
    pub priority: Option<i64>,
    /// The cache salt to send the engine (isolated tenants only).
    pub cache_salt: Option<String>,
}

/// Parses `body` as a request to `endpoint`, finds its pool and hashes its prompt there; for an
/// isolated tenant (`isolated`: its name), under the tenant's cache salt
/// ([`super::isolation`]).
pub fn ready(
    state: &AppState,
    endpoint: Endpoint,
    body: &[u8],
    isolated: Option<&str>,
) -> Result<Ready, GatewayError> {
    let mut input = parse::parse(endpoint, body)?;
    let cache_salt =
        isolated.map(|t| super::isolation::tenant_salt(t, input.cache_salt.as_deref()));
    if let Some(salt) = &cache_salt {
        input.cache_salt = Some(std::borrow::Cow::Owned(salt.clone()));
    }
    let pool = state.fleet.pool_for(input.model.as_deref())?;
    let prep = state.routing.prepare(pool, &input)?;
    Ok(Ready {
        pool: pool.index,
        prep,
        stream: input.stream,
        priority: input.priority,
        cache_salt,
    })
}
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The bounded tokenizing pool.
pub struct Offload {
    /// One permit per tokenizing thread.
    running: Arc<Semaphore>,
    /// Tokenizing threads (the permits `running` began with).
    threads: usize,
    /// Prompts waiting for a permit.
    waiting: AtomicUsize,
    max_queued: usize,
    max_wait: Duration,
    min_bytes: usize,
}

impl Offload {
    /// A pool sized by `cfg`.
    pub fn new(cfg: &TokenizeSection) -> Self {
        let threads = cfg.threads().max(1);
        Self {
            running: Arc::new(Semaphore::new(threads)),
            threads,
            waiting: AtomicUsize::new(0),
            max_queued: cfg.max_queued,
            max_wait: Duration::from_millis(cfg.max_wait_ms),
            min_bytes: cfg.offload_min_bytes,
        }
    }

    /// Whether a `body_len`-byte body is prepared here, when some pool hashes in `mode`. (Its
    /// pool is known only once it is parsed, which for a large body is itself worth moving.)
    pub fn applies(&self, mode: HashMode, body_len: usize) -> bool {
        mode == HashMode::Token && body_len >= self.min_bytes
    }

    /// Prompts waiting for a tokenizing thread now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Prompts being tokenized now (threads in use).
    pub fn tokenizing(&self) -> usize {
        self.threads
            .saturating_sub(self.running.available_permits())
    }

    /// Takes every tokenizing thread, as prompts being tokenized would, until the returned
    /// permit drops; `None` when one is in use. For tests of a full pool: a real prompt frees
    /// its thread at a moment no test controls.
    #[doc(hidden)]
    pub fn occupy(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let n = u32::try_from(self.threads).ok()?;
        self.running.clone().try_acquire_many_owned(n).ok()
    }

    /// [`ready`] on a blocking thread.
    pub async fn ready(
        &self,
        state: &AppState,
        endpoint: Endpoint,
        body: Bytes,
        isolated: Option<std::sync::Arc<str>>,
    ) -> Result<Ready, GatewayError> {
        let permit = match self.running.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let queued = self.waiting.fetch_add(1, Ordering::Relaxed);
                let _leave = Leave(&self.waiting);
                if queued >= self.max_queued {
                    return Err(GatewayError::TokenizerBusy { queued });
                }
                match tokio::time::timeout(self.max_wait, self.running.clone().acquire_owned())
                    .await
                {
                    Ok(Ok(p)) => p,
                    // Timed out, or (never: the semaphore is not closed) closed.
                    _ => {
                        return Err(GatewayError::TokenizerBusy {
                            queued: self.waiting(),
                        })
                    }
                }
            }
        };
        let state = state.clone();
        let job = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            ready(&state, endpoint, &body, isolated.as_deref())
        });
        match job.await {
            Ok(r) => r,
            Err(e) => Err(GatewayError::Internal(format!("tokenizing thread: {e}"))),
        }
    }
}

/// Leaves the waiting count when dropped (the wait ended, however it ended).
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, InstanceConfig, PoolConfig};

    fn state(tokenize: TokenizeSection) -> AppState {
        let mut c = Config::default();
        let mut pool =
            PoolConfig::serving("m", vec![InstanceConfig::at("a", "http://127.0.0.1:9")]);
        pool.tokenizer = Some("builtin".into());
        c.pools = vec![pool];
        c.routing.tokenize = tokenize;
        AppState::new(c).unwrap()
    }

    fn body() -> Bytes {
        let text = "a sentence that tokenizes into a good number of tokens. ".repeat(200);
        Bytes::from(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]})
                .to_string(),
        )
    }

    #[tokio::test]
    async fn off_the_thread_the_prompt_is_hashed_as_on_it() {
        let s = state(TokenizeSection {
            offload_min_bytes: 0,
            ..TokenizeSection::default()
        });
        assert!(s.offload.applies(s.routing.strictest_mode(), 1));
        let here = ready(&s, Endpoint::Chat, &body(), None).unwrap();
        let there = s
            .offload
            .ready(&s, Endpoint::Chat, body(), None)
            .await
            .unwrap();
        assert!(!here.prep.hashes.is_empty());
        assert_eq!(here.prep.hashes, there.prep.hashes);
        assert_eq!(here.prep.prompt_tokens, there.prep.prompt_tokens);
        assert_eq!((here.pool, here.stream), (there.pool, there.stream));
        // Bad input is the same error either way.
        let bad = s
            .offload
            .ready(&s, Endpoint::Chat, Bytes::from_static(b"{"), None);
        assert_eq!(bad.await.err().map(|e| e.code()), Some("malformed_json"));
    }

    #[tokio::test]
    async fn busy_tokenizers_turn_prompts_away_instead_of_queueing_without_bound() {
        let s = state(TokenizeSection {
            offload_min_bytes: 0,
            threads: 1,
            max_queued: 1,
            max_wait_ms: 100,
        });
        // The one tokenizing thread is taken.
        let held = s.offload.running.clone().try_acquire_owned().unwrap();
        // One prompt may wait, and gives up after the wait bound.
        let waiter = s.offload.ready(&s, Endpoint::Chat, body(), None);
        tokio::pin!(waiter);
        assert!(futures::poll!(&mut waiter).is_pending());
        assert_eq!(s.offload.waiting(), 1);
        // A second finds the queue full at once.
        let full = s.offload.ready(&s, Endpoint::Chat, body(), None).await;
        assert!(matches!(
            full,
            Err(GatewayError::TokenizerBusy { queued: 1 })
        ));
        let timed_out = waiter.await;
        assert!(matches!(timed_out, Err(GatewayError::TokenizerBusy { .. })));
        assert_eq!(s.offload.waiting(), 0);
        // Once the thread is free, prompts are served again.
        drop(held);
        assert!(s
            .offload
            .ready(&s, Endpoint::Chat, body(), None)
            .await
            .is_ok());
    }
}
