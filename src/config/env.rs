//! Every environment variable kvgate reads, in one place.
//!
//! Invariant: no other module calls `std::env::var` with a literal name; they use these constants,
//! so the full list of knobs is discoverable here and in `docs/gateway.md`.

/// Path of the TOML config file (same as `--config`).
pub const CONFIG: &str = "KVGATE_CONFIG";
/// `server.listen`: socket address to serve on (empty: no HTTP proxy listener, picker only).
pub const LISTEN: &str = "KVGATE_LISTEN";
/// `server.admin_listen`: socket address of the admin listener, or `main` for the main listener
/// (empty: the default for the fleet, see `config::admin_listen_default`).
pub const ADMIN_LISTEN: &str = "KVGATE_ADMIN_LISTEN";
/// `server.log_format`: `human` or `json`.
pub const LOG_FORMAT: &str = "KVGATE_LOG_FORMAT";
/// `server.log_filter`: a `tracing` filter directive such as `info` or `kvgate=debug`.
pub const LOG: &str = "KVGATE_LOG";
/// `server.body_limit_bytes`: maximum request body size.
pub const BODY_LIMIT_BYTES: &str = "KVGATE_BODY_LIMIT_BYTES";
/// `server.shutdown_grace_ms`: how long in-flight requests may finish after a shutdown signal.
pub const SHUTDOWN_GRACE_MS: &str = "KVGATE_SHUTDOWN_GRACE_MS";
/// `gossip.advertise`: the address peers reach this replica at (in Kubernetes, the pod IP and
/// gossip port, e.g. `$(POD_IP):7946`).
pub const GOSSIP_ADVERTISE: &str = "KVGATE_GOSSIP_ADVERTISE";
/// `gossip.previous_secrets`: comma-separated secrets still accepted while a new one rolls out.
pub const GOSSIP_PREVIOUS_SECRETS: &str = "KVGATE_GOSSIP_PREVIOUS_SECRETS";
/// `server.drain_delay_ms`: how long `/ready` fails before the listener closes on shutdown.
pub const DRAIN_DELAY_MS: &str = "KVGATE_DRAIN_DELAY_MS";
/// `server.threads`: serving threads (0 = one per core).
pub const THREADS: &str = "KVGATE_THREADS";
/// `server.tls.cert_file`: PEM certificate chain; setting it turns TLS on.
pub const TLS_CERT_FILE: &str = "KVGATE_TLS_CERT_FILE";
/// `server.tls.key_file`: PEM private key; setting it turns TLS on.
pub const TLS_KEY_FILE: &str = "KVGATE_TLS_KEY_FILE";
/// `upstream.max_attempts`: attempts per request (1 = no retry).
pub const MAX_ATTEMPTS: &str = "KVGATE_MAX_ATTEMPTS";
/// `routing.policy.name`: routing policy (`kvgate`, `round_robin`, ...).
pub const POLICY: &str = "KVGATE_POLICY";
/// `routing.hash_mode`: `auto`, `text` or `token`.
pub const HASH_MODE: &str = "KVGATE_HASH_MODE";
/// `sim.engines`: size of the embedded simulated fleet.
pub const SIM_ENGINES: &str = "KVGATE_SIM_ENGINES";
/// `rate_limits.requests_per_second`: default requests per second per tenant.
pub const RATE_LIMIT_REQUESTS_PER_SECOND: &str = "KVGATE_RATE_LIMIT_REQUESTS_PER_SECOND";
/// `rate_limits.tokens_per_minute`: default tokens per minute per tenant.
pub const RATE_LIMIT_TOKENS_PER_MINUTE: &str = "KVGATE_RATE_LIMIT_TOKENS_PER_MINUTE";

/// `server.limits.max_connections`: client connections open at once.
pub const MAX_CONNECTIONS: &str = "KVGATE_MAX_CONNECTIONS";
/// `server.limits.header_read_timeout_ms`: first byte of a request head to the complete head.
pub const HEADER_READ_TIMEOUT_MS: &str = "KVGATE_HEADER_READ_TIMEOUT_MS";
/// `server.limits.body_read_timeout_ms`: complete head to the complete declared body.
pub const BODY_READ_TIMEOUT_MS: &str = "KVGATE_BODY_READ_TIMEOUT_MS";
/// `server.limits.idle_timeout_ms`: between requests on a kept-alive connection.
pub const IDLE_TIMEOUT_MS: &str = "KVGATE_IDLE_TIMEOUT_MS";
/// `server.limits.write_timeout_ms`: how long an answer may wait for a client not reading.
pub const WRITE_TIMEOUT_MS: &str = "KVGATE_WRITE_TIMEOUT_MS";
/// `server.limits.body_budget_bytes`: request body bytes held in memory at once.
pub const BODY_BUDGET_BYTES: &str = "KVGATE_BODY_BUDGET_BYTES";
/// `server.limits.body_budget_wait_ms`: how long a body waits for room in the budget.
pub const BODY_BUDGET_WAIT_MS: &str = "KVGATE_BODY_BUDGET_WAIT_MS";
/// `picker.enabled`: serve the ext_proc endpoint picker (`true`/`false`).
pub const PICKER_ENABLED: &str = "KVGATE_PICKER_ENABLED";
/// `picker.listen`: socket address of the endpoint picker's gRPC listener.
pub const PICKER_LISTEN: &str = "KVGATE_PICKER_LISTEN";
/// `server.limits.evict_idle_at_capacity`: at the cap, evict the longest-idle connection.
pub const EVICT_IDLE_AT_CAPACITY: &str = "KVGATE_EVICT_IDLE_AT_CAPACITY";

/// All variables applied as config overrides, in the order they are applied.
pub const OVERRIDES: &[&str] = &[
    LISTEN,
    ADMIN_LISTEN,
    LOG_FORMAT,
    LOG,
    BODY_LIMIT_BYTES,
    SHUTDOWN_GRACE_MS,
    DRAIN_DELAY_MS,
    GOSSIP_ADVERTISE,
    GOSSIP_PREVIOUS_SECRETS,
    THREADS,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    MAX_ATTEMPTS,
    POLICY,
    HASH_MODE,
    SIM_ENGINES,
    RATE_LIMIT_REQUESTS_PER_SECOND,
    RATE_LIMIT_TOKENS_PER_MINUTE,
    MAX_CONNECTIONS,
    HEADER_READ_TIMEOUT_MS,
    BODY_READ_TIMEOUT_MS,
    IDLE_TIMEOUT_MS,
    WRITE_TIMEOUT_MS,
    BODY_BUDGET_BYTES,
    BODY_BUDGET_WAIT_MS,
    PICKER_ENABLED,
    PICKER_LISTEN,
    EVICT_IDLE_AT_CAPACITY,
];
