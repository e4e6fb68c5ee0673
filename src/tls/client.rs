//! The upstream client's rustls config, for `https://` instances: TLS 1.2 and 1.3, servers
//! verified against `[upstream.tls] ca_file` only, and the gateway's own certificate presented
//! when `cert_file` and `key_file` are set (mTLS to engines).
//!
//! Invariants:
//! - Built once at start-up from a validated `[upstream.tls]`; a missing, empty or unparsable
//!   file, or a key that does not match its certificate, is a start-up error naming the file.
//! - ALPN offers only `http/1.1`: the upstream client speaks HTTP/1.1.

use super::{pem, TlsError, VERSIONS};
use crate::config::UpstreamTlsConfig;
use std::sync::Arc;

/// The client config for `c`.
pub fn config(c: &UpstreamTlsConfig) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = pem::roots(&c.ca_file)?;
    let builder = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions".to_string(),
            source,
        })?
        .with_root_certificates(roots);
    let mut config = match (&c.cert_file, &c.key_file) {
        (Some(cert), Some(key)) => {
            let chain = pem::certs(cert, &pem::read(cert)?)?;
            let key_der = pem::key(key, &pem::read(key)?)?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|source| TlsError::Rustls {
                    what: format!("client certificate {cert} with key {key}"),
                    source,
                })?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![super::server::ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}
