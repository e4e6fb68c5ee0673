//! PEM certificates, keys and CA bundles, read from files.
//!
//! Invariant: an empty or unparsable file is an error naming the file, never an empty set.

use super::TlsError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

/// The bytes of `path`.
pub fn read(path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_string(),
        source,
    })
}

/// The certificates of PEM text `bytes` read from `path`, in order.
pub fn certs(path: &str, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_string(),
            message: format!("bad certificate PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_string(),
            message: "no CERTIFICATE in the file".to_string(),
        });
    }
    Ok(certs)
}

/// The private key of PEM text `bytes` read from `path`.
pub fn key(path: &str, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| TlsError::Pem {
        path: path.to_string(),
        message: format!("no usable private key: {e}"),
    })
}

/// A root store of every certificate in the PEM file `path`.
pub fn roots(path: &str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path, &read(path)?)? {
        store.add(cert).map_err(|source| TlsError::Rustls {
            what: format!("CA certificate in {path}"),
            source,
        })?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_pem_items_are_errors_naming_the_file() {
        let e = certs("x.pem", b"not pem").unwrap_err().to_string();
        assert!(e.contains("x.pem") && e.contains("CERTIFICATE"), "{e}");
        let e = key("k.pem", b"").unwrap_err().to_string();
        assert!(e.contains("k.pem"), "{e}");
        let e = read("/nonexistent/kvgate.pem").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/kvgate.pem"), "{e}");
    }
}
