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
//! - Where commits are not certified (`local`, `tfa`: nothing to hide) each transaction commits
//!   before `run` returns.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use atomos_core::{Deferred, Engine, Key, Tx, TxError};
use parking_lot::{Condvar, Mutex};

/// A transaction body kept to run again after a cascading abort.
type Body = Box<dyn FnMut(&mut Tx<'_>) -> Result<Box<dyn Settle>, TxError> + Send>;

/// The type-erased result of one run of a body, delivered to its handle when it commits.
trait Settle: Send {
    fn settle(self: Box<Self>, outcome: Result<(), TxError>);
}

/// The value a handle waits for.
struct Slot<T> {
    value: Mutex<Option<Result<T, TxError>>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn new() -> Arc<Slot<T>> {
        Arc::new(Slot {
            value: Mutex::new(None),
            ready: Condvar::new(),
        })
    }

    fn put(&self, v: Result<T, TxError>) {
        *self.value.lock() = Some(v);
        self.ready.notify_all();
    }
}

/// One run's value, waiting for its commit's outcome.
struct Pending<T> {
    value: T,
    slot: Arc<Slot<T>>,
}

impl<T: Send> Settle for Pending<T> {
    fn settle(self: Box<Self>, outcome: Result<(), TxError>) {
        let Pending { value, slot } = *self;
        slot.put(outcome.map(|()| value));
    }
}

/// The outcome of a linked transaction, once its commit is decided.
pub struct LinkedHandle<T> {
    slot: Arc<Slot<T>>,
}

impl<T> LinkedHandle<T> {
    /// Waits until the transaction committed and returns its value as it committed, or why it
    /// did not. A commit that conflicted is run again by its chain (at its next `run` or
    /// `finish`, or when it is dropped): wait after one of those, not before.
    pub fn wait(self) -> Result<T, TxError> {
        let mut v = self.slot.value.lock();
        loop {
            if let Some(r) = v.take() {
                return r;
            }
            self.slot.ready.wait(&mut v);
        }
    }

    /// The outcome, if it is decided already.
    pub fn try_take(&self) -> Option<Result<T, TxError>> {
        self.slot.value.lock().take()
    }
}

/// A commit on its way: the thread certifying it (which hands the value to the handle once
/// committed).
struct InFlight {
    commit: JoinHandle<Result<u64, TxError>>,
    writes: Vec<(Key, Option<Vec<u8>>)>,
    body: Body,
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
        let slot = Slot::new();
        let handle = LinkedHandle { slot: slot.clone() };
        let mut f = f;
        if !self.engine.has_certifier() {
            // Nothing to hide: commit now.
            slot.put(self.engine.atomically(f));
            return Ok(handle);
        }
        let body: Body = Box::new(move |tx| {
            let value = f(tx)?;
            Ok(Box::new(Pending {
                value,
                slot: slot.clone(),
            }) as Box<dyn Settle>)
        });
        self.push(body)?;
        Ok(handle)
    }

    /// Waits for every outstanding commit of the chain (re-running those that conflicted).
    pub fn finish(&mut self) -> Result<(), TxError> {
        while !self.flying.is_empty() {
            self.settle_oldest()?;
        }
        Ok(())
    }

    /// The writes of the outstanding commits, each key once (the latest value).
    fn base(&self) -> Vec<(Key, Option<Vec<u8>>)> {
        let mut base: Vec<(Key, Option<Vec<u8>>)> = Vec::new();
        for (key, value) in self.flying.iter().flat_map(|f| f.writes.iter()) {
            match base.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = value.clone(),
                None => base.push((key.clone(), value.clone())),
            }
        }
        base
    }

    /// Runs `body` over the outstanding writes and sends its commit when the chain allows.
    fn push(&mut self, mut body: Body) -> Result<(), TxError> {
        if self.flying.is_empty() {
            self.committed.clear();
        }
        loop {
            let (settle, deferred) = self.engine.run_linked(&self.base(), &mut body)?;
            let Some(deferred) = deferred else {
                // It read committed objects only: done.
                settle.settle(Ok(()));
                return Ok(());
            };
            if !deferred.inherited.is_empty() {
                // It saw writes not committed yet: it goes once they did. If one of them
                // failed and ran again, what this one saw is gone: it runs again too.
                let cascades = self.cascades;
                if let Err(e) = self.finish() {
                    let reason = e.to_string();
                    settle.settle(Err(e));
                    return Err(TxError::OutcomeUnknown {
                        reason: format!("an earlier linked commit failed: {reason}"),
                    });
                }
                if self.cascades != cascades {
                    continue;
                }
            }
            while self.flying.len() >= self.queue {
                if let Err(e) = self.settle_oldest() {
                    let reason = e.to_string();
                    settle.settle(Err(e));
                    return Err(TxError::OutcomeUnknown {
                        reason: format!("an earlier linked commit failed: {reason}"),
                    });
                }
            }
            self.send(body, settle, deferred);
            return Ok(());
        }
    }

    /// Starts certifying `deferred` on a thread of its own, which hands the value to its
    /// handle once it committed.
    fn send(&mut self, body: Body, settle: Box<dyn Settle>, deferred: Deferred) {
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
        let engine = self.engine.clone();
        let commit = std::thread::spawn(move || certify(&engine, certification, settle));
        self.flying.push_back(InFlight {
            commit,
            writes,
            body,
        });
    }

    /// Waits for the oldest outstanding commit; if it conflicted, its body runs again and
    /// commits before anything later is sent (a cascading abort).
    fn settle_oldest(&mut self) -> Result<(), TxError> {
        let Some(InFlight {
            commit,
            writes,
            mut body,
        }) = self.flying.pop_front()
        else {
            return Ok(());
        };
        let outcome = commit.join().unwrap_or_else(|_| {
            Err(TxError::OutcomeUnknown {
                reason: "the thread certifying a linked commit panicked".into(),
            })
        });
        match outcome {
            Ok(version) => {
                self.note_committed(&writes, version);
                Ok(())
            }
            Err(TxError::Conflict) => {
                self.cascades += 1;
                self.rerun_alone(&mut body)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `body` until it commits, over what is committed.
    fn rerun_alone(&mut self, body: &mut Body) -> Result<(), TxError> {
        loop {
            let (settle, deferred) = self.engine.run_linked(&[], &mut *body)?;
            let Some(deferred) = deferred else {
                settle.settle(Ok(()));
                return Ok(());
            };
            let writes = deferred.certification.writes.clone();
            match certify(&self.engine, deferred.certification, settle) {
                Ok(version) => {
                    self.note_committed(&writes, version);
                    return Ok(());
                }
                Err(TxError::Conflict) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn note_committed(&mut self, writes: &[(Key, Option<Vec<u8>>)], version: u64) {
        for (k, _) in writes {
            self.committed.insert(k.clone(), version);
        }
    }
}

/// Certifies a linked transaction's commit and settles its handle unless it conflicted (then
/// it runs again). Errors other than a conflict are the handle's; the chain gets a copy.
fn certify(
    engine: &Engine,
    certification: atomos_core::Certification,
    settle: Box<dyn Settle>,
) -> Result<u64, TxError> {
    match engine.certify_deferred(certification) {
        Ok(version) => {
            settle.settle(Ok(()));
            Ok(version)
        }
        Err(TxError::Conflict) => Err(TxError::Conflict),
        Err(e) => {
            let reason = e.to_string();
            settle.settle(Err(e));
            Err(TxError::OutcomeUnknown {
                reason: format!("an earlier linked commit failed: {reason}"),
            })
        }
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
