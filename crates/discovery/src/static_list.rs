//! The `static` source: the endpoints listed in the config, published once.

use crate::endpoint::{Endpoint, EndpointSet};
use crate::source::Source;
use std::future::Future;
use tokio::sync::watch;

/// Publishes a fixed list once and then waits for shutdown.
#[derive(Clone, Debug)]
pub struct StaticList {
    endpoints: Vec<Endpoint>,
}

impl StaticList {
    /// A source that always reports `endpoints`.
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        Self { endpoints }
    }
}

impl Source for StaticList {
    async fn run(
        self,
        tx: watch::Sender<EndpointSet>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let version = tx.borrow().version + 1;
        tx.send_replace(EndpointSet::new(version, self.endpoints));
        shutdown.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn publishes_its_list_once() {
        let (tx, mut rx) = watch::channel(EndpointSet::default());
        let source = StaticList::new(vec![Endpoint::new("a", "http://127.0.0.1:1")]);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(source.run(tx, async move {
            let _ = stop_rx.await;
        }));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow().version, 1);
        assert_eq!(rx.borrow().endpoints.len(), 1);
        stop_tx.send(()).unwrap();
        task.await.unwrap();
    }
}
