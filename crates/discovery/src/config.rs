//! `[pools.discovery]`: which source finds a pool's instances, and its settings. Defaults live
//! here and are read, never copied.
//!
//! ```toml
//! [[pools]]
//! model = "llama"
//! [pools.discovery]
//! source = "kubernetes"       # "static" (default: the pool's `instances`), "dns", "kubernetes"
//! namespace = "inference"     # kubernetes: default the pod's own namespace
//! service = "vllm"            # kubernetes: the EndpointSlices of this Service, or
//! # selector = "app=vllm"     #   pods matching this label selector, or
//! # inference_pool = "llama"  #   the pods of this InferencePool (its selector and target port)
//! port = 8000                 # engine HTTP port (dns, and kubernetes when the object has none)
//! # interval_ms = 5000       # dns: re-resolution interval
//! # lookup_timeout_ms = 2000  # dns: one lookup's timeout
//! # name = "vllm-headless.inference.svc.cluster.local"   # dns: the name to resolve
//! # record = "srv"            # dns: "a" (default: A/AAAA records, on `port`) or "srv" (each
//! #                           #   record's target and port; name = "_http._tcp.vllm-headless...")
//! # port_name = "http"        # kubernetes service: the EndpointSlice port of this name
//! # kubeconfig = "/path/config"  # kubernetes: default $KUBECONFIG, in-cluster, ~/.kube/config
//! # context = "prod"          # kubernetes: the kubeconfig context (default current-context)
//! # api_server = "https://10.0.0.1:6443"  # kubernetes: explicit server (instead of kubeconfig)
//! # token_file = "/path/token"   # kubernetes: bearer token, re-read on every (re)connect
//! # ca_file = "/path/ca.crt"     # kubernetes: the API server's CA
//! kv_events_port = 5557       # optional: KV events at tcp://<ip>:<port> on every endpoint
//! kv_replay_port = 5558       # optional
//! ```

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which kind of source a pool uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// The pool's `instances` list (the default).
    #[default]
    Static,
    /// The A/AAAA records of `name`, re-resolved every `interval_ms`.
    Dns,
    /// EndpointSlices of `service`, pods by `selector`, or an `InferencePool`, watched.
    Kubernetes,
}

/// Which DNS records the `dns` source reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsRecord {
    /// A/AAAA records of `name` (through the system resolver), every endpoint on `port`.
    #[default]
    A,
    /// SRV records of `name`: each names a target host and its port (Kubernetes publishes
    /// `_<port-name>._<proto>.<service>.<namespace>.svc.<zone>` for a Service's named ports).
    Srv,
}

/// A pool's discovery settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Which source.
    #[serde(default)]
    pub source: SourceKind,
    /// dns: the host name to resolve (a headless Service's name in Kubernetes).
    #[serde(default)]
    pub name: Option<String>,
    /// dns: which records of `name` to read.
    #[serde(default)]
    pub record: DnsRecord,
    /// dns: re-resolution interval.
    #[serde(default = "DiscoveryConfig::default_interval_ms")]
    pub interval_ms: u64,
    /// dns: how long one lookup may take before it counts as a failure.
    #[serde(default = "DiscoveryConfig::default_lookup_timeout_ms")]
    pub lookup_timeout_ms: u64,
    /// Engine HTTP port: for dns A records; for kubernetes when the watched object names none.
    /// (SRV records name their own ports.)
    #[serde(default)]
    pub port: Option<u16>,
    /// kubernetes: the namespace; default the pod's own (in cluster); required with `api_server`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// kubernetes: the Service whose EndpointSlices list the engines.
    #[serde(default)]
    pub service: Option<String>,
    /// kubernetes: a label selector over pods (`app=vllm,tier=gpu`).
    #[serde(default)]
    pub selector: Option<String>,
    /// kubernetes: the `InferencePool` whose selector and target port name the engines.
    #[serde(default)]
    pub inference_pool: Option<String>,
    /// kubernetes: a kubeconfig file to read the API server and credentials from; default the
    /// files of `$KUBECONFIG` (merged as kubectl merges them), else in-cluster config, else `~/.kube/config`. Not with
    /// `api_server`.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// kubernetes: the kubeconfig context to use; default its `current-context`.
    #[serde(default)]
    pub context: Option<String>,
    /// kubernetes, `service` mode: the EndpointSlice port to use, by name; default the slice's
    /// first port.
    #[serde(default)]
    pub port_name: Option<String>,
    /// kubernetes: the API server's base URL (`https://host:port`), for use outside a cluster;
    /// default in-cluster (`KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT`).
    #[serde(default)]
    pub api_server: Option<String>,
    /// kubernetes: file holding the bearer token, re-read on every (re)connect because bound
    /// service account tokens rotate; default the in-cluster service account token (none with
    /// `api_server`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// kubernetes: PEM file of the CA that signed the API server's certificate; default the
    /// in-cluster service account `ca.crt` (none with `api_server`).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// KV events port on every discovered endpoint (`tcp://<ip>:<port>`), unless the pod's
    /// annotation names another.
    #[serde(default)]
    pub kv_events_port: Option<u16>,
    /// KV event replay port on every discovered endpoint, unless annotated.
    #[serde(default)]
    pub kv_replay_port: Option<u16>,
    /// How long a removed instance keeps its in-flight requests and streams before its state
    /// (index entries, load, learned rates) is dropped.
    #[serde(default = "DiscoveryConfig::default_drain_grace_ms")]
    pub drain_grace_ms: u64,
}

impl DiscoveryConfig {
    /// Default DNS re-resolution interval: 5 s.
    pub const DEFAULT_INTERVAL_MS: u64 = 5_000;
    /// Default DNS lookup timeout: 2 s.
    pub const DEFAULT_LOOKUP_TIMEOUT_MS: u64 = 2_000;
    /// Default drain grace: 30 s, Kubernetes' default termination grace.
    pub const DEFAULT_DRAIN_GRACE_MS: u64 = 30_000;

    fn default_interval_ms() -> u64 {
        Self::DEFAULT_INTERVAL_MS
    }

    fn default_lookup_timeout_ms() -> u64 {
        Self::DEFAULT_LOOKUP_TIMEOUT_MS
    }

    fn default_drain_grace_ms() -> u64 {
        Self::DEFAULT_DRAIN_GRACE_MS
    }
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            source: SourceKind::default(),
            name: None,
            record: DnsRecord::default(),
            interval_ms: Self::DEFAULT_INTERVAL_MS,
            lookup_timeout_ms: Self::DEFAULT_LOOKUP_TIMEOUT_MS,
            port: None,
            namespace: None,
            service: None,
            selector: None,
            inference_pool: None,
            kubeconfig: None,
            context: None,
            port_name: None,
            api_server: None,
            token_file: None,
            ca_file: None,
            kv_events_port: None,
            kv_replay_port: None,
            drain_grace_ms: Self::DEFAULT_DRAIN_GRACE_MS,
        }
    }
}
