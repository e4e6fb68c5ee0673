//! The list-then-watch loop of one collection: LIST, then WATCH from the list's resource version,
//! resuming after every disconnect, relisting when the version is gone. Its output is a
//! [`Watched`] snapshot on a `watch` channel, replaced after each applied change.
//!
//! Invariants:
//! - A snapshot's objects are always a [`Reflector`]'s (see its invariants); `synced` turns true
//!   with the first complete LIST and stays true.
//! - A failure keeps the objects and sets `error`; a 401/403 message names the verbs, resource,
//!   API group and namespace to grant. The next successful LIST or WATCH clears it.
//! - Every retry after a failure waits a capped, jittered exponential backoff; the end of a
//!   watch that delivered events or stayed open for `healthy_watch` re-watches at once from the
//!   last version (bookmarks included).
//! - 410 Gone, as a status or as an `ERROR` event, relists; so does any event that could not be
//!   applied (an oversized line, undecodable JSON, the object limit), since the map may be wrong.
//! - A 404 on LIST tries the next API version in [`WatchSpec::apis`] (an `InferencePool` served
//!   only as `v1alpha2`).

use super::backoff::Backoff;
use super::client::{ApiError, Client};
use super::objects::Resource;
use super::reflector::{on_status, Applied, OnStatus, Reflector};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// What a watch has seen.
#[derive(Debug, Clone)]
pub struct Watched<T> {
    /// The objects by name.
    pub objects: Arc<BTreeMap<String, T>>,
    /// Whether a complete LIST has been applied (before that, `objects` means nothing).
    pub synced: bool,
    /// The current failure, if the last attempt failed.
    pub error: Option<String>,
}

impl<T> Default for Watched<T> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
            synced: false,
            error: None,
        }
    }
}

/// One served version of a collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    /// The collection's path (`/api/v1/namespaces/ns/pods`).
    pub path: String,
    /// Its resource name, for RBAC messages (`pods`).
    pub resource: &'static str,
    /// Its API group, for RBAC messages (`""` for core).
    pub group: &'static str,
}

/// What one watch loop watches.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// The collection, in order of preference (a 404 moves to the next).
    pub apis: Vec<Api>,
    /// `labelSelector` / `fieldSelector`.
    pub query: Vec<(String, String)>,
}

/// What to do once a watch stream is over.
enum After {
    /// Re-watch from the current version now.
    Rewatch,
    /// Re-watch from the current version after a backoff.
    RewatchLater,
    /// List again now.
    Relist,
    /// List again after a backoff.
    RelistLater,
}

/// A failed list: reports `msg` and waits out the next backoff before the caller lists again.
async fn report_and_wait<T>(tx: &watch::Sender<Watched<T>>, msg: String, backoff: &mut Backoff) {
    report(tx, msg);
    tokio::time::sleep(backoff.next_delay()).await;
}

fn report<T>(tx: &watch::Sender<Watched<T>>, msg: String) {
    let changed = tx.send_if_modified(|w| {
        if w.error.as_deref() == Some(msg.as_str()) {
            return false;
        }
        w.error = Some(msg.clone());
        true
    });
    if changed {
        tracing::warn!(error = %msg, "kubernetes discovery");
    }
}

fn clear<T>(tx: &watch::Sender<Watched<T>>) {
    tx.send_if_modified(|w| w.error.take().is_some());
}

fn describe(e: &ApiError, verb: &str, api: &Api, ns: &str) -> String {
    let resource = api.resource;
    match e {
        ApiError::Status { code, message } if on_status(*code) == OnStatus::Denied => format!(
            "kubernetes: {verb} {resource} in namespace {ns} refused (HTTP {code}: {message}); \
             the service account needs verbs list,watch on {resource} (apiGroup {:?}) in \
             namespace {ns} (deploy/components/kubernetes-discovery)",
            api.group
        ),
        _ => format!("kubernetes: {verb} {resource} in namespace {ns}: {e}"),
    }
}

/// Lists and watches `spec` forever, publishing on `tx`; the owner aborts the task to stop it.
pub async fn run<T: Resource>(client: Arc<Client>, spec: WatchSpec, tx: watch::Sender<Watched<T>>) {
    let limits = client.limits().clone();
    let ns = client.namespace().to_string();
    let mut reflector = Reflector::<T>::new(limits.max_objects);
    let mut backoff = Backoff::new(limits.backoff_initial, limits.backoff_max);
    let mut api_idx = 0usize;
    let mut not_found = 0usize;
    let mut gone_streak = 0u32;
    'relist: loop {
        let api = &spec.apis[api_idx % spec.apis.len()];
        let listed = client.list::<T>(&api.path, &spec.query).await;
        let (items, rv) = match listed {
            Ok(x) => x,
            Err(ApiError::Status { code, .. }) if on_status(code) == OnStatus::NotFound => {
                api_idx += 1;
                not_found += 1;
                if not_found < spec.apis.len() {
                    continue;
                }
                not_found = 0;
                let tried: Vec<&str> = spec.apis.iter().map(|a| a.path.as_str()).collect();
                let msg = format!(
                    "kubernetes: {} not served (HTTP 404 from {}): is its CRD installed?",
                    api.resource,
                    tried.join(" and ")
                );
                report_and_wait(&tx, msg, &mut backoff).await;
                continue;
            }
            Err(e) => {
                report_and_wait(&tx, describe(&e, "list", api, &ns), &mut backoff).await;
                continue;
            }
        };
        not_found = 0;
        if let Err(e) = reflector.replace(items, rv) {
            let msg = format!("kubernetes: {} in namespace {ns}: {e}", api.resource);
            report_and_wait(&tx, msg, &mut backoff).await;
            continue;
        }
        backoff.reset();
        tx.send_replace(Watched {
            objects: reflector.objects(),
            synced: true,
            error: None,
        });
        loop {
            let rv = reflector.resource_version().unwrap_or_default().to_string();
            let after = match client.watch(&api.path, &spec.query, &rv).await {
                Err(ApiError::Status { code, .. }) if on_status(code) == OnStatus::Relist => {
                    After::Relist
                }
                Err(e) => {
                    report(&tx, describe(&e, "watch", api, &ns));
                    After::RewatchLater
                }
                Ok(mut stream) => {
                    clear(&tx);
                    follow(
                        &mut stream,
                        &mut reflector,
                        &tx,
                        api,
                        &ns,
                        limits.healthy_watch,
                    )
                    .await
                }
            };
            match after {
                After::Rewatch => {
                    gone_streak = 0;
                    backoff.reset();
                }
                After::RewatchLater => tokio::time::sleep(backoff.next_delay()).await,
                After::Relist => {
                    // One relist per 410 is normal; 410 again right after a list is not.
                    gone_streak += 1;
                    if gone_streak > 1 {
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    continue 'relist;
                }
                After::RelistLater => {
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue 'relist;
                }
            }
        }
    }
}

/// Applies one open stream's events until it ends; says what to do next.
async fn follow<T: Resource>(
    stream: &mut super::client::WatchStream,
    reflector: &mut Reflector<T>,
    tx: &watch::Sender<Watched<T>>,
    api: &Api,
    ns: &str,
    healthy_after: std::time::Duration,
) -> After {
    let opened = tokio::time::Instant::now();
    let mut got_any = false;
    // Events arrived or it stayed open a while: resume at once. Otherwise do not spin on a
    // server that closes every watch at once.
    let healthy = |got_any: bool| got_any || opened.elapsed() >= healthy_after;
    loop {
        let lines = match stream.next_lines().await {
            Ok(Some(lines)) => lines,
            Ok(None) if healthy(got_any) => return After::Rewatch,
            Ok(None) => return After::RewatchLater,
            Err(e @ ApiError::TooLarge(_)) => {
                report(tx, describe(&e, "watch", api, ns));
                return After::RelistLater;
            }
            Err(e) => {
                tracing::debug!(error = %e, resource = api.resource, "kubernetes watch interrupted; resuming");
                return if healthy(got_any) {
                    After::Rewatch
                } else {
                    After::RewatchLater
                };
            }
        };
        got_any = true;
        let mut changed = false;
        let mut next = None;
        // Apply a chunk's lines together and publish once: bursts coalesce.
        for line in lines {
            match reflector.apply(&line) {
                Ok(Applied::Changed) => changed = true,
                Ok(Applied::Unchanged) => {}
                Ok(Applied::Gone) => {
                    next = Some(After::Relist);
                    break;
                }
                Err(e) => {
                    report(
                        tx,
                        format!("kubernetes: watch {} in namespace {ns}: {e}", api.resource),
                    );
                    next = Some(After::RelistLater);
                    break;
                }
            }
        }
        if changed {
            let objects = reflector.objects();
            tx.send_modify(|w| w.objects = objects);
        }
        if let Some(n) = next {
            return n;
        }
    }
}
