//! The endpoint picker (ext_proc) against the real gateway state and in-process mock engines: a
//! tonic client of the generated ExternalProcessor service plays the gateway's side message by
//! message (request headers, body chunks, trailers, response headers, response body chunks),
//! the way Envoy does in FULL_DUPLEX_STREAMED mode.

mod common;

use common::{client, config_for, eventually, Gateway, Mock, Mode};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, external_processor_client::ExternalProcessorClient,
    processing_request::Request as Req, processing_response::Response as Resp, HttpBody,
    HttpHeaders, HttpTrailers, ImmediateResponse, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use kvgate::config::{Config, FailureMode};
use kvgate::picker::protocol;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// A running picker over a gateway's state.
struct PickerServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl PickerServer {
    async fn start(state: &kvgate::app::AppState) -> PickerServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(kvgate::picker::serve(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        PickerServer {
            addr,
            stop: Some(tx),
            join,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.join).await;
    }
}

/// The gateway's side of one ext_proc stream.
struct Stream {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(addr: SocketAddr) -> Stream {
        let mut c = ExternalProcessorClient::connect(format!("http://{addr}"))
            .await
            .expect("connect to the picker");
        let (tx, rx) = mpsc::channel(64);
        let resp = c
            .process(ReceiverStream::new(rx))
            .await
            .expect("stream opened");
        Stream {
            tx: Some(tx),
            rx: resp.into_inner(),
        }
    }

    async fn send(&self, m: ProcessingRequest) {
        self.tx
            .as_ref()
            .expect("open")
            .send(m)
            .await
            .expect("picker reads");
    }

    /// The next message, within 10 s.
    async fn recv(&mut self) -> Result<Option<ProcessingResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("picker answers in time")
    }

    async fn expect(&mut self) -> ProcessingResponse {
        self.recv().await.expect("no error").expect("a message")
    }

    /// Sends a whole request: headers, the body in `chunks` pieces, the end.
    async fn request(&self, path: &str, body: &[u8], chunks: usize, md: Option<Metadata>) {
        self.send(req_headers(path, &[], false, md)).await;
        let size = body.len().div_ceil(chunks.max(1)).max(1);
        let parts: Vec<&[u8]> = body.chunks(size).collect();
        for (i, p) in parts.iter().enumerate() {
            self.send(req_body(p, i + 1 == parts.len())).await;
        }
    }

    /// Reads the picker's answer to a request: the destination, and the body passed back.
    async fn decision(&mut self) -> Decision {
        let m = self.expect().await;
        let Some(Resp::RequestHeaders(h)) = &m.response else {
            panic!("expected a request headers answer, got {m:?}");
        };
        let common = h.response.as_ref().expect("common response");
        assert!(common.clear_route_cache, "route cache cleared");
        let set = &common
            .header_mutation
            .as_ref()
            .expect("mutation")
            .set_headers;
        let header = set
            .iter()
            .filter_map(|o| o.header.as_ref())
            .find(|h| h.key == "x-gateway-destination-endpoint")
            .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
            .expect("destination header");
        let md = m.dynamic_metadata.as_ref().expect("dynamic metadata");
        let ns = match &md.fields["envoy.lb"].kind {
            Some(Kind::StructValue(s)) => s,
            other => panic!("envoy.lb is not a struct: {other:?}"),
        };
        let metadata = match &ns.fields["x-gateway-destination-endpoint"].kind {
            Some(Kind::StringValue(s)) => s.clone(),
            other => panic!("not a string: {other:?}"),
        };
        assert_eq!(
            header, metadata,
            "header and metadata name the same endpoints"
        );
        let mut body = Vec::new();
        loop {
            let m = self.expect().await;
            let Some(Resp::RequestBody(b)) = &m.response else {
                panic!("expected the body passed back, got {m:?}");
            };
            let Some(Mutation::StreamedResponse(s)) = b
                .response
                .as_ref()
                .and_then(|c| c.body_mutation.as_ref())
                .and_then(|m| m.mutation.as_ref())
            else {
                panic!("not a streamed body response");
            };
            body.extend_from_slice(&s.body);
            if s.end_of_stream {
                break;
            }
        }
        let endpoints: Vec<String> = header.split(',').map(str::to_string).collect();
        let request_id = set
            .iter()
            .filter_map(|o| o.header.as_ref())
            .find(|h| h.key == "x-request-id")
            .map(|h| String::from_utf8(h.raw_value.clone()).unwrap());
        Decision {
            endpoints,
            body,
            request_id,
        }
    }

    /// Plays the response: headers, then `chunks`, the last ending the stream; each must be
    /// passed back unchanged.
    async fn respond(&mut self, content_type: &str, served: Option<&str>, chunks: &[&[u8]]) {
        self.send(resp_headers(200, content_type, served)).await;
        let m = self.expect().await;
        assert!(
            matches!(m.response, Some(Resp::ResponseHeaders(_))),
            "{m:?}"
        );
        for (i, c) in chunks.iter().enumerate() {
            self.send(resp_body(c, i + 1 == chunks.len())).await;
            let m = self.expect().await;
            let Some(Resp::ResponseBody(b)) = &m.response else {
                panic!("expected a response body answer, got {m:?}");
            };
            let Some(Mutation::StreamedResponse(s)) = b
                .response
                .as_ref()
                .and_then(|c| c.body_mutation.as_ref())
                .and_then(|m| m.mutation.as_ref())
            else {
                panic!("not streamed");
            };
            assert_eq!(&s.body[..], *c, "response chunk passed back unchanged");
        }
    }

    /// Ends the stream from the gateway's side (what Envoy does when the client goes away).
    fn cancel(&mut self) {
        self.tx.take();
    }
}

struct Decision {
    /// Chosen first, then the fallbacks.
    endpoints: Vec<String>,
    /// The body passed back.
    body: Vec<u8>,
    /// The request id set on the request toward the engine.
    request_id: Option<String>,
}

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.to_string(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn req_headers(
    path: &str,
    extra: &[(&str, &str)],
    eos: bool,
    md: Option<Metadata>,
) -> ProcessingRequest {
    let mut headers = vec![
        hv(":method", "POST"),
        hv(":path", path),
        hv(":authority", "gateway.example"),
        hv("content-type", "application/json"),
    ];
    headers.extend(extra.iter().map(|(k, v)| hv(k, v)));
    ProcessingRequest {
        metadata_context: md,
        request: Some(Req::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn req_body(b: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::RequestBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn served_md(served: &str) -> Metadata {
    let mut md = Metadata::default();
    md.filter_metadata.insert(
        "envoy.lb".to_string(),
        Struct {
            fields: [(
                "x-gateway-destination-endpoint-served".to_string(),
                Value {
                    kind: Some(Kind::StringValue(served.to_string())),
                },
            )]
            .into(),
        },
    );
    md
}

fn resp_headers(status: u16, content_type: &str, served: Option<&str>) -> ProcessingRequest {
    ProcessingRequest {
        metadata_context: served.map(served_md),
        request: Some(Req::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":status", &status.to_string()),
                    hv("content-type", content_type),
                ],
            }),
            end_of_stream: false,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn resp_body(b: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::ResponseBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A chat request whose prompt is `words` distinct words of `seed` (several blocks long).
fn chat(seed: &str, words: usize, stream: bool) -> String {
    let text: Vec<String> = (0..words).map(|i| format!("{seed}{i}")).collect();
    serde_json::json!({
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": text.join(" ")}],
    })
    .to_string()
}

/// Three healthy mocks behind a gateway, and a picker over the same state.
async fn setup(tune: impl FnOnce(&mut Config)) -> (Vec<Mock>, Gateway, PickerServer) {
    setup_n(3, tune).await
}

/// `n` healthy mocks behind a gateway, and a picker over the same state.
async fn setup_n(n: usize, tune: impl FnOnce(&mut Config)) -> (Vec<Mock>, Gateway, PickerServer) {
    let mut mocks = Vec::with_capacity(n);
    for i in 0..n {
        mocks.push(Mock::start(&format!("mock{i}")).await);
    }
    let urls: Vec<String> = mocks.iter().map(|m| m.url()).collect();
    let mut cfg = config_for(&urls);
    cfg.picker.enabled = true;
    tune(&mut cfg);
    let gw = Gateway::start(cfg).await;
    let state = gw.state.clone();
    assert!(
        eventually(10, || {
            let now = state.clock.now_ms();
            state.fleet.view().serving().count() == n
                && state.fleet.view().serving().all(|i| i.health.usable(now))
        })
        .await,
        "instances healthy"
    );
    let picker = PickerServer::start(&gw.state).await;
    (mocks, gw, picker)
}

fn authority(m: &Mock) -> String {
    m.addr.to_string()
}

fn in_flight(gw: &Gateway, endpoint: &str) -> u32 {
    let view = gw.state.fleet.view();
    let inst = view
        .serving()
        .find(|i| i.authority == endpoint)
        .expect("instance of the endpoint");
    gw.state.routing.load().snapshot(inst.id).in_flight
}

fn decoding(gw: &Gateway, endpoint: &str) -> u32 {
    let view = gw.state.fleet.view();
    let inst = view
        .serving()
        .find(|i| i.authority == endpoint)
        .expect("instance of the endpoint");
    gw.state.routing.load().snapshot(inst.id).decoding
}

#[tokio::test]
async fn non_streaming_request_names_endpoint_fallbacks_and_passes_the_body_back() {
    let (mocks, gw, picker) = setup(|_| {}).await;
    let body = chat("alpha", 400, false);
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", body.as_bytes(), 3, None)
        .await;
    let d = s.decision().await;
    assert_eq!(d.body, body.as_bytes(), "body passed back unchanged");
    assert_eq!(
        d.endpoints.len(),
        3,
        "chosen + 2 fallbacks: {:?}",
        d.endpoints
    );
    let all: Vec<String> = mocks.iter().map(authority).collect();
    for e in &d.endpoints {
        assert!(all.contains(e), "{e} is one of the pool's endpoints");
    }
    let mut sorted = d.endpoints.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "no endpoint twice");
    // The decision holds the chosen instance's load until the response ends.
    assert_eq!(in_flight(&gw, &d.endpoints[0]), 1);
    // It is a decision like the proxy's: in the decision log.
    let decisions = gw.get_text("/admin/decisions").await;
    assert!(decisions.contains("\"chosen\""), "{decisions}");
    s.respond(
        "application/json",
        Some(&d.endpoints[0]),
        &[
            br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"#,
            br#""usage":{"completion_tokens":1}}"#,
        ],
    )
    .await;
    let gw_ref = &gw;
    let chosen = d.endpoints[0].clone();
    assert!(
        eventually(5, || in_flight(gw_ref, &chosen) == 0).await,
        "load released at the end of the response"
    );
    // The gateway closes its side; the stream ends without an error.
    s.cancel();
    assert!(s.recv().await.expect("clean end").is_none());
}

#[tokio::test]
async fn streaming_request_observes_first_token_and_end() {
    let (_mocks, gw, picker) = setup(|_| {}).await;
    let body = chat("beta", 300, true);
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", body.as_bytes(), 2, None)
        .await;
    let d = s.decision().await;
    let chosen = d.endpoints[0].clone();
    s.send(resp_headers(200, "text/event-stream", Some(&chosen)))
        .await;
    assert!(matches!(
        s.expect().await.response,
        Some(Resp::ResponseHeaders(_))
    ));
    assert_eq!(decoding(&gw, &chosen), 0, "no token yet");
    s.send(resp_body(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        false,
    ))
    .await;
    s.expect().await;
    assert_eq!(decoding(&gw, &chosen), 1, "first token seen: decoding");
    assert_eq!(in_flight(&gw, &chosen), 1);
    s.send(resp_body(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        false,
    ))
    .await;
    s.expect().await;
    s.send(resp_body(b"data: [DONE]\n\n", true)).await;
    s.expect().await;
    let view = gw.state.fleet.view();
    let inst = view.serving().find(|i| i.authority == chosen).unwrap();
    assert!(inst.ttft.get().is_some(), "time to first token observed");
    assert_eq!(in_flight(&gw, &chosen), 0, "load released at the end");
}

/// The request id the decision is logged under reaches the engine (set on the request) and the
/// client (set on the answer), as through the proxy: the client's own when it sent one, else a
/// generated one.
#[tokio::test]
async fn the_request_id_reaches_the_engine_and_the_answer() {
    let (_mocks, gw, picker) = setup(|_| {}).await;
    for sent in [None, Some("client-id-7")] {
        let body = chat("rid", 50, false);
        let mut s = Stream::open(picker.addr).await;
        let extra: Vec<(&str, &str)> = sent.map(|v| ("x-request-id", v)).into_iter().collect();
        s.send(req_headers("/v1/chat/completions", &extra, false, None))
            .await;
        s.send(req_body(body.as_bytes(), true)).await;
        let d = s.decision().await;
        let rid = d
            .request_id
            .clone()
            .expect("request id set toward the engine");
        assert!(!rid.is_empty());
        if let Some(v) = sent {
            assert_eq!(rid, v, "the client's id is kept");
        }
        let decisions = gw.get_text("/admin/decisions").await;
        assert!(
            decisions.contains(&format!("\"request_id\":\"{rid}\"")),
            "decision logged under {rid}: {decisions}"
        );
        s.send(resp_headers(200, "application/json", Some(&d.endpoints[0])))
            .await;
        let m = s.expect().await;
        let Some(Resp::ResponseHeaders(h)) = &m.response else {
            panic!("expected a response headers answer, got {m:?}");
        };
        let answered = h
            .response
            .as_ref()
            .and_then(|c| c.header_mutation.as_ref())
            .and_then(|m| {
                m.set_headers
                    .iter()
                    .filter_map(|o| o.header.as_ref())
                    .find(|h| h.key == "x-request-id")
            })
            .map(|h| String::from_utf8(h.raw_value.clone()).unwrap());
        assert_eq!(
            answered.as_deref(),
            Some(rid.as_str()),
            "the answer carries the id"
        );
        s.send(resp_body(br#"{"usage":{"completion_tokens":1}}"#, true))
            .await;
        s.expect().await;
    }
}

#[tokio::test]
async fn cancelled_stream_releases_the_load() {
    let (_mocks, gw, picker) = setup(|_| {}).await;
    let body = chat("gamma", 300, true);
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", body.as_bytes(), 1, None)
        .await;
    let d = s.decision().await;
    let chosen = d.endpoints[0].clone();
    s.send(resp_headers(200, "text/event-stream", None)).await;
    s.expect().await;
    s.send(resp_body(b"data: {}\n\n", false)).await;
    s.expect().await;
    assert_eq!(in_flight(&gw, &chosen), 1);
    // The client went away: Envoy ends the ext_proc stream mid-response.
    s.cancel();
    drop(s);
    let g = &gw;
    assert!(
        eventually(5, || in_flight(g, &chosen) == 0).await,
        "load released when the stream ends mid-response"
    );

    // Cancelled before the decision's response began: released too.
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("delta", 300, true).as_bytes(),
        1,
        None,
    )
    .await;
    let d = s.decision().await;
    let chosen = d.endpoints[0].clone();
    assert_eq!(in_flight(&gw, &chosen), 1);
    s.cancel();
    drop(s);
    assert!(eventually(5, || in_flight(g, &chosen) == 0).await);
}

/// Which door a request goes through.
#[derive(Clone, Copy, Debug)]
enum Door {
    Proxy,
    Picker,
}

/// Routes `body` through `door` under request id `rid`, lets the answer finish, waits until no
/// load is left, and returns the name of the instance that got it.
async fn route_via(
    door: Door,
    gw: &Gateway,
    picker: &PickerServer,
    body: &str,
    rid: &str,
) -> String {
    let name = match door {
        Door::Proxy => {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("x-request-id", rid)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let name = r.headers()["x-kvgate-instance"]
                .to_str()
                .unwrap()
                .to_string();
            r.bytes().await.unwrap();
            name
        }
        Door::Picker => {
            let mut s = Stream::open(picker.addr).await;
            s.send(req_headers(
                "/v1/chat/completions",
                &[("x-request-id", rid)],
                false,
                None,
            ))
            .await;
            let size = body.len().div_ceil(3);
            let parts: Vec<&[u8]> = body.as_bytes().chunks(size).collect();
            for (i, p) in parts.iter().enumerate() {
                s.send(req_body(p, i + 1 == parts.len())).await;
            }
            let d = s.decision().await;
            s.respond("application/json", None, &[b"{}"]).await;
            name_of(gw, &d.endpoints[0])
        }
    };
    let state = gw.state.clone();
    assert!(
        eventually(5, || {
            let view = state.fleet.view();
            let load = state.routing.load();
            let idle = view.serving().all(|i| load.snapshot(i.id).in_flight == 0);
            idle
        })
        .await,
        "load released after {rid}"
    );
    name
}

/// What a logged decision says, every candidate's matched blocks by instance id.
#[derive(Debug, PartialEq)]
struct Said {
    chosen: String,
    prompt_blocks: u64,
    matched_blocks: u64,
    reason: String,
    candidates: Vec<(u64, u64)>,
}

fn said(d: &serde_json::Value) -> Said {
    let mut candidates: Vec<(u64, u64)> = d["decision"]["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|c| {
            (
                c["id"].as_u64().expect("candidate id"),
                c["matched_blocks"].as_u64().expect("matched blocks"),
            )
        })
        .collect();
    candidates.sort();
    Said {
        chosen: d["chosen"].as_str().expect("chosen").to_string(),
        prompt_blocks: d["prompt_blocks"].as_u64().expect("prompt blocks"),
        matched_blocks: d["decision"]["matched_blocks"].as_u64().expect("matched"),
        reason: d["decision"]["reason"]
            .as_str()
            .expect("reason")
            .to_string(),
        candidates,
    }
}

/// One core, two doors. A prompt placed through one door is routed through the other to the
/// instance that computed it; then the same prompt, against the same state, gets the same
/// decision through both doors — instance, matched blocks, reason, and every candidate's
/// matched blocks. The prompt's blocks are cached on one instance only (the others match
/// none), so the doors cannot agree by a tie-break.
#[tokio::test]
async fn one_core_two_doors_make_the_same_decisions() {
    let (mocks, gw, picker) = setup(|_| {}).await;
    for m in &mocks {
        m.set_mode(Mode::Json);
    }
    for (seed, first, other) in [
        ("proxyfirst", Door::Proxy, Door::Picker),
        ("pickerfirst", Door::Picker, Door::Proxy),
    ] {
        let p = chat(seed, 600, false);
        let placed = route_via(first, &gw, &picker, &p, &format!("{seed}-0")).await;
        let placement = said(&decision_logged(&gw, &format!("{seed}-0")).await);
        assert_eq!(placement.matched_blocks, 0, "a new prompt: {placement:?}");
        // The other door follows the placement, then the first door decides again.
        let followed = route_via(other, &gw, &picker, &p, &format!("{seed}-1")).await;
        assert_eq!(followed, placed, "{other:?} follows {first:?}'s placement");
        let again = route_via(first, &gw, &picker, &p, &format!("{seed}-2")).await;
        assert_eq!(again, placed);
        let by_other = said(&decision_logged(&gw, &format!("{seed}-1")).await);
        let by_first = said(&decision_logged(&gw, &format!("{seed}-2")).await);
        assert_eq!(
            by_other, by_first,
            "{other:?} and {first:?} decide alike on the same state"
        );
        assert_eq!(by_other.chosen, placed);
        assert!(
            by_other.matched_blocks > 0 && by_other.matched_blocks <= by_other.prompt_blocks,
            "the prompt matches cached blocks: {by_other:?}"
        );
        let holding: Vec<u64> = by_other
            .candidates
            .iter()
            .filter(|(_, m)| *m > 0)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(
            holding.len(),
            1,
            "only the placed instance holds the prefix: {by_other:?}"
        );
        assert_eq!(by_other.candidates.len(), 3, "{by_other:?}");
    }
}

#[tokio::test]
async fn a_served_fallback_takes_the_load() {
    let (_mocks, gw, picker) = setup(|_| {}).await;
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("eps", 300, true).as_bytes(),
        1,
        None,
    )
    .await;
    let d = s.decision().await;
    let (chosen, fallback) = (d.endpoints[0].clone(), d.endpoints[1].clone());
    assert_eq!(in_flight(&gw, &chosen), 1);
    s.send(resp_headers(200, "text/event-stream", Some(&fallback)))
        .await;
    s.expect().await;
    assert_eq!(in_flight(&gw, &chosen), 0, "moved off the chosen instance");
    assert_eq!(
        in_flight(&gw, &fallback),
        1,
        "onto the fallback that served"
    );
    s.send(resp_body(b"data: [DONE]\n\n", true)).await;
    s.expect().await;
    assert_eq!(in_flight(&gw, &fallback), 0);
    // The fallback computed the prompt, and the index knows it: the same prompt goes there next.
    let mut again = Stream::open(picker.addr).await;
    again
        .request(
            "/v1/chat/completions",
            chat("eps", 300, true).as_bytes(),
            1,
            None,
        )
        .await;
    let d = again.decision().await;
    assert_eq!(
        d.endpoints[0], fallback,
        "routed to where the prefix was served"
    );
}

#[tokio::test]
async fn subset_hint_restricts_the_choice() {
    let (mocks, _gw, picker) = setup(|_| {}).await;
    let only = authority(&mocks[1]);
    let mut md = Metadata::default();
    md.filter_metadata.insert(
        "envoy.lb.subset_hint".into(),
        Struct {
            fields: [(
                "x-gateway-destination-endpoint-subset".to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue {
                        values: vec![Value {
                            kind: Some(Kind::StringValue(only.clone())),
                        }],
                    })),
                },
            )]
            .into(),
        },
    );
    for seed in ["s1", "s2", "s3"] {
        let mut s = Stream::open(picker.addr).await;
        s.request(
            "/v1/chat/completions",
            chat(seed, 100, false).as_bytes(),
            1,
            Some(md.clone()),
        )
        .await;
        let d = s.decision().await;
        assert_eq!(d.endpoints, vec![only.clone()], "only the subset");
    }
}

#[tokio::test]
async fn picker_restart_keeps_the_gateway_state() {
    let (_mocks, gw, picker) = setup(|_| {}).await;
    let p = chat("restart", 600, false);
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", p.as_bytes(), 1, None)
        .await;
    let first = s.decision().await.endpoints[0].clone();
    s.respond("application/json", None, &[b"{}"]).await;
    s.cancel();
    drop(s);
    let old = picker.addr;
    picker.stop().await;
    // A stopped picker refuses connections (the gateway's failure mode applies then).
    assert!(tokio::net::TcpStream::connect(old).await.is_err());
    let picker = PickerServer::start(&gw.state).await;
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", p.as_bytes(), 1, None)
        .await;
    let again = s.decision().await.endpoints[0].clone();
    assert_eq!(
        first, again,
        "the restarted picker routes on the same index"
    );
    s.respond("application/json", None, &[b"{}"]).await;
}

#[tokio::test]
async fn no_usable_instance_fails_closed_with_503() {
    let (mocks, gw, picker) = setup(|_| {}).await;
    for m in &mocks {
        m.set_healthy(false);
    }
    let state = gw.state.clone();
    assert!(
        eventually(10, || {
            let now = state.clock.now_ms();
            state.fleet.view().serving().all(|i| !i.health.usable(now))
        })
        .await
    );
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("x", 10, false).as_bytes(),
        1,
        None,
    )
    .await;
    let m = s.expect().await;
    let Some(Resp::ImmediateResponse(i)) = &m.response else {
        panic!("expected an immediate response, got {m:?}");
    };
    assert_eq!(i.status.as_ref().unwrap().code, 503);
    let body: serde_json::Value = serde_json::from_slice(&i.body).unwrap();
    assert_eq!(body["error"]["code"], "no_healthy_instance");
}

#[tokio::test]
async fn no_usable_instance_fails_open_with_unavailable() {
    let (mocks, gw, picker) = setup(|c| c.picker.failure_mode = FailureMode::FailOpen).await;
    for m in &mocks {
        m.set_healthy(false);
    }
    let state = gw.state.clone();
    assert!(
        eventually(10, || {
            let now = state.clock.now_ms();
            state.fleet.view().serving().all(|i| !i.health.usable(now))
        })
        .await
    );
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("x", 10, false).as_bytes(),
        1,
        None,
    )
    .await;
    let err = s
        .recv()
        .await
        .expect_err("the stream fails for the gateway to fail open");
    assert_eq!(err.code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn over_the_stream_cap_follows_the_failure_mode() {
    let (_mocks, _gw, picker) = setup(|c| {
        c.picker.max_streams = 1;
        c.picker.failure_mode = FailureMode::FailOpen;
    })
    .await;
    // One stream holds the only place.
    let held = Stream::open(picker.addr).await;
    held.send(req_headers("/v1/chat/completions", &[], false, None))
        .await;
    let mut s = Stream::open(picker.addr).await;
    s.send(req_headers("/v1/chat/completions", &[], false, None))
        .await;
    let err = s.recv().await.expect_err("over the cap");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    drop(held);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413() {
    let (_mocks, _gw, picker) = setup(|c| c.server.body_limit_bytes = 1024).await;
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("big", 500, false).as_bytes(),
        4,
        None,
    )
    .await;
    let m = s.expect().await;
    let Some(Resp::ImmediateResponse(i)) = &m.response else {
        panic!("expected an immediate response, got {m:?}");
    };
    assert_eq!(i.status.as_ref().unwrap().code, 413);
}

#[tokio::test]
async fn a_bad_request_is_answered_by_the_gateway() {
    let (_mocks, _gw, picker) = setup(|_| {}).await;
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", b"{not json", 1, None)
        .await;
    let m = s.expect().await;
    let Some(Resp::ImmediateResponse(i)) = &m.response else {
        panic!("expected an immediate response, got {m:?}");
    };
    assert_eq!(i.status.as_ref().unwrap().code, 400);
}

#[tokio::test]
async fn trailers_end_the_request_and_are_answered() {
    let (_mocks, _gw, picker) = setup(|_| {}).await;
    let body = chat("trail", 50, false);
    let mut s = Stream::open(picker.addr).await;
    s.send(req_headers("/v1/chat/completions", &[], false, None))
        .await;
    s.send(req_body(body.as_bytes(), false)).await;
    s.send(ProcessingRequest {
        request: Some(Req::RequestTrailers(HttpTrailers::default())),
        ..Default::default()
    })
    .await;
    let m = s.expect().await;
    assert!(matches!(m.response, Some(Resp::RequestHeaders(_))));
    let m = s.expect().await;
    let Some(Resp::RequestBody(b)) = &m.response else {
        panic!("{m:?}")
    };
    let Some(Mutation::StreamedResponse(sb)) = b
        .response
        .as_ref()
        .and_then(|c| c.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    else {
        panic!("streamed");
    };
    assert_eq!(sb.body, body.as_bytes());
    assert!(!sb.end_of_stream, "trailers follow the body");
    let m = s.expect().await;
    assert!(matches!(m.response, Some(Resp::RequestTrailers(_))));
}

#[tokio::test]
async fn a_request_without_body_goes_to_a_usable_instance() {
    let (mocks, _gw, picker) = setup(|_| {}).await;
    let mut s = Stream::open(picker.addr).await;
    s.send(req_headers("/v1/models", &[], true, None)).await;
    let m = s.expect().await;
    let Some(Resp::RequestHeaders(h)) = &m.response else {
        panic!("{m:?}")
    };
    let set = &h
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap()
        .set_headers;
    let dest = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == "x-gateway-destination-endpoint")
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
        .unwrap();
    let all: Vec<String> = mocks.iter().map(authority).collect();
    assert!(all.contains(&dest));
}

/// Golden: the protocol names, pinned to GIE v1.6.0's Endpoint Picker Protocol (v1.0.0), as
/// its docs/proposals/004-endpoint-picker-protocol and pkg/lwepp/metadata/consts.go spell them.
#[test]
fn golden_protocol_names_match_gie_v1_6_0() {
    assert_eq!(protocol::GIE_VERSION, "v1.6.0");
    assert_eq!(protocol::PROTOCOL_VERSION, "v1.0.0");
    assert_eq!(
        protocol::EXT_PROC_SERVICE,
        "envoy.service.ext_proc.v3.ExternalProcessor"
    );
    assert_eq!(
        protocol::DESTINATION_ENDPOINT_HEADER,
        "x-gateway-destination-endpoint"
    );
    assert_eq!(protocol::DESTINATION_ENDPOINT_NAMESPACE, "envoy.lb");
    assert_eq!(
        protocol::DESTINATION_ENDPOINT_KEY,
        "x-gateway-destination-endpoint"
    );
    assert_eq!(
        protocol::DESTINATION_ENDPOINT_SERVED_KEY,
        "x-gateway-destination-endpoint-served"
    );
    assert_eq!(protocol::SUBSET_HINT_NAMESPACE, "envoy.lb.subset_hint");
    assert_eq!(
        protocol::SUBSET_HINT_KEY,
        "x-gateway-destination-endpoint-subset"
    );
    assert_eq!(protocol::HEALTH_LIVENESS, "liveness");
    assert_eq!(protocol::HEALTH_READINESS, "readiness");
    assert_eq!(protocol::MAX_BODY_CHUNK, 62_000);
    // The message shape: header and metadata carry the same comma-separated list.
    let m = protocol::destination_response(
        "10.0.0.1:8000,10.0.0.2:8000",
        Some(7),
        &[],
        &[("x-request-id", b"r-1")],
    );
    let Some(Resp::RequestHeaders(h)) = &m.response else {
        panic!("a request headers response")
    };
    let c = h.response.as_ref().unwrap();
    assert!(c.clear_route_cache);
    let set = &c.header_mutation.as_ref().unwrap().set_headers;
    let keys: Vec<&str> = set
        .iter()
        .map(|o| o.header.as_ref().unwrap().key.as_str())
        .collect();
    assert_eq!(
        keys,
        vec![
            "x-gateway-destination-endpoint",
            "content-length",
            "x-request-id"
        ]
    );
    assert_eq!(
        set[0].header.as_ref().unwrap().raw_value,
        b"10.0.0.1:8000,10.0.0.2:8000"
    );
    // OVERWRITE_IF_EXISTS_OR_ADD: a client cannot choose its own endpoint.
    assert_eq!(set[0].append_action, 2);
    let md = m.dynamic_metadata.as_ref().unwrap();
    let Some(Kind::StructValue(ns)) = &md.fields["envoy.lb"].kind else {
        panic!("namespace struct")
    };
    assert_eq!(
        ns.fields["x-gateway-destination-endpoint"].kind,
        Some(Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into()))
    );
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    let (_mocks, _gw, picker) = setup(|_| {}).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", picker.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
    for svc in [
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        let ok = common::eventually_async(5, || {
            let mut h = h.clone();
            async move {
                h.check(tonic_health::pb::HealthCheckRequest {
                    service: svc.to_string(),
                })
                .await
                .map(|r| r.into_inner().status == 1)
                .unwrap_or(false)
            }
        })
        .await;
        assert!(ok, "{svc} serving");
    }
    let _ = &mut h;
}

#[tokio::test]
async fn fields_the_proxy_would_not_forward_are_removed() {
    let (_mocks, _gw, picker) = setup(|_| {}).await;
    let body = chat("strip", 50, false);
    let mut s = Stream::open(picker.addr).await;
    s.send(req_headers(
        "/v1/chat/completions",
        &[
            ("x-kvgate-instance", "spoofed"),
            ("x-kvgate-priority", "critical"),
        ],
        false,
        None,
    ))
    .await;
    s.send(req_body(body.as_bytes(), true)).await;
    let m = s.expect().await;
    let Some(Resp::RequestHeaders(h)) = &m.response else {
        panic!("{m:?}")
    };
    let mutation = h
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap();
    assert_eq!(
        mutation.remove_headers,
        vec!["x-kvgate-instance".to_string()]
    );
}

/// The gateway's immediate answer in `m`, which must be one.
fn immediate_of(m: &ProcessingResponse) -> &ImmediateResponse {
    match &m.response {
        Some(Resp::ImmediateResponse(i)) => i,
        other => panic!("expected an immediate response, got {other:?}"),
    }
}

/// A header the immediate answer sets, as text.
fn immediate_header(i: &ImmediateResponse, name: &str) -> Option<String> {
    i.headers
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| String::from_utf8(protocol::header_value(h).to_vec()).unwrap())
}

/// A refusal as either door gives it: status, `x-kvgate-reject-reason`, `Retry-After` and the
/// error body's code.
#[derive(Debug, PartialEq)]
struct Refusal {
    status: u16,
    reason: Option<String>,
    retry_after: Option<u64>,
    code: String,
}

fn picker_refusal(m: &ProcessingResponse) -> Refusal {
    let i = immediate_of(m);
    let body: serde_json::Value = serde_json::from_slice(&i.body).expect("JSON error body");
    Refusal {
        status: u16::try_from(i.status.as_ref().expect("a status").code).unwrap(),
        reason: immediate_header(i, "x-kvgate-reject-reason"),
        retry_after: immediate_header(i, "retry-after").map(|v| v.parse().unwrap()),
        code: body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    }
}

async fn proxy_refusal(r: reqwest::Response) -> Refusal {
    let text = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (status, reason, retry) = (
        r.status().as_u16(),
        text("x-kvgate-reject-reason"),
        text("retry-after"),
    );
    let body: serde_json::Value = r.json().await.expect("JSON error body");
    Refusal {
        status,
        reason,
        retry_after: retry.map(|v| v.parse().unwrap()),
        code: body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    }
}

/// A chat request through the proxy door, in the background.
fn proxy_chat(gw: &Gateway, body: String) -> tokio::task::JoinHandle<reqwest::Response> {
    let req = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body);
    tokio::spawn(async move { req.send().await.expect("answered") })
}

/// One instance under admission control with room for one request in flight, and one request
/// held on its engine: the pool is saturated.
async fn saturated(
    tune: impl FnOnce(&mut Config),
) -> (
    Vec<Mock>,
    Gateway,
    PickerServer,
    tokio::task::JoinHandle<reqwest::Response>,
) {
    let (mocks, gw, picker) = setup_n(1, |c| {
        c.admission.enabled = true;
        c.admission.max_inflight_per_instance = 1;
        tune(c);
    })
    .await;
    mocks[0].set_mode(Mode::Held);
    let held = proxy_chat(&gw, chat("held", 20, false));
    let m = &mocks[0];
    assert!(
        eventually(10, || m.held() == 1).await,
        "one request held on the engine"
    );
    (mocks, gw, picker, held)
}

/// Admission control turns a request away (it waited out `max_wait_ms` behind a saturated
/// pool): the picker answers the gateway's immediate 429 with `Retry-After` and the reason, the
/// same status, reason and code as the proxy gives a request in the same situation, and
/// neither request reaches the engine.
#[tokio::test]
async fn an_admission_wait_timeout_is_an_immediate_429_as_through_the_proxy() {
    let (mocks, gw, picker, held) = saturated(|c| c.admission.max_wait_ms = 200).await;
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("waits", 20, false).as_bytes(),
        2,
        None,
    )
    .await;
    let by_picker = picker_refusal(&s.expect().await);
    assert_eq!(by_picker.code, "overloaded");
    let by_proxy = proxy_refusal(proxy_chat(&gw, chat("waits", 20, false)).await.unwrap()).await;
    assert_same_429(by_picker, by_proxy, "wait_timeout");
    assert_eq!(
        mocks[0].count(),
        1,
        "only the held request reached the engine"
    );
    mocks[0].release(1);
    assert_eq!(held.await.unwrap().status(), 200);
}

/// The pool's queue is full (one request held on the engine, one waiting, room for one): the
/// picker's next request is refused at once with 429 `queue_full`, as the proxy's is.
#[tokio::test]
async fn a_full_admission_queue_is_an_immediate_429_as_through_the_proxy() {
    let (mocks, gw, picker, held) = saturated(|c| {
        c.admission.max_queue_entries = 1;
        c.admission.max_wait_ms = 10_000;
    })
    .await;
    let queued = proxy_chat(&gw, chat("queued", 20, false));
    let g = &gw;
    assert!(
        common::eventually_async(10, || async move {
            let v: serde_json::Value =
                serde_json::from_str(&g.get_text("/admin/admission").await).unwrap();
            v["pools"][0]["entries"].as_u64() == Some(1)
        })
        .await,
        "one request queued"
    );
    let mut s = Stream::open(picker.addr).await;
    s.request(
        "/v1/chat/completions",
        chat("full", 20, false).as_bytes(),
        1,
        None,
    )
    .await;
    let by_picker = picker_refusal(&s.expect().await);
    let by_proxy = proxy_refusal(proxy_chat(&gw, chat("full", 20, false)).await.unwrap()).await;
    assert_same_429(by_picker, by_proxy, "queue_full");
    assert_eq!(
        mocks[0].count(),
        1,
        "the refused requests never reached the engine"
    );
    mocks[0].release(2);
    assert_eq!(held.await.unwrap().status(), 200);
    assert_eq!(queued.await.unwrap().status(), 200);
}

/// Both doors refused with 429 for `reason`, each with a `Retry-After` of at least a second,
/// and otherwise the same answer (`Retry-After` is a prediction of the moment).
fn assert_same_429(by_picker: Refusal, by_proxy: Refusal, reason: &str) {
    assert_eq!(by_picker.status, 429, "{by_picker:?}");
    assert_eq!(by_picker.reason.as_deref(), Some(reason), "{by_picker:?}");
    for r in [&by_picker, &by_proxy] {
        assert!(r.retry_after.is_some_and(|s| s >= 1), "{r:?}");
    }
    assert_eq!(
        Refusal {
            retry_after: None,
            ..by_picker
        },
        Refusal {
            retry_after: None,
            ..by_proxy
        },
        "one core, two doors: the same refusal"
    );
}

/// The name of the instance behind `endpoint`.
fn name_of(gw: &Gateway, endpoint: &str) -> String {
    let view = gw.state.fleet.view();
    let name = view
        .serving()
        .find(|i| i.authority == endpoint)
        .map(|i| i.name.clone())
        .expect("instance of the endpoint");
    name
}

/// `kvgate_requests_total` of `instance` with status class `class`, summed over routes.
fn requests_total(metrics: &str, instance: &str, class: &str) -> f64 {
    let (inst, status) = (
        format!("instance=\"{instance}\""),
        format!("status=\"{class}\""),
    );
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("kvgate_requests_total{") && l.contains(&inst) && l.contains(&status)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The `/admin/decisions` entry logged under `rid`.
async fn decision_logged(gw: &Gateway, rid: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/decisions").await).unwrap();
    v["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .find(|d| d["request_id"] == rid)
        .unwrap_or_else(|| panic!("no decision logged under {rid}: {v}"))
        .clone()
}

/// The gateway's side ends the response with trailers (headers, body chunks none of which ends
/// the stream, then trailers): the trailers are answered, and they complete the request while
/// the stream is still open — load released, the request counted as a 2xx answer of the chosen
/// instance (not a cancellation), time to first token observed, the decision in the log.
#[tokio::test]
async fn response_trailers_complete_the_request() {
    let (_mocks, gw, picker) = setup(|c| {
        for (i, inst) in c.pools[0].instances.iter_mut().enumerate() {
            // Names of this test's own: the metrics recorder is shared by the process.
            inst.name = Some(format!("trailers{i}"));
        }
    })
    .await;
    let rid = "trailers-1";
    let mut s = Stream::open(picker.addr).await;
    s.send(req_headers(
        "/v1/chat/completions",
        &[("x-request-id", rid)],
        false,
        None,
    ))
    .await;
    s.send(req_body(chat("trailers", 200, true).as_bytes(), true))
        .await;
    let d = s.decision().await;
    let chosen = d.endpoints[0].clone();
    let name = name_of(&gw, &chosen);
    s.send(resp_headers(200, "text/event-stream", Some(&chosen)))
        .await;
    assert!(matches!(
        s.expect().await.response,
        Some(Resp::ResponseHeaders(_))
    ));
    for chunk in [
        &b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"[..],
        b"data: [DONE]\n\n",
    ] {
        s.send(resp_body(chunk, false)).await;
        let m = s.expect().await;
        assert!(matches!(m.response, Some(Resp::ResponseBody(_))), "{m:?}");
    }
    assert_eq!(
        in_flight(&gw, &chosen),
        1,
        "no body chunk ended the response: the trailers will"
    );
    s.send(ProcessingRequest {
        request: Some(Req::ResponseTrailers(HttpTrailers::default())),
        ..Default::default()
    })
    .await;
    let m = s.expect().await;
    assert!(
        matches!(m.response, Some(Resp::ResponseTrailers(_))),
        "trailers answered: {m:?}"
    );
    // The trailers were observed before they were answered: nothing to wait for.
    assert_eq!(in_flight(&gw, &chosen), 0, "load released by the trailers");
    let metrics = gw.get_text("/metrics").await;
    assert_eq!(
        requests_total(&metrics, &name, "2xx"),
        1.0,
        "counted as an answer of {name}: {metrics}"
    );
    assert_eq!(requests_total(&metrics, &name, "cancelled"), 0.0);
    {
        let view = gw.state.fleet.view();
        let inst = view.serving().find(|i| i.authority == chosen).unwrap();
        assert!(inst.ttft.get().is_some(), "time to first token observed");
    }
    let logged = decision_logged(&gw, rid).await;
    assert_eq!(logged["chosen"], name.as_str(), "{logged}");
    // The gateway closes the stream; the request was finished once, as complete.
    s.cancel();
    assert!(s.recv().await.expect("clean end").is_none());
    let metrics = gw.get_text("/metrics").await;
    assert_eq!(requests_total(&metrics, &name, "2xx"), 1.0);
    assert_eq!(requests_total(&metrics, &name, "cancelled"), 0.0);
}

/// The picker's candidates from an `inference_pool` discovery source: a pool `qwen` on the
/// fake Kubernetes API server selects two ready pods (engines on 127.0.0.1 and 127.0.0.2, the
/// pool's one target port). The picker names the pods' endpoints; once the server removes the
/// pod a prompt was placed on, the picker stops naming it, and routes that prompt to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_come_from_an_inference_pool_and_follow_its_pods() {
    use kvgate_discovery::fake_api::{pod, pool_v1, FakeApi, NS, PODS, POOLS_V1};
    use serde_json::json;
    // The pods of one InferencePool share its target port: the first engine's port, chosen
    // by the system, and the same port on a second loopback address.
    let (engines, port) = loop {
        let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        if let Ok(second) = tokio::net::TcpListener::bind(("127.0.0.2", port)).await {
            break (
                [
                    Mock::start_on("pod0", first),
                    Mock::start_on("pod1", second),
                ],
                port,
            );
        }
    };
    let labels = json!({"app": "qwen"});
    let pod_at =
        |name: &str, rv: &str, ip: &str| pod(name, rv, ip, true, labels.clone(), json!({}));
    let api = FakeApi::start().await.unwrap();
    api.list(
        POOLS_V1,
        "3",
        vec![pool_v1("qwen", "3", labels.clone(), port)],
    );
    let _pools = api.watch(POOLS_V1);
    api.list(
        PODS,
        "5",
        vec![
            pod_at("qwen-0", "5", "127.0.0.1"),
            pod_at("qwen-1", "5", "127.0.0.2"),
        ],
    );
    let pods = api.watch(PODS);

    let mut cfg = config_for(&[]);
    cfg.picker.enabled = true;
    let pool = &mut cfg.pools[0];
    pool.instances.clear();
    pool.discovery.source = kvgate_discovery::SourceKind::Kubernetes;
    pool.discovery.api_server = Some(api.url());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.inference_pool = Some("qwen".into());
    pool.discovery.drain_grace_ms = 200;
    let gw = Gateway::start(cfg).await;
    let endpoint = |ip: &str| format!("{ip}:{port}");
    let all = [endpoint("127.0.0.1"), endpoint("127.0.0.2")];
    let serving = |gw: &Gateway| -> Vec<String> {
        let now = gw.state.clock.now_ms();
        let view = gw.state.fleet.view();
        let mut v: Vec<String> = view
            .serving()
            .filter(|i| i.health.usable(now))
            .map(|i| i.authority.clone())
            .collect();
        v.sort();
        v
    };
    assert!(
        eventually(10, || serving(&gw) == all).await,
        "the pool's pods discovered: {:?}",
        serving(&gw)
    );
    assert_eq!(
        api.seen(PODS, false)[0].query["labelSelector"],
        "app=qwen",
        "pods chosen by the pool's selector"
    );
    let picker = PickerServer::start(&gw.state).await;

    let p = chat("k8s", 400, false);
    let mut s = Stream::open(picker.addr).await;
    s.request("/v1/chat/completions", p.as_bytes(), 2, None)
        .await;
    let d = s.decision().await;
    let mut named = d.endpoints.clone();
    named.sort();
    assert_eq!(named, all, "the chosen pod, then the other as fallback");
    let placed = d.endpoints[0].clone();
    s.respond("application/json", None, &[b"{}"]).await;
    let g = &gw;
    assert!(eventually(5, || in_flight(g, &placed) == 0).await);

    // The API server removes the pod the prompt was placed on.
    let (gone_pod, gone_ip, kept) = if placed == all[0] {
        ("qwen-0", "127.0.0.1", all[1].clone())
    } else {
        ("qwen-1", "127.0.0.2", all[0].clone())
    };
    pods.event("DELETED", pod_at(gone_pod, "6", gone_ip));
    assert!(
        eventually(10, || serving(&gw) == [kept.clone()]).await,
        "{gone_pod} left the fleet: {:?}",
        serving(&gw)
    );
    for (i, body) in [
        p.clone(),
        chat("k8s-after", 100, false),
        chat("k8s-more", 100, true),
    ]
    .iter()
    .enumerate()
    {
        let mut s = Stream::open(picker.addr).await;
        s.request("/v1/chat/completions", body.as_bytes(), 1, None)
            .await;
        let d = s.decision().await;
        assert_eq!(
            d.endpoints,
            vec![kept.clone()],
            "request {i}: only the remaining pod is named (not {placed})"
        );
        s.respond("application/json", None, &[b"{}"]).await;
    }
    drop(engines);
}

/// The sockets `pid` listens on (TCP, IPv4 and IPv6), by local port: its socket descriptors
/// matched against the kernel's tables of listening sockets.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            // local_address is f[1] (`ADDR:PORT` in hex), st f[3] (0A: LISTEN), inode f[9].
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports.sort();
    ports
}

/// A kvgate process started from the binary; killed when dropped.
struct Process {
    child: std::process::Child,
    /// `message` → `listen` of the JSON log lines that announce a listener.
    announced: std::collections::HashMap<String, String>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `kvgate --config <toml> --log-format json` and reads its log until every line of
/// `awaited` (messages announcing a listener) has been logged.
fn start_binary(toml: &str, awaited: &[&str]) -> Process {
    use std::io::BufRead;
    let config = common::fresh_dir("picker-only").join("kvgate.toml");
    std::fs::write(&config, toml).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .arg("--config")
        .arg(&config)
        .arg("--log-format")
        .arg("json")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let (Some(m), Some(l)) = (v["message"].as_str(), v["listen"].as_str()) {
                let _ = tx.send((m.to_string(), l.to_string()));
            }
        }
    });
    let mut p = Process {
        child,
        announced: Default::default(),
    };
    while let Some(missing) = awaited.iter().find(|m| !p.announced.contains_key(**m)) {
        let (m, l) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("kvgate did not log `{missing}`: {:?}", p.announced));
        p.announced.insert(m, l);
    }
    p
}

/// The binary's log lines announcing its listeners (`listen` field).
const SERVING: &str = "kvgate serving";
const ADMIN: &str = "admin listener serving /admin/*, /metrics, /health and /ready";
const PICKER: &str = "endpoint picker (ext_proc) serving";

/// Picker only, from the binary: with `server.listen = ""` kvgate listens on the admin
/// listener and the picker's port and nothing else; the admin surface is served; the background
/// tasks run (an engine failing its health checks leaves the picker's choice); the picker's
/// decisions are listed on the admin listener. Without the picker, or without an admin
/// listener, such a config is refused, naming `server.listen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picker_only_serves_no_http_proxy_and_keeps_the_admin_surface() {
    let mut cfg = config_for(&["http://127.0.0.1:1".to_string()]);
    cfg.server.listen = String::new();
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("server.listen") && e.contains("picker.enabled"),
        "{e}"
    );
    cfg.picker.enabled = true;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("server.listen") && e.contains("server.admin_listen"),
        "{e}"
    );
    cfg.server.admin_listen = "127.0.0.1:0".into();
    cfg.validate().unwrap();

    let mocks = [Mock::start("only0").await, Mock::start("only1").await];
    let p = start_binary(
        &format!(
            r#"
[server]
listen = ""
admin_listen = "127.0.0.1:0"
shutdown_grace_ms = 1000

[health]
interval_ms = 50
timeout_ms = 500

[picker]
enabled = true
listen = "127.0.0.1:0"

[[pools]]
model = "m"

[[pools.instances]]
name = "only0"
url = "{}"

[[pools.instances]]
name = "only1"
url = "{}"
"#,
            mocks[0].url(),
            mocks[1].url()
        ),
        &[SERVING, ADMIN, PICKER],
    );
    assert_eq!(p.announced[SERVING], "none (picker only)");
    let admin: SocketAddr = p.announced[ADMIN].parse().unwrap();
    let picker: SocketAddr = p.announced[PICKER].parse().unwrap();
    assert_eq!(
        listening_ports(p.child.id()),
        {
            let mut v = vec![admin.port(), picker.port()];
            v.sort();
            v
        },
        "listening on the admin listener and the picker only"
    );
    let get = |path: &str| {
        let url = format!("http://{admin}{path}");
        async move { client().get(url).send().await.unwrap() }
    };
    assert_eq!(get("/health").await.status(), 200);
    let g = &get;
    assert!(
        common::eventually_async(10, || async move { g("/ready").await.status() == 200 }).await,
        "ready"
    );
    assert!(get("/metrics")
        .await
        .text()
        .await
        .unwrap()
        .contains("kvgate_"));

    // The picker routes over both engines, and its decision is listed on the admin listener.
    let both: Vec<String> = mocks.iter().map(authority).collect();
    let mut s = Stream::open(picker).await;
    s.send(req_headers(
        "/v1/chat/completions",
        &[("x-request-id", "only-1")],
        false,
        None,
    ))
    .await;
    s.send(req_body(chat("only", 100, false).as_bytes(), true))
        .await;
    let d = s.decision().await;
    let mut named = d.endpoints.clone();
    named.sort();
    let mut sorted = both.clone();
    sorted.sort();
    assert_eq!(named, sorted);
    s.respond("application/json", None, &[b"{}"]).await;
    let decisions = get("/admin/decisions").await.text().await.unwrap();
    assert!(
        decisions.contains("\"request_id\":\"only-1\""),
        "{decisions}"
    );

    // Health checks run without the proxy listener: a failing engine leaves the choice.
    mocks[1].set_healthy(false);
    let only = vec![both[0].clone()];
    let only_ref = &only;
    assert!(
        common::eventually_async(10, || async move {
            let mut s = Stream::open(picker).await;
            s.request(
                "/v1/chat/completions",
                chat("after", 50, false).as_bytes(),
                1,
                None,
            )
            .await;
            s.decision().await.endpoints == *only_ref
        })
        .await,
        "the unhealthy engine is no longer named"
    );
}
