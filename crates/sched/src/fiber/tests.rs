use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// A waker that counts its wakes.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What a fiber may wait for in these tests: a flag, and the waker of whoever waits.
#[derive(Default)]
struct Flag {
    set: Mutex<(bool, Option<Waker>)>,
}

impl Flag {
    fn raise(&self) {
        let waker = {
            let mut set = self.set.lock();
            set.0 = true;
            set.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Awaited for Flag {
    fn ready_or_register(&self, waker: &Waker) -> bool {
        let mut set = self.set.lock();
        if !set.0 {
            set.1 = Some(waker.clone());
        }
        set.0
    }
}

fn poll<R>(fiber: &mut Fiber<R>, waker: &Waker) -> Poll<R> {
    Pin::new(fiber).poll(&mut Context::from_waker(waker))
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Runs `body` as a fiber on a current-thread runtime, beside a task spawned after it that
/// counts once in the counter `body` is given; returns what `body` returned.
fn beside_another_task<R: Send + 'static>(
    body: impl FnOnce(&AtomicUsize) -> R + Send + 'static,
) -> R {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    // SAFETY: `body` holds nothing tied to a thread.
    let fiber = unsafe { Fiber::new(move || body(&seen)) }.unwrap();
    rt.block_on(async {
        let fiber = tokio::spawn(fiber);
        let other = tokio::spawn(async move {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        other.await.unwrap();
        fiber.await.unwrap()
    })
}

#[test]
fn a_fiber_that_does_not_wait_returns_on_its_first_poll() {
    // SAFETY: the closure holds nothing tied to a thread.
    let mut fiber = unsafe { Fiber::new(|| 6 * 7) }.unwrap();
    assert!(!in_fiber());
    assert_eq!(poll(&mut fiber, Waker::noop()), Poll::Ready(42));
}

#[test]
fn a_suspended_fiber_goes_on_once_woken_by_what_it_waits_for() {
    let flag = Arc::new(Flag::default());
    let inner = flag.clone();
    // SAFETY: as above.
    let mut fiber = unsafe {
        Fiber::new(move || {
            assert!(in_fiber());
            let mut resumed = Vec::new();
            while !inner.set.lock().0 {
                resumed.push(suspend(&*inner, far()).unwrap());
            }
            resumed
        })
    }
    .unwrap();
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    assert_eq!(poll(&mut fiber, &waker), Poll::Pending);
    assert!(!in_fiber());
    // Polled again before the flag: still suspended, nothing woken.
    assert_eq!(poll(&mut fiber, &waker), Poll::Pending);
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    flag.raise();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert_eq!(poll(&mut fiber, &waker), Poll::Ready(vec![Resumed::Ready]));
}

#[test]
#[cfg_attr(
    not(feature = "tokio-timer"),
    ignore = "a deadline needs a timer: run with --features tokio-timer (the workspace does)"
)]
fn a_fiber_waits_until_its_deadline_and_no_longer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let start = Instant::now();
    // SAFETY: as above.
    let fiber = unsafe {
        Fiber::new(move || {
            let never = Flag::default();
            suspend(&never, Instant::now() + Duration::from_millis(30))
        })
    }
    .unwrap();
    assert_eq!(rt.block_on(fiber), Some(Resumed::TimedOut));
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert!(start.elapsed() < Duration::from_secs(10));
    // Outside fibers nothing suspends.
    assert_eq!(suspend(&Flag::default(), far()), None);
}

#[test]
fn a_fiber_suspended_on_one_thread_resumes_on_another() {
    // SAFETY: as above.
    let mut fiber = unsafe {
        Fiber::new(move || {
            let first = std::thread::current().id();
            yield_now();
            (first, std::thread::current().id(), in_fiber())
        })
    }
    .unwrap();
    assert_eq!(poll(&mut fiber, Waker::noop()), Poll::Pending);
    let (first, second, in_fiber_there) =
        std::thread::spawn(move || match poll(&mut fiber, Waker::noop()) {
            Poll::Ready(r) => r,
            Poll::Pending => panic!("a yield goes on at the next poll"),
        })
        .join()
        .unwrap();
    assert_ne!(first, second);
    assert!(in_fiber_there);
}

#[test]
fn a_yield_lets_the_other_tasks_run_first() {
    let (before, after) = beside_another_task(|ran| {
        let before = ran.load(Ordering::SeqCst);
        yield_now();
        (before, ran.load(Ordering::SeqCst))
    });
    assert_eq!((before, after), (0, 1));
    // Outside fibers it does nothing.
    yield_now();
}

#[test]
fn a_fiber_yields_to_its_budget_once_its_turn_is_over() {
    let (early, late) = beside_another_task(|ran| {
        // Just resumed: the turn goes on.
        consume_budget();
        let early = ran.load(Ordering::SeqCst);
        let start = Instant::now();
        while start.elapsed() < TURN * 2 {
            std::hint::spin_loop();
        }
        consume_budget();
        (early, ran.load(Ordering::SeqCst))
    });
    assert_eq!((early, late), (0, 1));
    // Outside fibers it does nothing.
    consume_budget();
}

#[test]
fn a_panicking_fiber_leaves_no_fiber_current() {
    // It panics at once, and after a suspension (when its yielder is known to the poller).
    for suspend_first in [false, true] {
        // SAFETY: as above.
        let mut fiber = unsafe {
            Fiber::new(move || {
                if suspend_first {
                    yield_now();
                }
                panic!("the body fails");
            })
        }
        .unwrap();
        if suspend_first {
            assert_eq!(poll(&mut fiber, Waker::noop()), Poll::Pending);
        }
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = poll(&mut fiber, Waker::noop());
        }));
        assert!(polled.is_err(), "the panic comes out of poll");
        assert!(!in_fiber(), "suspended first: {suspend_first}");
        // Waits on this thread are a thread's, with no fiber to suspend.
        yield_now();
        assert!(!pause_until(Instant::now()));
        drop(fiber);
        assert!(!in_fiber());
    }
}

#[test]
fn a_back_off_suspends_the_fiber_until_it_is_over() {
    let back_off = Duration::from_millis(20);
    let (waited, others) = beside_another_task(move |ran| {
        let start = Instant::now();
        assert!(pause_until(start + back_off));
        // The other task ran meanwhile: the back-off did not hold the thread.
        (start.elapsed(), ran.load(Ordering::SeqCst))
    });
    assert!(waited >= back_off);
    assert_eq!(others, 1);
    // Outside fibers the caller waits on its own.
    assert!(!pause_until(Instant::now() + back_off));

    // Polled outside a Tokio runtime, a back-off wakes its task at once until it is over.
    // SAFETY: as above.
    let mut fiber =
        unsafe { Fiber::new(move || pause_until(Instant::now() + Duration::from_millis(5))) }
            .unwrap();
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    let start = Instant::now();
    let mut polls = 0;
    while poll(&mut fiber, &waker).is_pending() {
        polls += 1;
        assert_eq!(count.0.load(Ordering::SeqCst), polls, "woken at once");
    }
    assert!(start.elapsed() >= Duration::from_millis(5));
}

#[test]
fn a_fiber_dropped_while_suspended_unwinds_its_stack() {
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            // Unwinding runs outside any fiber.
            assert!(!in_fiber());
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    // SAFETY: as above.
    let mut fiber = unsafe {
        Fiber::new(move || {
            let _guard = SetOnDrop(flag);
            suspend(&Flag::default(), far())
        })
    }
    .unwrap();
    assert_eq!(poll(&mut fiber, Waker::noop()), Poll::Pending);
    assert!(!dropped.load(Ordering::SeqCst));
    drop(fiber);
    assert!(dropped.load(Ordering::SeqCst));
}
