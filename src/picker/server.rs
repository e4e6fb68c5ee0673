//! The ext_proc service: one task per stream (one HTTP request through the gateway), its
//! request side gathered by [`super::stream::Request`], routed through the proxy's own
//! "admit + decide" ([`crate::proxy::admit`], [`crate::proxy::decide`]), its response observed
//! by the proxy's [`Tracker`].

use super::protocol::{self, EXT_PROC_SERVICE, HEALTH_LIVENESS, HEALTH_READINESS};
use super::stream::{Request, Step};
use crate::app::AppState;
use crate::client::OutHeaders;
use crate::config::FailureMode;
use crate::error::GatewayError;
use crate::metrics;
use crate::proxy::body::Tracker;
use crate::proxy::parse::Endpoint;
use crate::proxy::{self, headers, Admitted};
use crate::routing::Routed;
use axum::response::IntoResponse;
use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    external_processor_server::{ExternalProcessor, ExternalProcessorServer},
    processing_request, ProcessingRequest, ProcessingResponse,
};
use http::HeaderValue;
use kvgate_core::InstanceId;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

/// Messages a stream may have waiting for the gateway to read them.
const OUT_QUEUE: usize = 16;

/// How often readiness is re-evaluated for the gRPC health service.
const READINESS_INTERVAL: Duration = Duration::from_secs(1);

/// The ext_proc service over the gateway's state.
pub struct Picker {
    state: AppState,
    /// Places for open streams (`picker.max_streams`).
    streams: Arc<Semaphore>,
    /// Rotates requests the picker cannot route by prompt over the usable instances.
    rotate: Arc<AtomicUsize>,
}

impl Picker {
    /// The service over `state`.
    pub fn new(state: AppState) -> Self {
        let streams = Arc::new(Semaphore::new(state.config.picker.max_streams));
        Self {
            state,
            streams,
            rotate: Arc::default(),
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        let permit = self.streams.clone().try_acquire_owned().ok();
        let state = self.state.clone();
        let rotate = self.rotate.clone();
        tokio::spawn(async move {
            let out = Out(tx);
            if let Err(status) = run_stream(&state, inbound, &out, permit, &rotate).await {
                out.end(status).await;
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

/// The stream's way back to the gateway.
struct Out(mpsc::Sender<Result<ProcessingResponse, Status>>);

/// The gateway is gone: the stream ends (and with it what it holds).
struct Gone;

impl Out {
    async fn send(&self, m: ProcessingResponse) -> Result<(), Gone> {
        self.0.send(Ok(m)).await.map_err(|_| Gone)
    }
    async fn end(&self, status: Status) {
        let _ = self.0.send(Err(status)).await;
    }
}

/// Why a stream stops early.
enum Stop {
    /// The gateway ended or cancelled the stream; nothing more to say.
    Gone,
    /// End the stream with this gRPC status.
    Status(Status),
}

impl From<Gone> for Stop {
    fn from(_: Gone) -> Stop {
        Stop::Gone
    }
}

/// The next message from the gateway within `within`: `Ok(None)` when the stream ended or was
/// cancelled, `Err(())` past the deadline.
async fn next(
    inbound: &mut Streaming<ProcessingRequest>,
    within: Duration,
) -> Result<Option<ProcessingRequest>, ()> {
    match tokio::time::timeout(within, inbound.message()).await {
        Err(_) => Err(()),
        Ok(Ok(m)) => Ok(m),
        // Cancelled or reset by the gateway: the same as the end.
        Ok(Err(_)) => Ok(None),
    }
}

/// The picker's own failure (over capacity, a stream gone silent): failure mode decides.
fn own_failure(state: &AppState, why: &str) -> Result<ProcessingResponse, Status> {
    metrics::record_picker_failure(why);
    match state.config.picker.failure_mode {
        FailureMode::FailOpen => Err(Status::unavailable(format!("endpoint picker: {why}"))),
        FailureMode::FailClose => {
            let e = GatewayError::NoHealthyInstance {
                model: format!("(endpoint picker: {why})"),
            };
            Ok(immediate(e))
        }
    }
}

/// `e` as the gateway's immediate answer: the proxy's status, headers and OpenAI-style body.
fn immediate(e: GatewayError) -> ProcessingResponse {
    let status = e.status().as_u16();
    let body = e.body().into_bytes();
    let code = e.code();
    let resp = e.into_response();
    let fields: Vec<(String, Vec<u8>)> = resp
        .headers()
        .iter()
        .filter(|(n, _)| *n != http::header::CONNECTION && *n != http::header::CONTENT_LENGTH)
        .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    protocol::immediate(status, &fields, body, code)
}

/// A refusal of a request, recorded as the proxy records one; in fail-open mode a refusal for
/// want of an instance ends the stream instead, for the gateway to route the request itself.
fn refusal(
    state: &AppState,
    endpoint: Endpoint,
    e: GatewayError,
    rid: &http::HeaderValue,
    label: &str,
) -> Result<ProcessingResponse, Status> {
    proxy::record_refusal(endpoint, &e, rid, label);
    let unavailable = matches!(
        e,
        GatewayError::NoHealthyInstance { .. } | GatewayError::Internal(_)
    );
    if unavailable && state.config.picker.failure_mode == FailureMode::FailOpen {
        return Err(Status::unavailable(e.to_string()));
    }
    Ok(immediate(e))
}

/// Sends `r` (an immediate answer) or ends the stream with its status.
async fn finish_with(out: &Out, r: Result<ProcessingResponse, Status>) -> Result<(), Status> {
    match r {
        Ok(m) => {
            let _ = out.send(m).await;
            Ok(())
        }
        Err(s) => Err(s),
    }
}

/// What the decision left for the response side.
struct Decided<'s> {
    /// The request as admitted (gate, rate limit, charge): held until the stream ends.
    adm: Option<Admitted<'s>>,
    /// The decision and its load, until the response starts.
    routed: Option<Routed>,
    endpoint: Endpoint,
    /// When the destination was named (the dispatch, as far as the picker knows).
    sent: Instant,
    /// The request id the decision was made under (the client's, or one generated): set on the
    /// request toward the engine and on the answer, as the proxy sets it.
    rid: HeaderValue,
}

async fn run_stream(
    state: &AppState,
    mut inbound: Streaming<ProcessingRequest>,
    out: &Out,
    permit: Option<OwnedSemaphorePermit>,
    rotate: &AtomicUsize,
) -> Result<(), Status> {
    let started = Instant::now();
    let cfg = &state.config.picker;
    let idle = Duration::from_millis(cfg.idle_timeout_ms);
    let mut req = Request::new(state.limits.body_limit);
    let mut subset: Option<Vec<String>> = None;
    let mut reserved: Option<proxy::limits::budget::Reserved<'_>> = None;
    // The request side, until it is complete.
    loop {
        let msg = match next(&mut inbound, idle).await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(()) => return finish_with(out, own_failure(state, "idle_timeout")).await,
        };
        if permit.is_none() {
            return finish_with(out, own_failure(state, "max_streams")).await;
        }
        if let Some(s) = protocol::subset_hint(msg.metadata_context.as_ref()) {
            subset = Some(s.into_iter().map(str::to_string).collect());
        }
        let step = match &msg.request {
            Some(processing_request::Request::RequestHeaders(h)) => req.on_headers(h),
            Some(processing_request::Request::RequestBody(b)) => {
                let step = req.on_body(b);
                if step != Step::TooLarge {
                    if let Err(e) = hold(state, &mut reserved, req.held()).await {
                        return finish_with(out, Ok(immediate(e))).await;
                    }
                }
                step
            }
            Some(processing_request::Request::RequestTrailers(_)) => req.on_trailers(),
            _ => Step::OutOfOrder("a response before the request was complete"),
        };
        match step {
            Step::Wait => continue,
            Step::Route => break,
            Step::TooLarge => {
                let e = GatewayError::PayloadTooLarge {
                    limit: state.limits.body_limit,
                };
                proxy::record_refusal(
                    Endpoint::for_path(&req.path).unwrap_or(Endpoint::Chat),
                    &e,
                    &headers::request_id(None),
                    &proxy::tenant_label(state, None),
                );
                return finish_with(out, Ok(immediate(e))).await;
            }
            Step::OutOfOrder(why) => return Err(Status::invalid_argument(why)),
        }
    }
    let body = req.take();
    let decided = match pick(state, &req, body.clone(), subset.as_deref(), rotate).await {
        Ok(Ok((decided, destination, passed, remove))) => {
            let mut msgs = Vec::with_capacity(2 + passed.len() / protocol::MAX_BODY_CHUNK);
            let length = req.bodied.then_some(passed.len());
            msgs.push(protocol::destination_response(
                &destination,
                length,
                &remove,
                &[(state.request_id_header.as_str(), decided.rid.as_bytes())],
            ));
            if req.bodied {
                protocol::body_chunks(&passed, !req.trailers, true, &mut msgs);
            }
            if req.trailers {
                msgs.push(protocol::trailers_continue(true));
            }
            for m in msgs {
                if out.send(m).await.is_err() {
                    return Ok(());
                }
            }
            decided
        }
        Ok(Err(r)) => return finish_with(out, r).await,
        Err(Stop::Gone) => return Ok(()),
        Err(Stop::Status(s)) => return Err(s),
    };
    // The body was passed back: its place in the budget is free.
    drop(reserved);
    drop(body);
    match respond(state, &mut inbound, out, decided, started).await {
        Ok(()) | Err(Stop::Gone) => Ok(()),
        Err(Stop::Status(s)) => Err(s),
    }
}

/// Holds `held` bytes of body in the server's in-flight body budget.
async fn hold<'a>(
    state: &'a AppState,
    reserved: &mut Option<proxy::limits::budget::Reserved<'a>>,
    held: usize,
) -> Result<(), GatewayError> {
    let budget = &state.limits.budget;
    match reserved {
        None => *reserved = Some(budget.reserve(held).await?),
        Some(r) if held > r.num_permits() => {
            let more = held - r.num_permits();
            budget.grow(r, more).await?
        }
        Some(_) => {}
    }
    Ok(())
}

/// The decision, the destination list, the body to pass back and the request fields to remove
/// (what the proxy would not forward: a client's API key when keys are not forwarded, and
/// `x-kvgate-*` fields kvgate does not take from clients).
type Picked<'s> = (Decided<'s>, String, Bytes, Vec<String>);

/// Routes the complete request: through the proxy's admit + decide when it is an OpenAI
/// request with a body, else to a usable instance in turn. The inner `Err` is the answer (or
/// the failure-mode status) that ends the stream.
async fn pick<'s>(
    state: &'s AppState,
    req: &Request,
    body: Bytes,
    subset: Option<&[String]>,
    rotate: &AtomicUsize,
) -> Result<Result<Picked<'s>, Result<ProcessingResponse, Status>>, Stop> {
    let rid = headers::request_id(req.headers.get(&state.request_id_header));
    let endpoint = Endpoint::for_path(&req.path);
    let exclude = excluded(state, subset);
    let Some(endpoint) = endpoint.filter(|_| !body.is_empty()) else {
        // Nothing to route by (a GET, an unknown path): any usable instance, in turn.
        return Ok(match any_usable(state, &exclude, rotate) {
            Some(inst) => Ok((
                Decided {
                    adm: None,
                    routed: None,
                    endpoint: Endpoint::Chat,
                    sent: Instant::now(),
                    rid,
                },
                inst.authority.clone(),
                body,
                Vec::new(),
            )),
            None => {
                let e = GatewayError::NoHealthyInstance {
                    model: "(any)".into(),
                };
                Err(refusal(
                    state,
                    Endpoint::Chat,
                    e,
                    &rid,
                    &proxy::tenant_label(state, None),
                ))
            }
        });
    };
    let oh = OutHeaders::Map(&req.headers);
    let who = match headers::is_json(req.headers.get(http::header::CONTENT_TYPE))
        .map_err(GatewayError::UnsupportedMediaType)
        .and_then(|()| state.auth.check(&oh))
    {
        Ok(w) => w,
        Err(e) => {
            let label = proxy::tenant_label(state, None);
            metrics::record_tenant_request(&label);
            return Ok(Err(refusal(state, endpoint, e, &rid, &label)));
        }
    };
    let label = proxy::tenant_label(state, who.as_ref().map(|p| &p.tenant));
    metrics::record_tenant_request(&label);
    // The fields the proxy would not forward are removed here too, and the request is admitted
    // on what is left, as the proxy admits it.
    let (tenant_header, strip_key) = proxy::client_filter(state);
    let remove: Vec<http::HeaderName> = req
        .headers
        .keys()
        .filter(|n| !headers::from_client(n.as_str().as_bytes(), tenant_header, strip_key))
        .cloned()
        .collect();
    let kept;
    let oh = if remove.is_empty() {
        oh
    } else {
        let mut h = req.headers.clone();
        for n in &remove {
            h.remove(n);
        }
        kept = h;
        OutHeaders::Map(&kept)
    };
    let decided = async {
        let mut adm = proxy::admit(state, endpoint, &oh, body, who.as_ref()).await?;
        adm.prep.fallbacks = state.config.picker.fallbacks;
        let routed = proxy::decide(state, &mut adm, &exclude, None, &rid).await?;
        Ok::<_, GatewayError>((adm, routed))
    }
    .await;
    let (mut adm, routed) = match decided {
        Ok(d) => d,
        Err(e) => return Ok(Err(refusal(state, endpoint, e, &rid, &label))),
    };
    state.events.note_dispatch(routed.chosen);
    // Named to the gateway: from here the request is taken to be at the engine.
    adm.charge.at_engine(true);
    let mut destination = routed.instance.authority.clone();
    for f in &routed.fallbacks {
        destination.push(',');
        destination.push_str(&f.authority);
    }
    let passed = adm.body.clone();
    tracing::debug!(request_id = ?rid, %destination, matched_blocks = routed.matched_blocks, "endpoint picked");
    Ok(Ok((
        Decided {
            adm: Some(adm),
            routed: Some(routed),
            endpoint,
            sent: Instant::now(),
            rid,
        },
        destination,
        passed,
        remove.iter().map(|n| n.as_str().to_string()).collect(),
    )))
}

/// The instances outside the gateway's subset hint, if it gave one.
fn excluded(state: &AppState, subset: Option<&[String]>) -> Vec<InstanceId> {
    let Some(subset) = subset else {
        return Vec::new();
    };
    state
        .fleet
        .view()
        .serving()
        .filter(|i| !subset.iter().any(|s| *s == i.authority))
        .map(|i| i.id)
        .collect()
}

fn any_usable(
    state: &AppState,
    exclude: &[InstanceId],
    rotate: &AtomicUsize,
) -> Option<Arc<crate::fleet::Instance>> {
    let now = state.clock.now_ms();
    let view = state.fleet.view();
    let usable: Vec<_> = view
        .serving()
        .filter(|i| !exclude.contains(&i.id) && i.health.usable(now))
        .collect();
    if usable.is_empty() {
        return None;
    }
    let k = rotate.fetch_add(1, Ordering::Relaxed) % usable.len();
    Some(usable[k].clone())
}

/// The response side: headers, body chunks and trailers observed by the proxy's [`Tracker`]
/// and passed back unchanged, until the response ends; the stream ending first finishes the
/// request as a client gone (load released).
async fn respond(
    state: &AppState,
    inbound: &mut Streaming<ProcessingRequest>,
    out: &Out,
    mut decided: Decided<'_>,
    started: Instant,
) -> Result<(), Stop> {
    let idle = Duration::from_millis(state.config.upstream.idle_timeout_ms);
    let mut tracker: Option<Tracker> = None;
    let mut echo = Vec::new();
    loop {
        let msg = match next(inbound, idle).await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(()) => {
                if let Some(t) = tracker.as_mut() {
                    t.broke();
                }
                metrics::record_picker_failure("response_idle_timeout");
                return Err(Stop::Status(Status::deadline_exceeded(
                    "endpoint picker: no response message within upstream.idle_timeout_ms",
                )));
            }
        };
        match msg.request {
            Some(processing_request::Request::ResponseHeaders(h)) => {
                let mut status = 200u16;
                let mut sse = false;
                for hv in h.headers.iter().flat_map(|m| m.headers.iter()) {
                    let v = protocol::header_value(hv);
                    match hv.key.as_str() {
                        ":status" => {
                            status = std::str::from_utf8(v)
                                .ok()
                                .and_then(|s| s.parse().ok())
                                .unwrap_or(status)
                        }
                        "content-type" => {
                            sse = memchr::memmem::find(v, b"text/event-stream").is_some()
                        }
                        _ => {}
                    }
                }
                let served = protocol::served_endpoint(msg.metadata_context.as_ref());
                tracker = start_tracking(state, &mut decided, served, status, sse, started);
                // The client sees the id its decision is logged under, as from the proxy.
                let set = [(state.request_id_header.as_str(), decided.rid.as_bytes())];
                out.send(protocol::response_headers_continue(&set)).await?;
                if h.end_of_stream {
                    if let Some(t) = tracker.as_mut() {
                        t.complete();
                    }
                }
            }
            Some(processing_request::Request::ResponseBody(b)) => {
                if let Some(t) = tracker.as_mut() {
                    if !b.body.is_empty() {
                        t.observe(&b.body);
                    }
                    if b.end_of_stream {
                        t.complete();
                    }
                }
                echo.clear();
                protocol::body_chunks(&b.body, b.end_of_stream, false, &mut echo);
                for m in echo.drain(..) {
                    out.send(m).await?;
                }
            }
            Some(processing_request::Request::ResponseTrailers(_)) => {
                if let Some(t) = tracker.as_mut() {
                    t.complete();
                }
                out.send(protocol::trailers_continue(false)).await?;
            }
            // Late request trailers were answered with the body; anything else is out of order.
            Some(processing_request::Request::RequestTrailers(_)) => {}
            _ => {
                return Err(Stop::Status(Status::invalid_argument(
                    "request messages after the request was complete",
                )))
            }
        }
    }
}

/// The response started (`status`; `sse`: an event stream) on `served` (the gateway's report;
/// the chosen instance when it gives none): the proxy's [`Tracker`] takes over the decision's
/// load. A fallback that served is charged the load instead of the chosen instance, whose
/// prediction is taken back, and its times teach nothing.
fn start_tracking(
    state: &AppState,
    decided: &mut Decided<'_>,
    served: Option<&str>,
    status: u16,
    sse: bool,
    started: Instant,
) -> Option<Tracker> {
    let mut routed = decided.routed.take()?;
    let adm = decided.adm.as_mut()?;
    let mut inst = routed.instance.clone();
    let mut learn = true;
    if let Some(s) = served {
        let first = s.split(',').next().unwrap_or(s).trim();
        if first != inst.authority {
            if let Some(f) = routed.fallbacks.iter().find(|f| f.authority == first) {
                state.routing.served_elsewhere(&adm.prep, &routed, f.id);
                let size = routed.guard.size();
                routed.guard = state.routing.load().dispatch_sized(f.id, size);
                state.events.note_dispatch(f.id);
                inst = f.clone();
                learn = false;
            }
        }
    }
    inst.header_latency
        .observe(decided.sent.elapsed().as_secs_f64() * 1e3);
    proxy::note_answer(state, &inst, status);
    let mut t = Tracker::new(
        state.clone(),
        inst,
        decided.endpoint.index(),
        routed.guard,
        started,
        adm.stream || sse,
        routed.learning,
        status,
    );
    if !learn {
        t.without_learning();
    }
    t.dispatched(decided.sent, adm.gate.hand_over());
    if let Some(r) = adm.rate.take() {
        t.charge_to(r.tenant, r.label.clone());
    }
    Some(t)
}

/// Keeps the gRPC health services current: `liveness` always serving; `readiness` and the
/// ext_proc service serving while some instance is usable and shutdown has not started.
async fn readiness(
    reporter: tonic_health::server::HealthReporter,
    state: AppState,
    stop: tokio_util::sync::CancellationToken,
) {
    use tonic_health::ServingStatus;
    reporter
        .set_service_status(HEALTH_LIVENESS, ServingStatus::Serving)
        .await;
    let mut tick = tokio::time::interval(READINESS_INTERVAL);
    let mut last = None;
    loop {
        let now = state.clock.now_ms();
        let ready =
            !state.is_draining() && state.fleet.view().serving().any(|i| i.health.usable(now));
        if last != Some(ready) {
            let s = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for svc in ["", HEALTH_READINESS, EXT_PROC_SERVICE] {
                reporter.set_service_status(svc, s).await;
            }
            last = Some(ready);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
    }
}

/// Serves the endpoint picker (ext_proc and gRPC health) on `listener` until `shutdown`
/// resolves; streams still open then get `server.shutdown_grace_ms` to end.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let stop = tokio_util::sync::CancellationToken::new();
    let ready = tokio::spawn(readiness(reporter, state.clone(), stop.clone()));
    let grace = Duration::from_millis(state.config.server.shutdown_grace_ms);
    // Every accepted connection without Nagle's delay: the destination and the body passed
    // back are separate writes, and a gateway that delays its ACKs would otherwise hold the
    // second for its ACK timer (~40 ms measured by benches/picker.rs). The builder's
    // tcp_nodelay applies only to listeners tonic binds itself.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            conn.and_then(|s| {
                s.set_nodelay(true)?;
                Ok(s)
            })
        },
    );
    let signalled = stop.clone();
    let server = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(ExternalProcessorServer::new(Picker::new(state)))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            signalled.cancel();
        });
    let served = tokio::select! {
        r = server => r.map_err(std::io::Error::other),
        // Streams still open a grace period after the signal are dropped with the server.
        _ = async { stop.cancelled().await; tokio::time::sleep(grace).await } => Ok(()),
    };
    stop.cancel();
    let _ = ready.await;
    served
}
