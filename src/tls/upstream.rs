//! The upstream client's TLS, re-read when `[upstream.tls]`'s files change: the connector new
//! connections to `https://` instances use, and the name they verify certificates for.
//!
//! Invariants:
//! - A connection always gets a complete config: the one in force is replaced only by one
//!   built from files that all parsed (and whose key matches its certificate); a bad new set
//!   keeps the old config (logged and counted) and is tried again when the files change again.
//! - A check reads the files only when one's modification time, size or inode changed, and
//!   swaps the config only when their content (SHA-256 over all of them) changed.
//! - Open and pooled connections are untouched by a reload: only new handshakes use it (a
//!   rotated engine certificate is verified on the next connection; pooled connections end by
//!   their idle timeout).

use super::reload::{mtime, Stamp};
use super::{client, pem, TlsError};
use crate::config::UpstreamTlsConfig;
use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

/// `[upstream.tls]` in force, and where to re-read it.
pub struct UpstreamTls {
    cfg: UpstreamTlsConfig,
    current: RwLock<TlsConnector>,
    /// What the last check saw of the files, and the content hash of the config in force.
    seen: Mutex<(Vec<Stamp>, [u8; 32])>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("ca_file", &self.cfg.ca_file)
            .field("system_roots", &self.cfg.system_roots)
            .field("cert_file", &self.cfg.cert_file)
            .finish()
    }
}

impl UpstreamTls {
    /// Builds the config from `cfg`'s files; an error names the file at fault.
    pub fn load(cfg: &UpstreamTlsConfig) -> Result<Self, TlsError> {
        let stamps = stamps(cfg);
        let (connector, digest) = build(cfg)?;
        Ok(Self {
            cfg: cfg.clone(),
            current: RwLock::new(connector),
            seen: Mutex::new((stamps, digest)),
        })
    }

    /// The connector for a new connection.
    pub fn connector(&self) -> TlsConnector {
        self.current.read().clone()
    }

    /// `[upstream.tls] server_name`, when set: the name every instance's certificate is
    /// verified for.
    pub fn server_name(&self) -> Option<&str> {
        self.cfg.server_name.as_deref()
    }

    /// How often [`watch`] checks the files.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.cfg.reload_interval_ms)
    }

    /// Re-reads the files if they changed. `Ok(true)`: a new config is in force; `Ok(false)`:
    /// nothing changed; `Err`: the new files are unusable and the old config stays.
    pub fn check(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.cfg);
        let mut seen = self.seen.lock();
        if seen.0 == now {
            return Ok(false);
        }
        // Recorded before reading: a write that lands after the read changes the stamps again.
        seen.0 = now;
        let (connector, digest) = build(&self.cfg)?;
        if digest == seen.1 {
            return Ok(false);
        }
        seen.1 = digest;
        *self.current.write() = connector;
        Ok(true)
    }
}

fn files(cfg: &UpstreamTlsConfig) -> impl Iterator<Item = &str> {
    Some(cfg.ca_file.as_str())
        .filter(|f| !f.is_empty())
        .into_iter()
        .chain(cfg.cert_file.as_deref())
        .chain(cfg.key_file.as_deref())
}

fn stamps(cfg: &UpstreamTlsConfig) -> Vec<Stamp> {
    files(cfg).map(mtime).collect()
}

/// The connector and the content hash of the files it was built from.
fn build(cfg: &UpstreamTlsConfig) -> Result<(TlsConnector, [u8; 32]), TlsError> {
    let mut h = Sha256::new();
    for f in files(cfg) {
        let bytes = pem::read(f)?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let config = client::config(cfg)?;
    Ok((TlsConnector::from(config), h.finalize().into()))
}

impl super::reload::Reloads for UpstreamTls {
    fn check(&self) -> Result<bool, TlsError> {
        UpstreamTls::check(self)
    }
    fn record(&self, ok: bool) {
        crate::metrics::record_upstream_tls_reload(ok);
    }
    fn what(&self) -> String {
        format!(
            "upstream TLS files ({})",
            files(&self.cfg).collect::<Vec<_>>().join(", ")
        )
    }
}

/// Checks `tls` every [`UpstreamTls::interval`] until `stop` is cancelled, logging and counting
/// outcomes.
pub async fn watch(tls: Arc<UpstreamTls>, stop: CancellationToken) {
    let interval = tls.interval();
    super::reload::watch(tls, interval, stop).await
}
