//! Admission control: a bounded wait queue per pool, served by priority and, within a priority,
//! fairly between tenants by tokens.
//!
//! The gateway forwards a request at once while its pool has room; when every usable instance of
//! the pool is saturated, the request waits here until a request on the pool finishes, and is
//! rejected when the queue is full or its wait bound passes.
//!
//! - [`queue::WaitQueue`]: the bounded queue (entries, queued tokens, wait time), strict priority
//!   across [`Priority`] classes, eviction of the newest lower-priority entry by a higher-priority
//!   arrival when full.
//! - [`fair`]: per-class fair queueing between tenants by tokens (a virtual token counter per
//!   tenant; a tenant that becomes backlogged starts level with the least-served backlogged one,
//!   so idle time earns no burst credit).
//! - [`drain`]: the pool's drain rate learned from the queue's own service, and the `Retry-After`
//!   it implies.
//!
//! Invariants:
//! - Pure: no clock (callers pass `now` in ms), no I/O, no locks; the gateway serializes access.
//! - The queue never holds more than its configured entries or tokens; every entry leaves it
//!   exactly once: popped (admitted), expired, evicted or removed, and the caller gets its payload
//!   back each time.

pub mod drain;
pub mod fair;
pub mod queue;

pub use drain::{retry_after_secs, DrainRate};
pub use queue::{Pushed, QueueLimits, QueueStats, Queued, Rejected, WaitQueue};

use serde::{Deserialize, Serialize};

/// A request's priority class. Ordered from most to least urgent.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Served before everything else; may evict lower classes from a full queue.
    Critical = 0,
    /// The default.
    #[default]
    Standard = 1,
    /// Served last and shed first under overload.
    Sheddable = 2,
}

impl Priority {
    /// All classes, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// The class of vLLM's integer `priority` (lower is more urgent, 0 is the default):
    /// negative → critical, 0 → standard, positive → sheddable.
    pub fn from_vllm(p: i64) -> Priority {
        match p {
            ..=-1 => Priority::Critical,
            0 => Priority::Standard,
            _ => Priority::Sheddable,
        }
    }

    /// Parses `critical`, `standard` or `sheddable` (ASCII case-insensitive).
    pub fn parse(s: &[u8]) -> Option<Priority> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str().as_bytes().eq_ignore_ascii_case(s))
    }

    /// The class's name (also its metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }

    /// Index in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A tenant, interned by the caller (e.g. a hash of its name).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct TenantId(pub u64);

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The queue was full (entries or tokens) and nothing of lower priority could make room.
    QueueFull,
    /// The entry waited longer than the wait bound.
    WaitTimeout,
    /// A higher-priority arrival evicted it from a full queue.
    Shed,
}

impl RejectReason {
    /// All reasons.
    pub const ALL: [RejectReason; 3] = [
        RejectReason::QueueFull,
        RejectReason::WaitTimeout,
        RejectReason::Shed,
    ];

    /// The reason's name (header value and metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::WaitTimeout => "wait_timeout",
            RejectReason::Shed => "shed",
        }
    }
}

/// Identifies one queued entry (unique per queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct EntryId(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_priorities_map_by_sign() {
        assert_eq!(Priority::from_vllm(-5), Priority::Critical);
        assert_eq!(Priority::from_vllm(0), Priority::Standard);
        assert_eq!(Priority::from_vllm(3), Priority::Sheddable);
        assert_eq!(Priority::from_vllm(i64::MIN), Priority::Critical);
    }

    #[test]
    fn class_names_parse_back() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str().as_bytes()), Some(p));
        }
        assert_eq!(Priority::parse(b"CRITICAL"), Some(Priority::Critical));
        assert_eq!(Priority::parse(b"urgent"), None);
        assert!(Priority::Critical < Priority::Sheddable);
    }
}
