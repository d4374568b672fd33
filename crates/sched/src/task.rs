//! The running side of a scheduled transaction: its control block, and the safe points where it
//! may be suspended.
//!
//! A task runs on a stackful coroutine. The service asks it to yield by raising its `preempt`
//! flag; the task looks at the flag at its next *safe point* (a transactional read or write, or
//! an explicit [`yield_now`]) and, unless it is inside a non-preemptable region or no longer
//! preemptable, suspends there. Its worker then puts it back in the queue, where any worker may
//! resume it later.
//!
//! Thread-locals and migration: a suspended task may resume on another thread, and the compiler
//! may assume a thread-local's address does not change within one function. So every
//! thread-local this crate touches is read in a function that is never inlined and never
//! suspends, and code that runs inside tasks (the engine) must follow the same rule.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

use corosensei::Yielder;

use crate::queue::Level;

/// The control block of one task, shared by the task and the service that schedules it.
pub(crate) struct TaskControl {
    /// A more urgent request waits: suspend at the next safe point.
    pub(crate) preempt: AtomicBool,
    /// Whether the task may still be preempted (C_max clears it).
    pub(crate) preemptable: AtomicBool,
    /// Its level now (lazy promotion raises it).
    pub(crate) level: AtomicU8,
    /// The level it was submitted at.
    #[allow(dead_code)]
    pub(crate) base_level: Level,
    /// Times it was suspended at a safe point.
    pub(crate) preemptions: AtomicU32,
    /// Depth of non-preemptable regions it is inside.
    pinned: AtomicU32,
    /// Its coroutine's yielder, set when the coroutine starts (null before).
    yielder: Cell<*const Yielder<(), ()>>,
}

// SAFETY: `yielder` is written once by the task's coroutine when it starts and read only by
// that coroutine (at its safe points); every other field is atomic.
unsafe impl Sync for TaskControl {}
// SAFETY: as above; the yielder pointer is only dereferenced on the coroutine's own stack.
unsafe impl Send for TaskControl {}

impl TaskControl {
    pub(crate) fn new(level: Level) -> TaskControl {
        TaskControl {
            preempt: AtomicBool::new(false),
            preemptable: AtomicBool::new(true),
            level: AtomicU8::new(level),
            base_level: level,
            preemptions: AtomicU32::new(0),
            pinned: AtomicU32::new(0),
            yielder: Cell::new(std::ptr::null()),
        }
    }

    /// Called by the coroutine when it starts.
    pub(crate) fn set_yielder(&self, yielder: &Yielder<(), ()>) {
        self.yielder.set(yielder);
    }

    pub(crate) fn level(&self) -> Level {
        self.level.load(Ordering::Relaxed)
    }

    /// Whether it is inside a non-preemptable region now.
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed) > 0
    }

    /// Suspends the task if a preemption was requested and it may be preempted now; answers
    /// whether it was suspended (and has resumed since).
    #[cold]
    #[inline(never)]
    fn yield_if_asked(&self) -> bool {
        if !self.preempt.load(Ordering::Acquire)
            || self.pinned.load(Ordering::Relaxed) > 0
            || !self.preemptable.load(Ordering::Relaxed)
        {
            return false;
        }
        let yielder = self.yielder.get();
        if yielder.is_null() {
            return false;
        }
        self.preemptions.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the yielder belongs to the coroutine running this code, which outlives it.
        unsafe { (*yielder).suspend(()) };
        true
    }
}

thread_local! {
    /// The task the current worker thread is running (null outside tasks).
    static CURRENT: Cell<*const TaskControl> = const { Cell::new(std::ptr::null()) };
}

/// Sets the task this thread runs (null: none). Called by a worker around each resume.
#[inline(never)]
pub(crate) fn set_current(task: *const TaskControl) {
    CURRENT.with(|c| c.set(task));
}

/// The task the calling code runs in, if it runs in one.
///
/// The handle is valid until the task ends: a transaction may keep it for its own duration
/// (it runs inside the task), nothing longer.
#[inline(never)]
pub fn current() -> Option<TaskHandle> {
    NonNull::new(CURRENT.with(Cell::get).cast_mut()).map(TaskHandle)
}

/// A handle on the running task, for its safe points (see [`current`] for how long it is
/// valid).
#[derive(Clone, Copy, Debug)]
pub struct TaskHandle(NonNull<TaskControl>);

// SAFETY: the control block is `Sync`; the handle is used only while its task runs.
unsafe impl Send for TaskHandle {}
// SAFETY: as above.
unsafe impl Sync for TaskHandle {}

impl TaskHandle {
    fn control(&self) -> &TaskControl {
        // SAFETY: the task (and its control block) outlives every use of the handle.
        unsafe { self.0.as_ref() }
    }

    /// A safe point: suspends the task here if a more urgent request asked for its worker,
    /// and answers whether it did (the world may have changed meanwhile). Costs one load when
    /// nothing waits.
    #[inline]
    pub fn safe_point(&self) -> bool {
        let control = self.control();
        control.preempt.load(Ordering::Relaxed) && control.yield_if_asked()
    }

    /// The task's current priority level.
    pub fn level(&self) -> Level {
        self.control().level()
    }

    /// Times the task was preempted so far.
    pub fn preemptions(&self) -> u32 {
        self.control().preemptions.load(Ordering::Relaxed)
    }

    /// Enters a region where the task is not preempted (safe points in it do nothing) until
    /// the guard is dropped.
    pub fn non_preemptable(&self) -> NonPreemptable {
        self.control().pinned.fetch_add(1, Ordering::Relaxed);
        NonPreemptable(*self)
    }
}

/// A non-preemptable region of a task; it ends when this guard is dropped.
#[must_use = "the region ends when the guard is dropped"]
pub struct NonPreemptable(TaskHandle);

impl Drop for NonPreemptable {
    fn drop(&mut self) {
        self.0.control().pinned.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An explicit safe point: if the caller runs in a task and a more urgent request waits, the
/// task is suspended here and resumed later (perhaps on another worker thread); answers whether
/// it was. Does nothing outside tasks.
#[inline(never)]
pub fn yield_now() -> bool {
    current().is_some_and(|task| task.safe_point())
}
