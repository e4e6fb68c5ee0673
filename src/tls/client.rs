//! The upstream client's rustls config, for `https://` instances: TLS 1.2 and 1.3, servers
//! verified against `[upstream.tls] ca_file` (and the system's roots with `system_roots`), and
//! the gateway's own certificate presented when `cert_file` and `key_file` are set (mTLS to
//! engines).
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
    let mut roots = if c.ca_file.is_empty() {
        rustls::RootCertStore::empty()
    } else {
        pem::roots(&c.ca_file)?
    };
    if c.system_roots {
        system_roots(&mut roots)?;
    }
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

/// Adds the system's CA certificates to `roots`. Certificates rustls cannot parse are skipped
/// (a distribution bundle may hold a few); none usable is an error, since every instance would
/// then fail its handshake.
fn system_roots(roots: &mut rustls::RootCertStore) -> Result<(), TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no certificates found".to_string());
        return Err(TlsError::Pem {
            path: "the system's CA certificates (SSL_CERT_FILE, SSL_CERT_DIR)".to_string(),
            message: why,
        });
    }
    Ok(())
}
