//! A worker of the transaction service: takes the most urgent thing waiting, runs it on a
//! coroutine until it ends or yields, and parks when there is nothing to do.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};

use crate::outcome::{Outcome, Timing};
use crate::queue::{Level, Taken};
use crate::service::{Shared, State, WorkerSlot};
use crate::task::{set_current, TaskControl};

/// A transaction (or any task) the service runs; a boxed request before it starts.
pub(crate) struct Task {
    pub(crate) control: Arc<TaskControl>,
    /// The request, until it starts.
    body: Option<Box<dyn FnOnce() + Send>>,
    /// Its context, once started.
    context: Option<Context>,
    outcome: Arc<dyn Outcome>,
    submitted: Instant,
    started: Option<Instant>,
    /// Time it has run on workers so far.
    running: Duration,
    /// The worker it last ran on.
    worker: Option<usize>,
    migrations: u32,
    /// See [`Timing::needed_preemption`].
    needed_preemption: bool,
}

/// A coroutine with its own stack.
struct Context(Coroutine<(), (), (), DefaultStack>);

// SAFETY: a context is resumed by one worker at a time (it is owned by the task, which is in
// the queue or on one worker); its closure is `Send`, and code inside tasks reads thread-locals
// only through functions that are never inlined (see `task`), so nothing it holds is tied to
// the thread it last ran on.
unsafe impl Send for Context {}

impl Task {
    /// A request not started yet.
    pub(crate) fn new(
        level: Level,
        body: Box<dyn FnOnce() + Send>,
        outcome: Arc<dyn Outcome>,
        submitted: Instant,
        needed_preemption: bool,
    ) -> Box<Task> {
        Box::new(Task {
            control: Arc::new(TaskControl::new(level)),
            body: Some(body),
            context: None,
            outcome,
            submitted,
            started: None,
            running: Duration::ZERO,
            worker: None,
            migrations: 0,
            needed_preemption,
        })
    }
}

/// A worker: takes the most urgent thing waiting, runs it until it ends or yields, repeats.
pub(crate) fn worker(shared: &Shared, me: usize) {
    let config = &shared.config;
    let slot = &shared.slots[me];
    let _ = slot.thread.set(std::thread::current());
    let mut spun = false;
    // A task that just yielded: it waits only if something more urgent can run now.
    let mut yielded: Option<Box<Task>> = None;
    loop {
        let mut state = shared.state.lock();
        let seen = shared.pushes.load(Ordering::Acquire);
        drain_inbox(shared, &mut state);
        let mut requeued = false;
        let next = match yielded.take() {
            Some(task) if more_urgent_waits(shared, &state, task.control.level()) => {
                // The request it yielded to runs first, even when the policy promotes it
                // above that request: take that one, then put this one back.
                let next = take_next(shared, &mut state);
                state.stats.preemptions += 1;
                let level = config
                    .policy
                    .after_preemption(&task.control, state.queue.levels());
                // The level is one of the queue's: the task was submitted at one, and
                // promotion stops at the highest.
                let _ = state.queue.push_active(level, task);
                shared.count_waiting(level, true);
                requeued = true;
                next
            }
            Some(task) => {
                // What asked it to yield was taken by another worker: it goes on at once,
                // and that was no preemption.
                task.control.preemptions.fetch_sub(1, Ordering::Relaxed);
                Some(Taken::Resume(task))
            }
            None => take_next(shared, &mut state),
        };
        let Some(taken) = next else {
            let done = shared.closed.load(Ordering::Acquire)
                && state.queue.is_empty()
                && shared.inbox.is_empty();
            drop(state);
            if done {
                return;
            }
            if !spun {
                // Spin a moment first: waking a parked thread costs tens of microseconds,
                // more than many transactions take.
                spun = true;
                shared.spinning.fetch_add(1, Ordering::SeqCst);
                spin_until_pushed(shared, seen);
                shared.spinning.fetch_sub(1, Ordering::SeqCst);
            } else {
                park(shared, slot, seen);
            }
            continue;
        };
        spun = false;
        let mut task = match taken {
            Taken::Resume(task) => task,
            Taken::Start(task) => {
                shared.live.fetch_add(1, Ordering::Relaxed);
                task
            }
        };
        let stack = task.context.is_none().then(|| state.stacks.pop());
        if task.worker.is_some_and(|w| w != me) {
            task.migrations += 1;
            state.stats.migrations += 1;
        }
        // (A transaction put back is in the queue too.)
        let more_waits = !state.queue.is_empty();
        drop(state);
        if requeued {
            shared.pushes.fetch_add(1, Ordering::Release);
        }
        if more_waits {
            // An idle worker may take what is left (a submitter that found a worker
            // spinning woke nobody, and that worker took only one request).
            fence(Ordering::SeqCst);
            shared.unpark_one();
        }
        task.control.preempt.store(false, Ordering::Relaxed);
        *slot.running.lock() = Some(task.control.clone());
        if config.policy.preempts()
            && shared.unserved.load(Ordering::SeqCst) > 0
            && shared.live.load(Ordering::Relaxed) < config.contexts
            && shared.waits_above(task.control.level())
            && shared.claim_unserved()
        {
            // A more urgent request arrived while this worker was between tasks and found
            // no task here to ask: this one yields at its first safe point.
            task.control.preempt.store(true, Ordering::Relaxed);
        }

        let ran_before = task.running;
        let ended = run(&mut task, me, stack, config.stack_bytes);
        let busy = (task.running - ran_before).as_nanos() as u64;

        *slot.running.lock() = None;
        let mut state = shared.state.lock();
        state.stats.busy_ns += busy;
        match ended {
            Ok(Some(stack)) => {
                shared.live.fetch_sub(1, Ordering::Relaxed);
                state.stats.completed += 1;
                if let Some(stack) = stack.filter(|_| state.stacks.len() < config.contexts) {
                    state.stacks.push(stack);
                }
            }
            Ok(None) => yielded = Some(task),
            Err(e) => {
                shared.live.fetch_sub(1, Ordering::Relaxed);
                state.stats.completed += 1;
                task.outcome.fail(e);
            }
        }
    }
}

/// Whether the queue holds something above `level` that this worker may take now (a request
/// needs a free context).
fn more_urgent_waits(shared: &Shared, state: &State, level: Level) -> bool {
    let highest = if shared.live.load(Ordering::Relaxed) < shared.config.contexts {
        state.queue.highest()
    } else {
        state.queue.highest_active()
    };
    highest.is_some_and(|h| h > level)
}

/// Moves submitted requests into the queue's standing lists.
fn drain_inbox(shared: &Shared, state: &mut State) {
    while let Some(task) = shared.inbox.pop() {
        let level = task.control.level();
        // The level was checked when the request was submitted.
        let _ = state.queue.push_standing(level, task);
    }
}

/// The most urgent thing a worker may take: a preempted task, or a request if a context is
/// free for it.
fn take_next(shared: &Shared, state: &mut State) -> Option<Taken<Box<Task>>> {
    let taken = if shared.live.load(Ordering::Relaxed) < shared.config.contexts {
        state.queue.take().map(|(_, t)| t)
    } else {
        state.queue.take_active().map(|(_, t)| Taken::Resume(t))
    };
    if let Some(Taken::Start(t) | Taken::Resume(t)) = &taken {
        shared.count_waiting(t.control.level(), false);
    }
    taken
}

/// Parks the worker until a submitter or a worker wakes it, unless something was queued
/// after `seen` pushes.
fn park(shared: &Shared, slot: &WorkerSlot, seen: u64) {
    slot.parked.store(true, Ordering::Relaxed);
    // Pairs with the fence of whoever queues something (or closes the service) and then looks
    // for a parked worker.
    fence(Ordering::SeqCst);
    if shared.pushes.load(Ordering::Relaxed) != seen || shared.closed.load(Ordering::Relaxed) {
        slot.parked.store(false, Ordering::Relaxed);
        return;
    }
    while slot.parked.load(Ordering::Acquire) && !shared.closed.load(Ordering::Acquire) {
        std::thread::park();
    }
    slot.parked.store(false, Ordering::Relaxed);
}

/// Spins until something is queued after `seen` pushes, or the service's idle spin passes.
/// Gives the CPU to other threads now and then (the machine may have fewer cores than
/// threads).
fn spin_until_pushed(shared: &Shared, seen: u64) {
    let start = Instant::now();
    let mut spins = 0u32;
    while shared.pushes.load(Ordering::Acquire) == seen && start.elapsed() < shared.config.idle_spin
    {
        spins += 1;
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Runs (or resumes) `task` on this worker until it ends (`Ok(Some(stack))`, its stack back
/// for the pool if it had one) or yields (`Ok(None)`).
fn run(
    task: &mut Task,
    me: usize,
    pooled: Option<Option<DefaultStack>>,
    stack_bytes: usize,
) -> Result<Option<Option<DefaultStack>>, std::io::Error> {
    if let Some(pooled) = pooled {
        let stack = match pooled {
            Some(s) => s,
            None => DefaultStack::new(stack_bytes)?,
        };
        let body = task.body.take().unwrap_or_else(|| Box::new(|| {}));
        let control = task.control.clone();
        let coroutine = Coroutine::with_stack(stack, move |yielder, ()| {
            control.set_yielder(yielder);
            body();
        });
        task.context = Some(Context(coroutine));
        task.started = Some(Instant::now());
    }
    let Some(context) = task.context.as_mut() else {
        return Err(std::io::Error::other("a task without a context"));
    };
    task.worker = Some(me);
    set_current(Arc::as_ptr(&task.control));
    let resumed = Instant::now();
    let result = context.0.resume(());
    let ended = Instant::now();
    task.running += ended.duration_since(resumed);
    set_current(std::ptr::null());
    match result {
        CoroutineResult::Yield(()) => Ok(None),
        CoroutineResult::Return(()) => {
            let stack = task.context.take().map(|c| c.0.into_stack());
            task.outcome.complete(Timing {
                submitted: task.submitted,
                started: task.started.unwrap_or(task.submitted),
                ended,
                running: task.running,
                preemptions: task.control.preemptions.load(Ordering::Relaxed),
                level: task.control.level(),
                migrations: task.migrations,
                needed_preemption: task.needed_preemption,
            });
            Ok(Some(stack))
        }
    }
}
