//! Busy polling: for a short window after the transport last read or wrote, one task keeps a
//! runtime worker from going to sleep, so the next message is picked up by a thread that is
//! already running.
//!
//! Waking a thread that sleeps in the kernel costs tens of microseconds on a virtual machine
//! (the idle virtual CPU halts, and the host has to schedule it again): on the machine this
//! was measured on, a blocking-socket ping-pong took about 80 us per round trip and a C
//! program polling its sockets 7 us (docs/BENCHMARKS.md, "Network layer"). A worker with a
//! yielded task is never parked by tokio: it polls the I/O driver without blocking (when no
//! other worker holds the driver, blocked in `epoll_wait`) before running the task again, so
//! readiness is usually seen by a running thread. The window bounds what an idle node burns:
//! the task stops yielding once nothing was read or written for that long, and waits for the
//! next activity. While other processes keep the machine's cores busy, it does not spin at all
//! (see [`crate::spin`]).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::spin;

/// The activity clock of one transport and the task that spins on it.
pub(super) struct BusyPoll {
    window: Duration,
    base: Instant,
    /// Nanoseconds from `base` to the last activity.
    last: AtomicU64,
    /// The spinning task waits for activity (a `touch` must wake it).
    waiting: AtomicBool,
    wake: Notify,
}

impl BusyPoll {
    /// A busy poller that spins for `window` after each activity (never, if it is zero); its
    /// creation counts as activity.
    pub(super) fn new(window: Duration) -> Arc<BusyPoll> {
        Arc::new(BusyPoll {
            window,
            base: Instant::now(),
            last: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// Whether the transport busy-polls at all.
    pub(super) fn enabled(&self) -> bool {
        !self.window.is_zero()
    }

    /// Notes activity now: the spinning task spins (again) for the whole window.
    #[inline]
    pub(super) fn touch(&self) {
        if !self.enabled() {
            return;
        }
        self.last.store(self.now(), Ordering::Relaxed);
        // Pairs with the fence in `run`: either this sees the flag set, or `run` sees this
        // activity.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn recent(&self) -> bool {
        self.recent_at(Instant::now())
    }

    /// Whether there was activity within the window before `now`.
    fn recent_at(&self, now: Instant) -> bool {
        let at = now.saturating_duration_since(self.base).as_nanos() as u64;
        let idle = at.saturating_sub(self.last.load(Ordering::Relaxed));
        idle < u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The spinning task: until `stop`, yields while there was recent activity and otherwise
    /// waits for the next.
    pub(super) async fn run(self: Arc<Self>, stop: CancellationToken) {
        if !self.enabled() {
            return;
        }
        loop {
            let mut spinner = spin::gate().spinner();
            loop {
                // One clock read per look, for the window and the gate alike.
                let now = Instant::now();
                if !self.recent_at(now) {
                    break;
                }
                if stop.is_cancelled() {
                    return;
                }
                if !spinner.look_at(now) {
                    break;
                }
                tokio::task::yield_now().await;
            }
            if let Some(until) = spin::gate().closed_until(Instant::now()) {
                // Other processes want the cores (see `spin`): no spinning until the gate opens.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => {}
                }
                continue;
            }
            self.waiting.store(true, Ordering::Relaxed);
            // Activity between the last check and the flag did not see it set: look again
            // (pairs with the fence in `touch`).
            fence(Ordering::SeqCst);
            if self.recent() {
                self.waiting.store(false, Ordering::SeqCst);
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the task comes to wait for activity within two seconds (it may first sit out a
    /// pause of the spin gate, which other tests' load can close).
    async fn comes_to_wait(poll: &BusyPoll) -> bool {
        for _ in 0..200 {
            if poll.waiting.load(Ordering::SeqCst) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spins_after_activity_then_waits_and_stops_when_asked() {
        let poll = BusyPoll::new(Duration::from_millis(20));
        let stop = CancellationToken::new();
        let task = tokio::spawn(poll.clone().run(stop.clone()));
        // Its start counts as activity; once the window has passed with none, the task waits.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(comes_to_wait(&poll).await);
        // Activity wakes it: it spins for the window, then waits again.
        poll.touch();
        assert!(!poll.waiting.load(Ordering::SeqCst));
        assert!(poll.recent());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!poll.recent());
        assert!(comes_to_wait(&poll).await);
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stopped")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_zero_window_never_spins() {
        let poll = BusyPoll::new(Duration::ZERO);
        poll.touch();
        assert!(!poll.recent());
        // Returns at once.
        poll.clone().run(CancellationToken::new()).await;
    }
}
