//! TLS with rustls over the `ring` provider: on the listener, the server config ([`server`])
//! and its certificate reloading ([`reload`]); to `https://` instances, the upstream client's
//! config ([`client`]) and its reloading ([`upstream`]); PEM loading ([`pem`]).
//!
//! Invariants:
//! - Only TLS 1.2 and 1.3, with rustls' default (safe) cipher suites of the `ring` provider.
//! - Nothing here panics on bad files: every failure is a [`TlsError`] naming the file.

pub mod client;
pub mod pem;
pub mod reload;
pub mod server;
pub mod upstream;

use std::sync::Arc;

/// A TLS setup problem, naming the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file held no usable PEM item of the expected kind.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// rustls refused the material (a key that does not match its certificate, a bad CA).
    #[error("{what}: {source}")]
    Rustls {
        /// What was being set up.
        what: String,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The client certificate verifier could not be built from the CA file.
    #[error("{path}: {message}")]
    Verifier {
        /// The CA file.
        path: String,
        /// Why.
        message: String,
    },
}

/// The crypto provider every config here is built with.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The protocol versions offered and accepted.
pub const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];
