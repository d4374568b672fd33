//! How a submitter gets its request's result: a ticket, completed by the worker that ends it.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::queue::Level;

/// When a request was submitted, started and ended, and how often it was preempted.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// When it was submitted.
    pub submitted: Instant,
    /// When a worker first ran it.
    pub started: Instant,
    /// When it ended.
    pub ended: Instant,
    /// Time it spent running on a worker, over all its runs: its execution without the time
    /// it spent preempted.
    pub running: Duration,
    /// Times it was suspended for a more urgent request.
    pub preemptions: u32,
    /// The level it ended at (above the one it was submitted at if the policy promoted it).
    pub level: Level,
    /// Times it resumed on another worker than the one it left.
    pub migrations: u32,
    /// At its arrival every worker ran a less urgent request and nothing of its level or
    /// above waited: it could start at once only by preempting one (its [`Timing::reaction`]
    /// is then the service's preemption reaction time).
    pub needed_preemption: bool,
}

impl Timing {
    /// Submission to end: waiting, running, and time spent preempted.
    pub fn turnaround(&self) -> Duration {
        self.ended.duration_since(self.submitted)
    }

    /// Submission to first run: how long it waited for a worker.
    pub fn reaction(&self) -> Duration {
        self.started.duration_since(self.submitted)
    }
}

/// The worker's side of a ticket, without the result's type.
pub(crate) trait Outcome: Send + Sync {
    /// The request ended (its result was set by its body).
    fn complete(&self, timing: Timing);
    /// The request could not run.
    fn fail(&self, error: std::io::Error);
}

/// Why a ticket has no result.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// The service could not make a context for it.
    #[error("the request could not run: {0}")]
    NotRun(std::io::Error),
}

enum Slot<R> {
    Pending(Option<thread::Result<R>>),
    Done(thread::Result<R>, Timing),
    Failed(std::io::Error),
    Taken,
}

struct Shared<R> {
    slot: Mutex<Slot<R>>,
    done: Condvar,
}

/// The result of a submitted request, once it ends.
pub struct Ticket<R> {
    shared: Arc<Shared<R>>,
    level: Level,
}

/// The body's handle on its ticket: where it puts its result.
pub(crate) struct ResultSlot<R>(Arc<Shared<R>>);

impl<R: Send> ResultSlot<R> {
    pub(crate) fn set(&self, result: thread::Result<R>) {
        *self.0.slot.lock() = Slot::Pending(Some(result));
    }
}

impl<R: Send> Outcome for Shared<R> {
    fn complete(&self, timing: Timing) {
        let mut slot = self.slot.lock();
        if let Slot::Pending(Some(result)) = std::mem::replace(&mut *slot, Slot::Taken) {
            *slot = Slot::Done(result, timing);
        }
        self.done.notify_all();
    }

    fn fail(&self, error: std::io::Error) {
        *self.slot.lock() = Slot::Failed(error);
        self.done.notify_all();
    }
}

impl<R: Send + 'static> Ticket<R> {
    pub(crate) fn new(level: Level) -> (Ticket<R>, ResultSlot<R>, Arc<dyn Outcome>) {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::Pending(None)),
            done: Condvar::new(),
        });
        (
            Ticket {
                shared: shared.clone(),
                level,
            },
            ResultSlot(shared.clone()),
            shared,
        )
    }

    /// The level it was submitted at.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Whether it has ended.
    pub fn is_done(&self) -> bool {
        !matches!(*self.shared.slot.lock(), Slot::Pending(_))
    }

    /// Waits until it has ended or `deadline` has passed; returns whether it has ended (then
    /// [`Ticket::wait`] returns at once).
    pub fn wait_until(&self, deadline: Instant) -> bool {
        let mut slot = self.shared.slot.lock();
        while matches!(*slot, Slot::Pending(_)) {
            if self.shared.done.wait_until(&mut slot, deadline).timed_out() {
                return !matches!(*slot, Slot::Pending(_));
            }
        }
        true
    }

    /// Waits for it to end and returns its result and timing. A panic in the request is
    /// resumed here.
    pub fn wait(self) -> Result<(R, Timing), TicketError> {
        let mut slot = self.shared.slot.lock();
        while matches!(*slot, Slot::Pending(_)) {
            self.shared.done.wait(&mut slot);
        }
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Done(Ok(r), timing) => Ok((r, timing)),
            Slot::Done(Err(panic), _) => {
                drop(slot);
                std::panic::resume_unwind(panic)
            }
            Slot::Failed(e) => Err(TicketError::NotRun(e)),
            Slot::Pending(_) | Slot::Taken => Err(TicketError::NotRun(std::io::Error::other(
                "the result was taken already",
            ))),
        }
    }
}
