//! The endpoint picker's cost per request, in process: a tonic ext_proc client plays the
//! gateway's side of whole streams (request headers, the body in 64 KiB chunks as Envoy streams
//! it, then response headers and a one-chunk answer) against `kvgate::picker::serve` over a
//! gateway state of 8 instances (text mode, the kvgate policy), for prompts of ~8K and ~128K
//! tokens. Reported per request: decision latency (last body chunk sent → destination received),
//! whole-stream time, the picker runtime's CPU (its threads' user + system time, read from
//! /proc, client excluded), and gRPC messages each way.
//!
//! Run it optimized:
//!
//!   cargo bench --bench picker            # KVGATE_PICKER_BENCH_N=200 (default) requests per size
//!
//! `cargo bench` builds with Cargo's `bench` profile, which inherits the workspace's
//! `[profile.release]` (opt-level 3, thin LTO, 4 codegen units): release code. A quick,
//! unoptimized run is `cargo bench --profile dev --bench picker` (kvgate at opt-level 0, its
//! dependencies at 1): an upper bound, not a release figure. The output's first line says which
//! of the two built it (by `debug_assertions`, on in the dev profile only), and docs/picker.md
//! labels each table of figures with the command that produced it.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    external_processor_client::ExternalProcessorClient, processing_request::Request as Req,
    processing_response::Response as Resp, HttpBody, HttpHeaders, ProcessingRequest,
};
use kvgate::config::{Config, InstanceConfig, PoolConfig};
use std::time::{Duration, Instant};
use tokio_stream::wrappers::ReceiverStream;

/// Chunk size of the request body, as Envoy streams it.
const CHUNK: usize = 64 * 1024;
/// Threads of the picker's runtime, named so that their CPU time can be read.
const PICKER_THREADS: usize = 1;
const THREAD_NAME: &str = "kvgate-picker-bench";

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn msg(r: Req) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(r),
        ..Default::default()
    }
}

/// A chat body of about `tokens` tokens (text mode estimates 4 bytes a token), distinct per
/// `seed` after a shared half, as a multi-turn workload repeats a prefix.
fn body(tokens: usize, seed: usize) -> Vec<u8> {
    let bytes = tokens * 4;
    let shared: String = "The quick brown fox jumps over the lazy dog. "
        .repeat(bytes / 2 / 45 + 1)
        .chars()
        .take(bytes / 2)
        .collect();
    let own: String = format!("request {seed} ")
        .repeat(bytes / 2 / 12 + 1)
        .chars()
        .take(bytes / 2)
        .collect();
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{shared}"}},{{"role":"user","content":"{own}"}}],"max_tokens":16}}"#
    )
    .into_bytes()
}

/// CPU seconds (user + system) of this process's threads named `name`.
fn threads_cpu(name: &str) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    for t in dir.flatten() {
        let p = t.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(&name[..name.len().min(15)]) {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
        if let Some(rest) = stat.rsplit(')').next() {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 12 {
                total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            }
        }
    }
    total as f64 / tick
}

struct One {
    decision: Duration,
    whole: Duration,
    sent: usize,
    received: usize,
}

async fn one(client: &mut ExternalProcessorClient<tonic::transport::Channel>, body: &[u8]) -> One {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let started = Instant::now();
    let mut resp = client
        .process(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let mut sent = 0;
    let mut send = |m| {
        sent += 1;
        tx.try_send(m).expect("queue")
    };
    send(msg(Req::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                hv(":method", "POST"),
                hv(":path", "/v1/chat/completions"),
                hv("content-type", "application/json"),
            ],
        }),
        end_of_stream: false,
        ..Default::default()
    })));
    let chunks: Vec<&[u8]> = body.chunks(CHUNK).collect();
    for (i, c) in chunks.iter().enumerate() {
        send(msg(Req::RequestBody(HttpBody {
            body: c.to_vec(),
            end_of_stream: i + 1 == chunks.len(),
            ..Default::default()
        })));
    }
    let last_sent = Instant::now();
    let mut received = 0;
    let mut decision = Duration::ZERO;
    // The destination, then the body passed back.
    loop {
        let m = resp.message().await.expect("ok").expect("message");
        received += 1;
        match &m.response {
            Some(Resp::RequestHeaders(_)) => decision = last_sent.elapsed(),
            Some(Resp::RequestBody(b)) => {
                let eos = b
                    .response
                    .as_ref()
                    .and_then(|c| c.body_mutation.as_ref())
                    .and_then(|m| m.mutation.as_ref())
                    .map(|m| match m {
                        envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::StreamedResponse(s) => s.end_of_stream,
                        _ => true,
                    })
                    .unwrap_or(true);
                if eos {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    send(msg(Req::ResponseHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![hv(":status", "200"), hv("content-type", "application/json")],
        }),
        ..Default::default()
    })));
    resp.message().await.expect("ok").expect("headers answer");
    received += 1;
    send(msg(Req::ResponseBody(HttpBody {
        body: br#"{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}"#
            .to_vec(),
        end_of_stream: true,
        ..Default::default()
    })));
    resp.message().await.expect("ok").expect("body answer");
    received += 1;
    drop(tx);
    while let Ok(Some(_)) = resp.message().await {}
    One {
        decision,
        whole: started.elapsed(),
        sent,
        received,
    }
}

/// Which profile built this bench, as far as the code can tell: the dev profile is the only
/// one of this workspace with debug assertions on.
fn built_with() -> &'static str {
    if cfg!(debug_assertions) {
        "built with the dev profile (debug assertions on, unoptimized): figures are an upper bound, not release figures"
    } else {
        "built optimized (debug assertions off: `cargo bench`'s bench profile, which inherits [profile.release])"
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let n: usize = std::env::var("KVGATE_PICKER_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut cfg = Config::default();
    cfg.server.body_limit_bytes = 4 * 1024 * 1024;
    cfg.server.log_filter = "warn".into();
    cfg.picker.enabled = true;
    // Instances that are never contacted: the picker only names them (no health checks run).
    cfg.pools = vec![PoolConfig::serving(
        "m",
        (0..8)
            .map(|i| InstanceConfig::at(format!("i{i}"), format!("http://10.0.0.{}:8000", i + 1)))
            .collect(),
    )];
    let state = kvgate::app::AppState::new(cfg).expect("state");
    let picker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(PICKER_THREADS)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = picker_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    picker_rt.spawn(kvgate::picker::serve(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    println!("{}\n", built_with());
    println!(
        "| prompt | body | requests | decision p50 | decision p99 | stream p50 | picker CPU / request | gRPC messages in / out |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    client_rt.block_on(async {
        // As Envoy's gRPC client does: no Nagle delay between a stream's frames.
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        let mut client =
            ExternalProcessorClient::new(channel).max_decoding_message_size(8 * 1024 * 1024);
        for tokens in [8 * 1024, 128 * 1024] {
            let bodies: Vec<Vec<u8>> = (0..n.min(64)).map(|s| body(tokens, s)).collect();
            // Warm-up: connections, index, allocator.
            for b in bodies.iter().take(8) {
                one(&mut client, b).await;
            }
            let cpu0 = threads_cpu(THREAD_NAME);
            let mut dec = Vec::with_capacity(n);
            let mut whole = Vec::with_capacity(n);
            let (mut sent, mut received) = (0, 0);
            for i in 0..n {
                let r = one(&mut client, &bodies[i % bodies.len()]).await;
                dec.push(r.decision.as_secs_f64() * 1e3);
                whole.push(r.whole.as_secs_f64() * 1e3);
                sent = r.sent;
                received = r.received;
            }
            let cpu = (threads_cpu(THREAD_NAME) - cpu0) / n as f64;
            println!(
                "| {}K tokens | {} KiB | {n} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {sent} / {received} |",
                tokens / 1024,
                bodies[0].len() / 1024,
                pct(&mut dec, 0.5),
                pct(&mut dec, 0.99),
                pct(&mut whole, 0.5),
                cpu * 1e3,
            );
        }
    });
    let _ = stop_tx.send(());
    drop(state);
}
