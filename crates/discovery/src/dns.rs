//! The `dns` source: the A/AAAA records of one name, re-resolved every `interval_ms`.
//!
//! Invariants: every lookup has a timeout (`lookup_timeout_ms`); a failed, timed-out or empty
//! answer keeps the last set and sets its error (a name that resolves to nothing is treated as
//! a failure, never as "scale to zero", because DNS cannot tell the two apart); endpoints are
//! keyed `ip:port`, so a changed address is a new endpoint.

use crate::address::{host_port, http_url, tcp_url};
use crate::config::DiscoveryConfig;
use crate::endpoint::{Endpoint, EndpointSet};
use crate::publish::Publisher;
use crate::source::{DiscoveryError, Source};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::time::Duration;
use tokio::sync::watch;

/// Resolves a host name to addresses: the I/O seam of the `dns` source.
pub trait Resolver: Send + Sync + 'static {
    /// The addresses `name` resolves to now.
    fn lookup(&self, name: &str) -> impl Future<Output = io::Result<Vec<IpAddr>>> + Send;
}

/// The system resolver (`getaddrinfo` through [`tokio::net::lookup_host`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    async fn lookup(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((name, 0)).await?;
        Ok(addrs.map(|a| a.ip()).collect())
    }
}

/// Publishes the addresses of `name` as endpoints on `port`.
#[derive(Debug)]
pub struct DnsSource<R> {
    resolver: R,
    name: String,
    port: u16,
    kv_events_port: Option<u16>,
    kv_replay_port: Option<u16>,
    interval: Duration,
    lookup_timeout: Duration,
}

impl<R: Resolver> DnsSource<R> {
    /// A source for `cfg` (`name` and `port` are required) resolving with `resolver`.
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
        let port = cfg.port.filter(|p| *p != 0).ok_or(DiscoveryError::Config {
            key: "port",
            message: "source = \"dns\" needs the engines' HTTP port (1-65535)".into(),
        })?;
        if cfg.interval_ms == 0 {
            return Err(DiscoveryError::Config {
                key: "interval_ms",
                message: "must be at least 1".into(),
            });
        }
        Ok(Self {
            resolver,
            name,
            port,
            kv_events_port: cfg.kv_events_port,
            kv_replay_port: cfg.kv_replay_port,
            interval: Duration::from_millis(cfg.interval_ms),
            lookup_timeout: Duration::from_millis(cfg.lookup_timeout_ms.max(1)),
        })
    }

    fn endpoint(&self, ip: IpAddr) -> Endpoint {
        let mut e = Endpoint::new(host_port(ip, self.port), http_url(ip, self.port));
        e.kv_events = self.kv_events_port.map(|p| tcp_url(ip, p));
        e.kv_replay = self.kv_replay_port.map(|p| tcp_url(ip, p));
        e
    }

    async fn look(&self) -> Result<Vec<Endpoint>, String> {
        let name = &self.name;
        match tokio::time::timeout(self.lookup_timeout, self.resolver.lookup(name)).await {
            Err(_) => Err(format!(
                "dns: resolving {name:?} timed out after {} ms",
                self.lookup_timeout.as_millis()
            )),
            Ok(Err(e)) => Err(format!("dns: resolving {name:?}: {e}")),
            Ok(Ok(ips)) if ips.is_empty() => Err(format!("dns: {name:?} resolved to no addresses")),
            Ok(Ok(ips)) => Ok(ips.into_iter().map(|ip| self.endpoint(ip)).collect()),
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

    #[test]
    fn name_and_port_are_required() {
        let mut c = cfg();
        c.name = None;
        let e = DnsSource::new(&c, SystemResolver).unwrap_err();
        assert!(e.to_string().starts_with("discovery.name:"), "{e}");
        let mut c = cfg();
        c.port = None;
        let e = DnsSource::new(&c, SystemResolver).unwrap_err();
        assert!(e.to_string().starts_with("discovery.port:"), "{e}");
    }
}
