//! The `dns` source: the A/AAAA records of one name (every endpoint on `port`), or its SRV
//! records (each a target host and its own port), re-resolved every `interval_ms`.
//!
//! Invariants: every lookup has a timeout (`lookup_timeout_ms`), SRV target resolution
//! included; a failed, timed-out or empty answer keeps the last set and sets its error (a name
//! that resolves to nothing is treated as a failure, never as "scale to zero", because DNS
//! cannot tell the two apart); endpoints are keyed `ip:port`, so a changed address or port is a
//! new endpoint; an SRV answer's duplicate `ip:port` pairs count once, and at most
//! [`MAX_SRV_ENDPOINTS`] are taken.

use crate::address::{host_port, http_url, tcp_url};
use crate::config::{DiscoveryConfig, DnsRecord};
use crate::endpoint::{Endpoint, EndpointSet};
use crate::publish::Publisher;
use crate::source::{DiscoveryError, Source};
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// Most endpoints one SRV answer may contribute (a pool larger than any real fleet; bounds a
/// hostile or broken zone).
pub const MAX_SRV_ENDPOINTS: usize = 4096;

/// Resolves host names: the I/O seam of the `dns` source.
pub trait Resolver: Send + Sync + 'static {
    /// The addresses `name` resolves to now.
    fn lookup(&self, name: &str) -> impl Future<Output = io::Result<Vec<IpAddr>>> + Send;
    /// The SRV records of `name` now, each target resolved to its addresses: one `ip:port`
    /// per address of each target, on that record's port.
    fn lookup_srv(&self, name: &str) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send;
}

/// The system's resolvers: `getaddrinfo` (through [`tokio::net::lookup_host`]) for A/AAAA, and
/// for SRV a DNS client (hickory) reading `/etc/resolv.conf` (its name servers, search domains
/// and `ndots`, as the pod's own lookups use them), built at the first SRV lookup. It caches
/// no answer: every re-resolution asks the name servers.
#[derive(Clone, Debug, Default)]
pub struct SystemResolver {
    dns: Arc<OnceLock<Result<TokioResolver, String>>>,
    /// Name servers to ask instead of the system's (`with_name_servers`).
    servers: Option<Vec<SocketAddr>>,
}

impl SystemResolver {
    /// SRV lookups asked of `servers` (UDP, then TCP on truncation) instead of the system's
    /// name servers; A/AAAA lookups still go through `getaddrinfo`.
    pub fn with_name_servers(servers: Vec<SocketAddr>) -> Self {
        Self {
            dns: Arc::default(),
            servers: Some(servers),
        }
    }

    fn dns(&self) -> io::Result<&TokioResolver> {
        let built = self.dns.get_or_init(|| {
            use hickory_resolver::config::{NameServerConfig, ResolverConfig};
            let mut builder = match &self.servers {
                None => TokioResolver::builder_tokio()
                    .map_err(|e| format!("reading the system's resolver configuration: {e}"))?,
                Some(list) => {
                    let servers = list
                        .iter()
                        .map(|a| {
                            let mut ns = NameServerConfig::udp_and_tcp(a.ip());
                            for c in &mut ns.connections {
                                c.port = a.port();
                            }
                            ns
                        })
                        .collect();
                    TokioResolver::builder_with_config(
                        ResolverConfig::from_name_servers(servers),
                        Default::default(),
                    )
                }
            };
            // The source's interval is the refresh: a cached answer would hide a rollout.
            builder.options_mut().cache_size = 0;
            builder
                .build()
                .map_err(|e| format!("building the DNS client: {e}"))
        });
        built.as_ref().map_err(|e| io::Error::other(e.clone()))
    }
}

impl Resolver for SystemResolver {
    async fn lookup(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((name, 0)).await?;
        Ok(addrs.map(|a| a.ip()).collect())
    }

    async fn lookup_srv(&self, name: &str) -> io::Result<Vec<SocketAddr>> {
        let dns = self.dns()?;
        let answer = dns.srv_lookup(name).await.map_err(io::Error::other)?;
        // Targets' addresses the server put beside the answer (Kubernetes' DNS does).
        let beside = |target: &hickory_resolver::proto::rr::Name| -> Vec<IpAddr> {
            answer
                .additionals()
                .iter()
                .filter(|r| &r.name == target)
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })
                .collect()
        };
        let mut out = Vec::new();
        for r in answer.answers() {
            let RData::SRV(srv) = &r.data else { continue };
            let mut ips = beside(&srv.target);
            if ips.is_empty() {
                ips = dns
                    .lookup_ip(srv.target.clone())
                    .await
                    .map_err(io::Error::other)?
                    .iter()
                    .collect();
            }
            out.extend(ips.into_iter().map(|ip| SocketAddr::new(ip, srv.port)));
            if out.len() >= MAX_SRV_ENDPOINTS {
                break;
            }
        }
        Ok(out)
    }
}

/// Publishes the addresses of `name` as endpoints.
#[derive(Debug)]
pub struct DnsSource<R> {
    resolver: R,
    name: String,
    record: DnsRecord,
    /// A records: every endpoint's port (0 with SRV records, which name their own).
    port: u16,
    kv_events_port: Option<u16>,
    kv_replay_port: Option<u16>,
    interval: Duration,
    lookup_timeout: Duration,
}

impl<R: Resolver> DnsSource<R> {
    /// A source for `cfg` (`name` required, and `port` with A records) resolving with
    /// `resolver`.
    pub fn new(cfg: &DiscoveryConfig, resolver: R) -> Result<Self, DiscoveryError> {
        let name = match cfg.name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => {
                return Err(DiscoveryError::Config {
                    key: "name",
                    message: "source = \"dns\" needs the host name to resolve".into(),
                })
            }
        };
        let port = match cfg.record {
            DnsRecord::A => cfg.port.filter(|p| *p != 0).ok_or(DiscoveryError::Config {
                key: "port",
                message: "source = \"dns\" needs the engines' HTTP port (1-65535)".into(),
            })?,
            DnsRecord::Srv => 0,
        };
        if cfg.interval_ms == 0 {
            return Err(DiscoveryError::Config {
                key: "interval_ms",
                message: "must be at least 1".into(),
            });
        }
        Ok(Self {
            resolver,
            name,
            record: cfg.record,
            port,
            kv_events_port: cfg.kv_events_port,
            kv_replay_port: cfg.kv_replay_port,
            interval: Duration::from_millis(cfg.interval_ms),
            lookup_timeout: Duration::from_millis(cfg.lookup_timeout_ms.max(1)),
        })
    }

    fn endpoint(&self, ip: IpAddr, port: u16) -> Endpoint {
        let mut e = Endpoint::new(host_port(ip, port), http_url(ip, port));
        e.kv_events = self.kv_events_port.map(|p| tcp_url(ip, p));
        e.kv_replay = self.kv_replay_port.map(|p| tcp_url(ip, p));
        e
    }

    /// The addresses now: `(ip, port)` pairs, duplicates removed, in answer order.
    async fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        let mut addrs = match self.record {
            DnsRecord::A => {
                let ips = self.resolver.lookup(&self.name).await?;
                ips.into_iter()
                    .map(|ip| SocketAddr::new(ip, self.port))
                    .collect()
            }
            DnsRecord::Srv => self.resolver.lookup_srv(&self.name).await?,
        };
        let mut seen = std::collections::HashSet::new();
        addrs.retain(|a| seen.insert(*a));
        addrs.truncate(MAX_SRV_ENDPOINTS);
        Ok(addrs)
    }

    async fn look(&self) -> Result<Vec<Endpoint>, String> {
        let name = &self.name;
        let what = match self.record {
            DnsRecord::A => "resolving",
            DnsRecord::Srv => "resolving SRV",
        };
        match tokio::time::timeout(self.lookup_timeout, self.resolve()).await {
            Err(_) => Err(format!(
                "dns: {what} {name:?} timed out after {} ms",
                self.lookup_timeout.as_millis()
            )),
            Ok(Err(e)) => Err(format!("dns: {what} {name:?}: {e}")),
            Ok(Ok(addrs)) if addrs.is_empty() => {
                Err(format!("dns: {name:?} resolved to no addresses"))
            }
            Ok(Ok(addrs)) => Ok(addrs
                .into_iter()
                .map(|a| self.endpoint(a.ip(), a.port()))
                .collect()),
        }
    }
}

impl<R: Resolver> Source for DnsSource<R> {
    async fn run(
        self,
        tx: watch::Sender<EndpointSet>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let publisher = Publisher::new(tx);
        let mut tick = tokio::time::interval(self.interval);
        // A slow resolver must not cause a burst of catch-up lookups.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            let result = tokio::select! {
                _ = &mut shutdown => return,
                r = self.look() => r,
            };
            match result {
                Ok(endpoints) => {
                    publisher.publish(endpoints);
                }
                Err(e) => {
                    if publisher.fail(e.clone()) {
                        tracing::warn!(error = %e, "discovery: keeping the last endpoint set");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Answers with whatever the test last set; `None` fails the lookup, `Hang` never answers.
    #[derive(Clone, Default)]
    struct FakeResolver(Arc<Mutex<Answer>>);

    #[derive(Clone, Default)]
    enum Answer {
        #[default]
        Fail,
        Hang,
        Ips(Vec<IpAddr>),
        Srv(Vec<SocketAddr>),
    }

    impl FakeResolver {
        fn set(&self, a: Answer) {
            *self.0.lock().unwrap() = a;
        }
    }

    impl Resolver for FakeResolver {
        async fn lookup(&self, _name: &str) -> io::Result<Vec<IpAddr>> {
            let answer = self.0.lock().unwrap().clone();
            match answer {
                Answer::Fail => Err(io::Error::other("NXDOMAIN")),
                Answer::Hang => std::future::pending().await,
                Answer::Ips(ips) => Ok(ips),
                Answer::Srv(_) => Err(io::Error::other("no A records")),
            }
        }

        async fn lookup_srv(&self, _name: &str) -> io::Result<Vec<SocketAddr>> {
            let answer = self.0.lock().unwrap().clone();
            match answer {
                Answer::Fail => Err(io::Error::other("NXDOMAIN")),
                Answer::Hang => std::future::pending().await,
                Answer::Ips(_) => Err(io::Error::other("no SRV records")),
                Answer::Srv(a) => Ok(a),
            }
        }
    }

    fn ips(list: &[&str]) -> Answer {
        Answer::Ips(list.iter().map(|s| s.parse().unwrap()).collect())
    }

    fn cfg() -> DiscoveryConfig {
        DiscoveryConfig {
            source: crate::SourceKind::Dns,
            name: Some("vllm.inference.svc".into()),
            port: Some(8000),
            kv_events_port: Some(5557),
            ..DiscoveryConfig::default()
        }
    }

    async fn next(rx: &mut watch::Receiver<EndpointSet>) -> EndpointSet {
        rx.changed().await.unwrap();
        rx.borrow_and_update().clone()
    }

    fn names(set: &EndpointSet) -> Vec<&str> {
        set.endpoints.iter().map(|e| e.name.as_str()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn first_set_changes_failure_and_recovery() {
        let resolver = FakeResolver::default();
        resolver.set(ips(&["10.0.0.2", "fd00::1"]));
        let source = DnsSource::new(&cfg(), resolver.clone()).unwrap();
        let (tx, mut rx) = watch::channel(EndpointSet::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(source.run(tx, async move {
            let _ = stopped.await;
        }));

        let first = next(&mut rx).await;
        assert_eq!(names(&first), ["10.0.0.2:8000", "[fd00::1]:8000"]);
        assert_eq!(first.endpoints[1].url, "http://[fd00::1]:8000");
        assert_eq!(
            first.endpoints[0].kv_events.as_deref(),
            Some("tcp://10.0.0.2:5557")
        );
        assert_eq!(first.error, None);

        resolver.set(ips(&["10.0.0.2", "10.0.0.3"]));
        let changed = next(&mut rx).await;
        assert_eq!(names(&changed), ["10.0.0.2:8000", "10.0.0.3:8000"]);
        assert_eq!(changed.version, first.version + 1);

        resolver.set(Answer::Fail);
        let failed = next(&mut rx).await;
        assert_eq!(names(&failed), names(&changed), "the last set is kept");
        assert!(failed.error.as_deref().unwrap().contains("NXDOMAIN"));

        resolver.set(Answer::Hang);
        let hung = next(&mut rx).await;
        assert!(hung.error.as_deref().unwrap().contains("timed out"));
        assert_eq!(names(&hung), names(&changed));

        resolver.set(Answer::Ips(vec![]));
        let empty = next(&mut rx).await;
        assert!(empty.error.as_deref().unwrap().contains("no addresses"));
        assert_eq!(
            names(&empty),
            names(&changed),
            "never empty because it could not look"
        );

        resolver.set(ips(&["10.0.0.3"]));
        let recovered = next(&mut rx).await;
        assert_eq!(recovered.error, None);
        assert_eq!(names(&recovered), ["10.0.0.3:8000"]);

        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn srv_records_name_each_endpoint_port_once() {
        let resolver = FakeResolver::default();
        let a: SocketAddr = "10.0.0.2:8000".parse().unwrap();
        let b: SocketAddr = "10.0.0.3:8001".parse().unwrap();
        resolver.set(Answer::Srv(vec![a, b, a]));
        let mut c = cfg();
        c.record = DnsRecord::Srv;
        c.port = None;
        let source = DnsSource::new(&c, resolver.clone()).unwrap();
        let (tx, mut rx) = watch::channel(EndpointSet::default());
        let task = tokio::spawn(source.run(tx, std::future::pending()));
        let first = next(&mut rx).await;
        assert_eq!(names(&first), ["10.0.0.2:8000", "10.0.0.3:8001"]);
        assert_eq!(first.endpoints[1].url, "http://10.0.0.3:8001");
        assert_eq!(
            first.endpoints[1].kv_events.as_deref(),
            Some("tcp://10.0.0.3:5557"),
            "the events port is per address, not the SRV port"
        );
        // A pod moved to another port is a new endpoint.
        resolver.set(Answer::Srv(vec![a, "10.0.0.3:8002".parse().unwrap()]));
        let moved = next(&mut rx).await;
        assert_eq!(names(&moved), ["10.0.0.2:8000", "10.0.0.3:8002"]);
        resolver.set(Answer::Srv(vec![]));
        let empty = next(&mut rx).await;
        assert!(empty.error.as_deref().unwrap().contains("no addresses"));
        assert_eq!(names(&empty), names(&moved));
        task.abort();
    }

    #[test]
    fn srv_records_take_no_port() {
        let mut c = cfg();
        c.record = DnsRecord::Srv;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("discovery.port"));
        c.port = None;
        c.validate().unwrap();
        DnsSource::new(&c, SystemResolver::default()).unwrap();
    }

    #[test]
    fn name_and_port_are_required() {
        let mut c = cfg();
        c.name = None;
        let e = DnsSource::new(&c, SystemResolver::default()).unwrap_err();
        assert!(e.to_string().starts_with("discovery.name:"), "{e}");
        let mut c = cfg();
        c.port = None;
        let e = DnsSource::new(&c, SystemResolver::default()).unwrap_err();
        assert!(e.to_string().starts_with("discovery.port:"), "{e}");
    }
}
