//! A TLS engine for tests: a tokio-rustls terminator with a certificate from a test CA
//! (`pki.rs`), optionally requiring client certificates, relaying plaintext to a [`Mock`]; it
//! counts completed handshakes. Binds 127.0.0.1 port 0.

use crate::common::Mock;
use crate::pki;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A TLS engine: handshakes counted, plaintext relayed to the mock returned beside it.
pub struct TlsEngine {
    pub url: String,
    pub handshakes: Arc<AtomicUsize>,
}

/// Starts a TLS engine with a server certificate from `server_ca`, requiring client
/// certificates signed by `client_ca` when given.
pub async fn tls_engine(server_ca: &pki::Ca, client_ca: Option<&pki::Ca>) -> (TlsEngine, Mock) {
    tls_engine_with(&server_ca.server(), client_ca).await
}

/// Starts a TLS engine presenting `leaf`.
pub async fn tls_engine_with(leaf: &pki::Leaf, client_ca: Option<&pki::Ca>) -> (TlsEngine, Mock) {
    let mock = Mock::start("tls").await;
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
                .unwrap();
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(v)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plain = mock.addr;
    let handshakes = Arc::new(AtomicUsize::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(mut up) = tokio::net::TcpStream::connect(plain).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    let engine = TlsEngine {
        url: format!("https://127.0.0.1:{}", addr.port()),
        handshakes,
    };
    (engine, mock)
}
