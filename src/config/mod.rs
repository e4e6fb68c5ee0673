//! The gateway's one typed configuration.
//!
//! Invariants:
//! - Every default lives in a section's `Default` impl and nowhere else; `config/kvgate.toml`
//!   documents the same values and a test asserts it parses to exactly `Config::default()`.
//! - Precedence: built-in defaults < TOML file < `KVGATE_*` environment variables (see [`mod@env`]) <
//!   command-line flags (applied by the binary).
//! - Unknown keys and invalid values are start-up errors that name the key.

mod admission;
mod auth;
pub mod env;
mod picker;
mod pools;
mod ratelimit;
mod routing;
mod server;
mod tls;
mod upstream;

pub use admission::AdmissionConfig;
pub use auth::{AuthConfig, CacheSharing};
pub use picker::{FailureMode, PickerConfig};
pub use pools::{Flavour, InstanceConfig, PoolConfig, SimConfig};
pub use ratelimit::RateLimitsConfig;
pub use routing::{HashMode, IndexSection, RoutingConfig, TokenizeSection};
pub use server::{
    admin_listen_default, FleetKind, LimitsConfig, LogFormat, ServerConfig, ADMIN_ON_MAIN,
    DEFAULT_ADMIN_LISTEN,
};
pub use tls::{ClientAuth, ServerTlsConfig};
pub use upstream::{HealthConfig, LoadConfig, UpstreamConfig, UpstreamTlsConfig};

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The whole configuration. Sections map 1:1 to TOML tables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listening side.
    pub server: ServerConfig,
    /// Upstream client.
    pub upstream: UpstreamConfig,
    /// Instance health checking.
    pub health: HealthConfig,
    /// Engine load scraping.
    pub load: LoadConfig,
    /// Hashing, index and policy.
    pub routing: RoutingConfig,
    /// Instances, grouped by model. Empty = start the embedded simulated fleet.
    pub pools: Vec<PoolConfig>,
    /// The embedded simulated fleet.
    pub sim: SimConfig,
    /// Engine KV event ingestion (instances with `kv_events`).
    pub events: kvgate_events::EventsConfig,
    /// Replica gossip: shared placements, load and health between gateway replicas.
    pub gossip: kvgate_gossip::GossipConfig,
    /// Admission control: per-pool wait queues while pools are saturated.
    pub admission: AdmissionConfig,
    /// Client authentication: API keys, their tenants and allowed models.
    pub auth: AuthConfig,
    /// Default per-tenant rate limits (tenants' own are in the keys file).
    pub rate_limits: RateLimitsConfig,
    /// The ext_proc endpoint picker (Gateway API Inference Extension), off by default.
    pub picker: PickerConfig,
}

/// A configuration problem, naming the offending key (or environment variable).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax error, unknown key or wrongly typed value (the message names the key).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The path.
        path: String,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// An invalid value.
    #[error("invalid config value `{key}`: {message}")]
    Invalid {
        /// Dotted key, e.g. `pools[0].instances[1].url`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable with an invalid value.
    #[error("invalid environment variable {var} (sets `{key}`): {message}")]
    Env {
        /// The variable.
        var: &'static str,
        /// The key it sets.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parses TOML text (`origin` names it in errors). Does not validate.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })
    }

    /// Reads and parses a TOML file. Does not validate.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Applies `KVGATE_*` overrides, reading variables through `lookup` (tests pass a map;
    /// the binary passes `std::env::var`).
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        fn parse<T: std::str::FromStr>(
            var: &'static str,
            key: &'static str,
            value: &str,
        ) -> Result<T, ConfigError>
        where
            T::Err: std::fmt::Display,
        {
            value.trim().parse::<T>().map_err(|e| ConfigError::Env {
                var,
                key,
                message: e.to_string(),
            })
        }
        if let Some(v) = lookup(env::LISTEN) {
            self.server.listen = v;
        }
        if let Some(v) = lookup(env::ADMIN_LISTEN) {
            self.server.admin_listen = v;
        }
        if let Some(v) = lookup(env::PICKER_LISTEN) {
            self.picker.listen = v;
        }
        if let Some(v) = lookup(env::PICKER_ENABLED) {
            self.picker.enabled = parse(env::PICKER_ENABLED, "picker.enabled", &v)?;
        }
        if let Some(v) = lookup(env::LOG_FORMAT) {
            self.server.log_format = parse(env::LOG_FORMAT, "server.log_format", &v)?;
        }
        if let Some(v) = lookup(env::LOG) {
            self.server.log_filter = v;
        }
        if let Some(v) = lookup(env::BODY_LIMIT_BYTES) {
            self.server.body_limit_bytes =
                parse(env::BODY_LIMIT_BYTES, "server.body_limit_bytes", &v)?;
        }
        if let Some(v) = lookup(env::SHUTDOWN_GRACE_MS) {
            self.server.shutdown_grace_ms =
                parse(env::SHUTDOWN_GRACE_MS, "server.shutdown_grace_ms", &v)?;
        }
        if let Some(v) = lookup(env::DRAIN_DELAY_MS) {
            self.server.drain_delay_ms = parse(env::DRAIN_DELAY_MS, "server.drain_delay_ms", &v)?;
        }
        if let Some(v) = lookup(env::THREADS) {
            self.server.threads = parse(env::THREADS, "server.threads", &v)?;
        }
        if let Some(v) = lookup(env::TLS_CERT_FILE) {
            self.server
                .tls
                .get_or_insert_with(Default::default)
                .cert_file = v;
        }
        if let Some(v) = lookup(env::TLS_KEY_FILE) {
            self.server
                .tls
                .get_or_insert_with(Default::default)
                .key_file = v;
        }
        if let Some(v) = lookup(env::MAX_ATTEMPTS) {
            self.upstream.max_attempts = parse(env::MAX_ATTEMPTS, "upstream.max_attempts", &v)?;
        }
        if let Some(v) = lookup(env::POLICY) {
            self.routing.policy.name = parse(env::POLICY, "routing.policy.name", &v)?;
        }
        if let Some(v) = lookup(env::HASH_MODE) {
            self.routing.hash_mode = parse(env::HASH_MODE, "routing.hash_mode", &v)?;
        }
        if let Some(v) = lookup(env::SIM_ENGINES) {
            self.sim.engines = parse(env::SIM_ENGINES, "sim.engines", &v)?;
        }
        if let Some(v) = lookup(env::RATE_LIMIT_REQUESTS_PER_SECOND) {
            self.rate_limits.requests_per_second = Some(parse(
                env::RATE_LIMIT_REQUESTS_PER_SECOND,
                "rate_limits.requests_per_second",
                &v,
            )?);
        }
        if let Some(v) = lookup(env::RATE_LIMIT_TOKENS_PER_MINUTE) {
            self.rate_limits.tokens_per_minute = Some(parse(
                env::RATE_LIMIT_TOKENS_PER_MINUTE,
                "rate_limits.tokens_per_minute",
                &v,
            )?);
        }
        let limits = &mut self.server.limits;
        for (var, key, field) in [
            (
                env::MAX_CONNECTIONS,
                "server.limits.max_connections",
                &mut limits.max_connections,
            ),
            (
                env::BODY_BUDGET_BYTES,
                "server.limits.body_budget_bytes",
                &mut limits.body_budget_bytes,
            ),
        ] {
            if let Some(v) = lookup(var) {
                *field = parse(var, key, &v)?;
            }
        }
        for (var, key, field) in [
            (
                env::HEADER_READ_TIMEOUT_MS,
                "server.limits.header_read_timeout_ms",
                &mut limits.header_read_timeout_ms,
            ),
            (
                env::BODY_READ_TIMEOUT_MS,
                "server.limits.body_read_timeout_ms",
                &mut limits.body_read_timeout_ms,
            ),
            (
                env::IDLE_TIMEOUT_MS,
                "server.limits.idle_timeout_ms",
                &mut limits.idle_timeout_ms,
            ),
            (
                env::WRITE_TIMEOUT_MS,
                "server.limits.write_timeout_ms",
                &mut limits.write_timeout_ms,
            ),
            (
                env::BODY_BUDGET_WAIT_MS,
                "server.limits.body_budget_wait_ms",
                &mut limits.body_budget_wait_ms,
            ),
        ] {
            if let Some(v) = lookup(var) {
                *field = parse(var, key, &v)?;
            }
        }
        if let Some(v) = lookup(env::EVICT_IDLE_AT_CAPACITY) {
            limits.evict_idle_at_capacity = parse(
                env::EVICT_IDLE_AT_CAPACITY,
                "server.limits.evict_idle_at_capacity",
                &v,
            )?;
        }
        if let Some(v) = lookup(kvgate_gossip::ENV_SECRET).filter(|v| !v.is_empty()) {
            self.gossip.secret = v;
        }
        if let Some(v) = lookup(env::GOSSIP_PREVIOUS_SECRETS).filter(|v| !v.is_empty()) {
            self.gossip.previous_secrets = v.split(',').map(|s| s.trim().to_string()).collect();
        }
        if let Some(v) = lookup(env::GOSSIP_ADVERTISE).filter(|v| !v.is_empty()) {
            self.gossip.advertise = v;
        }
        Ok(())
    }

    /// What the gateway fronts: no `[[pools]]` means the embedded simulated fleet. Ask before
    /// the embedded fleet's instances are written into `pools`.
    pub fn fleet_kind(&self) -> FleetKind {
        if self.pools.is_empty() {
            FleetKind::Embedded
        } else {
            FleetKind::Real
        }
    }

    /// Gives an empty `server.admin_listen` the value it stands for ([`admin_listen_default`]):
    /// from here on it says where the admin surface is. `admin_token`: whether an admin token is
    /// set (the environment's included). Call before the embedded fleet fills `pools`; calling
    /// again changes nothing.
    pub fn settle_admin_listen(&mut self, admin_token: bool) {
        if self.server.admin_listen.is_empty() {
            self.server.admin_listen =
                admin_listen_default(self.fleet_kind(), admin_token).to_string();
        }
    }

    /// Checks every value; the error names the first offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if !s.has_proxy_listener() {
            // Picker only: something must still serve the fleet, and the admin surface.
            if !self.picker.enabled {
                return Err(invalid(
                    "server.listen",
                    "is empty (no HTTP proxy listener), which serves only the endpoint picker: set picker.enabled = true, or give a socket address like 127.0.0.1:8080",
                ));
            }
            if !s.has_admin_listener() {
                return Err(invalid(
                    "server.listen",
                    "is empty (no HTTP proxy listener): set server.admin_listen to serve /health, /ready, /metrics and /admin/*",
                ));
            }
        } else if s.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "server.listen",
                format!(
                    "`{}` is not a socket address like 127.0.0.1:8080 (empty: no HTTP proxy listener, picker only)",
                    s.listen
                ),
            ));
        }
        // An empty admin_listen is checked as what it stands for; the admin token from the
        // environment is not seen here, but a settled config (the gateway's) has no empty one.
        let admin_listen =
            s.admin_listen_in_force(self.fleet_kind(), self.auth.admin_token_configured(None));
        if admin_listen != ADMIN_ON_MAIN {
            match admin_listen.parse::<std::net::SocketAddr>() {
                Err(_) => {
                    return Err(invalid(
                        "server.admin_listen",
                        format!(
                            "`{admin_listen}` is not a socket address like 127.0.0.1:9091 \
                             (`{ADMIN_ON_MAIN}`: on the main listener; empty: the default)"
                        ),
                    ))
                }
                Ok(a) if a.port() != 0 && s.listen.parse().ok() == Some(a) => {
                    return Err(invalid(
                        "server.admin_listen",
                        format!(
                            "must differ from server.listen (`{ADMIN_ON_MAIN}` serves the admin \
                             surface there)"
                        ),
                    ))
                }
                Ok(_) => {}
            }
        }
        // Bodies are reserved in the in-flight body budget in one piece (at most u32::MAX).
        if s.body_limit_bytes == 0 || s.body_limit_bytes > u32::MAX as usize {
            return Err(invalid(
                "server.body_limit_bytes",
                "must be between 1 and 4294967295",
            ));
        }
        s.limits.validate()?;
        self.picker.validate()?;
        if let Some(tls) = &s.tls {
            tls.validate()?;
            if tls.admin && admin_listen == ADMIN_ON_MAIN {
                return Err(invalid(
                    "server.tls.admin",
                    "needs an admin listener (server.admin_listen is on the main listener, \
                     which serves the admin surface with TLS already)",
                ));
            }
        }
        if http::HeaderName::from_bytes(s.request_id_header.as_bytes()).is_err() {
            return Err(invalid(
                "server.request_id_header",
                "not a valid HTTP header name",
            ));
        }
        let u = &self.upstream;
        for (key, v) in [
            ("upstream.connect_timeout_ms", u.connect_timeout_ms),
            ("upstream.first_byte_timeout_ms", u.first_byte_timeout_ms),
            ("upstream.idle_timeout_ms", u.idle_timeout_ms),
            ("upstream.pool_idle_timeout_ms", u.pool_idle_timeout_ms),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            ("health.eject_ms", self.health.eject_ms),
            ("health.models_refresh_ms", self.health.models_refresh_ms),
            ("load.poll_interval_ms", self.load.poll_interval_ms),
            ("load.stale_after_ms", self.load.stale_after_ms),
            ("load.timeout_ms", self.load.timeout_ms),
            ("routing.predicted_ttl_ms", self.routing.predicted_ttl_ms),
            (
                "routing.index.expire_interval_ms",
                self.routing.index.expire_interval_ms,
            ),
            (
                "routing.tokenize.max_wait_ms",
                self.routing.tokenize.max_wait_ms,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be > 0"));
            }
        }
        if !(1..=16).contains(&u.max_attempts) {
            return Err(invalid("upstream.max_attempts", "must be between 1 and 16"));
        }
        if let Some(t) = &u.tls {
            t.validate()?;
        }
        let h = &self.health;
        for (key, v) in [
            ("health.unhealthy_threshold", h.unhealthy_threshold),
            ("health.healthy_threshold", h.healthy_threshold),
            (
                "health.passive_failure_threshold",
                h.passive_failure_threshold,
            ),
            ("health.passive_5xx_threshold", h.passive_5xx_threshold),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be >= 1"));
            }
        }
        let r = &self.routing;
        if r.text_block_bytes < 8 || r.text_block_bytes > 1 << 20 {
            return Err(invalid(
                "routing.text_block_bytes",
                "must be between 8 and 1048576",
            ));
        }
        if r.text_bytes_per_token == 0 {
            return Err(invalid("routing.text_bytes_per_token", "must be >= 1"));
        }
        let f = r.index.capacity_factor;
        if !(f.is_finite() && (1.0..=64.0).contains(&f)) {
            return Err(invalid(
                "routing.index.capacity_factor",
                "must be between 1 and 64",
            ));
        }
        if r.decision_log_size > 100_000 {
            return Err(invalid("routing.decision_log_size", "must be <= 100000"));
        }
        if let Err(e) = r.policy.kvgate.validate() {
            return Err(invalid(
                format!("routing.policy.kvgate.{}", e.field),
                e.requirement,
            ));
        }
        if let Err(e) = r.decode_rates.validate() {
            return Err(invalid(
                format!("routing.decode_rates.{}", e.field),
                e.requirement,
            ));
        }
        let rc = &r.rates;
        if !(rc.prefill_tokens_per_s.is_finite() && rc.prefill_tokens_per_s > 0.0) {
            return Err(invalid("routing.rates.prefill_tokens_per_s", "must be > 0"));
        }
        if !(rc.decode_interference_ms.is_finite() && rc.decode_interference_ms >= 0.0) {
            return Err(invalid(
                "routing.rates.decode_interference_ms",
                "must be >= 0",
            ));
        }
        if !(rc.forgetting >= 0.5 && rc.forgetting <= 1.0) {
            return Err(invalid("routing.rates.forgetting", "must be in [0.5, 1]"));
        }
        if !(rc.pool_weight.is_finite() && rc.pool_weight >= 0.0) {
            return Err(invalid("routing.rates.pool_weight", "must be >= 0"));
        }
        if !(rc.outlier_clip.is_finite() && rc.outlier_clip > 0.0) {
            return Err(invalid("routing.rates.outlier_clip", "must be > 0"));
        }
        if !(rc.overhead_ms.is_finite()
            && rc.overhead_ms >= 0.0
            && rc.overhead_ms <= rc.max_overhead_ms)
        {
            return Err(invalid(
                "routing.rates.overhead_ms",
                "must be >= 0 and <= max_overhead_ms",
            ));
        }
        if !(rc.min_prefill_tokens_per_s > 0.0
            && rc.min_prefill_tokens_per_s <= rc.max_prefill_tokens_per_s)
        {
            return Err(invalid(
                "routing.rates.min_prefill_tokens_per_s",
                "must be > 0 and <= max_prefill_tokens_per_s",
            ));
        }
        if r.index.shards == 0 || r.index.shards > 65_536 {
            return Err(invalid(
                "routing.index.shards",
                "must be between 1 and 65536",
            ));
        }
        if r.index.max_entries == 0 {
            return Err(invalid("routing.index.max_entries", "must be > 0"));
        }
        if r.index.default_instance_capacity == 0 {
            return Err(invalid(
                "routing.index.default_instance_capacity",
                "must be > 0",
            ));
        }
        if self.pools.is_empty() {
            if !(1..=256).contains(&self.sim.engine_count()) {
                let key = if self.sim.fleet.is_some() {
                    "sim.fleet"
                } else {
                    "sim.engines"
                };
                return Err(invalid(key, "must give between 1 and 256 engines"));
            }
            self.sim
                .validate()
                .map_err(|e| invalid("sim", e.to_string()))?;
        }
        self.events
            .validate()
            .map_err(|e| invalid(e.key, e.message))?;
        self.gossip
            .validate()
            .map_err(|e| invalid(format!("gossip.{}", e.key), e.message))?;
        self.admission
            .validate()
            .map_err(|(key, message)| invalid(format!("admission.{key}"), message))?;
        self.rate_limits
            .validate()
            .map_err(|(key, message)| invalid(format!("rate_limits.{key}"), message))?;
        self.validate_pools()
    }

    fn validate_pools(&self) -> Result<(), ConfigError> {
        let total: usize = self.pools.iter().map(PoolConfig::slot_budget).sum();
        if total > kvgate_core::index::MAX_INSTANCES {
            return Err(invalid(
                "pools",
                format!(
                    "at most {} instances in all",
                    kvgate_core::index::MAX_INSTANCES
                ),
            ));
        }
        let mut models = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for (p, pool) in self.pools.iter().enumerate() {
            if pool.model.trim().is_empty() {
                return Err(invalid(format!("pools[{p}].model"), "must not be empty"));
            }
            if !models.insert(pool.model.as_str()) {
                return Err(invalid(
                    format!("pools[{p}].model"),
                    format!("model `{}` is configured twice", pool.model),
                ));
            }
            if pool.block_size == Some(0) {
                return Err(invalid(format!("pools[{p}].block_size"), "must be >= 1"));
            }
            if pool.is_discovered() {
                if !pool.instances.is_empty() {
                    return Err(invalid(
                        format!("pools[{p}].instances"),
                        "a pool with a dns or kubernetes discovery source lists no instances: \
                         they come from the source",
                    ));
                }
                if pool.max_instances == Some(0) {
                    return Err(invalid(format!("pools[{p}].max_instances"), "must be >= 1"));
                }
                pool.discovery.validate().map_err(|e| match e {
                    kvgate_discovery::DiscoveryError::Config { key, message } => {
                        invalid(format!("pools[{p}].discovery.{key}"), message)
                    }
                    other => invalid(format!("pools[{p}].discovery"), other.to_string()),
                })?;
            } else if pool.instances.is_empty() {
                return Err(invalid(
                    format!("pools[{p}].instances"),
                    "a pool needs at least one instance (or a [pools.discovery] source)",
                ));
            }
            for (i, inst) in pool.instances.iter().enumerate() {
                let key = format!("pools[{p}].instances[{i}]");
                let (authority, https) = crate::fleet::parse_base_url(&inst.url)
                    .map_err(|m| invalid(format!("{key}.url"), m))?;
                if https && self.upstream.tls.is_none() {
                    return Err(invalid(
                        format!("{key}.url"),
                        "an https:// instance needs [upstream.tls] (ca_file or system_roots)",
                    ));
                }
                let name = inst.name.clone().unwrap_or(authority);
                if name.is_empty() || http::HeaderValue::from_str(&name).is_err() {
                    return Err(invalid(
                        format!("{key}.name"),
                        "must be non-empty printable ASCII",
                    ));
                }
                if !names.insert(name.clone()) {
                    return Err(invalid(
                        format!("{key}.name"),
                        format!("instance name `{name}` is used twice"),
                    ));
                }
                if inst.capacity_blocks == Some(0) {
                    return Err(invalid(format!("{key}.capacity_blocks"), "must be >= 1"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn bad_listen_names_key() {
        let mut c = Config::default();
        c.server.listen = "nope".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("server.listen"), "{e}");
    }

    fn with_static_instance() -> Config {
        Config {
            pools: vec![PoolConfig::serving(
                "m",
                vec![InstanceConfig::at("i0", "http://10.0.0.1:8000")],
            )],
            ..Config::default()
        }
    }

    #[test]
    fn the_admin_surface_default_depends_on_the_fleet() {
        // The embedded simulated fleet: on the main listener, as before.
        let mut c = Config::default();
        assert_eq!(c.fleet_kind(), FleetKind::Embedded);
        assert!(c.server.admin_listen.is_empty());
        c.settle_admin_listen(false);
        assert_eq!(c.server.admin_listen, ADMIN_ON_MAIN);
        assert!(!c.server.has_admin_listener());
        c.validate().unwrap();
        // Settled before the embedded fleet fills `pools`: the embedded pool does not move it.
        c.pools = with_static_instance().pools;
        c.settle_admin_listen(false);
        assert_eq!(c.server.admin_listen, ADMIN_ON_MAIN);

        // Static instances: a loopback admin listener of its own.
        let mut c = with_static_instance();
        assert_eq!(c.fleet_kind(), FleetKind::Real);
        c.settle_admin_listen(false);
        assert_eq!(c.server.admin_listen, DEFAULT_ADMIN_LISTEN);
        assert!(c.server.has_admin_listener());
        let a: std::net::SocketAddr = c.server.admin_listen.parse().unwrap();
        assert!(a.ip().is_loopback());
        c.validate().unwrap();

        // Discovered instances: the same.
        let mut c = Config::default();
        let mut pool = PoolConfig::serving("m", vec![]);
        pool.discovery.source = kvgate_discovery::SourceKind::Dns;
        c.pools = vec![pool];
        assert_eq!(c.fleet_kind(), FleetKind::Real);
        c.settle_admin_listen(false);
        assert_eq!(c.server.admin_listen, DEFAULT_ADMIN_LISTEN);

        // An admin token keeps it on the main listener, closed by the token.
        let mut c = with_static_instance();
        c.settle_admin_listen(true);
        assert_eq!(c.server.admin_listen, ADMIN_ON_MAIN);
        let mut c = with_static_instance();
        c.auth.admin_token_file = "/etc/kvgate/admin-token".into();
        assert!(c.auth.admin_token_configured(None));
        let mut c2 = with_static_instance();
        assert!(c2.auth.admin_token_configured(Some("t")));
        assert!(!c2.auth.admin_token_configured(Some("  ")));
        c.settle_admin_listen(c.auth.admin_token_configured(None));
        assert_eq!(c.server.admin_listen, ADMIN_ON_MAIN);

        // What the operator wrote stays.
        for explicit in [ADMIN_ON_MAIN, "0.0.0.0:9091"] {
            c2.server.admin_listen = explicit.into();
            c2.settle_admin_listen(false);
            assert_eq!(c2.server.admin_listen, explicit);
            c2.validate().unwrap();
        }
    }

    #[test]
    fn admin_listen_is_main_or_another_socket_address() {
        let mut c = Config::default();
        c.server.admin_listen = "127.0.0.1:9091".into();
        c.validate().unwrap();
        c.server.admin_listen = "main".into();
        c.validate().unwrap();
        c.server.admin_listen = "localhost".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("server.admin_listen"), "{e}");
        c.server.admin_listen = c.server.listen.clone();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("must differ"), "{e}");
        // Ephemeral ports (tests) may be written alike.
        c.server.listen = "127.0.0.1:0".into();
        c.server.admin_listen = "127.0.0.1:0".into();
        c.validate().unwrap();
    }

    #[test]
    fn tls_on_the_admin_listener_needs_one() {
        let mut c = Config::default();
        c.server.tls = Some(crate::config::ServerTlsConfig {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
            admin: true,
            ..Default::default()
        });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("server.tls.admin"), "{e}");
        c.server.admin_listen = "127.0.0.1:9091".into();
        c.validate().unwrap();
        c.server.admin_listen = ADMIN_ON_MAIN.into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("server.tls.admin"), "{e}");
        // In front of real instances an empty admin_listen is the default admin listener.
        let mut c = with_static_instance();
        c.server.tls = Some(crate::config::ServerTlsConfig {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
            admin: true,
            ..Default::default()
        });
        c.validate().unwrap();
    }

    #[test]
    fn env_overrides_apply_and_bad_values_name_the_variable() {
        let vars: HashMap<&str, &str> = [
            (env::LISTEN, "0.0.0.0:9000"),
            (env::LOG_FORMAT, "json"),
            (env::MAX_ATTEMPTS, "5"),
            (env::DRAIN_DELAY_MS, "5000"),
            (env::GOSSIP_ADVERTISE, "10.1.2.3:7946"),
            (
                env::GOSSIP_PREVIOUS_SECRETS,
                "old-secret-0123456789, older-secret-0123456",
            ),
            (env::MAX_CONNECTIONS, "500"),
            (env::HEADER_READ_TIMEOUT_MS, "2000"),
            (env::BODY_READ_TIMEOUT_MS, "3000"),
            (env::IDLE_TIMEOUT_MS, "4000"),
            (env::WRITE_TIMEOUT_MS, "5000"),
            (env::BODY_BUDGET_BYTES, "1048576"),
            (env::BODY_BUDGET_WAIT_MS, "250"),
            (env::PICKER_ENABLED, "true"),
            (env::PICKER_LISTEN, "0.0.0.0:9100"),
            (env::EVICT_IDLE_AT_CAPACITY, "false"),
            (env::ADMIN_LISTEN, "127.0.0.1:9091"),
        ]
        .into();
        let mut c = Config::default();
        c.apply_env(|k| vars.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(c.server.drain_delay_ms, 5000);
        assert_eq!(c.gossip.advertise, "10.1.2.3:7946");
        assert_eq!(
            c.gossip.previous_secrets,
            ["old-secret-0123456789", "older-secret-0123456"]
        );
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.server.admin_listen, "127.0.0.1:9091");
        assert!(c.picker.enabled);
        assert_eq!(c.picker.listen, "0.0.0.0:9100");
        assert_eq!(c.server.log_format, LogFormat::Json);
        assert_eq!(c.upstream.max_attempts, 5);
        let l = &c.server.limits;
        assert_eq!(
            (
                l.max_connections,
                l.body_budget_bytes,
                l.body_budget_wait_ms
            ),
            (500, 1 << 20, 250)
        );
        assert!(!l.evict_idle_at_capacity);
        assert_eq!(
            (
                l.header_read_timeout_ms,
                l.body_read_timeout_ms,
                l.idle_timeout_ms,
                l.write_timeout_ms
            ),
            (2000, 3000, 4000, 5000)
        );
        let e = c
            .apply_env(|k| (k == env::IDLE_TIMEOUT_MS).then(|| "soon".to_string()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("KVGATE_IDLE_TIMEOUT_MS") && e.contains("server.limits.idle_timeout_ms"),
            "{e}"
        );

        let e = c
            .apply_env(|k| (k == env::BODY_LIMIT_BYTES).then(|| "lots".to_string()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("KVGATE_BODY_LIMIT_BYTES") && e.contains("server.body_limit_bytes"),
            "{e}"
        );
    }

    #[test]
    fn bad_kvgate_param_names_key() {
        let mut c = Config::default();
        c.routing.policy.kvgate.stall_weight = -1.0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("routing.policy.kvgate.stall_weight"), "{e}");
    }

    #[test]
    fn duplicate_instance_names_rejected() {
        let text = r#"
            [[pools]]
            model = "m"
            instances = [{ url = "http://127.0.0.1:1" }, { url = "http://127.0.0.1:1" }]
        "#;
        let c = Config::from_toml_str(text, "t").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("pools[0].instances[1].name"), "{e}");
    }
}
