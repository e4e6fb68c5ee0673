//! Starts a discovered pool's source (`kvgate_discovery`) and hands back the channel it
//! publishes endpoint sets on; [`crate::live`] follows it.
//!
//! Invariant: a source that cannot start is a start-up error of its pool, logged with the key
//! to fix; the gateway still serves its other pools.

use kvgate_discovery::{
    DiscoveryConfig, DiscoveryError, DnsSource, EndpointSet, KubernetesSource, Source, SourceKind,
    SystemResolver,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running source: the sets it publishes, and its task.
pub type Running = (watch::Receiver<EndpointSet>, tokio::task::JoinHandle<()>);

/// Starts the source `cfg` (validated with the rest of the config) names; it runs until `token`
/// is cancelled.
pub fn start(cfg: &DiscoveryConfig, token: CancellationToken) -> Result<Running, DiscoveryError> {
    let (tx, rx) = watch::channel(EndpointSet::default());
    let task = match cfg.source {
        SourceKind::Dns => {
            let source = DnsSource::new(cfg, SystemResolver::default())?;
            tokio::spawn(source.run(tx, async move { token.cancelled().await }))
        }
        SourceKind::Static => {
            return Err(DiscoveryError::Config {
                key: "source",
                message: "a static pool lists its instances; it has no source to start".into(),
            })
        }
        SourceKind::Kubernetes => {
            let source = KubernetesSource::new(cfg)?;
            tokio::spawn(source.run(tx, async move { token.cancelled().await }))
        }
    };
    Ok((rx, task))
}
