//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use kvgate_sim::fleet::{Fleet, FleetConfig};
use serde_json::Value;
use zeromq::{Socket, SocketRecv, SubSocket};

/// One decoded published message.
#[derive(Debug, Clone)]
pub struct Frame {
    pub seq: u64,
    pub payload: Bytes,
    pub events: Vec<Value>,
}

pub async fn start(cfg: FleetConfig) -> Fleet {
    tokio::time::timeout(Duration::from_secs(10), Fleet::start(cfg))
        .await
        .unwrap()
        .unwrap()
}

pub async fn subscribe(endpoint: &str) -> SubSocket {
    let mut s = SubSocket::new();
    s.connect(endpoint).await.unwrap();
    s.subscribe("").await.unwrap();
    // Let the subscription reach the publisher (PUB drops messages without subscribers).
    tokio::time::sleep(Duration::from_millis(800)).await;
    s
}

/// msgpack → JSON value, hashes as u64.
pub fn to_json(v: &rmpv::Value) -> Value {
    match v {
        rmpv::Value::Nil => Value::Null,
        rmpv::Value::Boolean(b) => Value::Bool(*b),
        rmpv::Value::Integer(i) => {
            if let Some(u) = i.as_u64() {
                Value::from(u)
            } else {
                Value::from(i.as_i64().unwrap())
            }
        }
        rmpv::Value::F32(f) => Value::from(*f as f64),
        rmpv::Value::F64(f) => Value::from(*f),
        rmpv::Value::String(s) => Value::String(s.as_str().unwrap_or_default().to_string()),
        rmpv::Value::Binary(b) => Value::from(b.clone()),
        rmpv::Value::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        rmpv::Value::Map(m) => {
            let mut o = serde_json::Map::new();
            for (k, v) in m {
                o.insert(k.as_str().unwrap_or_default().to_string(), to_json(v));
            }
            Value::Object(o)
        }
        rmpv::Value::Ext(_, _) => Value::Null,
    }
}

pub fn decode_payload(payload: &[u8]) -> Value {
    let mut r = payload;
    let v = rmpv::decode::read_value(&mut r).unwrap();
    to_json(&v)
}

/// Receives messages until `quiet` passes without one (bounded by `max`).
pub async fn collect(sub: &mut SubSocket, quiet: Duration, max: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    while out.len() < max {
        match tokio::time::timeout(quiet, sub.recv()).await {
            Ok(Ok(msg)) => {
                let frames = msg.into_vec();
                assert_eq!(frames.len(), 3, "topic, seq, payload");
                let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
                let batch = decode_payload(&frames[2]);
                let events = batch[1].as_array().unwrap().clone();
                out.push(Frame {
                    seq,
                    payload: frames[2].clone(),
                    events,
                });
            }
            _ => break,
        }
    }
    out
}

pub async fn post(client: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// An engine's Prometheus metrics page (`{base}/metrics`).
pub async fn metrics(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Streams a request; returns the parsed `data:` chunks (without `[DONE]`) and whether `[DONE]` came.
pub async fn stream(client: &reqwest::Client, url: &str, body: Value) -> (Vec<Value>, bool) {
    let r = client.post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    let mut chunks = Vec::new();
    let mut done = false;
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data: ") {
            if d == "[DONE]" {
                done = true;
            } else {
                chunks.push(serde_json::from_str(d).unwrap());
            }
        }
    }
    (chunks, done)
}
