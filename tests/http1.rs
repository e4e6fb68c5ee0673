//! The gateway's own HTTP/1.1 loop, over raw TCP: pipelining, heads split across reads, framing
//! of relayed answers, `Connection: close`, and hand-off to hyper for every request it does not
//! serve itself (on a fresh connection and in the middle of one).

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn post(path: &str, body: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Appends what `conn` sends next to `buf`.
async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>, deadline: tokio::time::Instant) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout_at(deadline, conn.read(&mut chunk))
        .await
        .expect("answer within 10 s")
        .unwrap();
    assert!(n > 0, "connection closed mid-answer");
    buf.extend_from_slice(&chunk[..n]);
}

/// Reads one answer (Content-Length or chunked) from `conn`, keeping extra bytes in `buf`.
/// A gateway in front of `a`, and a client connection to it.
async fn connected(a: &Mock) -> (Gateway, TcpStream) {
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let conn = TcpStream::connect(gw.addr).await.unwrap();
    (gw, conn)
}

async fn read_answer(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Answer {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (status, headers, head_len) = loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut fields);
        if let httparse::Status::Complete(n) = resp.parse(buf).unwrap() {
            let headers = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect::<Vec<_>>();
            break (resp.code.unwrap(), headers, n);
        }
        fill(conn, buf, deadline).await;
    };
    buf.drain(..head_len);
    if (100..200).contains(&status) {
        // Interim (`100 Continue`): the answer follows.
        return Box::pin(read_answer(conn, buf)).await;
    }
    let mut answer = Answer {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(len) = answer.header("content-length") {
        let len: usize = len.parse().unwrap();
        assert!(answer.header("transfer-encoding").is_none());
        while buf.len() < len {
            fill(conn, buf, deadline).await;
        }
        answer.body = buf.drain(..len).collect();
    } else if answer.header("transfer-encoding").is_none() {
        // Delimited by the end of the connection.
        tokio::time::timeout_at(deadline, conn.read_to_end(buf))
            .await
            .expect("connection closed within 10 s")
            .unwrap();
        answer.body = std::mem::take(buf);
    } else {
        assert_eq!(answer.header("transfer-encoding"), Some("chunked"));
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(conn, buf, deadline).await;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                fill(conn, buf, deadline).await;
            }
            answer
                .body
                .extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            assert_eq!(&buf[line_end + 2 + size..line_end + 4 + size], b"\r\n");
            buf.drain(..line_end + 4 + size);
            if size == 0 {
                break;
            }
        }
    }
    answer
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    let mut wire = String::new();
    for i in 0..3 {
        wire.push_str(&post(
            "/v1/chat/completions",
            CHAT,
            &format!("x-request-id: r{i}\r\n"),
        ));
    }
    conn.write_all(wire.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    for i in 0..3 {
        let ans = read_answer(&mut conn, &mut buf).await;
        assert_eq!(ans.status, 200);
        assert_eq!(ans.header("x-request-id"), Some(format!("r{i}").as_str()));
        assert!(ans.header("date").is_some());
        let text = String::from_utf8(ans.body).unwrap();
        assert!(text.contains("\"served_by\":\"a\""), "{text}");
    }
    assert_eq!(a.received().len(), 3);
    assert!(a
        .received()
        .iter()
        .all(|r| r.body.as_ref() == CHAT.as_bytes()));
}

#[tokio::test]
async fn a_request_trickling_in_byte_by_byte_is_served() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    conn.set_nodelay(true).unwrap();
    for b in post("/v1/completions", r#"{"model":"m","prompt":"hello"}"#, "").bytes() {
        conn.write_all(&[b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ans = read_answer(&mut conn, &mut Vec::new()).await;
    assert_eq!(ans.status, 200);
    assert_eq!(a.received()[0].path, "/v1/completions");
    assert_eq!(
        a.received()[0].body.as_ref(),
        br#"{"model":"m","prompt":"hello"}"#
    );
}

#[tokio::test]
async fn streamed_answers_are_chunked_and_complete() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Stream {
        chunks: 4,
        delay: Duration::from_millis(20),
    });
    let (_gw, mut conn) = connected(&a).await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut buf = Vec::new();
    // Twice on one connection: the connection stays usable after a chunked answer.
    for _ in 0..2 {
        conn.write_all(post("/v1/chat/completions", body, "").as_bytes())
            .await
            .unwrap();
        let ans = read_answer(&mut conn, &mut buf).await;
        assert_eq!(ans.status, 200);
        assert!(ans
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let text = String::from_utf8(ans.body).unwrap();
        assert_eq!(text.matches("data: ").count(), 5, "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

#[tokio::test]
async fn other_requests_on_the_same_connection_go_to_hyper() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    // A proxied POST, then a GET of another route, then a chunked POST, in one write.
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    );
    let wire = format!(
        "{}GET /health HTTP/1.1\r\nhost: gw\r\n\r\n{chunked}",
        post("/v1/chat/completions", CHAT, "")
    );
    conn.write_all(wire.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let first = read_answer(&mut conn, &mut buf).await;
    assert_eq!(first.status, 200);
    let health = read_answer(&mut conn, &mut buf).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body, b"ok");
    let third = read_answer(&mut conn, &mut buf).await;
    assert_eq!(third.status, 200);
    let got = a.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body.as_ref(), CHAT.as_bytes());
}

#[tokio::test]
async fn requests_not_served_directly_get_hypers_answers() {
    let a = Mock::start("a").await;
    let mut cfg = config_for(&[a.url()]);
    cfg.server.body_limit_bytes = 1024;
    let gw = Gateway::start(cfg).await;
    let cases: [(String, u16); 5] = [
        // Over the body limit: refused before the body is read.
        (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n".to_string(),
            413,
        ),
        // Another method on a proxied path.
        ("GET /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n\r\n".to_string(), 405),
        // Not HTTP.
        ("BREW /v1/chat/completions HTCPCP/1.0\r\n\r\n".to_string(), 400),
        // Expect: 100-continue.
        (
            post(
                "/v1/embeddings",
                r#"{"model":"m","input":"x"}"#,
                "expect: 100-continue\r\n",
            ),
            200,
        ),
        // HTTP/1.0.
        (
            post("/v1/embeddings", r#"{"model":"m","input":"x"}"#, "")
                .replacen("HTTP/1.1", "HTTP/1.0", 1),
            200,
        ),
    ];
    for (wire, status) in cases {
        let mut conn = TcpStream::connect(gw.addr).await.unwrap();
        conn.write_all(wire.as_bytes()).await.unwrap();
        let ans = read_answer(&mut conn, &mut Vec::new()).await;
        assert_eq!(ans.status, status, "{wire} {ans:?}");
    }
}

#[tokio::test]
async fn connection_close_is_honoured() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    conn.write_all(post("/v1/chat/completions", CHAT, "connection: close\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let ans = read_answer(&mut conn, &mut buf).await;
    assert_eq!(ans.status, 200);
    assert_eq!(ans.header("connection"), Some("close"));
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("closed after the answer")
        .unwrap();
    assert_eq!(n, 0);
    assert!(buf.is_empty());
}

#[tokio::test]
async fn errors_are_framed_and_keep_the_connection() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    let mut buf = Vec::new();
    conn.write_all(post("/v1/chat/completions", "{not json", "").as_bytes())
        .await
        .unwrap();
    let bad = read_answer(&mut conn, &mut buf).await;
    assert_eq!(bad.status, 400);
    let v: serde_json::Value = serde_json::from_slice(&bad.body).unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(bad.header("x-request-id").is_some());
    conn.write_all(post("/v1/chat/completions", CHAT, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut conn, &mut buf).await.status, 200);
}

#[tokio::test]
async fn only_end_to_end_fields_reach_the_instance() {
    let a = Mock::start("a").await;
    let (_gw, mut conn) = connected(&a).await;
    let extra = "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nTE: trailers\r\nKeep-Alive: timeout=5\r\n\
                 Proxy-Authorization: p\r\nX-Keep: k\r\nX-Request-Id: mine\r\nX-Request-Id: second\r\n";
    conn.write_all(post("/v1/chat/completions?api-version=2", CHAT, extra).as_bytes())
        .await
        .unwrap();
    let ans = read_answer(&mut conn, &mut Vec::new()).await;
    assert_eq!(ans.status, 200);
    assert_eq!(ans.header("x-request-id"), Some("mine"));
    let got = a.received();
    let h = &got[0].headers;
    assert_eq!(got[0].path, "/v1/chat/completions?api-version=2");
    assert_eq!(h["x-keep"], "k");
    assert_eq!(
        h.get_all("x-request-id").iter().collect::<Vec<_>>(),
        ["mine"]
    );
    assert_eq!(h["host"], a.addr.to_string().as_str());
    assert_eq!(h["content-length"], CHAT.len().to_string().as_str());
    for gone in ["x-hop", "te", "keep-alive", "proxy-authorization"] {
        assert!(!h.contains_key(gone), "{gone} forwarded");
    }
}

#[tokio::test]
async fn a_large_body_arriving_in_pieces_is_forwarded_whole() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let prompt = "lorem ipsum ".repeat(25_000);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#);
    let wire = post("/v1/completions", &body, "");
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    for piece in wire.as_bytes().chunks(4096) {
        conn.write_all(piece).await.unwrap();
        tokio::task::yield_now().await;
    }
    let ans = read_answer(&mut conn, &mut Vec::new()).await;
    assert_eq!(ans.status, 200);
    assert_eq!(a.received()[0].body.as_ref(), body.as_bytes());
}

#[tokio::test]
async fn shutdown_closes_idle_connections_at_once_and_finishes_answers_under_way() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Slow(Duration::from_millis(300)));
    let mut cfg = config_for(&[a.url()]);
    cfg.server.shutdown_grace_ms = 30_000;
    let mut gw = Gateway::start(cfg).await;
    // One connection idle after an answer, one handed off to hyper and idle, one mid-request.
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    idle.write_all(post("/v1/chat/completions", CHAT, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut idle, &mut Vec::new()).await.status, 200);
    let mut handed = TcpStream::connect(gw.addr).await.unwrap();
    handed
        .write_all(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_answer(&mut handed, &mut Vec::new()).await.status, 200);
    let mut busy = TcpStream::connect(gw.addr).await.unwrap();
    busy.write_all(post("/v1/chat/completions", CHAT, "").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.shutdown();
    let ans = read_answer(&mut busy, &mut Vec::new()).await;
    assert_eq!(ans.status, 200);
    assert_eq!(ans.header("connection"), Some("close"));
    for conn in [&mut idle, &mut handed, &mut busy] {
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
            .await
            .expect("closed by the drain")
            .unwrap();
        assert_eq!(n, 0);
    }
    tokio::time::timeout(Duration::from_secs(5), gw.join.take().unwrap())
        .await
        .expect("server stops well within the grace period")
        .unwrap()
        .unwrap();
}
