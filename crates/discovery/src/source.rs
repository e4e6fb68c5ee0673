//! [`Source`]: the one trait every discovery source implements (an I/O seam).

use crate::endpoint::EndpointSet;
use std::future::Future;
use tokio::sync::watch;

/// A discovery source that cannot start (bad config, no credentials).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The source's configuration is invalid; names the key.
    #[error("discovery.{key}: {message}")]
    Config {
        /// The offending key.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The source could not reach what it watches at start.
    #[error("discovery: {0}")]
    Unavailable(String),
}

/// A running source: publishes [`EndpointSet`]s until `shutdown` resolves.
pub trait Source: Send + 'static {
    /// Watches and publishes on `tx` until `shutdown` resolves. Publishes a first set as soon as
    /// it has one; keeps the last set on failures (setting [`EndpointSet::error`]).
    fn run(
        self,
        tx: watch::Sender<EndpointSet>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send;
}
