//! Fibers: blocking-style code, such as a loop of transactions, run as a future on an async
//! runtime's threads.
//!
//! A thread that waits for a protocol's answer (a TFA read, a commit) polls and then sleeps
//! until the runtime worker that read the answer from the network wakes it: two threads and a
//! switch between them for every message. A fiber runs the same code on a stackful coroutine
//! instead; where the code would wait for an answer it suspends, and the future that drives
//! the fiber is woken by the answer like any other task. So the runtime's own threads read the
//! sockets, step the protocol and run the transactions waiting on it, with no thread switch
//! between them.
//!
//! Waits for a protocol's answer, the engine's waits (a contention manager's back-off,
//! `retry()`, a replica applying a commit) and [`yield_now`] suspend a fiber. Anything else
//! that blocks (a sleep, a lock held by a suspended fiber, a long computation) holds the
//! runtime thread it runs on. A fiber whose transactions find everything they need on their
//! node never waits, so it should call [`consume_budget`] between them: the runtime's other
//! tasks queued on its thread then get their turn (Tokio looks at the sockets between tasks,
//! every 61 tasks by default, and whenever its queue is empty).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};
use parking_lot::Mutex;

mod overflow;
mod timer;

/// The stack each fiber runs on, as large as a spawned thread's (mapped on first touch, so a
/// fiber uses what it touches).
const STACK_BYTES: usize = 2 << 20;

/// Stacks of finished fibers kept for new ones (mapping a stack costs system calls).
const POOLED_STACKS: usize = 64;

static STACKS: Mutex<Vec<DefaultStack>> = Mutex::new(Vec::new());

/// Something a suspended fiber waits for (see [`suspend`]).
pub trait Awaited: Sync {
    /// Whether it is ready; if not, `waker` is woken once it is. A suspended fiber is polled
    /// by one task, so a later call with that task's waker may keep the first one instead.
    fn ready_or_register(&self, waker: &Waker) -> bool;
}

/// Why a suspended fiber goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// What it waited for may be ready (it looks again).
    Ready,
    /// Its deadline passed.
    TimedOut,
}

/// What a fiber suspends with.
pub(crate) enum Wait {
    /// An answer: what it waits for, until when.
    Answer {
        awaited: *const dyn Awaited,
        deadline: Instant,
    },
    /// The time: it goes on once `until` has passed.
    Until(Instant),
    /// Nothing: it lets the runtime's other tasks run first.
    Yield,
}

type FiberYielder = Yielder<Resumed, Wait>;

/// How long a fiber runs before [`consume_budget`] yields.
pub const TURN: Duration = Duration::from_micros(50);

thread_local! {
    /// The yielder of the fiber this thread is running (null outside fibers).
    static CURRENT: Cell<*const FiberYielder> = const { Cell::new(std::ptr::null()) };
    /// When the fiber this thread runs was last resumed.
    static TURN_START: Cell<Option<Instant>> = const { Cell::new(None) };
}

#[inline(never)]
fn start_turn() {
    TURN_START.with(|t| t.set(Some(Instant::now())));
}

#[inline(never)]
fn turn_start() -> Option<Instant> {
    TURN_START.with(Cell::get)
}

// Never inlined: a fiber may resume on another thread, and an inlined access could reuse the
// address of the thread-local of the thread it ran on before (see `crate::task`).
#[inline(never)]
fn swap_current(yielder: *const FiberYielder) -> *const FiberYielder {
    CURRENT.with(|c| c.replace(yielder))
}

#[inline(never)]
fn current() -> *const FiberYielder {
    CURRENT.with(Cell::get)
}

/// Makes a fiber current on this thread until dropped (its yielder, and its stack for the
/// overflow handler), then puts back what was current before, however the scope ends (a
/// fiber's panic leaves `resume` by unwinding).
struct MadeCurrent {
    outer: *const FiberYielder,
    outer_stack: usize,
}

impl MadeCurrent {
    fn enter(yielder: *const FiberYielder, stack_limit: usize) -> MadeCurrent {
        MadeCurrent {
            outer: swap_current(yielder),
            outer_stack: overflow::enter(stack_limit),
        }
    }
}

impl Drop for MadeCurrent {
    fn drop(&mut self) {
        swap_current(self.outer);
        overflow::enter(self.outer_stack);
    }
}

/// Whether the calling code runs in a fiber.
pub fn in_fiber() -> bool {
    !current().is_null()
}

/// Suspends the calling fiber until `awaited` may be ready or `deadline` passes; `None`
/// outside fibers (the caller waits as a thread does).
pub fn suspend(awaited: &dyn Awaited, deadline: Instant) -> Option<Resumed> {
    let yielder = current();
    // SAFETY: a non-null current yielder is that of the fiber running this code, which lives
    // on the fiber's stack until the fiber ends.
    let yielder = unsafe { yielder.as_ref() }?;
    let awaited: *const (dyn Awaited + '_) = awaited;
    // SAFETY: only the lifetime is erased. The poller uses the pointer only while this call is
    // suspended (it drops it before it resumes the fiber or unwinds it), and `awaited` outlives
    // this call.
    let awaited: *const (dyn Awaited + 'static) = unsafe { std::mem::transmute(awaited) };
    Some(yielder.suspend(Wait::Answer { awaited, deadline }))
}

/// In a fiber, lets the other tasks queued where it runs go first (its task is woken at once
/// and queued behind them); elsewhere, does nothing. Costs a task switch.
pub fn yield_now() {
    let yielder = current();
    // SAFETY: as in `suspend`.
    if let Some(yielder) = unsafe { yielder.as_ref() } {
        yielder.suspend(Wait::Yield);
    }
}

/// In a fiber that has run for [`TURN`] since it was last resumed, [`yield_now`]; otherwise
/// (and outside fibers) does nothing. Called between transactions, it bounds how long a fiber
/// whose transactions never wait keeps the runtime's other tasks from running, and costs a
/// clock read when the fiber's turn is not over.
pub fn consume_budget() {
    if !in_fiber() {
        return;
    }
    if turn_start().is_none_or(|start| start.elapsed() >= TURN) {
        yield_now();
    }
}

/// In a fiber, suspends it until `until` has passed and answers `true` (a contention
/// manager's back-off waits so); elsewhere answers `false` at once.
pub fn pause_until(until: Instant) -> bool {
    let yielder = current();
    // SAFETY: as in `suspend`.
    match unsafe { yielder.as_ref() } {
        Some(yielder) => {
            yielder.suspend(Wait::Until(until));
            true
        }
        None => false,
    }
}

/// A fiber: a closure run as a future. Polling it runs the closure on its own stack until it
/// returns (the future is ready), waits for a protocol's answer (the future is pending until
/// the answer arrives or the wait's deadline passes), backs off after a conflict (pending
/// until the back-off is over) or calls [`yield_now`] (pending, and woken at once). A panic
/// in the closure comes out of `poll`.
///
/// Deadlines and back-offs use the Tokio runtime's timer when the fiber is polled inside a
/// Tokio runtime, which must then have its timer enabled, and this crate's `tokio-timer`
/// feature is on; polled elsewhere, a fiber waits for
/// its answers without a deadline, and waits out a back-off by waking its task at once until
/// the back-off is over.
pub struct Fiber<R> {
    /// The coroutine, until it returns.
    coroutine: Option<Coroutine<Resumed, Wait, R, DefaultStack>>,
    /// Its yielder, once it started (the poller makes it current around each resume).
    yielder: *const FiberYielder,
    /// What it waits for, while suspended.
    waiting: Option<Wait>,
    /// The timer of the wait's deadline.
    timer: timer::Timer,
    /// The lowest address of its stack's mapping: the guard page.
    stack_limit: usize,
}

// SAFETY: the closure and its result are `Send`; the fiber is resumed by one thread at a time
// (whoever polls it), and the contract of [`Fiber::new`] keeps what the closure holds across a
// suspension free of ties to the thread it ran on. `waiting` points into an `Awaited` the
// suspended closure keeps alive, which is `Sync`.
unsafe impl<R: Send> Send for Fiber<R> {}

impl<R> Unpin for Fiber<R> {}

impl<R> Fiber<R> {
    /// Runs `body` as a fiber (see the module documentation): the returned future runs it when
    /// polled, on the polling thread, suspending where it waits for a protocol's answer.
    ///
    /// # Safety
    ///
    /// A suspended fiber may resume on another thread (a multi-threaded runtime moves tasks
    /// between its threads). Across any call that may suspend it (a transaction, which may
    /// wait for a protocol's answer, back off or `retry()`; [`yield_now`]; [`consume_budget`]),
    /// `body` must not keep a reference into thread-local storage, a lock guard, or anything
    /// else tied to the thread it runs on, and must not rely on the thread's identity. The
    /// transactions of atomos keep this rule themselves.
    ///
    /// A fiber that overflows its stack aborts the process with a message saying so (see
    /// `overflow`). Fails only if no stack can be mapped for it.
    pub unsafe fn new<F>(body: F) -> std::io::Result<Fiber<R>>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let stack = STACKS.lock().pop();
        let stack = match stack {
            Some(stack) => stack,
            None => DefaultStack::new(STACK_BYTES)?,
        };
        overflow::install();
        let stack_limit = stack.limit().get();
        let coroutine = Coroutine::with_stack(stack, move |yielder: &FiberYielder, _| {
            swap_current(yielder);
            body()
        });
        Ok(Fiber {
            coroutine: Some(coroutine),
            yielder: std::ptr::null(),
            waiting: None,
            timer: timer::Timer::default(),
            stack_limit,
        })
    }

    /// How the fiber goes on after it suspended with `wait`: at once, or (`None`) once woken.
    fn resumption(&mut self, cx: &mut Context<'_>, wait: &Wait) -> Option<Resumed> {
        match *wait {
            Wait::Answer { awaited, deadline } => {
                // SAFETY: the fiber is suspended waiting on it, which keeps it alive.
                let awaited = unsafe { &*awaited };
                if awaited.ready_or_register(cx.waker()) {
                    Some(Resumed::Ready)
                } else if self.deadline_passed(cx, deadline) {
                    Some(Resumed::TimedOut)
                } else {
                    None
                }
            }
            Wait::Until(until) => {
                if self.deadline_passed(cx, until) {
                    return Some(Resumed::TimedOut);
                }
                if !self.timer.armed() {
                    // No timer outside a Tokio runtime: look again at the next turn.
                    cx.waker().wake_by_ref();
                }
                None
            }
            Wait::Yield => {
                // Woken while it runs, the task is queued behind the worker's other tasks.
                cx.waker().wake_by_ref();
                None
            }
        }
    }

    /// Whether the deadline of the current wait passed; if not and a timer can run, the timer
    /// wakes the task at the deadline.
    fn deadline_passed(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        self.timer.passed(cx, deadline)
    }
}

impl<R> Future for Fiber<R> {
    type Output = R;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        let this = self.get_mut();
        let mut input = match this.waiting.take() {
            // A yield goes on at its next poll.
            None | Some(Wait::Yield) => Resumed::Ready,
            Some(wait) => match this.resumption(cx, &wait) {
                Some(resumed) => resumed,
                None => {
                    this.waiting = Some(wait);
                    return Poll::Pending;
                }
            },
        };
        loop {
            let coroutine = this
                .coroutine
                .as_mut()
                .expect("a fiber polled after it returned");
            let result = {
                let _current = MadeCurrent::enter(this.yielder, this.stack_limit);
                start_turn();
                let result = coroutine.resume(input);
                this.yielder = current();
                result
            };
            match result {
                CoroutineResult::Return(r) => {
                    if let Some(coroutine) = this.coroutine.take() {
                        let mut stacks = STACKS.lock();
                        if stacks.len() < POOLED_STACKS {
                            stacks.push(coroutine.into_stack());
                        }
                    }
                    return Poll::Ready(r);
                }
                CoroutineResult::Yield(wait) => match this.resumption(cx, &wait) {
                    Some(resumed) => input = resumed,
                    None => {
                        this.waiting = Some(wait);
                        return Poll::Pending;
                    }
                },
            }
        }
    }
}

impl<R> Drop for Fiber<R> {
    fn drop(&mut self) {
        // A fiber dropped while suspended unwinds its stack here (its transactions abort as on
        // a panic). Code that runs meanwhile is in no fiber: a wait there blocks the thread
        // rather than suspend a fiber that is being torn down (or one polling this one).
        if let Some(mut coroutine) = self.coroutine.take() {
            self.waiting = None;
            let _current = MadeCurrent::enter(std::ptr::null(), self.stack_limit);
            coroutine.force_unwind();
        }
    }
}

#[cfg(test)]
mod tests;
