//! The gateway's monotonic clock, converted to the core's [`Millis`] at this edge.
//!
//! Invariant: the core never reads a clock; everything passes `Clock::now_ms()` in, so one process
//! has one time origin.

use kvgate_core::Millis;
use std::time::Instant;

/// Milliseconds since the gateway started, from a monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
    /// Now, in milliseconds since start.
    pub fn now_ms(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }
    /// Converts an `Instant` to milliseconds since start (0 if before start).
    pub fn ms_at(&self, t: Instant) -> Millis {
        t.saturating_duration_since(self.origin).as_millis() as Millis
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
