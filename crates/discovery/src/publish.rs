//! [`Publisher`]: the one place a source turns what it saw into [`EndpointSet`]s.
//!
//! Invariants: versions increase by one per published set; an unchanged set is not
//! re-published; a failure keeps the endpoints currently on the channel (the last set) and only
//! sets [`EndpointSet::error`]; the next successful look clears it.

use crate::endpoint::{Endpoint, EndpointSet};
use tokio::sync::watch;

/// Wraps a source's sender; every source publishes through one.
#[derive(Debug)]
pub struct Publisher {
    tx: watch::Sender<EndpointSet>,
}

impl Publisher {
    /// Publishes on `tx`, continuing from the version already on it.
    pub fn new(tx: watch::Sender<EndpointSet>) -> Self {
        Self { tx }
    }

    /// A complete, successful look: publishes `endpoints` unless they equal the current set and
    /// no error is pending. Returns whether a set was sent.
    pub fn publish(&self, endpoints: Vec<Endpoint>) -> bool {
        self.tx.send_if_modified(|current| {
            let next = EndpointSet::new(current.version + 1, endpoints);
            if current.version > 0 && current.error.is_none() && current.endpoints == next.endpoints
            {
                return false;
            }
            *current = next;
            true
        })
    }

    /// A failed look: keeps the current endpoints and reports `error`, unless that exact error
    /// is already reported. Returns whether a set was sent.
    pub fn fail(&self, error: String) -> bool {
        self.tx.send_if_modified(|current| {
            if current.error.as_deref() == Some(error.as_str()) {
                return false;
            }
            current.version += 1;
            current.error = Some(error);
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(name: &str) -> Endpoint {
        Endpoint::new(name, format!("http://{name}:1"))
    }

    #[test]
    fn unchanged_sets_are_not_republished_and_failures_keep_the_last_set() {
        let (tx, rx) = watch::channel(EndpointSet::default());
        let p = Publisher::new(tx);
        assert!(p.publish(vec![ep("a")]));
        assert!(!p.publish(vec![ep("a")]));
        assert_eq!(rx.borrow().version, 1);
        assert!(p.fail("down".into()));
        assert!(!p.fail("down".into()));
        let set = rx.borrow().clone();
        assert_eq!((set.version, set.endpoints.len()), (2, 1));
        assert_eq!(set.error.as_deref(), Some("down"));
        assert!(p.publish(vec![ep("a")]), "recovery clears the error");
        assert_eq!(rx.borrow().error, None);
        assert_eq!(rx.borrow().version, 3);
    }

    #[test]
    fn an_empty_first_look_is_published() {
        let (tx, rx) = watch::channel(EndpointSet::default());
        assert!(Publisher::new(tx).publish(vec![]));
        assert_eq!(rx.borrow().version, 1);
    }
}
