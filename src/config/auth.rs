//! `[auth]`: client API keys.
//!
//! Invariant: off by default; the keys themselves never live in this struct (only where to find
//! them), so printing the config never prints a key.

use serde::{Deserialize, Serialize};

/// Whether a tenant's prompts may hit KV cache another tenant filled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheSharing {
    /// One cache for all tenants: the most hits.
    #[default]
    Shared,
    /// The tenant's own partition: kvgate mixes the tenant into its block hashes and sets the
    /// engine's `cache_salt`, so another tenant's cached prefix never shortens its prefill (nor
    /// reveals, by timing, that someone sent it).
    Isolated,
}

/// Client authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Require an API key (`Authorization: Bearer <key>` or `x-api-key: <key>`) on the proxied
    /// endpoints and `/v1/models`.
    pub enabled: bool,
    /// A TOML file of `[[keys]]` tables (`key`, `tenant`, optional `models`); empty = none.
    /// Reloaded when its content changes, every `reload_interval_ms`.
    pub keys_file: String,
    /// How often the keys file is checked for changes, milliseconds.
    pub reload_interval_ms: u64,
    /// Answer 404 `model_not_found` instead of 403 `model_not_allowed` for a model outside the
    /// key's allow-list, so a tenant cannot learn which other models exist.
    pub hide_disallowed_models: bool,
    /// Forward the client's `Authorization` / `x-api-key` to the instance (off: stripped).
    pub forward_client_key: bool,
    /// A file holding the admin token (its content, trimmed; at least 16 bytes): when set (or
    /// `KVGATE_ADMIN_TOKEN` is), `/admin/*` and `/metrics` need `Authorization: Bearer <token>`.
    /// `/health` and `/ready` stay open for probes. Empty = no token.
    pub admin_token_file: String,
    /// Cache sharing of tenants whose `[[tenants]]` entry does not choose (`cache = ...`).
    pub cache: CacheSharing,
}

impl AuthConfig {
    /// Whether an admin token is set: `env` (the value of `KVGATE_ADMIN_TOKEN`, when set and not
    /// blank) or `admin_token_file`. Whether the token is usable is checked when it is loaded.
    pub fn admin_token_configured(&self, env: Option<&str>) -> bool {
        env.is_some_and(|v| !v.trim().is_empty()) || !self.admin_token_file.is_empty()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            keys_file: String::new(),
            reload_interval_ms: 2000,
            hide_disallowed_models: false,
            forward_client_key: false,
            admin_token_file: String::new(),
            cache: CacheSharing::Shared,
        }
    }
}
