//! A fiber that overflows its stack aborts the process with a message saying so, while the
//! faults that are not a fiber's overflow end the process as they would without fibers. Each
//! case runs in a child process (this test binary, running `fault_child` with the case named
//! in an environment variable).

use std::future::Future;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Output};
use std::task::{Context, Poll, Waker};

use atomos_sched::fiber::Fiber;

const CASE: &str = "ATOMOS_FAULT_CASE";

/// Recurses until the stack runs out: every frame keeps a kilobyte alive across the call.
#[inline(never)]
fn deep(n: u64) -> u64 {
    let frame = std::hint::black_box([n as u8; 1024]);
    if n == 0 {
        return u64::from(frame[0]);
    }
    deep(n - 1).wrapping_add(u64::from(frame[(n % 1024) as usize]))
}

/// A fiber, polled once on this thread with a waker that does nothing.
fn run_fiber(body: impl FnOnce() -> u64 + Send + 'static) -> Poll<u64> {
    // SAFETY: the body keeps nothing tied to this thread.
    let mut fiber = unsafe { Fiber::new(body) }.expect("a fiber stack");
    let mut cx = Context::from_waker(Waker::noop());
    std::pin::Pin::new(&mut fiber).poll(&mut cx)
}

/// Runs the case named in the environment; without one, it does nothing.
#[test]
fn fault_child() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    // Every case creates a fiber first, which installs the fault handler.
    assert_eq!(run_fiber(|| 7), Poll::Ready(7));
    match case.as_str() {
        "fiber-overflow" => {
            let _ = run_fiber(|| deep(u64::MAX));
        }
        "thread-overflow" => {
            // The thread runs a fiber first: once it returned, this thread runs no fiber.
            let _ = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(|| {
                    assert_eq!(run_fiber(|| 7), Poll::Ready(7));
                    deep(u64::MAX)
                })
                .expect("a thread")
                .join();
        }
        "bad-address" => {
            // SAFETY: none; the point is the fault (the page at address 8 is never mapped).
            unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>().wrapping_add(8), 1) };
        }
        other => panic!("unknown case {other}"),
    }
    unreachable!("case {case} returned");
}

fn child(case: &str) -> Output {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args(["fault_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE, case);
    // SAFETY: `setrlimit` is async-signal-safe, as code between fork and exec must be.
    unsafe {
        command.pre_exec(|| {
            // No core file for the crashes on purpose.
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            Ok(())
        });
    }
    command.output().expect("the child runs")
}

#[test]
fn a_fiber_overflowing_its_stack_aborts_with_a_message() {
    let out = child("fiber-overflow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{stderr}");
    assert!(
        stderr.contains("atomos: a fiber overflowed its stack"),
        "{stderr}"
    );
}

#[test]
fn a_thread_overflowing_its_stack_is_still_reported_as_a_thread() {
    let out = child("thread-overflow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{stderr}");
    assert!(stderr.contains("has overflowed its stack"), "{stderr}");
    assert!(!stderr.contains("fiber"), "{stderr}");
}

#[test]
fn any_other_fault_still_ends_the_process_with_sigsegv() {
    let out = child("bad-address");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{stderr}");
    assert!(!stderr.contains("overflowed"), "{stderr}");
}
