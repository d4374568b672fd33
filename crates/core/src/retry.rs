//! Waking transactions blocked in `retry()` (or waiting for a log position to be applied)
//! when something they read changes. A waiter in a fiber (`atomos_sched::fiber`) suspends it
//! instead of blocking its thread.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use atomos_sched::fiber::{self, Awaited};
use parking_lot::{Condvar, Mutex};

/// A broadcast signal raised after commits, but only while someone waits: committers pay one
/// load when nobody is blocked in `retry()`.
pub(crate) struct RetrySignal {
    waiters: AtomicUsize,
    state: Mutex<Signalled>,
    cv: Condvar,
}

/// What the signal's lock guards.
struct Signalled {
    /// Raised by every signal.
    generation: u64,
    /// The tasks of fibers waiting for the next signal.
    fibers: Vec<Waker>,
}

/// How long a waiter sleeps before it looks again on its own, as a guard against missed signals.
const RECHECK: Duration = Duration::from_millis(50);

impl RetrySignal {
    pub(crate) fn new() -> RetrySignal {
        RetrySignal {
            waiters: AtomicUsize::new(0),
            state: Mutex::new(Signalled {
                generation: 0,
                fibers: Vec::new(),
            }),
            cv: Condvar::new(),
        }
    }

    /// Called by a committer after its new versions are visible.
    #[inline]
    pub(crate) fn notify(&self) {
        // Pairs with the waiter's increment of `waiters` before it checks what it read.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.signal();
        }
    }

    #[cold]
    fn signal(&self) {
        let fibers = {
            let mut state = self.state.lock();
            state.generation += 1;
            std::mem::take(&mut state.fibers)
        };
        self.cv.notify_all();
        for waker in fibers {
            waker.wake();
        }
    }

    /// Blocks until `changed()` holds (true) or `deadline` passes (false); in a fiber, suspends
    /// it meanwhile.
    pub(crate) fn wait_until(
        &self,
        deadline: Option<Instant>,
        mut changed: impl FnMut() -> bool,
    ) -> bool {
        let in_fiber = fiber::in_fiber();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // Counted out however the wait ends: a fiber dropped while it waits unwinds from here.
        let _counted = Counted(&self.waiters);
        loop {
            let mut state = self.state.lock();
            if changed() {
                return true;
            }
            let now = Instant::now();
            let mut until = now + RECHECK;
            if let Some(d) = deadline {
                if now >= d {
                    return false;
                }
                until = until.min(d);
            }
            let seen = state.generation;
            if in_fiber {
                drop(state);
                let signal = Signal {
                    signal: self,
                    seen,
                    registered: AtomicBool::new(false),
                };
                fiber::suspend(&signal, until);
                continue;
            }
            while state.generation == seen {
                if self.cv.wait_until(&mut state, until).timed_out() {
                    break;
                }
            }
        }
    }
}

/// One waiter of a [`RetrySignal`], counted out when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The next signal after generation `seen`, as a fiber waits for it. (A fiber that stops
/// waiting leaves its waker registered until the next signal: one spurious wake.)
struct Signal<'a> {
    signal: &'a RetrySignal,
    seen: u64,
    /// Its task's waker is registered (a fiber's task does not change while it is suspended).
    registered: AtomicBool,
}

impl Awaited for Signal<'_> {
    fn ready_or_register(&self, waker: &Waker) -> bool {
        let mut state = self.signal.state.lock();
        if state.generation != self.seen {
            return true;
        }
        if !self.registered.swap(true, Ordering::Relaxed) {
            state.fibers.push(waker.clone());
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_fiber_waiting_for_a_signal_suspends_and_the_signal_wakes_it() {
        // One thread runs the waiting fiber and the task that signals: a wait that blocked the
        // thread would only end at its deadline, unchanged.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let signal = Arc::new(RetrySignal::new());
        let changed = Arc::new(AtomicBool::new(false));
        let (s, c) = (signal.clone(), changed.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        // SAFETY: the closure holds nothing tied to a thread.
        let waiter = unsafe {
            fiber::Fiber::new(move || s.wait_until(Some(deadline), || c.load(Ordering::SeqCst)))
        }
        .unwrap();
        let start = Instant::now();
        let woke = rt.block_on(async move {
            let waiter = tokio::spawn(waiter);
            tokio::spawn(async move {
                // A signal with nothing changed wakes it to look, and it waits again.
                signal.notify();
                tokio::task::yield_now().await;
                changed.store(true, Ordering::SeqCst);
                signal.notify();
            })
            .await
            .unwrap();
            // Woken by the signal, it ends within a few turns of the runtime (its own look
            // again, after RECHECK, is far later).
            for _ in 0..10 {
                if waiter.is_finished() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(waiter.is_finished(), "not woken by the signal");
            waiter.await.unwrap()
        });
        assert!(woke);
        assert!(start.elapsed() < RECHECK);
    }

    #[test]
    fn a_fiber_dropped_while_it_waits_is_counted_out() {
        let signal = Arc::new(RetrySignal::new());
        let s = signal.clone();
        // SAFETY: the closure holds nothing tied to a thread.
        let mut waiter = unsafe {
            fiber::Fiber::new(move || {
                s.wait_until(Some(Instant::now() + Duration::from_secs(30)), || false)
            })
        }
        .unwrap();
        let polled = std::future::Future::poll(
            std::pin::Pin::new(&mut waiter),
            &mut std::task::Context::from_waker(Waker::noop()),
        );
        assert!(polled.is_pending());
        assert_eq!(signal.waiters.load(Ordering::SeqCst), 1);
        drop(waiter);
        // Committers are back to one load per commit.
        assert_eq!(signal.waiters.load(Ordering::SeqCst), 0);
    }
}
