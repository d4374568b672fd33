//! One transaction's run across its attempts: how many it made and may make, when it switches
//! to a snapshot or to urgency, how it waits before the next; and what a finished run leaves to
//! do (its handlers, its abstract locks).

use std::time::Instant;

use crate::contention::{pause, ContentionPolicy};
use crate::engine::{Engine, TxOptions};
use crate::error::TxError;
use crate::stats::{AbortCause, Event};
use crate::tx::{HandlerEntry, Mode, TxState};

/// Consecutive conflicts after which a transaction under the priority manager becomes urgent.
const URGENT_AFTER: u32 = 3;

/// How a run ended without committing: an application error or a transaction error.
pub(crate) enum RunError<E> {
    User(E),
    Tx(TxError),
}

/// What is left to do once a transaction's state went back to the cache.
pub(crate) enum Finished {
    /// Nothing: no actions to run, no abstract locks to release or hand over.
    Nothing,
    Done {
        handlers: Vec<HandlerEntry>,
        locks: Vec<String>,
        owner: u64,
    },
    ForParent(ForParent),
}

/// What a committed open-nested block hands to its parent: its actions and abstract locks.
pub(crate) struct ForParent {
    pub(crate) handlers: Vec<HandlerEntry>,
    pub(crate) locks: Vec<String>,
}

impl Finished {
    /// Runs the handlers and releases the abstract locks of a top-level transaction; returns
    /// what an open-nested block hands to its parent.
    #[inline]
    pub(crate) fn run(self, engine: &Engine) -> Option<ForParent> {
        match self {
            Finished::Done {
                handlers,
                locks,
                owner,
            } => {
                engine.run_handlers(handlers);
                engine.release_abstract(locks, owner);
                None
            }
            Finished::ForParent(p) => Some(p),
            Finished::Nothing => None,
        }
    }
}

/// The bookkeeping of one transaction across its attempts.
pub(crate) struct Attempts {
    pub(crate) mode: Mode,
    count: u32,
    consecutive: u32,
    /// Some attempt wrote: never switch to a read-only snapshot.
    ever_wrote: bool,
    max: Option<u32>,
    deadline: Option<Instant>,
    /// Attempts run under a distributed protocol: `retry()` backs off instead of waiting for
    /// a local change.
    pub(crate) remote: bool,
}

impl Attempts {
    pub(crate) fn new(
        engine: &Engine,
        st: &mut TxState,
        opts: &TxOptions,
        owner: u64,
        open_nested: bool,
    ) -> Attempts {
        st.priority = opts.priority;
        st.policy = opts.contention.unwrap_or(engine.config().contention);
        st.explicit_read_only = opts.read_only;
        st.owner = owner;
        st.open_nested = open_nested;
        Attempts {
            mode: if opts.read_only {
                Mode::ReadOnly
            } else {
                Mode::Update
            },
            count: 0,
            consecutive: 0,
            ever_wrote: false,
            max: opts.max_attempts,
            deadline: opts.timeout.map(|t| Instant::now() + t),
            remote: false,
        }
    }

    /// Starts an attempt. The first one's start time is the transaction's age.
    #[inline]
    pub(crate) fn begin(&mut self, engine: &Engine, st: &mut TxState) {
        st.begin(engine, self.mode);
        if self.count == 0 {
            st.age = st.ub;
        }
    }

    /// Handles an aborted attempt: rolls it back, runs its compensations, waits as the cause and
    /// contention manager say. `Err` when the transaction must give up.
    pub(crate) fn aborted(
        &mut self,
        engine: &Engine,
        st: &mut Box<TxState>,
        cause: AbortCause,
    ) -> Result<(), TxError> {
        st.bump(Event::Abort(cause));
        self.count += 1;
        self.consecutive += 1;
        let since = st.ub;
        let watch = (cause == AbortCause::ExplicitRetry).then(|| st.reads.clone());
        self.ever_wrote |= st.wants_write;
        st.end_attempt();
        // The attempt has ended: compensations of what it committed through open nesting run
        // now (an open-nested attempt committed nothing, so it has none), and its abstract locks
        // are released.
        let mut handlers: Vec<HandlerEntry> =
            st.handlers.drain(..).filter(|h| !h.on_commit).collect();
        if !st.open_nested && !handlers.is_empty() {
            handlers.reverse();
            engine.run_handlers(handlers);
        }
        if !st.abstract_locks.is_empty() {
            let locks = std::mem::take(&mut st.abstract_locks);
            engine.release_abstract(locks, st.owner);
        }
        // An open-nested transaction that lost an abstract lock aborts its parent instead.
        if cause == AbortCause::AbstractLock && st.open_nested {
            return Err(TxError::Conflict);
        }
        if self.max.is_some_and(|m| self.count >= m) {
            return Err(TxError::RetryBudgetExhausted {
                attempts: self.count,
            });
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(TxError::Timeout {
                attempts: self.count,
            });
        }
        match cause {
            AbortCause::Upgrade => self.mode = Mode::Update,
            AbortCause::ExplicitRetry if !self.remote => {
                st.bump(Event::RetryWait);
                let reads = watch.unwrap_or_default();
                if !engine.wait_for_change(&reads, since, self.deadline) {
                    return Err(TxError::Timeout {
                        attempts: self.count,
                    });
                }
                self.consecutive = 0;
            }
            _ => {
                // A reader that did not write re-runs as a read-only snapshot, which cannot abort.
                if !self.ever_wrote && self.consecutive >= 2 {
                    self.mode = Mode::ReadOnly;
                }
                // A prioritized transaction that keeps losing asks lower priorities to hold
                // their commits for a moment (see `urgent`).
                if st.policy == ContentionPolicy::Priority
                    && self.consecutive >= URGENT_AFTER
                    && st.urgent == 0
                {
                    st.urgent = engine.urgent.claim(st.priority);
                }
                let wait = st
                    .policy
                    .backoff(self.consecutive, st.priority, st.jitter.next());
                pause(wait);
            }
        }
        Ok(())
    }
}
