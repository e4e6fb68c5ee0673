//! The listener's certificate and key, re-read when their files change.
//!
//! Invariants:
//! - Handshakes always get a complete, matching pair: the one in force is replaced only by a new
//!   pair that parsed and whose key matches its certificate; a bad new pair keeps the old one
//!   (an error is logged and counted) and is tried again when the files change again.
//! - A check reads the files only when a modification time (or size, or inode) changed since the last check, and
//!   swaps the pair only when their content (SHA-256 of both) changed.
//! - Open connections are untouched by a reload: only new handshakes see the new pair.

use super::{pem, TlsError};
use parking_lot::{Mutex, RwLock};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// What a check saw of one file: modification time, size and inode. The time alone misses a
/// rewrite within the file system's timestamp granularity; a rename also changes the inode.
pub(super) type Stamp = Option<(SystemTime, u64, u64)>;

/// What the last check saw of the files.
#[derive(PartialEq, Eq, Clone, Copy)]
struct Seen {
    cert: Stamp,
    key: Stamp,
}

/// The certificate resolver of the listener: the pair in force, and where to re-read it.
pub struct Reloading {
    cert_file: String,
    key_file: String,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// Modification times at the last check, and the content hash of the pair in force.
    seen: Mutex<(Seen, [u8; 32])>,
}

impl std::fmt::Debug for Reloading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

pub(super) fn mtime(path: &str) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let ino = 0;
    Some((m.modified().ok()?, m.len(), ino))
}

fn hash(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert.len() as u64).to_le_bytes());
    h.update(cert);
    h.update(key);
    h.finalize().into()
}

impl Reloading {
    /// Loads the pair from `cert_file` and `key_file`; an error names the file at fault.
    pub fn load(
        cert_file: &str,
        key_file: &str,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let seen = Seen {
            cert: mtime(cert_file),
            key: mtime(key_file),
        };
        let (pair, digest) = read_pair(cert_file, key_file, &provider)?;
        Ok(Self {
            cert_file: cert_file.to_string(),
            key_file: key_file.to_string(),
            provider,
            current: RwLock::new(Arc::new(pair)),
            seen: Mutex::new((seen, digest)),
        })
    }

    /// The pair in force.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }

    /// Re-reads the files if they changed. `Ok(true)`: a new pair is in force; `Ok(false)`:
    /// nothing changed; `Err`: the new files are unusable and the old pair stays.
    pub fn check(&self) -> Result<bool, TlsError> {
        let now = Seen {
            cert: mtime(&self.cert_file),
            key: mtime(&self.key_file),
        };
        let mut seen = self.seen.lock();
        if seen.0 == now {
            return Ok(false);
        }
        // Recorded before reading: a write that lands after the read changes the time again.
        seen.0 = now;
        let (pair, digest) = read_pair(&self.cert_file, &self.key_file, &self.provider)?;
        if digest == seen.1 {
            return Ok(false);
        }
        seen.1 = digest;
        *self.current.write() = Arc::new(pair);
        Ok(true)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Reads and checks a pair: certificates, key, and that the key is the certificate's.
fn read_pair(
    cert_file: &str,
    key_file: &str,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, [u8; 32]), TlsError> {
    let cert_pem = pem::read(cert_file)?;
    let key_pem = pem::read(key_file)?;
    let certs = pem::certs(cert_file, &cert_pem)?;
    let key = pem::key(key_file, &key_pem)?;
    let pair = CertifiedKey::from_der(certs, key, provider).map_err(|source| TlsError::Rustls {
        what: format!("{cert_file} with {key_file}"),
        source,
    })?;
    Ok((pair, hash(&cert_pem, &key_pem)))
}

/// TLS material re-read from its files when they change (the listener's pair, the upstream
/// client's config), checked by [`watch`].
pub trait Reloads: Send + Sync + 'static {
    /// Re-reads the files if they changed: `Ok(true)` a new set is in force, `Ok(false)` nothing
    /// changed, `Err` the new files are unusable and the old set stays.
    fn check(&self) -> Result<bool, TlsError>;
    /// Counts an outcome in the metrics.
    fn record(&self, ok: bool);
    /// What is reloaded, for the log (e.g. the certificate file).
    fn what(&self) -> String;
}

impl Reloads for Reloading {
    fn check(&self) -> Result<bool, TlsError> {
        Reloading::check(self)
    }
    fn record(&self, ok: bool) {
        crate::metrics::record_tls_reload(ok);
    }
    fn what(&self) -> String {
        format!("TLS certificate {}", self.cert_file)
    }
}

/// Checks `files` every `interval` until `stop` is cancelled, logging and counting outcomes.
pub async fn watch<T: Reloads>(files: Arc<T>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        // File reads are small and rare; a blocking thread keeps them off the serving threads.
        let f = files.clone();
        match tokio::task::spawn_blocking(move || f.check()).await {
            Ok(Ok(true)) => {
                files.record(true);
                tracing::info!("{} reloaded", files.what());
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                files.record(false);
                tracing::error!("{} not reloaded, the previous one stays: {e}", files.what());
            }
            Err(e) => tracing::error!("{} check failed: {e}", files.what()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kvgate-reload-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Writes beside and renames, so that the new file has a new modification time.
    fn put(path: &std::path::Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_bad_pair_keeps_the_old_one_and_a_good_one_replaces_it() {
        let d = dir();
        let (cert, key) = (d.join("a.crt"), d.join("a.key"));
        let (c1, k1) = pair();
        put(&cert, &c1);
        put(&key, &k1);
        let (cs, ks) = (cert.to_str().unwrap(), key.to_str().unwrap());
        let r = Reloading::load(cs, ks, crate::tls::provider()).unwrap();
        let first = r.current();
        assert!(!r.check().unwrap(), "nothing changed");

        // The same content rewritten: not a new pair.
        put(&cert, &c1);
        assert!(!r.check().unwrap());
        assert!(Arc::ptr_eq(&first, &r.current()));

        // A certificate whose key is not the one on disk: refused, the old pair stays.
        let (c2, k2) = pair();
        put(&cert, &c2);
        let e = r.check().unwrap_err().to_string();
        assert!(e.contains(cs), "{e}");
        assert!(Arc::ptr_eq(&first, &r.current()));
        // Garbage in the key file: refused too.
        put(&key, "not a key");
        assert!(r.check().is_err());
        assert!(Arc::ptr_eq(&first, &r.current()));

        // Its key arrives: the new pair is in force.
        put(&key, &k2);
        assert!(r.check().unwrap());
        assert!(!Arc::ptr_eq(&first, &r.current()));
        assert_ne!(r.current().cert[0], first.cert[0]);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = Reloading::load(
            "/nonexistent/x.crt",
            "/nonexistent/x.key",
            crate::tls::provider(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/x.crt"), "{e}");
    }
}
