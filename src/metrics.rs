//! Every metric the gateway exports: names, help texts and histogram buckets, in one file.
//!
//! Invariants:
//! - Label values come from bounded sets only: configured pool models and instance names, route
//!   names, status classes, error codes ([`crate::error::GatewayError::code`]), policy names and
//!   decision reasons. Never prompt text, request ids or error messages.
//! - The Prometheus recorder is process-global (the `metrics` facade allows one); [`install`] is
//!   idempotent so several gateways in one test process share it.

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Requests answered, by route, pool, instance and status class.
pub const REQUESTS: &str = "kvgate_requests_total";
/// Request duration from arrival to the end of the response body, by route and pool.
pub const REQUEST_DURATION: &str = "kvgate_request_duration_seconds";
/// Time from arrival to the first response body chunk of streaming requests, by pool and instance.
pub const TTFT: &str = "kvgate_time_to_first_token_seconds";
/// Upstream failures by instance and cause.
pub const UPSTREAM_ERRORS: &str = "kvgate_upstream_errors_total";
/// Requests in flight per instance.
pub const IN_FLIGHT: &str = "kvgate_in_flight_requests";
/// Retries on another instance, by pool and cause.
pub const RETRIES: &str = "kvgate_retries_total";
/// Counter: predictions taken back because their request did not reach the instance.
pub const RETRACTIONS: &str = "kvgate_prediction_retractions_total";
/// Counter: ext_proc streams the endpoint picker could not serve itself, by bounded reason
/// (`max_streams`, `idle_timeout`, `response_idle_timeout`).
pub const PICKER_FAILURES: &str = "kvgate_picker_failures_total";
/// Requests rejected by the gateway itself, by error code.
pub const REJECTED: &str = "kvgate_rejected_requests_total";
/// Requests answered per tenant (label: the keys file's tenants, `anonymous` without keys,
/// `unauthenticated` for requests without a valid key).
pub const TENANT_REQUESTS: &str = "kvgate_tenant_requests_total";
/// Requests the gateway refused per tenant, by reason ([`crate::error::GatewayError::audit_reason`]).
pub const TENANT_REJECTIONS: &str = "kvgate_tenant_rejections_total";
/// Tokens charged to a tenant's rate limit, by kind (`prompt`, `output`).
pub const TENANT_TOKENS: &str = "kvgate_tenant_tokens_charged_total";
/// Instance health (1 usable, 0 unhealthy or ejected).
pub const INSTANCE_HEALTHY: &str = "kvgate_instance_healthy";
/// Passive ejections after consecutive connect failures.
pub const EJECTIONS: &str = "kvgate_instance_ejections_total";
/// Fraction of a prompt's blocks the chosen instance held.
pub const MATCHED_PREFIX_RATIO: &str = "kvgate_routing_matched_prefix_ratio";
/// Time to hash a prompt and decide where it goes.
pub const DECISION_DURATION: &str = "kvgate_routing_decision_duration_seconds";
/// Decisions by policy and reason.
pub const DECISIONS: &str = "kvgate_routing_decisions_total";
/// Requests waiting in a pool's admission queue.
pub const ADMISSION_QUEUE_DEPTH: &str = "kvgate_admission_queue_depth";
/// Requests admission control turned away, by pool and reason.
pub const ADMISSION_REJECTIONS: &str = "kvgate_admission_rejections_total";
/// Time admitted requests waited in their pool's admission queue, by pool.
pub const ADMISSION_WAIT: &str = "kvgate_admission_queue_wait_seconds";
/// Client connections open, as of the scrape.
pub const CONNECTIONS_OPEN: &str = "kvgate_connections_open";
/// Client connections the gateway closed because a limit was hit, by reason (one of
/// [`CLOSE_REASONS`]).
pub const CONNECTIONS_CLOSED: &str = "kvgate_connections_closed_total";
/// Idle client connections closed at the connection cap to admit a new one, by reason (one of
/// [`EVICT_REASONS`]).
pub const CONNECTIONS_EVICTED: &str = "kvgate_connections_evicted_total";
/// TLS handshakes with clients that failed, by reason (`timeout` or `error`).
pub const TLS_HANDSHAKE_FAILURES: &str = "kvgate_tls_handshake_failures_total";
/// Reloads of the listener's certificate and key, by outcome (`ok` or `error`).
pub const TLS_RELOADS: &str = "kvgate_tls_cert_reloads_total";
/// Reloads of `[upstream.tls]` files (CA bundle, client certificate), by outcome.
pub const UPSTREAM_TLS_RELOADS: &str = "kvgate_upstream_tls_reloads_total";
/// Request body bytes held in the in-flight body budget, as of the scrape.
pub const BODY_BUDGET_IN_FLIGHT: &str = "kvgate_body_budget_in_flight_bytes";
/// Instances of a pool by state (`serving`, `draining`), as of the last membership change.
pub const POOL_INSTANCES: &str = "kvgate_pool_instances";
/// Membership changes by pool and kind (`added`, `removed`, `revived`, `refused`).
pub const DISCOVERY_CHANGES: &str = "kvgate_discovery_changes_total";
/// 1 while a discovered pool's source refreshes, 0 while it fails (the last set is kept).
pub const DISCOVERY_UP: &str = "kvgate_discovery_up";
/// Placement index entries by source (`event`, `local`, `peer`), as of the scrape.
pub const INDEX_ENTRIES: &str = "kvgate_index_entries";
/// Distinct block hashes in the placement index, as of the scrape.
pub const INDEX_BLOCKS: &str = "kvgate_index_blocks";
/// Estimated heap bytes of the placement index, as of the scrape.
pub const INDEX_MEMORY: &str = "kvgate_index_memory_bytes";
/// Index entries evicted for capacity since start.
pub const INDEX_EVICTED: &str = "kvgate_index_evicted_total";
/// Predicted index entries expired since start.
pub const INDEX_EXPIRED: &str = "kvgate_index_expired_total";
/// Token cache lookups that found a segment's ids, by pool (token mode).
pub const TOKEN_CACHE_HITS: &str = "kvgate_tokenizer_cache_hits_total";
/// Token cache lookups that had to encode, by pool.
pub const TOKEN_CACHE_MISSES: &str = "kvgate_tokenizer_cache_misses_total";
/// Token cache segments evicted to stay within `routing.tokenizer_cache_bytes`, by pool.
pub const TOKEN_CACHE_EVICTIONS: &str = "kvgate_tokenizer_cache_evictions_total";
/// Bytes the token cache holds, by pool, as of the scrape.
pub const TOKEN_CACHE_BYTES: &str = "kvgate_tokenizer_cache_bytes";

/// Label values of [`INDEX_ENTRIES`], in `IndexStats::entries_by_source` order.
const INDEX_SOURCES: [&str; 3] = ["event", "local", "peer"];

/// Why the gateway closed a client connection (the label values of [`CONNECTIONS_CLOSED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// A head was not complete within the header read timeout.
    HeaderTimeout,
    /// A declared body was not complete within the body read timeout.
    BodyTimeout,
    /// No request began within the idle timeout.
    IdleTimeout,
    /// The client stopped reading an answer for longer than the write timeout.
    WriteTimeout,
    /// Refused at accept: the connection cap was reached.
    OverCapacity,
    /// A body did not fit the in-flight body budget.
    BodyBudget,
}

/// Every [`CloseReason`] label value.
pub const CLOSE_REASONS: [&str; 6] = [
    "header_timeout",
    "body_timeout",
    "idle_timeout",
    "write_timeout",
    "over_capacity",
    "body_budget",
];

impl CloseReason {
    /// The label value.
    pub fn label(self) -> &'static str {
        CLOSE_REASONS[self as usize]
    }
}

/// What an idle connection evicted at the cap was waiting in (the label values of
/// [`CONNECTIONS_EVICTED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictReason {
    /// Accepted and no byte of a request received yet.
    Fresh,
    /// Kept alive after an answer, no byte of the next request received yet.
    KeepAlive,
}

/// Every [`EvictReason`] label value.
pub const EVICT_REASONS: [&str; 2] = ["fresh", "keep_alive"];

/// Counts an idle connection evicted at the cap (only at the cap: the registry lookup is fine).
pub fn record_connection_evicted(reason: EvictReason) {
    counter!(CONNECTIONS_EVICTED, "reason" => EVICT_REASONS[reason as usize]).increment(1);
}

/// A connection closed because a limit was hit (rare: the registry lookup is fine here).
pub fn record_connection_closed(reason: CloseReason) {
    counter!(CONNECTIONS_CLOSED, "reason" => reason.label()).increment(1);
}

/// Counts a failed client TLS handshake: `timed_out` or another failure.
pub fn record_tls_handshake_failure(timed_out: bool) {
    let reason = if timed_out { "timeout" } else { "error" };
    counter!(TLS_HANDSHAKE_FAILURES, "reason" => reason).increment(1);
}

/// Counts a certificate reload attempt on a change of the files.
pub fn record_tls_reload(ok: bool) {
    counter!(TLS_RELOADS, "outcome" => if ok { "ok" } else { "error" }).increment(1);
}

/// Counts a reload attempt of the `[upstream.tls]` files on a change.
pub fn record_upstream_tls_reload(ok: bool) {
    counter!(UPSTREAM_TLS_RELOADS, "outcome" => if ok { "ok" } else { "error" }).increment(1);
}

/// Sets the connection and body-budget gauges. Set when `/metrics` is scraped, not moved per
/// connection or request (see [`InstanceMetrics::set_in_flight`]).
pub fn set_limits_usage(connections: usize, body_bytes: usize) {
    gauge!(CONNECTIONS_OPEN).set(connections as f64);
    gauge!(BODY_BUDGET_IN_FLIGHT).set(body_bytes as f64);
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 60.0,
];
const RATIO_BUCKETS: &[f64] = &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0];
const DECISION_BUCKETS: &[f64] = &[
    0.000_002, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.005,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the Prometheus recorder once per process and returns its handle.
pub fn install() -> Result<PrometheusHandle, String> {
    HANDLE.get_or_init(build).clone()
}

fn build() -> Result<PrometheusHandle, String> {
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in [
        (REQUEST_DURATION, LATENCY_BUCKETS),
        (TTFT, TTFT_BUCKETS),
        (MATCHED_PREFIX_RATIO, RATIO_BUCKETS),
        (DECISION_DURATION, DECISION_BUCKETS),
        (ADMISSION_WAIT, LATENCY_BUCKETS),
        (
            kvgate_gossip::metrics::CONVERGENCE_LAG_SECONDS,
            kvgate_gossip::metrics::LAG_BUCKETS,
        ),
    ] {
        b = b
            .set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)
            .map_err(|e| e.to_string())?;
    }
    let handle = b.install_recorder().map_err(|e| e.to_string())?;
    describe_counter!(
        REQUESTS,
        "Requests answered, by route, pool, instance and status class."
    );
    describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Request duration from arrival to the end of the response body."
    );
    describe_histogram!(
        TTFT,
        metrics::Unit::Seconds,
        "Time from arrival to the first streamed response chunk."
    );
    describe_counter!(UPSTREAM_ERRORS, "Upstream failures by instance and cause.");
    describe_gauge!(
        IN_FLIGHT,
        "Requests dispatched to each instance and not finished, as of the scrape."
    );
    describe_counter!(RETRIES, "Retries on another instance, by pool and cause.");
    describe_counter!(
        RETRACTIONS,
        "Routing predictions taken back (locally and through gossip): the attempt was refused, or admission control held the request back."
    );
    describe_counter!(REJECTED, "Requests rejected by the gateway, by error code.");
    describe_counter!(
        PICKER_FAILURES,
        "Endpoint picker streams ended for a reason of the picker's own (stream cap, idle stream), answered by picker.failure_mode."
    );
    describe_counter!(TENANT_REQUESTS, "Requests answered per tenant.");
    describe_counter!(
        TENANT_REJECTIONS,
        "Requests the gateway refused per tenant, by reason."
    );
    describe_counter!(
        TENANT_TOKENS,
        "Tokens charged to tenants' rate limits, by kind (prompt, output), and prompt tokens given back (refunded) to requests that failed before an engine held them."
    );
    describe_gauge!(
        INSTANCE_HEALTHY,
        "1 when the instance receives traffic, 0 when unhealthy or ejected."
    );
    describe_counter!(
        EJECTIONS,
        "Passive ejections after consecutive connect failures."
    );
    describe_histogram!(
        MATCHED_PREFIX_RATIO,
        "Fraction of the prompt's blocks held by the chosen instance."
    );
    describe_histogram!(
        DECISION_DURATION,
        metrics::Unit::Seconds,
        "Time to hash a prompt and choose an instance."
    );
    describe_counter!(DECISIONS, "Routing decisions by policy and reason.");
    describe_gauge!(
        ADMISSION_QUEUE_DEPTH,
        "Requests waiting in the pool's admission queue."
    );
    describe_counter!(
        ADMISSION_REJECTIONS,
        "Requests admission control rejected with 429, by pool and reason (queue_full, wait_timeout, shed)."
    );
    describe_histogram!(
        ADMISSION_WAIT,
        metrics::Unit::Seconds,
        "Time admitted requests waited in the pool's admission queue."
    );
    describe_gauge!(
        CONNECTIONS_OPEN,
        "Client connections open, as of the scrape."
    );
    describe_counter!(
        CONNECTIONS_CLOSED,
        "Client connections closed because a limit was hit, by reason."
    );
    describe_counter!(
        CONNECTIONS_EVICTED,
        "Idle client connections closed at the connection cap to admit a new one, by reason."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "Client TLS handshakes that failed, by reason."
    );
    describe_counter!(
        TLS_RELOADS,
        "Reloads of the listener's certificate and key after the files changed, by outcome."
    );
    describe_counter!(
        UPSTREAM_TLS_RELOADS,
        "Reloads of the upstream TLS files (CA bundle, client certificate) after they changed, by outcome."
    );
    describe_gauge!(
        BODY_BUDGET_IN_FLIGHT,
        metrics::Unit::Bytes,
        "Request body bytes held in the in-flight body budget, as of the scrape."
    );
    describe_gauge!(
        POOL_INSTANCES,
        "Instances of the pool by state (serving, draining)."
    );
    describe_counter!(
        DISCOVERY_CHANGES,
        "Membership changes by pool and kind (added, removed, revived; refused and other_model count endpoints left out, per look)."
    );
    describe_gauge!(
        DISCOVERY_UP,
        "1 while the pool's discovery source refreshes, 0 while it fails (the last set is kept)."
    );
    describe_gauge!(
        INDEX_ENTRIES,
        "Placement index (block, instance) entries by source (event, local, peer), as of the scrape."
    );
    describe_gauge!(
        INDEX_BLOCKS,
        "Distinct block hashes in the placement index, as of the scrape."
    );
    describe_gauge!(
        INDEX_MEMORY,
        metrics::Unit::Bytes,
        "Estimated heap bytes held by the placement index, as of the scrape."
    );
    describe_counter!(
        INDEX_EVICTED,
        "Placement index entries evicted for capacity."
    );
    describe_counter!(
        INDEX_EXPIRED,
        "Predicted placement index entries expired by their TTL."
    );
    describe_counter!(
        TOKEN_CACHE_HITS,
        "Token cache lookups that found a prompt segment's ids (token mode), by pool."
    );
    describe_counter!(
        TOKEN_CACHE_MISSES,
        "Token cache lookups that had to encode the segment, by pool."
    );
    describe_counter!(
        TOKEN_CACHE_EVICTIONS,
        "Token cache segments evicted to stay within routing.tokenizer_cache_bytes, by pool."
    );
    describe_gauge!(
        TOKEN_CACHE_BYTES,
        metrics::Unit::Bytes,
        "Bytes the token cache holds, by pool, as of the scrape."
    );
    Ok(handle)
}

/// Sets the placement index gauges from `stats`. Set when `/metrics` is scraped: the index's own
/// counters are the truth, so nothing on the request path moves a metric for it.
pub fn set_index_stats(stats: &kvgate_core::index::IndexStats) {
    for (source, &n) in INDEX_SOURCES.iter().zip(&stats.entries_by_source) {
        gauge!(INDEX_ENTRIES, "source" => *source).set(n as f64);
    }
    gauge!(INDEX_BLOCKS).set(stats.blocks as f64);
    gauge!(INDEX_MEMORY).set(stats.memory_bytes as f64);
    counter!(INDEX_EVICTED).absolute(stats.evicted);
    counter!(INDEX_EXPIRED).absolute(stats.expired);
}

/// Sets `pool`'s token cache series from `stats`, at scrape time (the cache's own counters are
/// the truth).
pub fn set_token_cache_stats(pool: &str, stats: &kvgate_tokenizer::CacheStats) {
    counter!(TOKEN_CACHE_HITS, "pool" => pool.to_string()).absolute(stats.hits);
    counter!(TOKEN_CACHE_MISSES, "pool" => pool.to_string()).absolute(stats.misses);
    counter!(TOKEN_CACHE_EVICTIONS, "pool" => pool.to_string()).absolute(stats.evictions);
    gauge!(TOKEN_CACHE_BYTES, "pool" => pool.to_string()).set(stats.bytes as f64);
}

/// A pool's membership: instances serving and draining (a static pool's once, at start; a
/// discovered pool's after every change).
pub fn set_pool_instances(pool: &str, serving: usize, draining: usize) {
    gauge!(POOL_INSTANCES, "pool" => pool.to_string(), "state" => "serving").set(serving as f64);
    gauge!(POOL_INSTANCES, "pool" => pool.to_string(), "state" => "draining").set(draining as f64);
}

/// `n` membership changes of `kind` in `pool`.
pub fn record_discovery_changes(pool: &str, kind: &'static str, n: usize) {
    if n > 0 {
        counter!(DISCOVERY_CHANGES, "pool" => pool.to_string(), "change" => kind)
            .increment(n as u64);
    }
}

/// Whether `pool`'s discovery source refreshes.
pub fn set_discovery_up(pool: &str, up: bool) {
    gauge!(DISCOVERY_UP, "pool" => pool.to_string()).set(if up { 1.0 } else { 0.0 });
}

/// HTTP status class label (`2xx`, `4xx`, ...); `cancelled` when the client went away first.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Route labels, indexed by `Endpoint::index`.
pub const ROUTES: [&str; 4] = ["chat_completions", "completions", "embeddings", "responses"];
/// Status class labels; [`CANCELLED`] is the client going away before the end.
pub const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "cancelled"];
/// Index of `cancelled` in [`CLASSES`].
pub const CANCELLED: usize = 5;

/// Index in [`CLASSES`] of an HTTP status.
pub fn class_index(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// `text` (Prometheus exposition format) without the samples labelled with an `instance` in
/// `gone`. `# HELP` / `# TYPE` lines stay: other series of the metric may remain.
pub fn without_instances(text: &str, gone: &std::collections::HashSet<String>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let drop = !line.starts_with('#')
            && instance_label(line).is_some_and(|name| gone.contains(name.as_ref()));
        if !drop {
            out.push_str(line);
        }
    }
    out
}

/// The value of a sample line's `instance` label, unescaped.
fn instance_label(line: &str) -> Option<std::borrow::Cow<'_, str>> {
    let open = line.find('{')?;
    let labels = &line[open + 1..];
    let mut rest = labels;
    loop {
        let eq = rest.find("=\"")?;
        let key = rest[..eq].trim_start_matches(',').trim();
        let body = &rest[eq + 2..];
        // The value runs to the first quote not escaped by a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end?;
        let raw = &body[..end];
        if key == "instance" {
            return Some(if raw.contains('\\') {
                std::borrow::Cow::Owned(unescape_label(raw))
            } else {
                std::borrow::Cow::Borrowed(raw)
            });
        }
        rest = &body[end + 1..];
        if !rest.starts_with(',') {
            return None;
        }
    }
}

/// A label value with the exposition format's escapes (`\\`, `\"`, `\n`) undone.
fn unescape_label(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Pre-registered per-instance handles, so the request path does no registry lookups.
/// Must be built after [`install`].
pub struct InstanceMetrics {
    requests: Vec<Counter>,
    duration: Vec<Histogram>,
    ttft: Histogram,
    in_flight: Gauge,
    healthy: Gauge,
}

impl InstanceMetrics {
    /// Handles for `instance` of `pool`.
    pub fn new(pool: &str, instance: &str) -> Self {
        let mut requests = Vec::with_capacity(ROUTES.len() * CLASSES.len());
        for route in ROUTES {
            for class in CLASSES {
                requests.push(counter!(REQUESTS, "route" => route, "pool" => pool.to_string(), "instance" => instance.to_string(), "status" => class));
            }
        }
        let duration = ROUTES
            .iter()
            .map(
                |route| histogram!(REQUEST_DURATION, "route" => *route, "pool" => pool.to_string()),
            )
            .collect();
        Self {
            requests,
            duration,
            ttft: histogram!(TTFT, "pool" => pool.to_string(), "instance" => instance.to_string()),
            in_flight: gauge!(IN_FLIGHT, "instance" => instance.to_string()),
            healthy: gauge!(INSTANCE_HEALTHY, "pool" => pool.to_string(), "instance" => instance.to_string()),
        }
    }

    /// One finished (or abandoned) request on `route` (index in [`ROUTES`]).
    pub fn finish(&self, route: usize, class: usize, seconds: f64) {
        if let Some(c) = self.requests.get(route * CLASSES.len() + class) {
            c.increment(1);
        }
        if let Some(h) = self.duration.get(route) {
            h.record(seconds);
        }
    }

    /// First streamed chunk after `seconds`.
    pub fn ttft(&self, seconds: f64) {
        self.ttft.record(seconds);
    }

    /// Sets the in-flight gauge. Set from the router's load tracker when `/metrics` is scraped,
    /// not moved per request: a shared gauge updated by every serving thread on every request
    /// costs each of them the cache line.
    pub fn set_in_flight(&self, requests: u32) {
        self.in_flight.set(f64::from(requests));
    }

    /// Current health: 1 usable, 0 unhealthy, ejected or draining.
    pub fn set_healthy(&self, usable: bool) {
        self.healthy.set(if usable { 1.0 } else { 0.0 });
    }
}

/// Pre-registered admission handles of one pool. Must be built after [`install`].
pub struct AdmissionMetrics {
    depth: Gauge,
    wait: Histogram,
    /// Indexed like `RejectReason::ALL`.
    rejected: [Counter; 3],
}

impl AdmissionMetrics {
    /// Handles for `pool`.
    pub fn new(pool: &str) -> Self {
        use kvgate_core::admission::RejectReason;
        Self {
            depth: gauge!(ADMISSION_QUEUE_DEPTH, "pool" => pool.to_string()),
            wait: histogram!(ADMISSION_WAIT, "pool" => pool.to_string()),
            rejected: RejectReason::ALL.map(|r| {
                counter!(ADMISSION_REJECTIONS, "pool" => pool.to_string(), "reason" => r.as_str())
            }),
        }
    }

    /// The queue now holds `n` requests.
    pub fn depth(&self, n: usize) {
        self.depth.set(n as f64);
    }

    /// A request admitted after waiting `seconds`.
    pub fn waited(&self, seconds: f64) {
        self.wait.record(seconds);
    }

    /// A request rejected for `reason`.
    pub fn rejected(&self, reason: kvgate_core::admission::RejectReason) {
        if let Some(c) = kvgate_core::admission::RejectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| self.rejected.get(i))
        {
            c.increment(1);
        }
    }
}

/// A request the gateway rejected before choosing an instance.
pub fn record_rejected(route: &'static str, code: &'static str, class: &'static str) {
    counter!(REJECTED, "route" => route, "code" => code).increment(1);
    counter!(REQUESTS, "route" => route, "pool" => "", "instance" => "", "status" => class)
        .increment(1);
}

/// A request of `tenant` answered (refused or not).
pub fn record_tenant_request(tenant: &str) {
    // Handles taken before the recorder exists would stay no-ops forever: cache only after.
    if !HANDLE.get().is_some_and(|h| h.is_ok()) {
        counter!(TENANT_REQUESTS, "tenant" => tenant.to_string()).increment(1);
        return;
    }
    TENANT_REQUEST_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, c)) = cache.iter().find(|(t, _)| &**t == tenant) {
            c.increment(1);
            return;
        }
        if cache.len() >= TENANT_CACHE_CAP {
            cache.clear();
        }
        let c = counter!(TENANT_REQUESTS, "tenant" => tenant.to_string());
        c.increment(1);
        cache.push((tenant.into(), c));
    });
}

/// Bound on the per-thread cache of per-tenant request counters: past it the cache starts over,
/// so a fleet of many tenants costs a registry lookup per request, as without the cache.
const TENANT_CACHE_CAP: usize = 64;

thread_local! {
    /// Per-thread request counters by tenant for [`record_tenant_request`]: no label allocation,
    /// key hashing and registry lock per request.
    static TENANT_REQUEST_CACHE: std::cell::RefCell<Vec<(Box<str>, Counter)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A request of `tenant` refused for `reason`.
pub fn record_tenant_rejection(tenant: &str, reason: &'static str) {
    counter!(TENANT_REJECTIONS, "tenant" => tenant.to_string(), "reason" => reason).increment(1);
}

/// `n` tokens of `kind` (`prompt` or `output`) charged to `tenant`'s rate limit, or given back
/// (`refunded`).
pub fn record_tenant_tokens(tenant: &str, kind: &'static str, n: u64) {
    if n > 0 {
        counter!(TENANT_TOKENS, "tenant" => tenant.to_string(), "kind" => kind).increment(n);
    }
}

/// First streamed chunk.
pub fn record_ttft(pool: &str, instance: &str, seconds: f64) {
    histogram!(TTFT, "pool" => pool.to_string(), "instance" => instance.to_string())
        .record(seconds);
}

/// An upstream failure; `cause` is one of `connect`, `closed`, `timeout`, `status_5xx`,
/// `protocol`, `idle_timeout`, `body`.
pub fn record_upstream_error(instance: &str, cause: &'static str) {
    counter!(UPSTREAM_ERRORS, "instance" => instance.to_string(), "cause" => cause).increment(1);
}

/// A retry on another instance; `cause` is one of `connect`, `closed`, `status`.
pub fn record_retry(pool: &str, cause: &'static str) {
    counter!(RETRIES, "pool" => pool.to_string(), "cause" => cause).increment(1);
}

/// The endpoint picker could not serve a stream itself (`reason`: a fixed set).
pub fn record_picker_failure(reason: &str) {
    let reason: &'static str = match reason {
        "max_streams" => "max_streams",
        "idle_timeout" => "idle_timeout",
        "response_idle_timeout" => "response_idle_timeout",
        _ => "other",
    };
    counter!(PICKER_FAILURES, "reason" => reason).increment(1);
}

/// A prediction was taken back.
pub fn record_retraction() {
    counter!(RETRACTIONS).increment(1);
}

/// A passive ejection.
pub fn record_ejection(instance: &str) {
    counter!(EJECTIONS, "instance" => instance.to_string()).increment(1);
}

/// Handles of one (policy, reason) pair, as [`record_decision`] caches them.
struct DecisionHandles {
    key: (usize, usize, usize, usize),
    decisions: Counter,
    duration: Histogram,
    /// Registered on the first ratio, so a policy that never reports one exports no series.
    ratio: Option<Histogram>,
}

/// Bound on the per-thread cache of decision handles (policies × reasons is small and fixed).
const DECISION_CACHE_CAP: usize = 64;

thread_local! {
    /// Per-thread handles for [`record_decision`], keyed by the label strings' addresses, so the
    /// request path does no registry lookup (label hashing, allocation, a sharded lock).
    static DECISION_CACHE: std::cell::RefCell<Vec<DecisionHandles>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// One routing decision.
pub fn record_decision(
    policy: &'static str,
    reason: &'static str,
    matched_ratio: Option<f64>,
    seconds: f64,
) {
    // Handles taken before the recorder exists would stay no-ops forever: cache only after.
    if !HANDLE.get().is_some_and(|h| h.is_ok()) {
        counter!(DECISIONS, "policy" => policy, "reason" => reason).increment(1);
        histogram!(DECISION_DURATION, "policy" => policy).record(seconds);
        if let Some(r) = matched_ratio {
            histogram!(MATCHED_PREFIX_RATIO, "policy" => policy).record(r);
        }
        return;
    }
    let key = (
        policy.as_ptr() as usize,
        policy.len(),
        reason.as_ptr() as usize,
        reason.len(),
    );
    DECISION_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let i = match cache.iter().position(|h| h.key == key) {
            Some(i) => i,
            None => {
                if cache.len() >= DECISION_CACHE_CAP {
                    cache.clear();
                }
                cache.push(DecisionHandles {
                    key,
                    decisions: counter!(DECISIONS, "policy" => policy, "reason" => reason),
                    duration: histogram!(DECISION_DURATION, "policy" => policy),
                    ratio: None,
                });
                cache.len() - 1
            }
        };
        let h = &mut cache[i];
        h.decisions.increment(1);
        h.duration.record(seconds);
        if let Some(r) = matched_ratio {
            h.ratio
                .get_or_insert_with(|| histogram!(MATCHED_PREFIX_RATIO, "policy" => policy))
                .record(r);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn leaves_out_only_the_gone_instances_samples() {
        let text = "# HELP kvgate_in_flight_requests x\n\
                    # TYPE kvgate_in_flight_requests gauge\n\
                    kvgate_in_flight_requests{instance=\"gone\"} 3\n\
                    kvgate_in_flight_requests{instance=\"gone-2\"} 1\n\
                    kvgate_instance_healthy{pool=\"m\",instance=\"gone\"} 0\n\
                    kvgate_requests_total{route=\"chat\",pool=\"m\",instance=\"\",status=\"4xx\"} 2\n\
                    kvgate_pool_instances{pool=\"gone\",state=\"serving\"} 1\n\
                    kvgate_odd{pool=\"a\\\"instance=\\\"gone\",instance=\"kept\"} 1\n\
                    kvgate_esc{instance=\"we\\\"ird\"} 1\n\
                    kvgate_uptime 5\n";
        let gone: HashSet<String> = ["gone".to_string(), "we\"ird".to_string()].into();
        let out = without_instances(text, &gone);
        assert_eq!(
            out,
            "# HELP kvgate_in_flight_requests x\n\
             # TYPE kvgate_in_flight_requests gauge\n\
             kvgate_in_flight_requests{instance=\"gone-2\"} 1\n\
             kvgate_requests_total{route=\"chat\",pool=\"m\",instance=\"\",status=\"4xx\"} 2\n\
             kvgate_pool_instances{pool=\"gone\",state=\"serving\"} 1\n\
             kvgate_odd{pool=\"a\\\"instance=\\\"gone\",instance=\"kept\"} 1\n\
             kvgate_uptime 5\n"
        );
        assert_eq!(without_instances(text, &HashSet::new()), text);
    }
}
