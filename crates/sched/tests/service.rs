//! The transaction service: priority order, preemption at safe points, resumption on another
//! worker, the policies, the context pool, and failures.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_sched::{yield_now, Policy, ServiceConfig, ServiceError, Ticket, TxService};

fn service(workers: usize, contexts: usize, policy: Policy) -> TxService {
    TxService::start(ServiceConfig {
        workers,
        levels: 5,
        contexts,
        stack_bytes: 128 * 1024,
        policy,
        ..ServiceConfig::default()
    })
    .expect("a valid configuration")
}

/// A flag shared with tasks.
#[derive(Clone, Default)]
struct Flag(Arc<AtomicBool>);

impl Flag {
    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    /// Waits until set (panics after 10 s).
    fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.is_set() {
            assert!(Instant::now() < deadline, "a flag was never set");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A long task: announces it runs, then passes safe points until `stop` is set (or 10 s).
fn spinner(
    service: &TxService,
    level: u8,
    running: &Flag,
    stop: &Flag,
) -> Ticket<std::thread::ThreadId> {
    let (running, stop) = (running.clone(), stop.clone());
    service
        .submit(level, move || {
            running.set();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !stop.is_set() && Instant::now() < deadline {
                yield_now();
                std::hint::spin_loop();
            }
            std::thread::current().id()
        })
        .expect("submitted")
}

#[test]
fn a_long_low_priority_task_is_preempted_by_an_urgent_one_and_ends_later() {
    let s = service(1, 4, Policy::Preemptive);
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    let pause = Duration::from_millis(5);
    let urgent = s
        .submit(5, move || {
            std::thread::sleep(pause);
            42
        })
        .expect("submitted");
    let (answer, urgent_timing) = urgent.wait().expect("ran");
    assert_eq!(answer, 42);
    assert!(urgent_timing.running >= pause);
    assert!(
        !low.is_done(),
        "the low task was still running when the urgent one ended"
    );
    stop.set();
    let (_, low_timing) = low.wait().expect("ran");
    assert_eq!(low_timing.preemptions, 1);
    assert!(urgent_timing.ended < low_timing.ended);
    // Its time on the worker leaves out the time it spent preempted.
    let execution = low_timing.ended.duration_since(low_timing.started);
    assert!(low_timing.running + pause <= execution);
    assert_eq!(s.stats().preemptions, 1);
}

#[test]
fn without_preemption_an_urgent_task_waits_for_the_running_one() {
    let s = service(1, 4, Policy::None);
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    let urgent = s.submit(5, || 42).expect("submitted");
    std::thread::sleep(Duration::from_millis(30));
    assert!(!urgent.is_done(), "nothing preempted the running task");
    stop.set();
    let (_, low_timing) = low.wait().expect("ran");
    let (_, urgent_timing) = urgent.wait().expect("ran");
    assert_eq!(low_timing.preemptions, 0);
    assert!(urgent_timing.started >= low_timing.ended);
}

#[test]
fn a_preempted_task_resumes_on_another_worker() {
    let s = service(2, 8, Policy::Preemptive);
    let (a_runs, b_runs, stop_low) = (Flag::default(), Flag::default(), Flag::default());
    let a = spinner(&s, 1, &a_runs, &stop_low);
    let b = spinner(&s, 1, &b_runs, &stop_low);
    a_runs.wait();
    b_runs.wait();
    // The urgent task holds the worker it took until released; the other low task ends, and
    // its worker resumes the preempted one.
    let (urgent_runs, release) = (Flag::default(), Flag::default());
    let urgent = spinner(&s, 5, &urgent_runs, &release);
    urgent_runs.wait();
    stop_low.set();
    let (a_thread, a_timing) = a.wait().expect("ran");
    let (b_thread, b_timing) = b.wait().expect("ran");
    release.set();
    urgent.wait().expect("ran");
    let (preempted, _) = if a_timing.preemptions > 0 {
        (a_timing, b_timing)
    } else {
        (b_timing, a_timing)
    };
    assert_eq!(preempted.preemptions, 1);
    assert_eq!(preempted.migrations, 1, "it resumed on the other worker");
    assert_eq!(a_thread, b_thread, "both ended on the worker that was free");
    assert_eq!(s.stats().migrations, 1);
}

#[test]
fn cmax_stops_preempting_a_task_preempted_cmax_times() {
    let s = service(1, 4, Policy::Cmax(1));
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    s.submit(5, || ()).expect("submitted").wait().expect("ran");
    while s.waiting() > 0 {
        std::thread::sleep(Duration::from_micros(100));
    }
    // Preempted once: C_max reached, so the next urgent request waits for it.
    let second = s.submit(5, || ()).expect("submitted");
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !second.is_done(),
        "the low task is not preemptable any more"
    );
    stop.set();
    let (_, low_timing) = low.wait().expect("ran");
    let (_, second_timing) = second.wait().expect("ran");
    assert_eq!(low_timing.preemptions, 1);
    assert!(second_timing.started >= low_timing.ended);
}

#[test]
fn cmax_moves_a_task_to_the_highest_level_where_nothing_preempts_it() {
    let s = service(1, 4, Policy::Cmax(2));
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    for _ in 0..2 {
        s.submit(3, || ()).expect("submitted").wait().expect("ran");
        while s.waiting() > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    // At the highest level now: even a level-5 request waits for it.
    let top = s.submit(5, || ()).expect("submitted");
    std::thread::sleep(Duration::from_millis(30));
    assert!(!top.is_done());
    stop.set();
    let (_, low_timing) = low.wait().expect("ran");
    assert_eq!((low_timing.preemptions, low_timing.level), (2, 5));
    assert!(top.wait().expect("ran").1.started >= low_timing.ended);
}

#[test]
fn lazy_promotion_raises_a_task_one_level_per_preemption() {
    let s = service(1, 4, Policy::Lazy(3));
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    for _ in 0..2 {
        s.submit(4, || ()).expect("submitted").wait().expect("ran");
        while s.waiting() > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    // Promoted twice, from 1 to 3: a level-3 request no longer preempts it, a level-4 one
    // does (its third preemption: C_max, so it ends at the highest level).
    let same = s.submit(3, || ()).expect("submitted");
    std::thread::sleep(Duration::from_millis(30));
    assert!(!same.is_done(), "a request of its own level waits");
    s.submit(4, || ()).expect("submitted").wait().expect("ran");
    stop.set();
    let (_, low_timing) = low.wait().expect("ran");
    same.wait().expect("ran");
    assert_eq!((low_timing.preemptions, low_timing.level), (3, 5));
}

#[test]
fn with_every_context_in_use_an_urgent_request_waits() {
    let s = service(1, 1, Policy::Preemptive);
    let (running, stop) = (Flag::default(), Flag::default());
    let low = spinner(&s, 1, &running, &stop);
    running.wait();
    let urgent = s.submit(5, || ()).expect("submitted");
    std::thread::sleep(Duration::from_millis(30));
    assert!(!urgent.is_done(), "no context to start it in");
    stop.set();
    assert_eq!(low.wait().expect("ran").1.preemptions, 0);
    urgent.wait().expect("ran");
}

#[test]
fn requests_start_most_urgent_first_then_oldest_first() {
    let s = service(1, 8, Policy::None);
    let (running, stop) = (Flag::default(), Flag::default());
    let blocker = spinner(&s, 1, &running, &stop);
    running.wait();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let tickets: Vec<_> = [(2, 'a'), (4, 'b'), (2, 'c'), (5, 'd'), (4, 'e')]
        .into_iter()
        .map(|(level, name)| {
            let order = order.clone();
            s.submit(level, move || order.lock().push(name))
                .expect("submitted")
        })
        .collect();
    stop.set();
    blocker.wait().expect("ran");
    for t in tickets {
        t.wait().expect("ran");
    }
    assert_eq!(*order.lock(), vec!['d', 'b', 'e', 'a', 'c']);
}

#[test]
fn a_panic_in_a_request_reaches_its_submitter_and_the_worker_goes_on() {
    let s = service(1, 2, Policy::Preemptive);
    let failing = s.submit(3, || panic!("boom")).expect("submitted");
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| failing.wait()));
    assert!(caught.is_err());
    assert_eq!(
        s.submit(3, || 7).expect("submitted").wait().expect("ran").0,
        7
    );
}

#[test]
fn bad_levels_and_configurations_are_refused() {
    let s = service(1, 2, Policy::None);
    assert!(matches!(s.submit(0, || ()), Err(ServiceError::Queue(_))));
    assert!(matches!(s.submit(6, || ()), Err(ServiceError::Queue(_))));
    let bad = |c: ServiceConfig| TxService::start(c).err().expect("refused");
    let ok = ServiceConfig::default();
    assert!(matches!(
        bad(ServiceConfig {
            workers: 0,
            ..ok.clone()
        }),
        ServiceError::Config(_)
    ));
    assert!(matches!(
        bad(ServiceConfig {
            contexts: 0,
            ..ok.clone()
        }),
        ServiceError::Config(_)
    ));
    assert!(matches!(
        bad(ServiceConfig {
            levels: 0,
            ..ok.clone()
        }),
        ServiceError::Queue(_)
    ));
    assert!(matches!(
        bad(ServiceConfig {
            stack_bytes: 10,
            ..ok.clone()
        }),
        ServiceError::Config(_)
    ));
    assert!(matches!(
        bad(ServiceConfig {
            idle_spin: Duration::from_secs(2),
            ..ok.clone()
        }),
        ServiceError::Config(_)
    ));
    assert!(matches!(
        bad(ServiceConfig {
            policy: Policy::Cmax(0),
            ..ok
        }),
        ServiceError::Config(_)
    ));
    assert!("cmax:x".parse::<Policy>().is_err());
    assert!("preemptive:2".parse::<Policy>().is_err());
    assert!("fifo".parse::<Policy>().is_err());
    assert_eq!("cmax:4".parse::<Policy>(), Ok(Policy::Cmax(4)));
    assert_eq!("lazy:8".parse::<Policy>(), Ok(Policy::Lazy(8)));
}

#[test]
fn dropping_the_service_ends_everything_submitted() {
    let done = Arc::new(AtomicUsize::new(0));
    let tickets: Vec<_> = {
        let s = service(2, 4, Policy::Preemptive);
        (0..50)
            .map(|i| {
                let done = done.clone();
                s.submit(1 + (i % 5) as u8, move || {
                    for _ in 0..100 {
                        yield_now();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
                .expect("submitted")
            })
            .collect()
    };
    assert_eq!(done.load(Ordering::Relaxed), 50);
    for t in tickets {
        t.wait().expect("ran");
    }
}

#[test]
fn many_preemptions_lose_no_work() {
    // Low tasks count on their own stacks, with safe points between steps, while urgent
    // requests keep arriving: every step of every task is done once.
    let s = service(2, 64, Policy::Preemptive);
    let total = Arc::new(AtomicUsize::new(0));
    let stop = Flag::default();
    let lows: Vec<_> = (0..8)
        .map(|_| {
            let (total, stop) = (total.clone(), stop.clone());
            s.submit(1, move || {
                let mut steps = 0usize;
                while !stop.is_set() || steps < 1000 {
                    steps += 1;
                    total.fetch_add(1, Ordering::Relaxed);
                    yield_now();
                }
                steps
            })
            .expect("submitted")
        })
        .collect();
    let urgent: Vec<_> = (0..200)
        .map(|i| {
            std::thread::sleep(Duration::from_micros(50));
            s.submit(2 + (i % 4) as u8, || std::hint::black_box(1))
                .expect("submitted")
        })
        .collect();
    for t in urgent {
        t.wait().expect("ran");
    }
    stop.set();
    let mut steps = 0;
    let mut preempted = 0;
    for t in lows {
        let (n, timing) = t.wait().expect("ran");
        steps += n;
        preempted += timing.preemptions;
    }
    assert_eq!(total.load(Ordering::Relaxed), steps);
    assert!(
        preempted >= 100,
        "urgent requests preempted low tasks ({preempted} times)"
    );
}
