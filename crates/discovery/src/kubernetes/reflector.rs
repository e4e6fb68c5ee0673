//! [`Reflector`]: the sans-I/O state of one list-then-watch: the objects seen, keyed by name, and
//! the resource version to resume from; plus [`on_status`], what an HTTP status means for it.
//!
//! Invariants:
//! - The object map is only ever the result of one complete LIST followed by the watch events
//!   after it, in order; an event that cannot be applied (undecodable, over the object limit, an
//!   `ERROR`) leaves the map as it was and asks for a relist, because an event lost means the
//!   map may be wrong.
//! - The resource version only moves forward through applied events and `BOOKMARK`s, so a
//!   re-watch after a disconnect misses nothing and replays nothing already applied.
//! - At most `max_objects` objects are tracked.

use super::objects::{Resource, Status};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why an answer could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReflectError {
    /// A line or object that does not parse.
    #[error("undecodable watch event: {0}")]
    Decode(String),
    /// More objects than the limit.
    #[error("more than {max} objects; narrow the selector or namespace")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// An `ERROR` event other than 410.
    #[error("watch error event: {0}")]
    Event(String),
}

/// What applying one watch event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The object map changed.
    Changed,
    /// The event changed nothing the map holds (same object again) or only the version.
    Unchanged,
    /// The version is too old (an `ERROR` event with code 410): list again.
    Gone,
}

/// What to do after an HTTP status other than 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStatus {
    /// 410 Gone: the version is too old; list again at once.
    Relist,
    /// 401/403: credentials or RBAC; report what to grant and retry with backoff.
    Denied,
    /// 404: the resource kind is not served (a CRD not installed, another version).
    NotFound,
    /// Anything else: report and retry with backoff.
    Retry,
}

/// What a non-200 status means for a list or watch.
pub fn on_status(code: u16) -> OnStatus {
    match code {
        410 => OnStatus::Relist,
        401 | 403 => OnStatus::Denied,
        404 => OnStatus::NotFound,
        _ => OnStatus::Retry,
    }
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bookmark {
    #[serde(default)]
    metadata: BookmarkMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// One watch's objects and resume point.
#[derive(Debug, Clone)]
pub struct Reflector<T> {
    objects: Arc<BTreeMap<String, T>>,
    resource_version: Option<String>,
    max_objects: usize,
}

impl<T: Resource> Reflector<T> {
    /// Empty, not yet listed; tracks at most `max_objects`.
    pub fn new(max_objects: usize) -> Self {
        Self {
            objects: Arc::default(),
            resource_version: None,
            max_objects,
        }
    }

    /// The objects, by name (cheap to clone: shared until the next change).
    pub fn objects(&self) -> Arc<BTreeMap<String, T>> {
        Arc::clone(&self.objects)
    }

    /// Where the next watch starts; `None` before the first list.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Replaces everything with a complete LIST answer at `resource_version`.
    pub fn replace(&mut self, items: Vec<T>, resource_version: String) -> Result<(), ReflectError> {
        if items.len() > self.max_objects {
            return Err(ReflectError::TooMany {
                max: self.max_objects,
            });
        }
        self.objects = Arc::new(
            items
                .into_iter()
                .map(|o| (o.meta().name.clone(), o))
                .collect(),
        );
        self.resource_version = Some(resource_version);
        Ok(())
    }

    /// Applies one watch event line (`{"type":..,"object":..}`).
    pub fn apply(&mut self, line: &[u8]) -> Result<Applied, ReflectError> {
        let event: RawEvent<'_> =
            serde_json::from_slice(line).map_err(|e| ReflectError::Decode(e.to_string()))?;
        let decode = |e: serde_json::Error| ReflectError::Decode(format!("{}: {e}", event.kind));
        match event.kind.as_str() {
            "ADDED" | "MODIFIED" | "DELETED" => {
                let object: T = serde_json::from_str(event.object.get()).map_err(decode)?;
                let rv = object.meta().resource_version.clone();
                let name = object.meta().name.clone();
                let changed = if event.kind == "DELETED" {
                    self.objects.contains_key(&name) && {
                        Arc::make_mut(&mut self.objects).remove(&name);
                        true
                    }
                } else if self.objects.get(&name) == Some(&object) {
                    false
                } else {
                    if !self.objects.contains_key(&name) && self.objects.len() >= self.max_objects {
                        return Err(ReflectError::TooMany {
                            max: self.max_objects,
                        });
                    }
                    Arc::make_mut(&mut self.objects).insert(name, object);
                    true
                };
                if rv.is_some() {
                    self.resource_version = rv;
                }
                Ok(if changed {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                })
            }
            "BOOKMARK" => {
                let b: Bookmark = serde_json::from_str(event.object.get()).map_err(decode)?;
                if let Some(rv) = b.metadata.resource_version {
                    self.resource_version = Some(rv);
                }
                Ok(Applied::Unchanged)
            }
            "ERROR" => {
                let s: Status = serde_json::from_str(event.object.get()).map_err(decode)?;
                if s.code == Some(410) {
                    return Ok(Applied::Gone);
                }
                Err(ReflectError::Event(format!(
                    "code {}: {}",
                    s.code.map_or_else(|| "?".to_string(), |c| c.to_string()),
                    s.message.unwrap_or_default()
                )))
            }
            other => Err(ReflectError::Decode(format!(
                "unknown event type {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::objects::Pod;

    fn pod(name: &str, rv: &str, ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": rv},
            "status": {"podIP": ip}
        }))
        .unwrap()
    }

    fn event(kind: &str, name: &str, rv: &str, ip: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "type": kind,
            "object": {"metadata": {"name": name, "resourceVersion": rv}, "status": {"podIP": ip}}
        }))
        .unwrap()
    }

    #[test]
    fn list_then_events_track_objects_and_the_version() {
        let mut r = Reflector::<Pod>::new(10);
        assert_eq!(r.resource_version(), None);
        r.replace(vec![pod("a", "1", "10.0.0.1")], "5".into())
            .unwrap();
        assert_eq!(r.resource_version(), Some("5"));
        assert_eq!(
            r.apply(&event("ADDED", "b", "6", "10.0.0.2")),
            Ok(Applied::Changed)
        );
        assert_eq!(
            r.apply(&event("MODIFIED", "b", "7", "10.0.0.2")),
            Ok(Applied::Changed),
            "a new resourceVersion is a change of the object"
        );
        assert_eq!(
            r.apply(&event("MODIFIED", "b", "7", "10.0.0.2")),
            Ok(Applied::Unchanged)
        );
        assert_eq!(
            r.apply(&event("DELETED", "a", "8", "10.0.0.1")),
            Ok(Applied::Changed)
        );
        assert_eq!(
            r.apply(&event("DELETED", "zz", "9", "")),
            Ok(Applied::Unchanged)
        );
        assert_eq!(r.resource_version(), Some("9"));
        let names: Vec<_> = r.objects().keys().cloned().collect();
        assert_eq!(names, ["b"]);
        let bookmark =
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"42"}}}"#;
        assert_eq!(r.apply(bookmark), Ok(Applied::Unchanged));
        assert_eq!(r.resource_version(), Some("42"));
    }

    #[test]
    fn gone_errors_and_garbage_do_not_touch_the_map() {
        let mut r = Reflector::<Pod>::new(1);
        r.replace(vec![pod("a", "1", "10.0.0.1")], "5".into())
            .unwrap();
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}"#;
        assert_eq!(r.apply(gone), Ok(Applied::Gone));
        let other = br#"{"type":"ERROR","object":{"code":500,"message":"etcd"}}"#;
        assert!(matches!(r.apply(other), Err(ReflectError::Event(m)) if m.contains("etcd")));
        assert!(matches!(
            r.apply(b"{not json"),
            Err(ReflectError::Decode(_))
        ));
        assert_eq!(
            r.apply(&event("ADDED", "b", "6", "10.0.0.2")),
            Err(ReflectError::TooMany { max: 1 })
        );
        assert_eq!(r.objects().len(), 1);
        assert_eq!(r.resource_version(), Some("5"));
        assert!(r
            .replace(vec![pod("a", "1", ""), pod("b", "1", "")], "6".into())
            .is_err());
    }

    #[test]
    fn statuses_map_to_actions() {
        assert_eq!(on_status(410), OnStatus::Relist);
        assert_eq!(on_status(403), OnStatus::Denied);
        assert_eq!(on_status(401), OnStatus::Denied);
        assert_eq!(on_status(404), OnStatus::NotFound);
        assert_eq!(on_status(500), OnStatus::Retry);
    }
}
