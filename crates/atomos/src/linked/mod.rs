//! Linked transactions (OSS III-C): a thread's next transaction runs while the commit of its
//! previous one is still on the network, so the commit's latency hides behind useful work.
//!
//! ```no_run
//! # let node = atomos::Node::new(Default::default());
//! # let counter: atomos::TRef<u64> = atomos::TRef::new("counter");
//! let mut chain = node.linked(1);
//! let mut handles = Vec::new();
//! for _ in 0..10 {
//!     // Runs at once, seeing the increments still being committed; returns before its own
//!     // commit is decided.
//!     let c = counter.clone();
//!     handles.push(chain.run(move |tx| tx.modify(&c, |v| { *v += 1; *v }))?);
//! }
//! chain.finish()?; // commits that conflicted run again here
//! for h in handles {
//!     let value = h.wait()?; // the value as committed
//! }
//! # Ok::<(), atomos::TxError>(())
//! ```
//!
//! Guarantees:
//! - Each transaction sees the writes of the chain's earlier transactions, committed or not.
//! - At most `queue` commits of the chain are outstanding: a transaction that finishes when the
//!   queue is full waits for the oldest commit first.
//! - A transaction that saw an earlier one's writes is sent only once that one committed, and
//!   reads them at the version it committed with. If that commit failed on a conflict, the
//!   earlier transaction re-runs (and commits) and the later one re-runs after it (a
//!   cascading abort); a handle's value is always the one of the run that committed.
//! - Transactions that saw nothing of each other may commit in either order when `queue` is
//!   above 1 (both orders are serializable); with a queue of 1 they commit in program order.
//! - A transaction never sees the chain's writes next to values newer than what those writes
//!   were computed from (opacity): when something an outstanding commit read is replaced, the
//!   transactions built on it stop, wait for that commit (which re-runs) and run again.
//! - Every handle gets an outcome: its value as committed, or the error that ended it. A commit
//!   that conflicted is run again by the chain (at its next `run`, `finish`, or when it is
//!   dropped): wait on a handle after one of those.
//! - Inside a linked transaction, `tx.retry()` and open nesting are refused (`TxError::Refused`).
//! - Where commits are not certified (`local`, `tfa`: nothing to hide) each transaction commits
//!   before `run` returns.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_core::{Certification, Deferred, Engine, Key, LinkBase, Tx, TxError};

use crate::answer::{AnswerSlot, Replier};

mod certifiers;

use certifiers::Certifiers;

/// A transaction body kept to run again after a cascading abort.
type Body = Box<dyn FnMut(&mut Tx<'_>) -> Result<Box<dyn Settle>, TxError> + Send>;

/// Ends a handle with an error (when its body cannot produce a value any more).
type Fail = Arc<dyn Fn(TxError) + Send + Sync>;

/// The type-erased result of one run of a body, delivered to its handle when it commits.
trait Settle: Send {
    /// The run committed: its value goes to the handle.
    fn settle(self: Box<Self>);
    /// The run conflicted and will run again: its value is thrown away.
    fn discard(self: Box<Self>);
}

/// The value a handle waits for (a fiber waiting on it suspends).
type Slot<T> = AnswerSlot<Result<T, TxError>>;

/// A commit's outcome, put by the job certifying it (`None`: that job panicked).
type CommitSlot = AnswerSlot<Option<Result<u64, TxError>>>;

/// A deadline that never comes, for waits that end only with their answer.
fn never() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// Waits for `slot`'s answer, however long it takes: a thread sleeps until it comes, a fiber
/// suspends.
fn wait_for<T: Send>(slot: &AnswerSlot<T>) -> T {
    loop {
        if let Some(answer) = slot.wait_until(never(), Duration::ZERO) {
            return answer;
        }
    }
}

/// Like [`wait_for`], but a fiber blocks its thread rather than suspend: code unwinding a
/// panic must not suspend (the thread's panic count would stay raised for the other tasks
/// that run on it meanwhile, and the fiber might finish unwinding on another thread).
fn block_for<T: Send>(slot: &AnswerSlot<T>) -> T {
    loop {
        if let Some(answer) = slot.block_until(never(), Duration::ZERO) {
            return answer;
        }
    }
}

/// One run's value, waiting for its commit's outcome. Dropped unsettled (a thread that
/// panicked), it ends the handle with an error.
struct Pending<T> {
    value: Option<T>,
    slot: Arc<Slot<T>>,
}

impl<T: Send> Settle for Pending<T> {
    fn settle(mut self: Box<Self>) {
        if let Some(v) = self.value.take() {
            self.slot.put(Ok(v));
        }
    }

    fn discard(mut self: Box<Self>) {
        self.value = None;
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.value.take().is_some() {
            self.slot.put(Err(TxError::OutcomeUnknown {
                reason: "the linked commit was abandoned before its outcome was known".into(),
                ticket: None,
            }));
        }
    }
}

/// The outcome of a linked transaction, once its commit is decided.
pub struct LinkedHandle<T> {
    slot: Arc<Slot<T>>,
}

impl<T: Send> LinkedHandle<T> {
    /// Waits until the transaction committed and returns its value as it committed, or the
    /// error that ended it. A commit that conflicted is run again by its chain (at its next
    /// `run` or `finish`, or when it is dropped): wait after one of those, not before. In a
    /// fiber the wait suspends the fiber.
    pub fn wait(self) -> Result<T, TxError> {
        wait_for(&self.slot)
    }

    /// Whether the outcome is known already (`wait` then returns at once).
    pub fn is_ready(&self) -> bool {
        self.slot.is_full()
    }
}

/// A commit on its way: where the thread certifying it (which hands the value to the handle
/// once committed) puts its outcome.
struct InFlight {
    commit: Arc<CommitSlot>,
    writes: Vec<(Key, Option<Vec<u8>>)>,
    reads: Vec<(Key, u64)>,
    body: Body,
    fail: Fail,
}

/// A thread's chain of linked transactions (see the module's documentation). Dropping it
/// waits for its outstanding commits.
pub struct Linked {
    engine: Arc<Engine>,
    queue: usize,
    /// Commits outstanding, oldest first.
    flying: VecDeque<InFlight>,
    /// Versions the chain's commits gave their keys since the queue was last empty (for the
    /// reads of a transaction that saw those writes before they committed).
    committed: HashMap<Key, u64>,
    /// Cascading aborts so far: a transaction that saw writes of a commit that failed runs
    /// again.
    cascades: u64,
    /// The threads certifying the outstanding commits.
    certifiers: Certifiers,
}

/// The error the chain reports for a transaction whose earlier commit failed.
fn earlier_failed(e: &TxError) -> TxError {
    TxError::OutcomeUnknown {
        reason: format!("an earlier linked commit failed: {e}"),
        ticket: None,
    }
}

impl Linked {
    /// A chain on `engine` with at most `queue` (at least 1) commits outstanding.
    pub(crate) fn new(engine: Arc<Engine>, queue: usize) -> Linked {
        Linked {
            engine,
            queue: queue.max(1),
            flying: VecDeque::new(),
            committed: HashMap::new(),
            cascades: 0,
            certifiers: Certifiers::new(queue.max(1)),
        }
    }

    /// Runs `f` as the chain's next transaction and returns a handle to its outcome, usually
    /// before its commit is decided. An error of `f`, or of an earlier commit this
    /// transaction built on, is returned here.
    pub fn run<T, F>(&mut self, f: F) -> Result<LinkedHandle<T>, TxError>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T, TxError> + Send + 'static,
    {
        let slot = Arc::new(Slot::default());
        let handle = LinkedHandle { slot: slot.clone() };
        let mut f = f;
        if !self.engine.has_certifier() {
            // Nothing to hide: commit now.
            slot.put(self.engine.atomically(f));
            return Ok(handle);
        }
        let failing = slot.clone();
        let fail: Fail = Arc::new(move |e| failing.put(Err(e)));
        let body: Body = Box::new(move |tx| {
            let value = f(tx)?;
            Ok(Box::new(Pending {
                value: Some(value),
                slot: slot.clone(),
            }) as Box<dyn Settle>)
        });
        self.push(body, fail)?;
        Ok(handle)
    }

    /// Waits for every outstanding commit of the chain (re-running those that conflicted).
    pub fn finish(&mut self) -> Result<(), TxError> {
        while !self.flying.is_empty() {
            self.settle_oldest()?;
        }
        Ok(())
    }

    /// What the outstanding commits wrote (each key once, the latest value) and read.
    fn base(&self) -> LinkBase {
        let mut writes: Vec<(Key, Option<Vec<u8>>)> = Vec::new();
        let mut index: HashMap<Key, usize> = HashMap::new();
        for (key, value) in self.flying.iter().flat_map(|f| f.writes.iter()) {
            match index.get(key) {
                Some(&i) => writes[i].1 = value.clone(),
                None => {
                    index.insert(key.clone(), writes.len());
                    writes.push((key.clone(), value.clone()));
                }
            }
        }
        let reads = self
            .flying
            .iter()
            .flat_map(|f| f.reads.iter().cloned())
            .collect();
        LinkBase { writes, reads }
    }

    /// Runs `body` over the outstanding commits and sends its commit when the chain allows.
    fn push(&mut self, mut body: Body, fail: Fail) -> Result<(), TxError> {
        if self.flying.is_empty() {
            self.committed.clear();
        }
        loop {
            let (settle, deferred) = match self.engine.run_linked(&self.base(), &mut body) {
                Ok(ran) => ran,
                Err(TxError::Conflict) => {
                    // What the outstanding commits read was replaced: wait for them (they
                    // run again) and run over what they came to.
                    self.finish_or_fail(&fail)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(deferred) = deferred else {
                // It read committed objects only: done.
                settle.settle();
                return Ok(());
            };
            if !deferred.inherited.is_empty() {
                // It saw writes not committed yet: it goes once they did. If one of them
                // failed and ran again, what this one saw is gone: it runs again too.
                let cascades = self.cascades;
                if let Err(e) = self.finish_or_fail(&fail) {
                    settle.discard();
                    return Err(e);
                }
                if self.cascades != cascades {
                    settle.discard();
                    continue;
                }
            }
            while self.flying.len() >= self.queue {
                if let Err(e) = self.settle_oldest() {
                    settle.discard();
                    fail(earlier_failed(&e));
                    return Err(earlier_failed(&e));
                }
            }
            self.send(body, fail, settle, deferred);
            return Ok(());
        }
    }

    /// [`Linked::finish`], ending the handle of `fail` if an earlier commit failed.
    fn finish_or_fail(&mut self, fail: &Fail) -> Result<(), TxError> {
        self.finish().map_err(|e| {
            fail(earlier_failed(&e));
            earlier_failed(&e)
        })
    }

    /// Starts certifying `deferred` on one of the chain's certifying threads, which hands the
    /// value to its handle once it committed.
    fn send(&mut self, body: Body, fail: Fail, settle: Box<dyn Settle>, deferred: Deferred) {
        let Deferred {
            mut certification,
            inherited,
        } = deferred;
        for key in inherited {
            let version = self.committed.get(&key).copied().unwrap_or(0);
            certification.reads.retain(|(k, _)| *k != key);
            certification.reads.push((key, version));
        }
        let writes = certification.writes.clone();
        let reads = certification.reads.clone();
        let engine = self.engine.clone();
        let failing = fail.clone();
        let commit = Arc::new(CommitSlot::default());
        let replier = Replier::new(commit.clone());
        // Dropped unanswered if the job panics, the replier puts `None`.
        self.certifiers.submit(Box::new(move || {
            let outcome = certify(&engine, certification, settle, &*failing);
            // Nothing of the chain stays alive once its outcome is known.
            drop((engine, failing));
            replier.send(outcome);
        }));
        self.flying.push_back(InFlight {
            commit,
            writes,
            reads,
            body,
            fail,
        });
    }

    /// Waits for the oldest outstanding commit; if it conflicted, its body runs again and
    /// commits before anything later is sent (a cascading abort).
    fn settle_oldest(&mut self) -> Result<(), TxError> {
        let Some(InFlight {
            commit,
            writes,
            mut body,
            fail,
            ..
        }) = self.flying.pop_front()
        else {
            return Ok(());
        };
        let outcome = wait_for(&commit).unwrap_or_else(|| {
            Err(TxError::OutcomeUnknown {
                reason: "the job certifying a linked commit panicked".into(),
                ticket: None,
            })
        });
        match outcome {
            Ok(version) => {
                self.note_committed(&writes, version);
                Ok(())
            }
            Err(TxError::Conflict) => {
                self.cascades += 1;
                self.rerun_alone(&mut body, &fail)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `body` until it commits, over what is committed; its handle gets the error that
    /// stops it otherwise.
    fn rerun_alone(&mut self, body: &mut Body, fail: &Fail) -> Result<(), TxError> {
        loop {
            let (settle, deferred) = match self.engine.run_linked(&LinkBase::default(), &mut *body)
            {
                Ok(ran) => ran,
                Err(e) => {
                    let reason = e.to_string();
                    fail(e);
                    return Err(TxError::OutcomeUnknown {
                        reason,
                        ticket: None,
                    });
                }
            };
            let Some(deferred) = deferred else {
                settle.settle();
                return Ok(());
            };
            let writes = deferred.certification.writes.clone();
            match certify(&self.engine, deferred.certification, settle, &**fail) {
                Ok(version) => {
                    self.note_committed(&writes, version);
                    return Ok(());
                }
                // The commit it conflicted with may still be on its way: a fiber lets the
                // runtime's other tasks (the network that decides it) run before it tries again.
                Err(TxError::Conflict) => atomos_sched::fiber::yield_now(),
                Err(e) => return Err(e),
            }
        }
    }

    fn note_committed(&mut self, writes: &[(Key, Option<Vec<u8>>)], version: u64) {
        for (k, _) in writes {
            let v = self.committed.entry(k.clone()).or_default();
            *v = (*v).max(version);
        }
    }
}

/// Certifies a linked transaction's commit: its handle gets the value once it committed, or
/// the error (but a conflict: the chain runs it again). The chain gets a copy of the error.
fn certify(
    engine: &Engine,
    certification: Certification,
    settle: Box<dyn Settle>,
    fail: &(dyn Fn(TxError) + Send + Sync),
) -> Result<u64, TxError> {
    match engine.certify_deferred(certification) {
        Ok(version) => {
            settle.settle();
            Ok(version)
        }
        Err(TxError::Conflict) => {
            settle.discard();
            Err(TxError::Conflict)
        }
        Err(e) => {
            settle.discard();
            let copy = earlier_failed(&e);
            fail(e);
            Err(copy)
        }
    }
}

impl Drop for Linked {
    /// Waits for every outstanding commit; those that conflicted run again (unless the
    /// thread is unwinding from a panic: their handles then get an error, and a fiber blocks
    /// its thread for them instead of suspending).
    fn drop(&mut self) {
        while let Some(front) = self.flying.front() {
            if std::thread::panicking() {
                let fail = front.fail.clone();
                let done = self.flying.pop_front().map(|f| block_for(&f.commit));
                if !matches!(done, Some(Some(Ok(_)))) {
                    fail(TxError::OutcomeUnknown {
                        reason: "the chain was dropped while its thread panicked".into(),
                        ticket: None,
                    });
                }
                continue;
            }
            let _ = self.settle_oldest();
        }
    }
}
