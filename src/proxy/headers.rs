//! Header handling at the proxy edge: hop-by-hop filtering, request ids, kvgate's own headers.
//!
//! Invariant: end-to-end headers pass through unchanged in both directions; only the hop-by-hop set
//! of RFC 9110 §7.6.1 (plus any header the `Connection` header names) and `Host` are dropped.

use crate::client::wire::{is_hop_by_hop, HOP_BY_HOP};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Response header: the instance that served the request.
pub const X_INSTANCE: HeaderName = HeaderName::from_static("x-kvgate-instance");
/// Response header: leading prompt blocks the chosen instance held.
pub const X_MATCHED_BLOCKS: HeaderName = HeaderName::from_static("x-kvgate-matched-blocks");
/// Response header: the policy's predicted time to first token on the chosen instance, in ms.
pub const X_PREDICTED_TTFT: HeaderName = HeaderName::from_static("x-kvgate-predicted-ttft-ms");

/// The first value of field `name` (lowercase) in either form of a request's headers.
pub fn find<'a>(headers: &crate::client::OutHeaders<'a>, name: &str) -> Option<&'a [u8]> {
    use crate::client::OutHeaders;
    match *headers {
        OutHeaders::Map(map) => map.get(name).map(HeaderValue::as_bytes),
        OutHeaders::Fields(fields) => fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v),
    }
}

/// Whether a client's field `name` may reach the instance and kvgate's own hint readers: no
/// `x-kvgate-*` field but the ones kvgate accepts from clients (`x-kvgate-priority` and the
/// admission tenant header), and no client API key when `strip_key`.
pub fn from_client(name: &[u8], tenant_header: &str, strip_key: bool) -> bool {
    const PREFIX: &[u8] = b"x-kvgate-";
    if name.len() >= PREFIX.len() && name[..PREFIX.len()].eq_ignore_ascii_case(PREFIX) {
        return name.eq_ignore_ascii_case(crate::admission::PRIORITY_HEADER.as_bytes())
            || name.eq_ignore_ascii_case(tenant_header.as_bytes());
    }
    !(strip_key
        && (name.eq_ignore_ascii_case(b"authorization") || name.eq_ignore_ascii_case(b"x-api-key")))
}

/// Removes hop-by-hop headers ([`HOP_BY_HOP`], and those listed in `Connection`) in place.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass of cheap comparisons first: usually there is nothing to remove, and a removal
    // hashes its name.
    if !headers.keys().any(|k| is_hop_by_hop(k.as_str().as_bytes())) {
        return;
    }
    if let Some(conn) = headers.get(header::CONNECTION).cloned() {
        if let Ok(list) = conn.to_str() {
            for name in list.split(',') {
                if let Ok(n) = HeaderName::from_bytes(name.trim().as_bytes()) {
                    headers.remove(n);
                }
            }
        }
    }
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
}

/// The client's request id if it sent a usable one, else a fresh one.
pub fn request_id(sent: Option<&HeaderValue>) -> HeaderValue {
    if let Some(v) = sent {
        if !v.is_empty() && v.len() <= 256 {
            return v.clone();
        }
    }
    generate_id()
}

/// A process-unique id: a random per-process prefix and a counter, as
/// `{prefix:016x}-{counter:08x}` (no syscall and no formatting machinery per request).
fn generate_id() -> HeaderValue {
    static PREFIX: OnceLock<[u8; 16]> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let mut hex = [0u8; 16];
        hex_into(&mut hex, rand::random::<u64>());
        hex
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let digits = if n >> 32 == 0 { 8 } else { 16 };
    let mut buf = [0u8; 33];
    buf[..16].copy_from_slice(prefix);
    buf[16] = b'-';
    hex_into(&mut buf[17..17 + digits], n);
    // Hex digits and '-' are always a valid header value.
    HeaderValue::from_bytes(&buf[..17 + digits])
        .unwrap_or_else(|_| HeaderValue::from_static("kvgate"))
}

/// Writes the low `out.len()` hex digits of `v`, most significant first.
fn hex_into(out: &mut [u8], mut v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in out.iter_mut().rev() {
        *b = HEX[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// `v` with one decimal, like `format!("{v:.1}")` but without the formatting machinery or an
/// allocation for ordinary values (exact halves may round away from zero instead of to even).
pub fn one_decimal(v: f64) -> Option<HeaderValue> {
    if !v.is_finite() || v.abs() >= 1e15 {
        return HeaderValue::from_str(&format!("{v:.1}")).ok();
    }
    let tenths = (v.abs() * 10.0).round() as u64;
    let mut buf = [0u8; 24];
    let mut i = buf.len() - 2;
    buf[i + 1] = b'0' + (tenths % 10) as u8;
    buf[i] = b'.';
    let mut n = tenths / 10;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0.0 && tenths != 0 {
        i -= 1;
        buf[i] = b'-';
    }
    HeaderValue::from_bytes(&buf[i..]).ok()
}

/// True when the `Content-Type` value is JSON (`application/json`, optionally with parameters).
pub fn is_json(content_type: Option<&HeaderValue>) -> Result<(), String> {
    match content_type {
        None => Err("(none)".to_string()),
        // What nearly every client sends.
        Some(v) if v.as_bytes() == b"application/json" => Ok(()),
        Some(v) => {
            let s = v.to_str().map_err(|_| "(unprintable)".to_string())?;
            let mime = s.split(';').next().unwrap_or("").trim();
            if mime.eq_ignore_ascii_case("application/json")
                || (mime.len() > 5
                    && mime[..mime.len().min(12)].eq_ignore_ascii_case("application/")
                    && mime.to_ascii_lowercase().ends_with("+json"))
            {
                Ok(())
            } else {
                Err(s.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_connection_listed_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn json_content_types() {
        let mut h = HeaderMap::new();
        let is_json = |h: &HeaderMap| is_json(h.get(header::CONTENT_TYPE));
        assert!(is_json(&h).is_err());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert!(is_json(&h).is_ok());
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(is_json(&h).is_err());
    }

    #[test]
    fn one_decimal_matches_format() {
        for v in [
            0.0,
            0.04,
            0.06,
            1.0,
            9.96,
            12.34,
            99.99,
            1234.5678,
            -3.21,
            1e14 + 0.3,
        ] {
            let want = format!("{v:.1}");
            assert_eq!(one_decimal(v).unwrap(), want.as_str(), "{v}");
        }
        assert_eq!(one_decimal(f64::INFINITY).unwrap(), "inf");
    }

    #[test]
    fn ids_are_kept_or_generated_unique() {
        let a = request_id(None);
        let b = request_id(None);
        assert_ne!(a, b);
        assert_eq!(request_id(Some(&HeaderValue::from_static("abc"))), "abc");
        let long = HeaderValue::from_str(&"a".repeat(257)).unwrap();
        assert_ne!(request_id(Some(&long)), long);
        assert_ne!(request_id(Some(&HeaderValue::from_static(""))), "");
    }
}
