//! A node's transaction service (PRESTO chapter 4): requests with priorities, a pool of worker
//! threads, and transactions that run as suspendable contexts.
//!
//! A request waits in the standing list of its level. A worker takes the most urgent thing
//! waiting (a preempted transaction of the highest level first, else that level's oldest
//! request), and runs it on a coroutine with a stack from the context pool. When a request
//! arrives and no worker is idle, the policy may ask the least urgent running transaction below
//! the request's level to yield; it suspends at its next safe point, its context goes to its
//! level's active list, and its worker takes the request. Any worker resumes it later.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use parking_lot::{Condvar, Mutex};

use crate::outcome::{Outcome, Ticket, Timing};
use crate::policy::Policy;
use crate::queue::{Level, PriorityQueue, QueueError, Taken};
use crate::task::{set_current, TaskControl};

/// How a transaction service is set up.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Worker threads.
    pub workers: usize,
    /// Priority levels: 1 (lowest) to `levels`.
    pub levels: u16,
    /// The most transactions started and not ended at once (each holds a context).
    pub contexts: usize,
    /// Each context's stack, in bytes.
    pub stack_bytes: usize,
    /// When running transactions give way to more urgent requests.
    pub policy: Policy,
}

impl Default for ServiceConfig {
    fn default() -> ServiceConfig {
        ServiceConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            levels: 5,
            contexts: 256,
            stack_bytes: 256 * 1024,
            policy: Policy::None,
        }
    }
}

/// Why the service refused to start or to take a request.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A setting out of range.
    #[error("bad transaction service configuration: {0}")]
    Config(String),
    /// A priority outside the service's levels, or bad levels.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The service is shutting down.
    #[error("the transaction service is shutting down")]
    Closed,
    /// A context's stack could not be made.
    #[error("could not allocate a transaction context: {0}")]
    Stack(std::io::Error),
}

/// What the service did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Requests taken.
    pub submitted: u64,
    /// Requests ended (returned or panicked).
    pub completed: u64,
    /// Times a running transaction was suspended for a more urgent request.
    pub preemptions: u64,
    /// Times a suspended transaction resumed on another worker than the one it left.
    pub migrations: u64,
    /// Nanoseconds workers spent running requests, summed over workers.
    pub busy_ns: u64,
    /// Contexts in use that arriving requests found, summed over arrivals (divided by
    /// `submitted` and the pool size: how busy the context pool was).
    pub contexts_seen: u64,
}

/// A transaction (or any task) the service runs; a boxed request before it starts.
struct Task {
    control: Arc<TaskControl>,
    /// The request, until it starts.
    body: Option<Box<dyn FnOnce() + Send>>,
    /// Its context, once started.
    context: Option<Context>,
    outcome: Arc<dyn Outcome>,
    submitted: Instant,
    started: Option<Instant>,
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

struct State {
    queue: PriorityQueue<Box<Task>>,
    /// Per worker, the task it runs.
    running: Vec<Option<Arc<TaskControl>>>,
    /// Workers asleep, waiting for a request.
    idle: usize,
    /// Workers spinning for a moment before they sleep (see `IDLE_SPIN`).
    spinning: usize,
    stacks: Vec<DefaultStack>,
    /// Contexts in use (started tasks not ended).
    live: usize,
    closed: bool,
    stats: ServiceStats,
}

struct Shared {
    config: ServiceConfig,
    state: Mutex<State>,
    wake: Condvar,
    next_id: AtomicU64,
    /// Requests and preempted transactions queued so far: a spinning worker watches it.
    pushes: AtomicU64,
}

/// A running transaction service. Dropping it lets everything submitted end, then stops the
/// workers.
pub struct TxService {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl TxService {
    /// Starts the workers.
    pub fn start(config: ServiceConfig) -> Result<TxService, ServiceError> {
        if config.workers == 0 || config.workers > 1024 {
            return Err(ServiceError::Config(format!(
                "workers must be 1 to 1024, not {}",
                config.workers
            )));
        }
        if config.contexts < config.workers {
            return Err(ServiceError::Config(format!(
                "contexts ({}) must be at least the workers ({})",
                config.contexts, config.workers
            )));
        }
        if !(16 * 1024..=64 << 20).contains(&config.stack_bytes) {
            return Err(ServiceError::Config(format!(
                "a context's stack must be 16 KiB to 64 MiB, not {} bytes",
                config.stack_bytes
            )));
        }
        if config.policy.cmax() == Some(0) {
            return Err(ServiceError::Config("cmax must be at least 1".into()));
        }
        let queue = PriorityQueue::new(config.levels)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue,
                running: vec![None; config.workers],
                idle: 0,
                spinning: 0,
                stacks: Vec::new(),
                live: 0,
                closed: false,
                stats: ServiceStats::default(),
            }),
            wake: Condvar::new(),
            next_id: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            config,
        });
        let workers = (0..shared.config.workers)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("atomos-worker-{i}"))
                    .spawn(move || worker(&shared, i))
                    .map_err(|e| ServiceError::Config(format!("cannot start a worker: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(TxService { shared, workers })
    }

    /// Its configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.shared.config
    }

    /// Runs `f` at priority `level` (1 lowest) on a worker, as a suspendable task: code in it
    /// may be suspended at safe points (see [`crate::yield_now`]) and resumed on any worker.
    /// The ticket gives its result.
    pub fn submit<R: Send + 'static>(
        &self,
        level: Level,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<Ticket<R>, ServiceError> {
        if level == 0 || u16::from(level) > self.shared.config.levels {
            return Err(QueueError::NoSuchLevel {
                level,
                levels: self.shared.config.levels.min(255) as Level,
            }
            .into());
        }
        let (ticket, slot, outcome) = Ticket::new(level);
        let body: Box<dyn FnOnce() + Send> = Box::new(move || {
            slot.set(catch_unwind(AssertUnwindSafe(f)));
        });
        let mut task = Box::new(Task {
            control: Arc::new(TaskControl::new(level)),
            body: Some(body),
            context: None,
            outcome,
            submitted: Instant::now(),
            started: None,
            worker: None,
            migrations: 0,
            needed_preemption: false,
        });
        self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.shared.state.lock();
        if state.closed {
            return Err(ServiceError::Closed);
        }
        task.needed_preemption = state.idle + state.spinning == 0
            && state
                .running
                .iter()
                .all(|r| r.as_ref().is_some_and(|t| t.level() < level))
            && state.queue.highest().is_none_or(|h| h < level);
        state.queue.push_standing(level, task)?;
        state.stats.submitted += 1;
        state.stats.contexts_seen += state.live as u64;
        self.shared.pushes.fetch_add(1, Ordering::Release);
        if state.spinning > 0 {
            // A spinning worker takes it at once.
        } else if state.idle > 0 {
            self.shared.wake.notify_one();
        } else if self.shared.config.policy.preempts() && state.live < self.shared.config.contexts {
            ask_to_yield(&state, level);
        }
        Ok(ticket)
    }

    /// What the service did so far.
    pub fn stats(&self) -> ServiceStats {
        self.shared.state.lock().stats.clone()
    }

    /// Requests waiting (standing or preempted).
    pub fn waiting(&self) -> usize {
        self.shared.state.lock().queue.len()
    }
}

impl Drop for TxService {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Asks the least urgent preemptable running task below `level`, not asked already, to yield;
/// among equals, one outside a non-preemptable region (a commit) first, since it can yield
/// sooner.
fn ask_to_yield(state: &State, level: Level) {
    let victim = state
        .running
        .iter()
        .flatten()
        .filter(|t| {
            t.level() < level
                && t.preemptable.load(Ordering::Relaxed)
                && !t.preempt.load(Ordering::Relaxed)
        })
        .min_by_key(|t| (t.level(), t.is_pinned()));
    if let Some(t) = victim {
        t.preempt.store(true, Ordering::Release);
    }
}

/// A worker: takes the most urgent thing waiting, runs it until it ends or yields, repeats.
fn worker(shared: &Shared, me: usize) {
    let config = &shared.config;
    let mut state = shared.state.lock();
    let mut spun = false;
    // A task that just yielded: it waits only if something else can run now.
    let mut yielded: Option<Box<Task>> = None;
    loop {
        let next = take_next(&mut state, config.contexts);
        let next = match (next, yielded.take()) {
            (Some(next), Some(task)) => {
                let level = task.control.level();
                // The level is one of the queue's: the task was submitted at one, and
                // promotion stops at the highest.
                let _ = state.queue.push_active(level, task);
                shared.pushes.fetch_add(1, Ordering::Release);
                Some(next)
            }
            // What asked it to yield was taken by another worker: it goes on at once.
            (None, Some(task)) => Some(Taken::Resume(task)),
            (next, None) => next,
        };
        let Some(taken) = next else {
            if state.closed && state.queue.is_empty() {
                return;
            }
            if !spun {
                // Spin a moment first: waking a sleeping thread costs tens of microseconds,
                // more than many transactions take.
                spun = true;
                state.spinning += 1;
                let seen = shared.pushes.load(Ordering::Acquire);
                drop(state);
                spin_until_pushed(shared, seen);
                state = shared.state.lock();
                state.spinning -= 1;
                continue;
            }
            state.idle += 1;
            shared.wake.wait(&mut state);
            state.idle -= 1;
            continue;
        };
        spun = false;
        let mut task = match taken {
            Taken::Resume(task) => task,
            Taken::Start(task) => {
                state.live += 1;
                task
            }
        };
        let stack = task.context.is_none().then(|| state.stacks.pop());
        if task.worker.is_some_and(|w| w != me) {
            task.migrations += 1;
            state.stats.migrations += 1;
        }
        task.control.preempt.store(false, Ordering::Relaxed);
        state.running[me] = Some(task.control.clone());
        drop(state);

        let began = Instant::now();
        let ended = run(&mut task, me, stack, config.stack_bytes);
        let busy = began.elapsed().as_nanos() as u64;

        state = shared.state.lock();
        state.stats.busy_ns += busy;
        state.running[me] = None;
        match ended {
            Ok(Some(stack)) => {
                state.live -= 1;
                state.stats.completed += 1;
                if let Some(stack) = stack.filter(|_| state.stacks.len() < config.contexts) {
                    state.stacks.push(stack);
                }
            }
            Ok(None) => {
                state.stats.preemptions += 1;
                config
                    .policy
                    .after_preemption(&task.control, state.queue.levels());
                // The request it yielded to runs first, even when the policy promoted it
                // above that request.
                yielded = Some(task);
            }
            Err(e) => {
                state.live -= 1;
                state.stats.completed += 1;
                task.outcome.fail(e);
            }
        }
    }
}

/// The most urgent thing a worker may take: a preempted task, or a request if a context is
/// free for it.
fn take_next(state: &mut State, contexts: usize) -> Option<Taken<Box<Task>>> {
    if state.live < contexts {
        state.queue.take().map(|(_, t)| t)
    } else {
        state.queue.take_active().map(|(_, t)| Taken::Resume(t))
    }
}

/// How long an idle worker spins before it sleeps.
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// Spins until something is queued after `seen` pushes, or `IDLE_SPIN` passes. Gives the CPU
/// to other threads now and then (the machine may have fewer cores than threads).
fn spin_until_pushed(shared: &Shared, seen: u64) {
    let start = Instant::now();
    let mut spins = 0u32;
    while shared.pushes.load(Ordering::Acquire) == seen && start.elapsed() < IDLE_SPIN {
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
    let result = context.0.resume(());
    set_current(std::ptr::null());
    match result {
        CoroutineResult::Yield(()) => Ok(None),
        CoroutineResult::Return(()) => {
            let stack = task.context.take().map(|c| c.0.into_stack());
            task.outcome.complete(Timing {
                submitted: task.submitted,
                started: task.started.unwrap_or(task.submitted),
                ended: Instant::now(),
                preemptions: task.control.preemptions.load(Ordering::Relaxed),
                level: task.control.level(),
                migrations: task.migrations,
                needed_preemption: task.needed_preemption,
            });
            Ok(Some(stack))
        }
    }
}
