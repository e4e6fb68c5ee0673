//! # kvgate: a cache-aware request router for LLM inference fleets
//!
//! kvgate is an HTTP gateway in front of vLLM / SGLang / any OpenAI-compatible instances. For each
//! request it hashes the prompt's prefix into block hashes, asks the KV placement index which
//! instances already hold how much of it, scores the healthy instances on what the cache saves
//! versus what their queues cost, and proxies the request there (SSE streaming included).
//!
//! # Layout
//!
//! The workspace, top to bottom (arrows point down only):
//!
//! - `src/main.rs` — the `kvgate` binary: flags, config loading, logging, signals; `kvgate sim`
//!   runs the engine simulator; `kvgate healthcheck` probes a running gateway (container
//!   `HEALTHCHECK`).
//! - [`app`] — [`app::AppState`], [`app::router`] (admin surface and the proxied routes; with
//!   `server.admin_listen` the admin surface only on [`app::admin_router`], served on that
//!   second listener) and [`app::run`] (serve a bound listener until a shutdown future
//!   resolves, then drain for the grace period, through the binary's own serving path);
//!   starts the background tasks
//!   (health, scrapes, models, index expiry, KV events) and, when enabled, replica gossip.
//! - [`proxy`] — the OpenAI endpoints: body read once under a limit, routing fields parsed by
//!   borrowing ([`proxy::parse`] over the validating reader [`proxy::json`]), original bytes
//!   forwarded, SSE relayed frame by frame ([`proxy::body`]), retries before the first byte
//!   only; served thread-per-core ([`proxy::server`]): plain proxied `POST`s on kvgate's own
//!   HTTP/1.1 loop ([`proxy::h1`]), any other request through hyper, with the proxied routes
//!   going straight to the same handler and everything else through the axum router
//!   ([`proxy::service`]); [`proxy::limits`] holds both paths to the same timeouts,
//!   connection cap (at the cap the longest-idle connection gives its place to a new one) and
//!   in-flight body budget; token-mode parsing and tokenizing of large bodies
//!   run on a bounded set of blocking threads ([`proxy::offload`]). A request's "admit + decide"
//!   ([`proxy::admit`], [`proxy::decide`]) and its response observation
//!   ([`proxy::body::Tracker`]) are the steps the endpoint picker shares.
//! - [`picker`] — the second door: a Gateway API Inference Extension endpoint picker, Envoy's
//!   `ext_proc` gRPC service on its own port (`[picker]`), beside the HTTP listener and over the
//!   same state. Each stream's request body is gathered ([`picker::stream`]), routed through the
//!   proxy's own [`proxy::admit`] and [`proxy::decide`], answered with the endpoint header and
//!   `envoy.lb` metadata ([`picker::protocol`]); the response is observed by the proxy's
//!   [`proxy::body::Tracker`], so load, learned rates, gossip and `/admin/decisions` work as in
//!   proxy mode.
//! - [`admission`] — admission control: while every usable instance of a pool is saturated
//!   (predicted time to first token over a bound, or in-flight requests at a capacity), requests
//!   wait in the pool's queue (`kvgate_core::admission`: priority classes, token-fair tenant
//!   share) and are admitted as requests on the pool finish; 429 with `Retry-After` when the
//!   queue is full, the wait bound passes or a request is shed.
//! - [`ratelimit`] — per-tenant rate limits (requests/s, tokens/min) over
//!   `kvgate_core::ratelimit`: checked before admission, output charged as it streams, prompt
//!   tokens given back to a request that fails while no engine holds it, OpenAI's
//!   `x-ratelimit-*` headers, usage shared with gossip peers so replicas enforce one budget.
//! - [`admin`] — `/health`, `/ready`, `/metrics`, `/v1/models`, `/admin/*`.
//! - [`routing`] — the only caller of the routing core: prompt → block hashes → usable instances
//!   offered to `kvgate_core::router::Router::route` (index match → policy decision → prediction +
//!   load guard, the sequence the offline simulator runs too), gossip as its peer plane; feeds
//!   first tokens and finished streams back to the learned rates; keeps the decision log
//!   ([`decision_log`], sharded by serving thread).
//! - [`live`] — the live fleet: discovered pools follow the endpoint sets their sources publish
//!   ([`discovery`] starts them); KV events, health checks and gossip naming start and stop with
//!   each instance; drained instances are freed and forgotten.
//! - [`fleet`] — pools by model; instances in id slots under a membership view swapped whole
//!   (`arc-swap`), serving or draining; health (active checks + passive ejection), latency
//!   averages, engine load scraping, the `/v1/models` union.
//! - [`client`] — HTTP/1.1 client doing each exchange on the request's own task over a per-thread
//!   keep-alive pool ([`client::wire`] encodes and parses heads, [`client::body`] streams bodies,
//!   [`client::stream`] is plain TCP or TLS to `https://` instances); connect / first-byte
//!   timeouts, stale pooled connections replaced.
//! - [`error`] — [`error::GatewayError`]: one error type, one mapping to status + OpenAI body,
//!   with fault and retry-safety.
//! - [`events`] — engine KV event ingestion (`crates/events`) wired to the fleet: one source per
//!   instance with `kv_events`, started with the background tasks, shown in `/admin/index`.
//! - [`tls`] — rustls on the listener: TLS 1.2/1.3, ALPN `h2` and `http/1.1`, client
//!   certificates, certificate reloading; and the upstream client's config for `https://`
//!   instances (CA bundle, optional client certificate, optional verified name), re-read when
//!   its files change.
//! - [`metrics`] — every metric name, help text and bucket set.
//! - [`config`] — one typed [`config::Config`]; defaults in one place; TOML < `KVGATE_*` env < flags.
//! - [`alloc`] — the binaries' global allocator (mimalloc through its unaligned fast paths).
//! - `crates/core` (`kvgate-core`) — the pure routing core: hashing, placement index, load and
//!   learned rates, policies, the one decision sequence (`router`).
//!   No I/O, no clock (time is passed in via [`clock::Clock`] at this edge).
//! - `crates/tokenizer` — tokenizers and chat templates for token-mode hashing.
//! - `crates/sim` — engine simulator (OpenAI API, prefix cache, metrics, KV events); also the
//!   embedded default fleet.
//! - `crates/events` — engine KV event ingestion into the index.
//! - `crates/gossip` — replica gossip of placements and load.
//! - `crates/discovery` — discovery sources (static, DNS, Kubernetes), each publishing the whole
//!   current endpoint set of a pool on a watch channel.
//! - `loadtest/` — trace replay, synthetic workloads, offline policy simulation, comparisons;
//!   `loadtest/overhead.sh` measures the proxy's own cost against nginx.
//!   `loadtest/flood.sh` runs the flood of `tests/flood.rs` (slow clients, idle connections,
//!   memory) at full size; `loadtest/sizing.sh` measures the gateway's cores and memory per
//!   100 req/s by prompt length, traffic, hash mode, index size and serving threads.

pub mod admin;
pub mod admission;
pub mod alloc;
pub mod app;
pub mod auth;
pub mod client;
pub mod clock;
pub mod config;
pub mod decision_log;
pub mod discovery;
pub mod error;
pub mod events;
pub mod fleet;
pub mod live;
pub mod metrics;
pub mod picker;
pub mod proxy;
pub mod ratelimit;
pub mod routing;
pub mod tls;
