//! Token-mode tokenization off the serving threads (`proxy::offload`), at the wire: a full
//! tokenizing pool answers `503 tokenizer_busy` at once, and a huge prompt being tokenized does
//! not hold up a small request on the same serving thread (the test gateway has one).
//!
//! Both tests are decided by states and order, not by how long anything takes: the pool is
//! filled with its own permit, and the huge prompt's tokenization is observed under way
//! (`Offload::tokenizing`) before and after the small request is answered.

mod common;

use common::*;
use kvgate::config::{Config, TokenizeSection};

#[derive(Clone, Copy, Debug)]
enum Via {
    /// A body with a `content-length`: served by kvgate's own loop.
    H1,
    /// A chunked body: handed to hyper.
    Hyper,
}

/// One mock instance behind a token-mode pool (the built-in tokenizer), tokenizing as `tokenize`
/// says.
fn token_mode(mock: &Mock, tokenize: TokenizeSection) -> Config {
    let mut c = config_for(&[mock.url()]);
    c.pools[0].tokenizer = Some("builtin".into());
    c.routing.tokenize = tokenize;
    c.server.threads = 1;
    c
}

/// A chat request whose one message is `sentences` distinct sentences (~11 tokens each).
fn chat(sentences: usize) -> String {
    let mut text = String::with_capacity(sentences * 48);
    for i in 0..sentences {
        text.push_str(&format!("Sentence number {i} says something new. "));
    }
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string()
}

/// Posts `body` to the chat endpoint over `via`, in the background.
fn post(gw: &Gateway, via: Via, body: String) -> tokio::task::JoinHandle<reqwest::Response> {
    let req = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json");
    let req = match via {
        Via::H1 => req.body(body),
        Via::Hyper => {
            let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(body)];
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        }
    };
    tokio::spawn(async move { req.send().await.expect("answered") })
}

macro_rules! over_both_paths {
    ($($name:ident),* $(,)?) => {
        mod h1 {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::H1).await })*
        }
        mod hyper {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::Hyper).await })*
        }
    };
}

over_both_paths!(
    a_full_tokenizing_pool_answers_503_at_once,
    a_small_request_is_answered_while_a_huge_prompt_is_tokenized,
);

/// The smallest pool and queue (one thread, one waiter): with the thread taken, one prompt
/// waits and the next is turned away at once with an OpenAI-style 503; once the thread is free
/// the waiter is served.
async fn a_full_tokenizing_pool_answers_503_at_once(via: Via) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(token_mode(
        &mock,
        TokenizeSection {
            offload_min_bytes: 1024,
            threads: 1,
            max_queued: 1,
            // Far longer than the test: the waiter leaves by being served, not by timing out.
            max_wait_ms: 60_000,
        },
    ))
    .await;
    let offload = &gw.state.offload;
    let held = offload.occupy().expect("the tokenizing thread is free");
    assert_eq!(offload.tokenizing(), 1);
    let waiter = post(&gw, via, chat(100));
    assert!(
        eventually(10, || offload.waiting() == 1).await,
        "{via:?}: the first prompt never queued for the tokenizer"
    );
    let refused = post(&gw, via, chat(100)).await.unwrap();
    assert_eq!(refused.status(), 503, "{via:?}");
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1"),
        "{via:?}"
    );
    let v: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "tokenizer_busy", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert_eq!(mock.count(), 0, "{via:?}: nothing was forwarded");
    // The waiter still waits; freed, it is tokenized and forwarded.
    assert_eq!(offload.waiting(), 1);
    drop(held);
    assert_eq!(waiter.await.unwrap().status(), 200, "{via:?}");
    assert_eq!(mock.count(), 1);
    assert_eq!((offload.waiting(), offload.tokenizing()), (0, 0));
}

/// On the test gateway's one serving thread: a huge prompt (several MB, seconds of tokenizing in a
/// debug build) is sent first and observed being tokenized; a small request on another
/// connection is then answered, and the huge prompt is still being tokenized and not yet
/// forwarded when it is. Tokenized on the serving thread, the small request could not be read
/// before the huge prompt's tokenization ended.
async fn a_small_request_is_answered_while_a_huge_prompt_is_tokenized(via: Via) {
    let mock = Mock::start("a").await;
    let gw = Gateway::start(token_mode(
        &mock,
        TokenizeSection {
            threads: 1,
            ..TokenizeSection::default()
        },
    ))
    .await;
    let offload = &gw.state.offload;
    let huge = chat(100_000);
    assert!(huge.len() > 4_000_000, "{}", huge.len());
    let sent = std::time::Instant::now();
    let huge = post(&gw, via, huge);
    assert!(
        eventually(30, || offload.tokenizing() == 1).await,
        "{via:?}: the huge prompt was never tokenized off the serving thread"
    );
    let small = post(&gw, via, CHAT.to_string()).await.unwrap();
    assert_eq!(small.status(), 200, "{via:?}");
    // Order, not time: the huge prompt is still being tokenized, unanswered and unforwarded.
    assert_eq!(
        offload.tokenizing(),
        1,
        "{via:?}: the huge prompt was done before the small request was answered"
    );
    assert!(!huge.is_finished(), "{via:?}");
    assert_eq!(
        mock.count(),
        1,
        "{via:?}: only the small request was forwarded"
    );
    assert_eq!(huge.await.unwrap().status(), 200, "{via:?}");
    assert_eq!(mock.count(), 2);
    eprintln!(
        "{via:?}: the huge prompt was answered after {:?}",
        sent.elapsed()
    );
}
