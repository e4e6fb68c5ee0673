//! Client API keys: who is calling, as which tenant, allowed which models.
//!
//! Invariants:
//! - Keys are held only as SHA-256 digests; a presented key is hashed and compared against every
//!   stored digest in constant time ([`subtle`]), so neither timing nor a memory dump gives a key.
//! - No key ever reaches a log line or `Debug` output: [`Principal`] and [`Keys`] print tenants only.
//! - A keys file that fails to read or parse on reload keeps the keys in force (logged as an error).
//! - A keys file is read with a bound ([`MAX_KEYS_FILE_BYTES`]).
//! - A tenant's rate limits come from its `[[tenants]]` table and from its keys' own limit
//!   fields; two places giving one tenant different values make the file invalid, so which
//!   one applies never depends on order. Every reload bumps [`Keys::generation`].

use crate::client::OutHeaders;
use crate::config::AuthConfig;
use crate::error::GatewayError;
use kvgate_core::admission::Priority;
use kvgate_core::ratelimit::Limits;
use parking_lot::RwLock;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

/// Environment variable holding extra keys: comma-separated `key:tenant` pairs.
pub const ENV_KEYS: &str = "KVGATE_API_KEYS";
/// The largest keys file read, bytes.
pub const MAX_KEYS_FILE_BYTES: u64 = 1 << 20;

/// Who a valid key belongs to.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The key's tenant (admission fair share, audit, metrics).
    pub tenant: Arc<str>,
    /// Models the key may use; `None` = all.
    pub models: Option<Arc<[String]>>,
    /// The most urgent admission class the key may ask for; more urgent asks are lowered to it.
    pub max_priority: Option<Priority>,
    /// The tenant's cache sharing, when its `[[tenants]]` entry chooses (else `auth.cache`).
    pub cache: Option<crate::config::CacheSharing>,
}

impl Principal {
    /// Whether this principal may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x == model))
    }
}

struct Entry {
    digest: [u8; 32],
    who: Principal,
}

/// A keys file's content.
#[derive(Default)]
struct Loaded {
    entries: Vec<Entry>,
    /// Every tenant the file names, with the limits it gives (unset fields: the defaults).
    tenants: Vec<(Arc<str>, Limits)>,
}

/// The keys in force, replaceable on reload.
pub struct Keys {
    enabled: bool,
    loaded: RwLock<Arc<Loaded>>,
    env: Vec<Entry>,
    generation: AtomicU64,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("enabled", &self.enabled)
            .field("count", &self.loaded.read().entries.len())
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
    #[serde(default)]
    tenants: Vec<TenantEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    key: String,
    tenant: String,
    #[serde(default)]
    models: Option<Vec<String>>,
    #[serde(default)]
    requests_per_second: Option<u64>,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
    #[serde(default)]
    burst_requests: Option<u64>,
    #[serde(default)]
    burst_tokens: Option<u64>,
    #[serde(default)]
    max_priority: Option<Priority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    #[serde(default)]
    cache: Option<crate::config::CacheSharing>,
    #[serde(default)]
    requests_per_second: Option<u64>,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
    #[serde(default)]
    burst_requests: Option<u64>,
    #[serde(default)]
    burst_tokens: Option<u64>,
    #[serde(default)]
    max_priority: Option<Priority>,
}

/// Merges `add` into `into`; a field both set to different values is an error naming it.
fn merge_limits(into: &mut Limits, add: Limits) -> Result<(), &'static str> {
    for (key, a, b) in [
        (
            "requests_per_second",
            &mut into.requests_per_second,
            add.requests_per_second,
        ),
        (
            "tokens_per_minute",
            &mut into.tokens_per_minute,
            add.tokens_per_minute,
        ),
        (
            "burst_requests",
            &mut into.burst_requests,
            add.burst_requests,
        ),
        ("burst_tokens", &mut into.burst_tokens, add.burst_tokens),
    ] {
        match (*a, b) {
            (Some(x), Some(y)) if x != y => return Err(key),
            (None, Some(y)) => *a = Some(y),
            _ => {}
        }
    }
    Ok(())
}

/// A keys source that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The file could not be read.
    #[error("cannot read keys file {0}: {1}")]
    Read(String, std::io::Error),
    /// The file is larger than [`MAX_KEYS_FILE_BYTES`].
    #[error("keys file {0} is larger than {MAX_KEYS_FILE_BYTES} bytes")]
    TooLarge(String),
    /// The file is not a valid keys file.
    #[error("keys file {0} is invalid: {1}")]
    Parse(String, String),
    /// `KVGATE_API_KEYS` is not `key:tenant` pairs.
    #[error("{ENV_KEYS} must be comma-separated key:tenant pairs")]
    Env,
    /// The admin token cannot be used.
    #[error("{0}")]
    Invalid(String),
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

fn entry(key: &str, tenant: &str, models: Option<Vec<String>>) -> Entry {
    Entry {
        digest: digest(key.as_bytes()),
        who: Principal {
            tenant: tenant.into(),
            models: models.map(Into::into),
            max_priority: None,
            cache: None,
        },
    }
}

/// Parses a keys file's text.
fn parse_file(origin: &str, text: &str) -> Result<Loaded, KeysError> {
    let bad = |m: String| KeysError::Parse(origin.into(), m);
    let file: KeysFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
    let mut tenants: Vec<(Arc<str>, Limits)> = Vec::new();
    let mut add = |name: &str, limits: Limits| -> Result<(), KeysError> {
        limits
            .validate()
            .map_err(|(k, m)| bad(format!("tenant `{name}`: {k} {m}")))?;
        match tenants.iter_mut().find(|(n, _)| &**n == name) {
            Some((_, l)) => merge_limits(l, limits).map_err(|k| {
                bad(format!(
                    "tenant `{name}` is given two different values of {k}"
                ))
            }),
            None => {
                tenants.push((name.into(), limits));
                Ok(())
            }
        }
    };
    for t in &file.tenants {
        if t.name.is_empty() {
            return Err(bad("every tenant needs a non-empty name".into()));
        }
        if tenants_named(&file.tenants, &t.name) > 1 {
            return Err(bad(format!("tenant `{}` is listed twice", t.name)));
        }
        add(
            &t.name,
            Limits {
                requests_per_second: t.requests_per_second,
                tokens_per_minute: t.tokens_per_minute,
                burst_requests: t.burst_requests,
                burst_tokens: t.burst_tokens,
            },
        )?;
    }
    let mut entries = Vec::with_capacity(file.keys.len());
    for k in file.keys {
        if k.key.is_empty() || k.tenant.is_empty() {
            return Err(bad("every key needs a non-empty key and tenant".into()));
        }
        add(
            &k.tenant,
            Limits {
                requests_per_second: k.requests_per_second,
                tokens_per_minute: k.tokens_per_minute,
                burst_requests: k.burst_requests,
                burst_tokens: k.burst_tokens,
            },
        )?;
        let mut e = entry(&k.key, &k.tenant, k.models);
        // The key's own ceiling, else its tenant's.
        e.who.max_priority = k.max_priority.or_else(|| {
            file.tenants
                .iter()
                .find(|t| t.name == k.tenant)
                .and_then(|t| t.max_priority)
        });
        e.who.cache = file
            .tenants
            .iter()
            .find(|t| t.name == k.tenant)
            .and_then(|t| t.cache);
        entries.push(e);
    }
    Ok(Loaded { entries, tenants })
}

fn tenants_named(tenants: &[TenantEntry], name: &str) -> usize {
    tenants.iter().filter(|t| t.name == name).count()
}

/// Parses `key:tenant,key:tenant`.
fn parse_env(text: &str) -> Result<Vec<Entry>, KeysError> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.rsplit_once(':') {
            Some((k, t)) if !k.is_empty() && !t.is_empty() => Ok(entry(k, t, None)),
            _ => Err(KeysError::Env),
        })
        .collect()
}

/// Reads a keys file under the size bound.
fn read_file(path: &str) -> Result<String, KeysError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| KeysError::Read(path.into(), e))?;
    let mut text = String::new();
    f.take(MAX_KEYS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| KeysError::Read(path.into(), e))?;
    if text.len() as u64 > MAX_KEYS_FILE_BYTES {
        return Err(KeysError::TooLarge(path.into()));
    }
    Ok(text)
}

impl Keys {
    /// The keys `cfg` names (file, then [`ENV_KEYS`] from `env_keys`). Off: no keys, no checks.
    pub fn load(cfg: &AuthConfig, env_keys: Option<&str>) -> Result<Keys, KeysError> {
        let env = match env_keys {
            Some(t) if cfg.enabled => parse_env(t)?,
            _ => Vec::new(),
        };
        let file = if cfg.enabled && !cfg.keys_file.is_empty() {
            parse_file(&cfg.keys_file, &read_file(&cfg.keys_file)?)?
        } else {
            Loaded::default()
        };
        Ok(Keys {
            enabled: cfg.enabled,
            loaded: RwLock::new(Arc::new(file)),
            env,
            generation: AtomicU64::new(0),
        })
    }

    /// Whether keys are required.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The principal of `key`, compared against every digest in constant time.
    fn lookup(&self, key: &[u8]) -> Option<Principal> {
        let d = digest(key);
        let file = self.loaded.read().clone();
        let mut found = None;
        for e in file.entries.iter().chain(self.env.iter()) {
            // No early exit: the time taken does not depend on which entry matched.
            if bool::from(e.digest.ct_eq(&d)) && found.is_none() {
                found = Some(e.who.clone());
            }
        }
        found
    }

    /// The request's principal: `Ok(None)` when auth is off, 401 when on and the request's
    /// `Authorization: Bearer` / `x-api-key` key is missing or unknown.
    pub fn check(&self, headers: &OutHeaders<'_>) -> Result<Option<Principal>, GatewayError> {
        if !self.enabled {
            return Ok(None);
        }
        let key = presented(headers).ok_or(GatewayError::InvalidApiKey)?;
        self.lookup(key)
            .map(Some)
            .ok_or(GatewayError::InvalidApiKey)
    }

    /// Replaces the file's keys with `text`'s; on error keeps the old ones.
    fn replace(&self, origin: &str, text: &str) -> Result<usize, KeysError> {
        let new = parse_file(origin, text)?;
        let n = new.entries.len();
        *self.loaded.write() = Arc::new(new);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(n)
    }

    /// Bumped on every reload: a cheap way to see that [`Keys::tenants`] may have changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every tenant the keys name (file tenants with their limits, then the environment keys'
    /// tenants with none of their own), each once.
    pub fn tenants(&self) -> Vec<(Arc<str>, Limits)> {
        let mut out = self.loaded.read().tenants.clone();
        for e in &self.env {
            if !out.iter().any(|(n, _)| *n == e.who.tenant) {
                out.push((e.who.tenant.clone(), Limits::default()));
            }
        }
        out
    }
}

/// The key a request presents: `Authorization: Bearer <key>`, else `x-api-key`.
fn presented<'a>(headers: &OutHeaders<'a>) -> Option<&'a [u8]> {
    let bearer = crate::proxy::headers::find(headers, "authorization").and_then(|v| {
        let v = v.trim_ascii();
        (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
    });
    bearer
        .or_else(|| crate::proxy::headers::find(headers, "x-api-key").map(<[u8]>::trim_ascii))
        .filter(|k| !k.is_empty())
}

/// Reloads `cfg.keys_file` whenever its content changes, every `cfg.reload_interval_ms`, until
/// `token` is cancelled.
pub async fn reload_loop(keys: Arc<Keys>, cfg: AuthConfig, token: CancellationToken) {
    if !cfg.enabled || cfg.keys_file.is_empty() {
        return;
    }
    let mut last = read_file(&cfg.keys_file).ok();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.reload_interval_ms.max(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let path = cfg.keys_file.clone();
        let read = tokio::task::spawn_blocking(move || read_file(&path)).await;
        let text = match read {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                tracing::error!("keys file reload failed, keeping the keys in force: {e}");
                continue;
            }
            Err(_) => continue,
        };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        match keys.replace(&cfg.keys_file, &text) {
            Ok(n) => tracing::info!(keys = n, "keys file reloaded"),
            Err(e) => tracing::error!("keys file reload failed, keeping the keys in force: {e}"),
        }
        last = Some(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> AuthConfig {
        AuthConfig {
            enabled: true,
            ..AuthConfig::default()
        }
    }

    #[test]
    fn env_keys_and_both_header_styles() {
        let keys = Keys::load(&on(), Some("sk-a:alpha, sk-b:beta")).unwrap();
        let mut h = http::HeaderMap::new();
        assert!(keys.check(&OutHeaders::Map(&h)).is_err());
        h.insert("authorization", "Bearer sk-b".parse().unwrap());
        let p = keys.check(&OutHeaders::Map(&h)).unwrap().unwrap();
        assert_eq!(&*p.tenant, "beta");
        h.clear();
        h.insert("x-api-key", "sk-a".parse().unwrap());
        let p = keys.check(&OutHeaders::Map(&h)).unwrap().unwrap();
        assert_eq!(&*p.tenant, "alpha");
        h.insert("x-api-key", "sk-c".parse().unwrap());
        assert!(keys.check(&OutHeaders::Map(&h)).is_err());
        assert!(!format!("{keys:?}").contains("sk-"));
    }

    #[test]
    fn bad_reload_keeps_old_keys() {
        let keys = Keys::load(&on(), None).unwrap();
        keys.replace(
            "f",
            "[[keys]]\nkey = \"k1\"\ntenant = \"t\"\nmodels = [\"m\"]\n",
        )
        .unwrap();
        assert!(keys.replace("f", "not toml [").is_err());
        let p = keys.lookup(b"k1").unwrap();
        assert!(p.allows("m") && !p.allows("other"));
    }

    #[test]
    fn tenant_limits_merge_from_tenants_and_keys_and_conflicts_are_errors() {
        let text = r#"
            [[tenants]]
            name = "a"
            requests_per_second = 5

            [[keys]]
            key = "k1"
            tenant = "a"
            tokens_per_minute = 1000

            [[keys]]
            key = "k2"
            tenant = "b"
        "#;
        let l = parse_file("f", text).unwrap();
        let a = &l.tenants[0];
        assert_eq!(&*a.0, "a");
        assert_eq!(
            (a.1.requests_per_second, a.1.tokens_per_minute),
            (Some(5), Some(1000))
        );
        assert_eq!(l.tenants[1].1, Limits::default());
        let clash =
            format!("{text}\n[[keys]]\nkey = \"k3\"\ntenant = \"a\"\nrequests_per_second = 6\n");
        let e = parse_file("f", &clash).err().unwrap().to_string();
        assert!(e.contains("requests_per_second"), "{e}");
        let zero = "[[tenants]]\nname = \"z\"\nrequests_per_second = 0\n";
        assert!(parse_file("f", zero).is_err());
    }

    #[test]
    fn cache_sharing_comes_from_the_tenant_entry() {
        let text = r#"
            [[tenants]]
            name = "a"
            cache = "isolated"

            [[keys]]
            key = "k1"
            tenant = "a"

            [[keys]]
            key = "k2"
            tenant = "b"
        "#;
        let keys = Keys::load(&on(), None).unwrap();
        keys.replace("f", text).unwrap();
        let c = |k: &[u8]| keys.lookup(k).unwrap().cache;
        assert_eq!(c(b"k1"), Some(crate::config::CacheSharing::Isolated));
        assert_eq!(c(b"k2"), None);
        assert!(keys
            .replace("f", "[[tenants]]\nname = \"x\"\ncache = \"private\"\n")
            .is_err());
    }

    #[test]
    fn max_priority_from_the_key_else_its_tenant() {
        let text = r#"
            [[tenants]]
            name = "a"
            max_priority = "standard"

            [[keys]]
            key = "k1"
            tenant = "a"

            [[keys]]
            key = "k2"
            tenant = "a"
            max_priority = "sheddable"

            [[keys]]
            key = "k3"
            tenant = "b"
        "#;
        let keys = Keys::load(&on(), None).unwrap();
        keys.replace("f", text).unwrap();
        let p = |k: &[u8]| keys.lookup(k).unwrap().max_priority;
        assert_eq!(p(b"k1"), Some(Priority::Standard));
        assert_eq!(p(b"k2"), Some(Priority::Sheddable));
        assert_eq!(p(b"k3"), None);
        assert!(keys
            .replace(
                "f",
                "[[tenants]]\nname = \"x\"\nmax_priority = \"urgent\"\n"
            )
            .is_err());
    }

    #[test]
    fn off_checks_nothing() {
        let keys = Keys::load(&AuthConfig::default(), Some("x:y")).unwrap();
        let h = http::HeaderMap::new();
        assert!(keys.check(&OutHeaders::Map(&h)).unwrap().is_none());
    }
}

/// Environment variable holding the admin token (wins over `auth.admin_token_file`).
pub const ENV_ADMIN_TOKEN: &str = "KVGATE_ADMIN_TOKEN";

/// Shortest admin token accepted, bytes.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// The admin token guarding `/admin/*` and `/metrics`, held as a SHA-256 digest; `Debug` shows
/// only whether one is set.
#[derive(Clone, Default)]
pub struct AdminToken(Option<[u8; 32]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AdminToken({})",
            if self.0.is_some() { "set" } else { "none" }
        )
    }
}

impl AdminToken {
    /// From `env` (the value of [`ENV_ADMIN_TOKEN`]) or else `cfg.admin_token_file`; none when
    /// neither is set.
    pub fn load(cfg: &AuthConfig, env: Option<&str>) -> Result<AdminToken, KeysError> {
        let raw = match env.filter(|v| !v.trim().is_empty()) {
            Some(v) => v.trim().to_string(),
            None if cfg.admin_token_file.is_empty() => return Ok(AdminToken(None)),
            None => std::fs::read_to_string(&cfg.admin_token_file)
                .map_err(|e| KeysError::Invalid(format!("auth.admin_token_file: {e}")))?
                .trim()
                .to_string(),
        };
        if raw.len() < MIN_ADMIN_TOKEN_BYTES {
            return Err(KeysError::Invalid(format!(
                "the admin token must be at least {MIN_ADMIN_TOKEN_BYTES} bytes"
            )));
        }
        Ok(AdminToken(Some(digest(raw.as_bytes()))))
    }

    /// True when a token is required.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `authorization` (the header's value) carries the token; always true when no token
    /// is set. Constant time in the token.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(want) = &self.0 else {
            return true;
        };
        let Some(token) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) else {
            return false;
        };
        bool::from(digest(token.trim_ascii()).ct_eq(want))
    }
}
