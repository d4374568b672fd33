//! Where an application thread waits for a protocol machine's answer to its request.
//!
//! The answer is usually put by a runtime worker that read it from the network. Waking a
//! sleeping thread costs tens of microseconds on a busy or virtual machine, and on a machine
//! with fewer cores than threads the woken thread then waits for a core. So a waiter first
//! polls for a while, yielding its core between looks (other threads, the runtime's workers
//! among them, run meanwhile), and only then sleeps on a condition variable. It does not poll
//! while other processes keep the machine's cores busy (see `atomos_net::spin`).
//!
//! Code running in a fiber (see `atomos_sched::fiber`) does neither: it suspends its fiber,
//! and the answer wakes the fiber's task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use atomos_sched::fiber::{self, Awaited, Resumed};

/// How long a thread waiting for a protocol's answer polls before it sleeps, by default (see
/// `NodeRuntime::set_answer_poll`). Measured: TFA bank over TCP, 4 nodes × 4 threads in one
/// process on 2 cores, from about 21k to 25-27k tx/s, p50 about 570 to 270 us, p99 3.0 to
/// 4.2 ms.
pub const DEFAULT_ANSWER_POLL: Duration = Duration::from_micros(500);

/// A slot one application thread waits on for the answer to its request to a protocol
/// machine; the machine's deliveries fill it from any thread.
pub(crate) struct AnswerSlot<T> {
    answer: parking_lot::Mutex<Slot<T>>,
    /// Set once an answer was put (pollers look here without taking the lock).
    arrived: AtomicBool,
    ready: parking_lot::Condvar,
}

/// What the slot's lock guards.
struct Slot<T> {
    answer: Option<T>,
    /// The task of a fiber suspended on the slot, woken by the answer.
    fiber: Option<Waker>,
}

impl<T> Default for AnswerSlot<T> {
    fn default() -> Self {
        AnswerSlot {
            answer: parking_lot::Mutex::new(Slot {
                answer: None,
                fiber: None,
            }),
            arrived: AtomicBool::new(false),
            ready: parking_lot::Condvar::new(),
        }
    }
}

impl<T> AnswerSlot<T> {
    /// Puts the answer and wakes the waiter.
    pub(crate) fn put(&self, answer: T) {
        let mut slot = self.answer.lock();
        slot.answer = Some(answer);
        // Set and cleared under the lock, so it says whether the slot is full.
        self.arrived.store(true, Ordering::Release);
        let fiber = slot.fiber.take();
        drop(slot);
        if let Some(waker) = fiber {
            waker.wake();
        }
        self.ready.notify_one();
    }

    /// Whether an answer is there (not taken yet).
    pub(crate) fn is_full(&self) -> bool {
        self.arrived.load(Ordering::Acquire)
    }

    /// The answer if one arrived, without waiting.
    pub(crate) fn take(&self) -> Option<T> {
        Self::take_locked(&mut self.answer.lock(), &self.arrived)
    }

    fn take_locked(slot: &mut Slot<T>, arrived: &AtomicBool) -> Option<T> {
        arrived.store(false, Ordering::Relaxed);
        slot.answer.take()
    }
}

impl<T: Send> Awaited for AnswerSlot<T> {
    fn ready_or_register(&self, waker: &Waker) -> bool {
        let mut slot = self.answer.lock();
        if slot.answer.is_some() {
            return true;
        }
        match &mut slot.fiber {
            Some(registered) => registered.clone_from(waker),
            none => *none = Some(waker.clone()),
        }
        false
    }
}

impl<T: Send> AnswerSlot<T> {
    /// Waits for the answer until `deadline` (`None` if none came by then). In a fiber it
    /// suspends the fiber until the answer is put or the deadline passes. On a thread, for up
    /// to `poll` it looks for the answer and yields its core between looks, then it sleeps
    /// until the answer is put or the deadline passes.
    pub(crate) fn wait_until(&self, deadline: Instant, poll: Duration) -> Option<T> {
        if fiber::in_fiber() {
            return self.suspend_until(deadline);
        }
        self.block_until(deadline, poll)
    }

    /// Like [`AnswerSlot::wait_until`] on a thread, even in a fiber: it blocks the thread it
    /// runs on (for waits that must not suspend, such as those of code unwinding a panic).
    pub(crate) fn block_until(&self, deadline: Instant, poll: Duration) -> Option<T> {
        if !poll.is_zero() {
            let until = Instant::now()
                .checked_add(poll)
                .map_or(deadline, |end| end.min(deadline));
            let mut spinner = atomos_net::spin::gate().spinner();
            loop {
                if self.arrived.load(Ordering::Acquire) {
                    if let Some(answer) = self.take() {
                        return Some(answer);
                    }
                }
                let now = Instant::now();
                if now >= until || !spinner.look_at(now) {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let mut slot = self.answer.lock();
        while slot.answer.is_none() {
            if self.ready.wait_until(&mut slot, deadline).timed_out() {
                break;
            }
        }
        Self::take_locked(&mut slot, &self.arrived)
    }

    /// Suspends the calling fiber until the answer is put or `deadline` passes.
    fn suspend_until(&self, deadline: Instant) -> Option<T> {
        loop {
            if let Some(answer) = self.take() {
                return Some(answer);
            }
            match fiber::suspend(self, deadline) {
                Some(Resumed::Ready) => continue,
                Some(Resumed::TimedOut) | None => return self.take(),
            }
        }
    }
}

/// The answering end of a slot whose answer may never come: dropped unanswered (its sender
/// stopped), it puts `None`, so the waiter learns so at once instead of at its deadline.
pub(crate) struct Replier<T>(Option<std::sync::Arc<AnswerSlot<Option<T>>>>);

impl<T> Replier<T> {
    /// Answers into `slot`.
    pub(crate) fn new(slot: std::sync::Arc<AnswerSlot<Option<T>>>) -> Replier<T> {
        Replier(Some(slot))
    }

    /// Puts the answer.
    pub(crate) fn send(mut self, answer: T) {
        if let Some(slot) = self.0.take() {
            slot.put(Some(answer));
        }
    }
}

impl<T> Drop for Replier<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.put(None);
        }
    }
}

/// Answer slots by request number, shared by a driver and its machine's deliveries.
pub(crate) type AnswerSlots<T> = std::sync::Arc<
    parking_lot::Mutex<std::collections::HashMap<u64, std::sync::Arc<AnswerSlot<T>>>>,
>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn an_answer_put_while_polling_is_taken() {
        let slot = Arc::new(AnswerSlot::default());
        let putter = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                slot.put(7u32);
            })
        };
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        assert_eq!(slot.wait_until(deadline, Duration::from_secs(5)), Some(7));
        // Seen while polling, not when the 5 s window ran out.
        assert!(start.elapsed() < Duration::from_secs(2));
        putter.join().unwrap();
        // Taken once: the slot is empty again.
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn an_answer_after_the_poll_wakes_the_sleeper() {
        let slot = Arc::new(AnswerSlot::default());
        let putter = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                slot.put("late");
            })
        };
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        assert_eq!(
            slot.wait_until(deadline, Duration::from_micros(100)),
            Some("late")
        );
        // Woken by the answer, not by the deadline.
        assert!(start.elapsed() < Duration::from_secs(5));
        putter.join().unwrap();
    }

    #[test]
    fn a_reused_slot_does_not_hand_out_an_answer_twice() {
        let slot = AnswerSlot::default();
        let far = Instant::now() + Duration::from_secs(10);
        slot.put(1u8);
        assert_eq!(slot.wait_until(far, Duration::from_millis(1)), Some(1));
        // The next request of the same attempt: nothing yet, polling or sleeping.
        let soon = Instant::now() + Duration::from_millis(5);
        assert_eq!(slot.wait_until(soon, Duration::from_millis(50)), None);
        let soon = Instant::now() + Duration::from_millis(5);
        assert_eq!(slot.wait_until(soon, Duration::ZERO), None);
        slot.put(2);
        assert_eq!(slot.wait_until(far, Duration::from_millis(1)), Some(2));
    }

    #[test]
    fn a_window_too_large_for_the_clock_polls_until_the_deadline() {
        let slot = AnswerSlot::<u8>::default();
        let deadline = Instant::now() + Duration::from_millis(5);
        assert_eq!(slot.wait_until(deadline, Duration::MAX), None);
    }

    #[test]
    fn no_answer_by_the_deadline_is_none_even_while_polling() {
        let slot = AnswerSlot::<u8>::default();
        let start = Instant::now();
        // The deadline comes before the poll window ends: polling stops there.
        let got = slot.wait_until(start + Duration::from_millis(5), Duration::from_secs(10));
        assert_eq!(got, None);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// Polls `fiber` once with a waker that counts its wakes in `woken`.
    fn poll_counting<R>(
        fiber: &mut atomos_sched::fiber::Fiber<R>,
        woken: &Arc<AtomicUsize>,
    ) -> std::task::Poll<R> {
        struct Count(Arc<AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = std::task::Waker::from(Arc::new(Count(woken.clone())));
        std::future::Future::poll(
            std::pin::Pin::new(fiber),
            &mut std::task::Context::from_waker(&waker),
        )
    }

    #[test]
    fn in_a_fiber_a_missing_answer_suspends_it_and_the_answer_wakes_it() {
        let slot = Arc::new(AnswerSlot::<u32>::default());
        let inner = slot.clone();
        let far = Instant::now() + Duration::from_secs(60);
        // SAFETY: the closure holds nothing tied to a thread.
        let mut fiber = unsafe {
            atomos_sched::fiber::Fiber::new(move || {
                // Neither a poll of a second nor a sleep: the fiber suspends.
                let first = inner.wait_until(far, Duration::from_secs(1));
                let second = inner.wait_until(far, Duration::ZERO);
                (first, second)
            })
        }
        .unwrap();
        let woken = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        assert!(poll_counting(&mut fiber, &woken).is_pending());
        assert!(start.elapsed() < Duration::from_millis(500));
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        slot.put(7);
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        // It takes the answer and suspends again on the next wait.
        assert!(poll_counting(&mut fiber, &woken).is_pending());
        slot.put(8);
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert_eq!(
            poll_counting(&mut fiber, &woken),
            std::task::Poll::Ready((Some(7), Some(8)))
        );

        // An answer put before the wait is taken without suspending.
        slot.put(9);
        let inner = slot.clone();
        // SAFETY: as above.
        let mut fiber = unsafe {
            atomos_sched::fiber::Fiber::new(move || inner.wait_until(far, Duration::ZERO))
        }
        .unwrap();
        assert_eq!(
            poll_counting(&mut fiber, &woken),
            std::task::Poll::Ready(Some(9))
        );
    }

    #[test]
    fn fibers_waiting_for_each_others_answers_interleave_on_one_thread() {
        // Neither can finish unless the other runs while it is suspended.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (a, b) = (
            Arc::new(AnswerSlot::<u32>::default()),
            Arc::new(AnswerSlot::<u32>::default()),
        );
        let far = Instant::now() + Duration::from_secs(60);
        let ping = {
            let (a, b) = (a.clone(), b.clone());
            move || {
                let mut sum = 0;
                for i in 0..100 {
                    b.put(i);
                    sum += a.wait_until(far, Duration::ZERO).unwrap();
                }
                sum
            }
        };
        let pong = move || {
            for _ in 0..100 {
                let got = b.wait_until(far, Duration::ZERO).unwrap();
                a.put(got * 2);
            }
        };
        // SAFETY: the closures hold nothing tied to a thread.
        let (ping, pong) = unsafe {
            (
                atomos_sched::fiber::Fiber::new(ping).unwrap(),
                atomos_sched::fiber::Fiber::new(pong).unwrap(),
            )
        };
        let (sum, ()) = rt.block_on(async {
            let ping = tokio::spawn(ping);
            let pong = tokio::spawn(pong);
            (ping.await.unwrap(), pong.await.unwrap())
        });
        assert_eq!(sum, (0..100).map(|i| i * 2).sum::<u32>());
    }

    #[test]
    fn in_a_fiber_no_answer_by_the_deadline_is_none() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let slot = Arc::new(AnswerSlot::<u32>::default());
        let inner = slot.clone();
        let start = Instant::now();
        // SAFETY: the closure holds nothing tied to a thread.
        let fiber = unsafe {
            atomos_sched::fiber::Fiber::new(move || {
                inner.wait_until(Instant::now() + Duration::from_millis(30), Duration::ZERO)
            })
        }
        .unwrap();
        assert_eq!(rt.block_on(fiber), None);
        assert!(start.elapsed() >= Duration::from_millis(30));
        // A late answer stays in the slot.
        slot.put(1);
        assert_eq!(slot.take(), Some(1));
    }

    #[test]
    fn a_replier_dropped_unanswered_says_so_at_once() {
        let far = Instant::now() + Duration::from_secs(60);
        let slot = Arc::new(AnswerSlot::<Option<u8>>::default());
        Replier::new(slot.clone()).send(3);
        assert_eq!(slot.wait_until(far, Duration::ZERO), Some(Some(3)));
        drop(Replier::<u8>::new(slot.clone()));
        let start = Instant::now();
        assert_eq!(slot.wait_until(far, Duration::ZERO), Some(None));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn an_answer_put_before_waiting_is_taken_at_once() {
        let slot = AnswerSlot::default();
        slot.put(1u8);
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(slot.wait_until(deadline, Duration::ZERO), Some(1));
    }
}
