//! `[server]`: the listening side of the gateway, and `[server.limits]`: what one client
//! connection, and all of them together, may hold of the gateway (time, sockets, memory).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable, one line per event.
    Human,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("expected `human` or `json`, got `{other}`")),
        }
    }
}

/// `server.admin_listen` value that keeps the admin surface on the main listener.
pub const ADMIN_ON_MAIN: &str = "main";

/// The admin listener an empty `server.admin_listen` means in front of real instances without an
/// admin token: loopback only, so nothing off the host reads the fleet, the decisions or the
/// metrics unless the operator says so.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9091";

/// What the gateway fronts: some defaults depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetKind {
    /// No `[[pools]]`: the embedded simulated fleet (no real model, nothing to protect).
    Embedded,
    /// `[[pools]]` of static or discovered instances.
    Real,
}

/// What an empty `server.admin_listen` stands for: the main listener in front of the embedded
/// simulated fleet (so `curl /admin/decisions` works out of the box) or when an admin token
/// closes the surface there; in front of real instances without a token, a listener of its own on
/// [`DEFAULT_ADMIN_LISTEN`].
pub fn admin_listen_default(fleet: FleetKind, admin_token: bool) -> &'static str {
    match fleet {
        FleetKind::Embedded => ADMIN_ON_MAIN,
        FleetKind::Real if admin_token => ADMIN_ON_MAIN,
        FleetKind::Real => DEFAULT_ADMIN_LISTEN,
    }
}

/// `[server]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Socket address the gateway listens on: the HTTP proxy (and the admin surface when
    /// `admin_listen` is empty). Empty: no HTTP proxy listener at all — the endpoint picker
    /// (`[picker]`) is the only door to the fleet, and the admin surface is on `admin_listen`,
    /// which must then be set.
    pub listen: String,
    /// Where the admin surface (`/admin/*`, `/metrics`) is served:
    /// - a socket address: a listener of its own, serving only it plus `/health` and `/ready`;
    ///   the main listener then answers `/admin/*` and `/metrics` 404;
    /// - [`ADMIN_ON_MAIN`] (`"main"`): the main listener (behind the admin token, when one is
    ///   set);
    /// - empty (the default): chosen by [`admin_listen_default`] from what the gateway fronts.
    pub admin_listen: String,
    /// Largest accepted request body; bigger bodies get 413 without being read.
    pub body_limit_bytes: usize,
    /// After SIGTERM/SIGINT: how long in-flight requests and streams may still finish.
    pub shutdown_grace_ms: u64,
    /// After SIGTERM/SIGINT and before the listener closes: how long `/ready` fails while new
    /// connections are still served, so that load balancers and Kubernetes endpoints stop
    /// sending here first. 0 closes the listener at once.
    pub drain_delay_ms: u64,
    /// Log line format.
    pub log_format: LogFormat,
    /// `tracing` filter directive (e.g. `info`, `kvgate=debug,info`).
    pub log_filter: String,
    /// Header carrying the request id, propagated upstream and returned to the client.
    pub request_id_header: String,
    /// Threads serving client connections, each with its own single-threaded runtime and
    /// upstream connection pools; 0 = one per available core.
    pub threads: usize,
    /// Timeouts, the connection cap, TCP keepalive and the in-flight body budget.
    pub limits: LimitsConfig,
    /// TLS on the listener; absent: plain HTTP.
    pub tls: Option<super::ServerTlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_string(),
            admin_listen: String::new(),
            body_limit_bytes: 32 * 1024 * 1024,
            shutdown_grace_ms: 30_000,
            drain_delay_ms: 0,
            log_format: LogFormat::Human,
            log_filter: "info".to_string(),
            request_id_header: "x-request-id".to_string(),
            threads: 0,
            limits: LimitsConfig::default(),
            tls: None,
        }
    }
}

impl ServerConfig {
    /// True when `listen` is set: the HTTP proxy is served (false: picker only).
    pub fn has_proxy_listener(&self) -> bool {
        !self.listen.is_empty()
    }

    /// True when `admin_listen` moves the admin surface to a listener of its own. An empty
    /// `admin_listen` counts as none here: [`crate::config::Config::settle_admin_listen`] gives
    /// it its value first (the gateway's state does that when it is built).
    pub fn has_admin_listener(&self) -> bool {
        !self.admin_listen.is_empty() && self.admin_listen != ADMIN_ON_MAIN
    }

    /// `admin_listen`, or what an empty one stands for (see [`admin_listen_default`]).
    pub fn admin_listen_in_force(&self, fleet: FleetKind, admin_token: bool) -> &str {
        if self.admin_listen.is_empty() {
            admin_listen_default(fleet, admin_token)
        } else {
            &self.admin_listen
        }
    }

    /// True when `listen` is a loopback address (nothing off the host reaches it).
    pub fn listens_on_loopback(&self) -> bool {
        self.listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback())
    }
}

/// `[server.limits]`: the same limits on both serving paths (kvgate's HTTP/1.1 loop and hyper).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// From the first byte of a request head to the complete head; a client trickling its head
    /// is disconnected without an answer beyond it.
    pub header_read_timeout_ms: u64,
    /// From a complete head to the complete declared body; beyond it the client gets 408 and
    /// the connection closes.
    pub body_read_timeout_ms: u64,
    /// From accepting a connection, or from the end of the previous answer, to the first byte of
    /// the next request; the connection closes quietly beyond it.
    pub idle_timeout_ms: u64,
    /// Longest time an answer's bytes may wait for a client that stopped reading (its socket
    /// buffer full); beyond it the connection is cut and the upstream request cancelled.
    pub write_timeout_ms: u64,
    /// Client connections open at once. At the cap a new connection takes the place of the one
    /// idle the longest (see `evict_idle_at_capacity`); when none is idle it gets a fast 503
    /// with `Retry-After`.
    pub max_connections: usize,
    /// At the cap, close the connection that has waited longest for a request (a keep-alive
    /// connection between requests, or one that has sent nothing yet) and admit the new one;
    /// connections in the middle of a request or an answer are never closed for it. Off: the
    /// cap refuses whenever it is reached.
    pub evict_idle_at_capacity: bool,
    /// Connections the kernel may hold completed but not yet accepted (`listen(2)`'s backlog,
    /// capped by the kernel at `net.core.somaxconn`). Beyond it a new client's SYN is dropped
    /// and it waits out a retransmit (a second or more), so a burst of connections must fit.
    pub listen_backlog: u32,
    /// TCP keepalive on accepted sockets: idle time before the first probe (whole seconds in
    /// the kernel: rounded up, at least 1 s).
    pub tcp_keepalive_idle_ms: u64,
    /// TCP keepalive: time between unanswered probes (rounded up to whole seconds, as above).
    pub tcp_keepalive_interval_ms: u64,
    /// Request body bytes held in memory at once, across all connections. A request whose body
    /// does not fit waits up to `body_budget_wait_ms`, then gets 503; one larger than the whole
    /// budget gets 413.
    pub body_budget_bytes: usize,
    /// How long a request waits for room in the body budget before its 503.
    pub body_budget_wait_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            write_timeout_ms: 30_000,
            max_connections: 10_000,
            evict_idle_at_capacity: true,
            listen_backlog: 4096,
            tcp_keepalive_idle_ms: 60_000,
            tcp_keepalive_interval_ms: 10_000,
            body_budget_bytes: 1 << 30,
            body_budget_wait_ms: 1_000,
        }
    }
}

/// Most connections the cap may allow (a semaphore's permits, with room to spare).
const MAX_CONNECTIONS: usize = 1 << 24;
/// Largest `listen_backlog` (Linux keeps the backlog in 16 bits' worth and caps it at
/// `somaxconn` anyway).
const MAX_LISTEN_BACKLOG: u32 = 65_535;

impl LimitsConfig {
    /// Checks every value; the error names the offending key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("write_timeout_ms", self.write_timeout_ms),
            ("tcp_keepalive_idle_ms", self.tcp_keepalive_idle_ms),
            ("tcp_keepalive_interval_ms", self.tcp_keepalive_interval_ms),
            ("body_budget_wait_ms", self.body_budget_wait_ms),
        ] {
            // An hour bounds every one: a longer wait is no limit, and the sum of two stays far
            // from overflowing a deadline.
            if v == 0 || v > 3_600_000 {
                return Err(invalid(
                    format!("server.limits.{key}"),
                    "must be between 1 and 3600000",
                ));
            }
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(invalid(
                "server.limits.max_connections",
                format!("must be between 1 and {MAX_CONNECTIONS}"),
            ));
        }
        if !(1..=MAX_LISTEN_BACKLOG).contains(&self.listen_backlog) {
            return Err(invalid(
                "server.limits.listen_backlog",
                format!("must be between 1 and {MAX_LISTEN_BACKLOG}"),
            ));
        }
        if self.body_budget_bytes == 0 {
            return Err(invalid("server.limits.body_budget_bytes", "must be > 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        LimitsConfig::default().validate().unwrap();
    }

    #[test]
    fn each_bad_limit_names_its_key() {
        type Set = fn(&mut LimitsConfig);
        let cases: [(&str, Set); 12] = [
            ("header_read_timeout_ms", |l| l.header_read_timeout_ms = 0),
            ("body_read_timeout_ms", |l| l.body_read_timeout_ms = 0),
            ("idle_timeout_ms", |l| l.idle_timeout_ms = 3_600_001),
            ("write_timeout_ms", |l| l.write_timeout_ms = 0),
            ("tcp_keepalive_idle_ms", |l| l.tcp_keepalive_idle_ms = 0),
            ("tcp_keepalive_interval_ms", |l| {
                l.tcp_keepalive_interval_ms = 0
            }),
            ("body_budget_wait_ms", |l| l.body_budget_wait_ms = 0),
            ("max_connections", |l| l.max_connections = 0),
            ("max_connections", |l| {
                l.max_connections = MAX_CONNECTIONS + 1
            }),
            ("body_budget_bytes", |l| l.body_budget_bytes = 0),
            ("listen_backlog", |l| l.listen_backlog = 0),
            ("listen_backlog", |l| {
                l.listen_backlog = MAX_LISTEN_BACKLOG + 1
            }),
        ];
        for (key, set) in cases {
            let mut l = LimitsConfig::default();
            set(&mut l);
            let e = l.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("server.limits.{key}")), "{key}: {e}");
        }
    }

    #[test]
    fn limits_parse_from_their_own_table() {
        let c = crate::config::Config::from_toml_str(
            "[server.limits]\nheader_read_timeout_ms = 5\nmax_connections = 7\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.server.limits.header_read_timeout_ms, 5);
        assert_eq!(c.server.limits.max_connections, 7);
        assert_eq!(c.server.limits.idle_timeout_ms, 60_000);
        let e = crate::config::Config::from_toml_str("[server.limits]\nheader_ms = 5\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("header_ms"), "{e}");
    }
}
