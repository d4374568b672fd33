//! A node's transaction service (PRESTO chapter 4): requests with priorities, a pool of worker
//! threads, and transactions that run as suspendable contexts.
//!
//! A request waits in the standing list of its level. A worker takes the most urgent thing
//! waiting (a preempted transaction of the highest level first, else that level's oldest
//! request), and runs it on a coroutine with a stack from the context pool. When a request
//! arrives and no worker is idle, the policy may ask the least urgent running transaction below
//! the request's level to yield; it suspends at its next safe point, its context goes to its
//! level's active list, and its worker takes the request. Any worker resumes it later.
//!
//! Submission takes no lock that a worker holds for long: a request goes into a lock-free
//! inbox that workers move into the queue, a sleeping worker is woken by its own parking
//! token, and the running transactions are read from per-worker slots. (A submitter that
//! waits for a busy lock may be put to sleep by the OS, and its wake-up alone costs more than
//! the reaction time this service aims at.)

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use corosensei::stack::DefaultStack;
use crossbeam_queue::SegQueue;
use parking_lot::Mutex;

use crate::outcome::Ticket;
use crate::policy::Policy;
use crate::queue::{Level, PriorityQueue, QueueError};
use crate::task::TaskControl;
use crate::worker::{worker, Task};

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
    /// How long a worker with nothing to do spins, watching for requests, before it parks.
    /// A parked worker takes tens of microseconds to wake, more than most transactions take:
    /// spinning longer trades idle CPU for the latency of requests that arrive after a lull.
    /// At most 1 s.
    pub idle_spin: Duration,
}

impl Default for ServiceConfig {
    fn default() -> ServiceConfig {
        ServiceConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            levels: 5,
            contexts: 256,
            stack_bytes: 256 * 1024,
            policy: Policy::None,
            idle_spin: Duration::from_millis(1),
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

/// What workers share under one lock: only workers take it, so a submission never waits on it.
pub(crate) struct State {
    pub(crate) queue: PriorityQueue<Box<Task>>,
    pub(crate) stacks: Vec<DefaultStack>,
    /// What workers counted (`submitted` and `contexts_seen` live in [`Shared`]).
    pub(crate) stats: ServiceStats,
}

/// One worker's place: the task it runs and how to wake it.
pub(crate) struct WorkerSlot {
    /// The task it runs. Held only for a moment, by the worker and by submitters choosing
    /// whom to preempt.
    pub(crate) running: Mutex<Option<Arc<TaskControl>>>,
    /// It is parked (or about to park), waiting for work.
    pub(crate) parked: AtomicBool,
    /// Its thread, to unpark it.
    pub(crate) thread: OnceLock<Thread>,
}

pub(crate) struct Shared {
    pub(crate) config: ServiceConfig,
    pub(crate) state: Mutex<State>,
    /// Requests submitted and not yet moved into the queue.
    pub(crate) inbox: SegQueue<Box<Task>>,
    pub(crate) slots: Vec<WorkerSlot>,
    /// Per level (index `level - 1`), requests and preempted transactions waiting there,
    /// in the inbox or the queue.
    pub(crate) waiting: Vec<AtomicU32>,
    /// Contexts in use (started tasks not ended). Changed by workers under the state lock.
    pub(crate) live: AtomicUsize,
    /// Workers spinning for a moment before they park (see [`ServiceConfig::idle_spin`]).
    pub(crate) spinning: AtomicUsize,
    /// Requests and preempted transactions queued so far (and one more at shutdown): spinning
    /// and parking workers watch it for work queued since they last looked.
    pub(crate) pushes: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Requests that, when they arrived, found no worker idle and no task to ask to yield
    /// (every worker was between tasks, or its task already asked): the next worker to start
    /// a less urgent task has it yield at once, for one of them.
    pub(crate) unserved: AtomicUsize,
    submitted: AtomicU64,
    contexts_seen: AtomicU64,
}

impl Shared {
    /// Wakes one parked worker, if one is parked; answers whether it woke one.
    pub(crate) fn unpark_one(&self) -> bool {
        for slot in &self.slots {
            if slot.parked.load(Ordering::Relaxed) && slot.parked.swap(false, Ordering::AcqRel) {
                if let Some(t) = slot.thread.get() {
                    t.unpark();
                }
                return true;
            }
        }
        false
    }

    /// Takes one unserved request to serve (see `unserved`), if one is left.
    pub(crate) fn claim_unserved(&self) -> bool {
        self.unserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Whether a request or preempted transaction above `level` waits.
    pub(crate) fn waits_above(&self, level: Level) -> bool {
        self.waiting
            .get(usize::from(level)..)
            .is_some_and(|above| above.iter().any(|w| w.load(Ordering::Relaxed) > 0))
    }

    /// Counts a request or preempted transaction waiting at `level` (or one fewer).
    pub(crate) fn count_waiting(&self, level: Level, more: bool) {
        if let Some(w) = self.waiting.get(usize::from(level).wrapping_sub(1)) {
            if more {
                w.fetch_add(1, Ordering::Relaxed);
            } else {
                w.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
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
        if config.idle_spin > Duration::from_secs(1) {
            return Err(ServiceError::Config(format!(
                "idle_spin must be at most 1 s, not {:?}",
                config.idle_spin
            )));
        }
        if config.policy.cmax() == Some(0) {
            return Err(ServiceError::Config("cmax must be at least 1".into()));
        }
        let queue = PriorityQueue::new(config.levels)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue,
                stacks: Vec::new(),
                stats: ServiceStats::default(),
            }),
            inbox: SegQueue::new(),
            slots: (0..config.workers)
                .map(|_| WorkerSlot {
                    running: Mutex::new(None),
                    parked: AtomicBool::new(false),
                    thread: OnceLock::new(),
                })
                .collect(),
            waiting: (0..config.levels).map(|_| AtomicU32::new(0)).collect(),
            live: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            pushes: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            unserved: AtomicUsize::new(0),
            submitted: AtomicU64::new(0),
            contexts_seen: AtomicU64::new(0),
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
    /// The ticket gives its result. Never waits for a lock a worker holds for long.
    pub fn submit<R: Send + 'static>(
        &self,
        level: Level,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<Ticket<R>, ServiceError> {
        let shared = &*self.shared;
        if level == 0 || u16::from(level) > shared.config.levels {
            return Err(QueueError::NoSuchLevel {
                level,
                levels: shared.config.levels.min(255) as Level,
            }
            .into());
        }
        if shared.closed.load(Ordering::Acquire) {
            return Err(ServiceError::Closed);
        }
        let (ticket, slot, outcome) = Ticket::new(level);
        let body: Box<dyn FnOnce() + Send> = Box::new(move || {
            slot.set(catch_unwind(AssertUnwindSafe(f)));
        });
        let submitted = Instant::now();
        let needed_preemption = needs_preemption(shared, level);
        let task = Task::new(level, body, outcome, submitted, needed_preemption);
        shared.count_waiting(level, true);
        shared.inbox.push(task);
        shared.submitted.fetch_add(1, Ordering::Relaxed);
        let live = shared.live.load(Ordering::Relaxed);
        shared
            .contexts_seen
            .fetch_add(live as u64, Ordering::Relaxed);
        shared.pushes.fetch_add(1, Ordering::Release);
        // Pairs with the fence of a worker that marks itself parked and then looks at the
        // inbox: either it sees this request or this sees it parked.
        fence(Ordering::SeqCst);
        if shared.spinning.load(Ordering::Relaxed) > 0 || shared.unpark_one() {
            // A spinning worker takes it at once, or a woken one does.
        } else if shared.config.policy.preempts() && live < shared.config.contexts {
            // Counted before the running tasks are read: a worker that starts one after this
            // looked at its slot sees the count (the slot's lock orders the two).
            shared.unserved.fetch_add(1, Ordering::SeqCst);
            if ask_to_yield(shared, level) {
                shared.claim_unserved();
            }
        }
        Ok(ticket)
    }

    /// What the service did so far.
    pub fn stats(&self) -> ServiceStats {
        let mut stats = self.shared.state.lock().stats.clone();
        stats.submitted = self.shared.submitted.load(Ordering::Relaxed);
        stats.contexts_seen = self.shared.contexts_seen.load(Ordering::Relaxed);
        stats
    }

    /// Requests waiting (standing or preempted).
    pub fn waiting(&self) -> usize {
        self.shared
            .waiting
            .iter()
            .map(|w| w.load(Ordering::Relaxed) as usize)
            .sum()
    }
}

impl Drop for TxService {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // Ends every idle spin now, and pairs with the fence of a worker going to park.
        self.shared.pushes.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        for slot in &self.shared.slots {
            if let Some(t) = slot.thread.get() {
                t.unpark();
            }
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Whether a request at `level` arriving now can start at once only by preempting: every
/// worker runs something less urgent and nothing of its level or above waits.
fn needs_preemption(shared: &Shared, level: Level) -> bool {
    shared.spinning.load(Ordering::Relaxed) == 0
        && shared.waiting[usize::from(level) - 1..]
            .iter()
            .all(|w| w.load(Ordering::Relaxed) == 0)
        && shared.slots.iter().all(|s| {
            !s.parked.load(Ordering::Relaxed)
                && s.running.lock().as_ref().is_some_and(|t| t.level() < level)
        })
}

/// Asks the least urgent preemptable running task below `level`, not asked already, to yield;
/// among equals, one outside a non-preemptable region (a commit) first, since it can yield
/// sooner. Answers whether it asked one.
fn ask_to_yield(shared: &Shared, level: Level) -> bool {
    let mut victim: Option<(Level, bool, Arc<TaskControl>)> = None;
    for slot in &shared.slots {
        let running = slot.running.lock();
        let Some(t) = running.as_ref() else { continue };
        if t.level() >= level
            || !t.preemptable.load(Ordering::Relaxed)
            || t.preempt.load(Ordering::Relaxed)
        {
            continue;
        }
        let key = (t.level(), t.is_pinned());
        if victim.as_ref().is_none_or(|(l, p, _)| key < (*l, *p)) {
            victim = Some((key.0, key.1, t.clone()));
        }
    }
    if let Some((_, _, t)) = victim {
        t.preempt.store(true, Ordering::Release);
        return true;
    }
    false
}
