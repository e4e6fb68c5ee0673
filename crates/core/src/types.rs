//! Small shared vocabulary types of the routing core.

use serde::{Deserialize, Serialize};

/// A chained block hash (XXH3-64, see [`crate::hash`]). Stable across processes.
pub type BlockHash = u64;

/// Monotonic time in milliseconds, supplied by the caller (the core never reads a clock).
pub type Millis = u64;

/// Dense identifier of an instance (engine endpoint) within one gateway's fleet.
///
/// Dense so per-instance state can live in vectors indexed by it; the mapping to URLs lives in the
/// gateway. Ids are never reused for a different URL while the process lives.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct InstanceId(pub u32);

impl InstanceId {
    /// The id as a vector index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a cached block lives on an instance. Ordered from most to least valuable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Tier {
    /// Accelerator memory: a hit costs nothing.
    Gpu = 0,
    /// Host-memory offload: a hit costs a transfer.
    Cpu = 1,
    /// Disk / remote offload: a hit costs a slower transfer.
    Disk = 2,
}

impl Tier {
    /// All tiers, most valuable first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Disk];

    /// Parses an engine's `medium` string (vLLM: `"GPU"`, `"CPU"`, `"DISK"`, connector names).
    /// Unknown media count as disk: present, but the least valuable.
    pub fn from_medium(medium: Option<&str>) -> Tier {
        match medium.map(|m| m.to_ascii_uppercase()) {
            None => Tier::Gpu,
            Some(m) if m == "GPU" || m == "CUDA" || m.is_empty() => Tier::Gpu,
            Some(m) if m == "CPU" || m.contains("CPU") => Tier::Cpu,
            Some(_) => Tier::Disk,
        }
    }
}

/// Where the index learned about a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Source {
    /// The engine's own KV event stream: exact until the engine says otherwise.
    Event = 0,
    /// This gateway's own routing decision: a prediction with a time-to-live.
    Local = 1,
    /// A peer gateway replica's routing decision, received by gossip: a prediction with a TTL.
    Peer = 2,
}
