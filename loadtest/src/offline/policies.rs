//! Policy names and `section.field=value` overrides of the routing core's policy configuration.
//!
//! Invariants: overrides go through the configuration's own serde representation, so an unknown
//! section or field is an error (never silently ignored) and every value is validated by the same
//! deserializer the gateway's config file uses.

use kvgate_core::policy::{build_policy, Policy, PolicyConfig, PolicyName};

use super::OfflineError;

/// Every policy the routing core offers, kvgate's default first.
pub fn all_policies() -> Vec<String> {
    PolicyName::ALL
        .iter()
        .map(|p| p.as_str().to_string())
        .collect()
}

/// `all` or a comma-separated list of known policy names.
pub fn resolve_policies(spec: &str) -> Result<Vec<String>, OfflineError> {
    let spec = spec.trim();
    if spec == "all" {
        return Ok(all_policies());
    }
    let mut out: Vec<String> = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Err(e) = name.parse::<PolicyName>() {
            return Err(OfflineError::Policy {
                name: name.to_string(),
                msg: e.to_string(),
            });
        }
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    if out.is_empty() {
        return Err(OfflineError::Param("no policy given".into()));
    }
    Ok(out)
}

/// Builds the named policy with `cfg`'s parameters (its `name` is replaced by `name`).
pub fn make_policy(name: &str, cfg: &PolicyConfig) -> Result<Box<dyn Policy>, OfflineError> {
    let name: PolicyName =
        name.parse().map_err(
            |e: kvgate_core::policy::UnknownPolicy| OfflineError::Policy {
                name: name.to_string(),
                msg: e.to_string(),
            },
        )?;
    let cfg = PolicyConfig {
        name,
        ..cfg.clone()
    };
    Ok(build_policy(&cfg))
}

/// The default policy configuration with `overrides` (`a.b=value`, value as JSON, or a bare
/// string) applied.
pub fn apply_overrides(overrides: &[String]) -> Result<PolicyConfig, OfflineError> {
    apply_overrides_to(&PolicyConfig::default(), overrides)
}

/// `base` with `overrides` applied.
pub fn apply_overrides_to(
    base: &PolicyConfig,
    overrides: &[String],
) -> Result<PolicyConfig, OfflineError> {
    apply_json_overrides(base, overrides, "policy config")
}

/// `base` (any serde section, here called `what`) with `overrides` (`a.b=value`, keys relative
/// to the section) applied through its JSON form; a field the section does not serialize (a
/// secret) comes back at its default.
pub fn apply_json_overrides<T: serde::Serialize + serde::de::DeserializeOwned>(
    base: &T,
    overrides: &[String],
    what: &str,
) -> Result<T, OfflineError> {
    let bad = |m: String| OfflineError::Param(m);
    let mut v = serde_json::to_value(base).map_err(|e| bad(format!("{what}: {e}")))?;
    for o in overrides {
        let (key, raw) = o
            .split_once('=')
            .ok_or_else(|| bad(format!("override `{o}`: expected KEY=VALUE")))?;
        let value: serde_json::Value = serde_json::from_str(raw.trim())
            .unwrap_or_else(|_| serde_json::Value::String(raw.trim().to_string()));
        let mut at = &mut v;
        let parts: Vec<&str> = key.trim().split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let obj = at
                .as_object_mut()
                .ok_or_else(|| bad(format!("override `{o}`: `{part}` is not inside a section")))?;
            if !obj.contains_key(*part) {
                let known: Vec<&String> = obj.keys().collect();
                return Err(bad(format!(
                    "override `{o}`: unknown key `{part}` (known: {known:?})"
                )));
            }
            let slot = obj
                .get_mut(*part)
                .ok_or_else(|| bad(format!("override `{o}`: unknown key `{part}`")))?;
            if i + 1 == parts.len() {
                *slot = value.clone();
                break;
            }
            at = slot;
        }
    }
    serde_json::from_value(v).map_err(|e| bad(format!("{what} after overrides: {e}")))
}
