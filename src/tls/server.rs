//! The listener's rustls config: TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`, the certificate
//! from [`super::reload::Reloading`], client certificates verified against `client_ca_file` when
//! `client_auth` asks for them.
//!
//! Invariant: a client that offers no ALPN, or only `http/1.1`, is served HTTP/1.1; `h2` only
//! when it offered `h2`.

use super::reload::Reloading;
use super::{pem, TlsError, VERSIONS};
use crate::config::{ClientAuth, ServerTlsConfig};
use rustls::server::WebPkiClientVerifier;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// What the listener needs of TLS: the acceptor, and the pair it serves (for reloading).
#[derive(Clone)]
pub struct ServerTls {
    /// Accepts handshakes with the current pair.
    pub acceptor: TlsAcceptor,
    /// The pair in force, re-read by [`super::reload::watch`].
    pub pair: Arc<Reloading>,
}

impl ServerTls {
    /// Builds the listener's TLS from a validated `[server.tls]`; an error names the file.
    pub fn new(c: &ServerTlsConfig) -> Result<Self, TlsError> {
        let provider = super::provider();
        let pair = Arc::new(Reloading::load(
            &c.cert_file,
            &c.key_file,
            provider.clone(),
        )?);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(VERSIONS)
            .map_err(|source| TlsError::Rustls {
                what: "TLS versions".to_string(),
                source,
            })?;
        let builder = match (&c.client_ca_file, c.client_auth) {
            (Some(ca), ClientAuth::Optional | ClientAuth::Required) => {
                let roots = Arc::new(pem::roots(ca)?);
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
                let verifier = if c.client_auth == ClientAuth::Optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier.build().map_err(|e| TlsError::Verifier {
                    path: ca.clone(),
                    message: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(pair.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            pair,
        })
    }
}
