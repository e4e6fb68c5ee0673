//! Coarse deadlines for the upstream exchange, checked by a periodic sweep on the serving thread.
//!
//! Why: every proxied request bounds its wait for the response head. A Tokio timer costs an
//! insertion into and a removal from the timer wheel under the driver's lock, a sizeable part of
//! a small request's CPU; a deadline that only has to fire within [`SWEEP_EVERY`] of its time
//! needs no more than a slot in a per-thread table.
//!
//! Invariants:
//! - A thread that runs [`sweep_forever`] keeps a table; on any other thread (the background
//!   runtime's, tests') [`within`] falls back to a Tokio timer, so a deadline always fires.
//! - A deadline fires no earlier than its time and, on a swept thread, at most one sweep period
//!   (plus scheduling) after it.
//! - A slot is taken only while its future is pending and is freed when the future ends or is
//!   dropped; the table never holds more slots than futures alive on its thread.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often a serving thread checks its deadlines.
pub const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// The deadline passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// One pending deadline.
struct Slot {
    at: Instant,
    waker: Waker,
    fired: bool,
}

/// A thread's pending deadlines: slots, and the indexes of the free ones.
#[derive(Default)]
struct Table {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, slot: Slot) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            if s.take().is_some() {
                self.free.push(i);
            }
        }
    }

    /// Marks every slot due at `now` fired and wakes its task.
    fn fire(&mut self, now: Instant) {
        for slot in self.slots.iter_mut().flatten() {
            if !slot.fired && slot.at <= now {
                slot.fired = true;
                slot.waker.wake_by_ref();
            }
        }
    }
}

thread_local! {
    static TABLE: RefCell<Option<Table>> = const { RefCell::new(None) };
}

/// Keeps this thread's deadline table swept every [`SWEEP_EVERY`] for as long as it runs. Run it
/// as a task on a current-thread runtime, whose tasks never leave the thread.
pub async fn sweep_forever() {
    TABLE.with(|t| {
        t.borrow_mut().get_or_insert_with(Table::default);
    });
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        TABLE.with(|t| {
            if let Some(table) = t.borrow_mut().as_mut() {
                table.fire(Instant::now());
            }
        });
    }
}

/// `fut`, or [`Elapsed`] if it has not finished `limit` from now.
pub fn within<F: Future>(limit: Duration, fut: F) -> Within<F> {
    Within {
        fut,
        at: Instant::now() + limit,
        wait: Wait::Unarmed,
    }
}

/// How a [`Within`] waits for its deadline.
enum Wait {
    /// Not pending yet.
    Unarmed,
    /// A slot in this thread's table.
    Slot(usize),
    /// A Tokio timer (a thread without a table).
    Timer(Pin<Box<tokio::time::Sleep>>),
}

pin_project_lite::pin_project! {
    /// The future of [`within`].
    pub struct Within<F> {
        #[pin]
        fut: F,
        at: Instant,
        wait: Wait,
    }

    impl<F> PinnedDrop for Within<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Wait::Slot(i) = this.wait {
                // `try_with`: the table may already be gone when a thread exits.
                let _ = TABLE.try_with(|t| {
                    if let Some(table) = t.borrow_mut().as_mut() {
                        table.remove(i);
                    }
                });
            }
        }
    }
}

/// A Tokio timer for `at`, polled once so that it wakes the task; [`Elapsed`] if already due.
fn timer(at: Instant, cx: &mut Context<'_>) -> Result<Pin<Box<tokio::time::Sleep>>, Elapsed> {
    let mut sleep = Box::pin(tokio::time::sleep_until(at.into()));
    match sleep.as_mut().poll(cx) {
        Poll::Ready(()) => Err(Elapsed),
        Poll::Pending => Ok(sleep),
    }
}

impl<F: Future> Future for Within<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            if let Wait::Slot(i) = *this.wait {
                TABLE.with(|t| {
                    if let Some(table) = t.borrow_mut().as_mut() {
                        table.remove(i);
                    }
                });
                *this.wait = Wait::Unarmed;
            }
            return Poll::Ready(Ok(v));
        }
        match this.wait {
            Wait::Unarmed => {
                let at = *this.at;
                let slot = TABLE.with(|t| {
                    t.borrow_mut().as_mut().map(|table| {
                        table.insert(Slot {
                            at,
                            waker: cx.waker().clone(),
                            fired: false,
                        })
                    })
                });
                *this.wait = match slot {
                    Some(i) => Wait::Slot(i),
                    None => match timer(at, cx) {
                        Ok(sleep) => Wait::Timer(sleep),
                        Err(e) => return Poll::Ready(Err(e)),
                    },
                };
                Poll::Pending
            }
            Wait::Slot(i) => {
                let i = *i;
                let fired = TABLE.with(|t| {
                    let mut t = t.borrow_mut();
                    let slot = t
                        .as_mut()
                        .and_then(|table| table.slots.get_mut(i))?
                        .as_mut()?;
                    if !slot.waker.will_wake(cx.waker()) {
                        slot.waker = cx.waker().clone();
                    }
                    Some(slot.fired)
                });
                match fired {
                    Some(true) => Poll::Ready(Err(Elapsed)),
                    Some(false) => Poll::Pending,
                    // Polled off the thread that holds its slot (not on a current-thread
                    // runtime): a timer takes over.
                    None => match timer(*this.at, cx) {
                        Ok(sleep) => {
                            *this.wait = Wait::Timer(sleep);
                            Poll::Pending
                        }
                        Err(e) => {
                            // The slot is not this thread's: dropping must not free one.
                            *this.wait = Wait::Unarmed;
                            Poll::Ready(Err(e))
                        }
                    },
                }
            }
            Wait::Timer(sleep) => match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread that sweeps, a deadline fires within a sweep period of its time, a future
    /// that finishes first returns its value, and every slot is freed.
    #[tokio::test(flavor = "current_thread")]
    async fn swept_deadlines_fire_late_by_at_most_a_sweep() {
        let sweeper = tokio::spawn(sweep_forever());
        tokio::task::yield_now().await;
        let started = Instant::now();
        let r = within(Duration::from_millis(80), std::future::pending::<()>()).await;
        let took = started.elapsed();
        assert_eq!(r, Err(Elapsed));
        assert!(took >= Duration::from_millis(80), "{took:?}");
        assert!(
            took < Duration::from_millis(80) + SWEEP_EVERY * 4,
            "{took:?}"
        );
        let v = within(Duration::from_secs(5), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            7
        })
        .await;
        assert_eq!(v, Ok(7));
        // Dropped while pending: its slot is freed too.
        let dropped = tokio::time::timeout(
            Duration::from_millis(20),
            within(Duration::from_secs(5), std::future::pending::<()>()),
        )
        .await;
        assert!(dropped.is_err());
        let live = TABLE.with(|t| t.borrow().as_ref().unwrap().slots.iter().flatten().count());
        assert_eq!(live, 0);
        sweeper.abort();
    }

    /// Without a sweep on the thread, a Tokio timer stands in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unswept_threads_fall_back_to_a_timer() {
        let started = Instant::now();
        let r = within(Duration::from_millis(50), std::future::pending::<()>()).await;
        assert_eq!(r, Err(Elapsed));
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(within(Duration::from_secs(1), async { 3 }).await, Ok(3));
    }
}
