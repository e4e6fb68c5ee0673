//! Tenant cache isolation (`cache = "isolated"`): the tenant's requests get a cache salt of
//! their own, mixed into kvgate's block hashes *and* sent to the engine as `cache_salt` (vLLM
//! partitions its prefix cache by it), so no other tenant's cached prefix shortens their prefill.
//!
//! Invariants:
//! - The salt depends only on the tenant and the client's own `cache_salt`: one tenant's
//!   requests still share a cache among themselves; a client salt partitions further *inside*
//!   the tenant, never outside it.
//! - The forwarded body is the client's bytes with one member appended before the closing `}`;
//!   nothing else is re-serialized. JSON readers keep the last of duplicate keys (Python's
//!   `json`, serde_json), so a client-sent `cache_salt` is overridden by the appended one.
//! - The salt is lowercase hex behind a fixed prefix: it needs no JSON escaping.

use crate::error::GatewayError;
use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};

/// The cache salt of `tenant`'s request whose own `cache_salt` is `client`.
pub fn tenant_salt(tenant: &str, client: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update((tenant.len() as u64).to_le_bytes());
    h.update(tenant.as_bytes());
    if let Some(c) = client {
        h.update([1]);
        h.update(c.as_bytes());
    }
    let d = h.finalize();
    let mut out = String::with_capacity(7 + 32);
    out.push_str("kvgate-");
    for b in &d[..16] {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

/// `body` (a JSON object, already validated) with `"cache_salt": salt` appended as its last
/// member.
pub fn with_cache_salt(body: &[u8], salt: &str) -> Result<Bytes, GatewayError> {
    let not_object = || GatewayError::Internal("the request body is not a JSON object".into());
    let close = body
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .filter(|&i| body[i] == b'}')
        .ok_or_else(not_object)?;
    let open = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&i| body[i] == b'{')
        .ok_or_else(not_object)?;
    let empty = body[open + 1..close].iter().all(u8::is_ascii_whitespace);
    let mut out = BytesMut::with_capacity(body.len() + salt.len() + 16);
    out.put_slice(&body[..close]);
    if !empty {
        out.put_u8(b',');
    }
    out.put_slice(b"\"cache_salt\":\"");
    out.put_slice(salt.as_bytes());
    out.put_u8(b'"');
    out.put_slice(&body[close..]);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salts_partition_by_tenant_then_by_client_salt() {
        let a = tenant_salt("a", None);
        assert_eq!(a, tenant_salt("a", None));
        assert_ne!(a, tenant_salt("b", None));
        assert_ne!(a, tenant_salt("a", Some("x")));
        assert_ne!(tenant_salt("a", Some("x")), tenant_salt("b", Some("x")));
        // Length-prefixed: no tenant/salt split collides.
        assert_ne!(tenant_salt("ab", None), tenant_salt("a", Some("b")));
        assert!(a.starts_with("kvgate-") && a.len() == 39);
    }

    #[test]
    fn the_member_is_appended_and_wins_over_the_clients() {
        let body = br#" {"model":"m","cache_salt":"mine","messages":[]}  "#;
        let out = with_cache_salt(body, "kvgate-00").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cache_salt"], "kvgate-00");
        assert_eq!(v["model"], "m");
        assert!(out.starts_with(br#" {"model":"m","cache_salt":"mine","messages":[]"#));
        let empty = with_cache_salt(b"{ }", "s").unwrap();
        assert_eq!(&empty[..], br#"{ "cache_salt":"s"}"#);
        assert!(with_cache_salt(b"[1]", "s").is_err());
    }
}
