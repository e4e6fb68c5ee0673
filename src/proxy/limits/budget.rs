//! The in-flight body budget: request body bytes held in memory at once, across all connections
//! and serving threads.
//!
//! Invariants:
//! - A body is reserved before it is buffered: its declared length up front, or frame by frame
//!   when it has none; the reservation is released when the permit drops (the body forwarded, or
//!   the request over).
//! - A reservation that does not fit waits at most the configured wait, in arrival order (the
//!   semaphore is fair, so a large body is not starved by small ones), then fails with 503; one
//!   larger than the whole budget fails at once with 413.

use crate::error::GatewayError;
use crate::metrics::{self, CloseReason};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Bytes reserved in the budget; released on drop.
pub type Reserved<'a> = SemaphorePermit<'a>;

/// The budget: one semaphore permit per byte.
pub struct BodyBudget {
    bytes: Semaphore,
    total: usize,
    wait: Duration,
}

impl BodyBudget {
    /// A budget of `total` bytes whose reservations wait at most `wait`.
    pub fn new(total: usize, wait: Duration) -> Self {
        let total = total.min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Semaphore::new(total),
            total,
            wait,
        }
    }

    /// Bytes reserved now.
    pub fn in_flight(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// Reserves `n` bytes, waiting for room at most the budget's wait.
    pub async fn reserve(&self, n: usize) -> Result<Reserved<'_>, GatewayError> {
        let Ok(want) = u32::try_from(n) else {
            return Err(self.too_large());
        };
        if n > self.total {
            return Err(self.too_large());
        }
        if let Ok(p) = self.bytes.try_acquire_many(want) {
            return Ok(p);
        }
        let started = Instant::now();
        match tokio::time::timeout(self.wait, self.bytes.acquire_many(want)).await {
            Ok(Ok(p)) => Ok(p),
            // Timed out (the semaphore is never closed).
            _ => {
                metrics::record_connection_closed(CloseReason::BodyBudget);
                Err(GatewayError::BodyBudgetExhausted {
                    waited_ms: started.elapsed().as_millis() as u64,
                })
            }
        }
    }

    /// Adds `n` bytes to `reserved`, as [`Self::reserve`] does.
    pub async fn grow<'a>(
        &'a self,
        reserved: &mut Reserved<'a>,
        n: usize,
    ) -> Result<(), GatewayError> {
        let more = self.reserve(n).await?;
        reserved.merge(more);
        Ok(())
    }

    fn too_large(&self) -> GatewayError {
        GatewayError::PayloadTooLarge { limit: self.total }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_then_fail_and_release_on_drop() {
        let b = BodyBudget::new(100, Duration::from_millis(50));
        let a = b.reserve(80).await.unwrap();
        assert_eq!(b.in_flight(), 80);
        let e = b.reserve(30).await.unwrap_err();
        assert!(
            matches!(e, GatewayError::BodyBudgetExhausted { waited_ms } if waited_ms >= 50),
            "{e}"
        );
        assert!(matches!(
            b.reserve(101).await.unwrap_err(),
            GatewayError::PayloadTooLarge { limit: 100 }
        ));
        // A waiter gets its room as soon as it is released.
        let waiting = b.reserve(30);
        tokio::pin!(waiting);
        assert!(futures_util::poll!(&mut waiting).is_pending());
        drop(a);
        let mut r = waiting.await.unwrap();
        b.grow(&mut r, 70).await.unwrap();
        assert_eq!(b.in_flight(), 100);
        drop(r);
        assert_eq!(b.in_flight(), 0);
    }
}
