//! # kvgate-discovery: where a pool's engine instances come from
//!
//! A discovery source watches one place (a list of URLs in the config, a DNS name, a Kubernetes
//! Service / label selector / `InferencePool`) and publishes the **whole current set** of a
//! pool's endpoints on a [`tokio::sync::watch`] channel ([`EndpointSet`]). The gateway's fleet
//! reconciles each new set against the instances it has: new endpoints become instances, missing
//! ones are drained and then dropped.
//!
//! Invariants:
//! - A source publishes only complete sets, never deltas: a consumer that misses intermediate
//!   sets (a `watch` keeps only the newest) still converges on the truth.
//! - An endpoint's identity is `(name, url)` ([`Endpoint::key`]): a pod re-created with a new IP,
//!   or a new pod that reuses an old IP, is a different endpoint (its engine's cache is empty).
//! - A source that loses its backend (DNS failures, API server unreachable, RBAC missing) keeps
//!   the last set it published and reports the failure in [`EndpointSet::error`]; it never
//!   publishes an empty set because it could not look.
//! - Only endpoints ready to take new requests are published; a terminating endpoint is left out,
//!   which drains it.
//!
//! No gateway types here: this crate sits below the gateway and beside the routing core.

pub mod address;
pub mod config;
pub mod dns;
pub mod endpoint;
#[cfg(feature = "fake-api")]
pub mod fake_api;
pub mod kubernetes;
pub mod publish;
pub mod source;
pub mod static_list;
pub mod validate;

pub use config::{DiscoveryConfig, DnsRecord, SourceKind};
pub use dns::{DnsSource, Resolver, SystemResolver};
pub use endpoint::{Endpoint, EndpointSet};
pub use kubernetes::KubernetesSource;
pub use publish::Publisher;
pub use source::{DiscoveryError, Source};
