//! Waking transactions blocked in `retry()` when something they read changes.

use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A broadcast signal raised after commits, but only while someone waits: committers pay one
/// load when nobody is blocked in `retry()`.
pub(crate) struct RetrySignal {
    waiters: AtomicUsize,
    generation: Mutex<u64>,
    cv: Condvar,
}

/// How long a waiter sleeps before it looks again on its own, as a guard against missed signals.
const RECHECK: Duration = Duration::from_millis(50);

impl RetrySignal {
    pub(crate) fn new() -> RetrySignal {
        RetrySignal {
            waiters: AtomicUsize::new(0),
            generation: Mutex::new(0),
            cv: Condvar::new(),
        }
    }

    /// Called by a committer after its new versions are visible.
    #[inline]
    pub(crate) fn notify(&self) {
        // Pairs with the waiter's increment of `waiters` before it checks what it read.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            *self.generation.lock() += 1;
            self.cv.notify_all();
        }
    }

    /// Blocks until `changed()` holds (true) or `deadline` passes (false).
    pub(crate) fn wait_until(
        &self,
        deadline: Option<Instant>,
        mut changed: impl FnMut() -> bool,
    ) -> bool {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            let mut gen = self.generation.lock();
            if changed() {
                break true;
            }
            let now = Instant::now();
            let mut until = now + RECHECK;
            if let Some(d) = deadline {
                if now >= d {
                    break false;
                }
                until = until.min(d);
            }
            let seen = *gen;
            while *gen == seen {
                if self.cv.wait_until(&mut gen, until).timed_out() {
                    break;
                }
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }
}
