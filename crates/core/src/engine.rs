//! The engine: one node's objects, clock and transactions, and the loop that runs an atomic
//! section until it commits.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

pub(crate) use crate::attempts::{Attempts, Finished, ForParent, RunError};
use crate::contention::ContentionPolicy;
use crate::error::TxError;
use crate::history::HistoryLog;
use crate::open::AbstractLocks;
use crate::ordered::Certifier;
use crate::remote::{CommitOutcome, RemoteSource, RemoteState};
use crate::retry::RetrySignal;
use crate::slots::SlotRegistry;
use crate::stats::{Event, Stats};
use crate::store::Store;
use crate::tx::{CommitFailure, HandlerEntry, Mode, ReadEntry, Tx, TxState};
use crate::urgent::Urgent;

/// Engine-wide settings.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// The contention manager transactions use unless their options say otherwise.
    pub contention: ContentionPolicy,
    /// Record every committed transaction's reads and writes (for the serializability checker).
    /// Costs a lock and allocations per commit: for tests.
    pub record_history: bool,
    /// Options a transaction gets when its caller gives none.
    pub default_options: TxOptions,
    /// The engine is a replica of a replicated store: it keeps every object's key beside its
    /// cell (certification requests name what they read and wrote), and accepts a
    /// [`Certifier`](crate::Certifier).
    pub replicated: bool,
    /// Keep every object's key beside its cell (as a replicated engine does) so that conflict
    /// counts ([`Engine::hot_spots`]) name their objects. Costs one table entry per object.
    pub monitor_conflicts: bool,
}

/// Options of one transaction.
#[derive(Clone, Debug, Default)]
pub struct TxOptions {
    /// Higher wins conflicts under [`ContentionPolicy::Priority`].
    pub priority: u16,
    /// Give up with [`TxError::RetryBudgetExhausted`] after this many attempts (`None`: never).
    pub max_attempts: Option<u32>,
    /// Give up with [`TxError::Timeout`] once this much time has passed (`None`: never).
    pub timeout: Option<Duration>,
    /// Overrides the engine's contention manager.
    pub contention: Option<ContentionPolicy>,
    /// Run as a read-only snapshot: never aborts; a write is an error.
    pub read_only: bool,
    /// Under a replicated protocol, first wait until this node has applied everything
    /// committed anywhere before the transaction began (a barrier through the log), so that
    /// it sees every transaction that finished before it started. Elsewhere nothing to wait
    /// for: every commit is visible at once.
    pub linearizable: bool,
}

/// Engine ids: never reused, and 0 is reserved (an empty `TRef` cell cache). `TRef`s cache
/// cells only for the first 65,535 engines of a process (see `tref`); later engines look every
/// `TRef` up in their key table, which is correct but slower.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// One node's transactional engine: object cells, the version clock, and the machinery that runs
/// transactions over them from many threads. It performs no I/O.
pub struct Engine {
    pub(crate) id: u64,
    pub(crate) clock: CachePadded<AtomicU64>,
    pub(crate) store: Store,
    pub(crate) slots: Arc<SlotRegistry>,
    pub(crate) retry_signal: RetrySignal,
    pub(crate) abstract_locks: AbstractLocks,
    pub(crate) urgent: Urgent,
    pub(crate) history: Option<HistoryLog>,
    /// Conflicts per object (see `hot_spots`).
    pub(crate) hot_spots: crate::hot_spots::HotSpots,
    /// The distributed protocol transactions run under, once set.
    remote: OnceLock<Arc<dyn RemoteSource>>,
    /// Where update transactions are certified, once set (see `ordered`).
    pub(crate) certifier: OnceLock<Arc<dyn Certifier>>,
    /// The log position applied so far, under a certifier (read by every operation of a
    /// replicated engine's transactions: a line of its own).
    pub(crate) applied: CachePadded<AtomicU64>,
    /// Tells this engine's anonymous objects from other engines' (random per engine).
    anon_origin: u64,
    anon_next: AtomicU64,
    config: EngineConfig,
}

thread_local! {
    /// The transaction state this thread used last (the common case: one engine per thread).
    static HOT_STATE: Cell<Option<Box<TxState>>> = const { Cell::new(None) };
    /// Other transaction states kept for reuse, by engine. Boxed: a state moves in and out of
    /// the cache on every transaction, and moving a pointer is cheaper than moving the state.
    #[allow(clippy::vec_box)]
    static STATES: RefCell<Vec<Box<TxState>>> = const { RefCell::new(Vec::new()) };
}
const CACHED_STATES: usize = 8;

impl Engine {
    /// A new, empty engine.
    pub fn new(config: EngineConfig) -> Engine {
        Engine {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            clock: CachePadded::new(AtomicU64::new(0)),
            store: Store::new(
                config.record_history || config.replicated || config.monitor_conflicts,
            ),
            hot_spots: crate::hot_spots::HotSpots::default(),
            slots: SlotRegistry::new(),
            retry_signal: RetrySignal::new(),
            abstract_locks: AbstractLocks::new(),
            urgent: Urgent::new(),
            history: config.record_history.then(HistoryLog::new),
            remote: OnceLock::new(),
            certifier: OnceLock::new(),
            applied: CachePadded::new(AtomicU64::new(0)),
            anon_origin: {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(NEXT_ENGINE_ID.load(Ordering::Relaxed));
                h.finish()
            },
            anon_next: AtomicU64::new(1),
            config,
        }
    }

    /// Runs every later transaction under a distributed protocol: reads and commits go to
    /// `source` instead of this engine's objects. Set once; `false` if it was set before.
    pub fn set_remote(&self, source: Arc<dyn RemoteSource>) -> bool {
        self.certifier.get().is_none() && self.remote.set(source).is_ok()
    }

    /// A key for a new anonymous object, never given out before (by any engine, with
    /// overwhelming probability: each engine draws a random 64-bit origin).
    pub(crate) fn fresh_anonymous_key(&self) -> crate::Key {
        crate::Key::anonymous(
            self.anon_origin,
            self.anon_next.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// Releases a family's abstract locks, wherever they are kept.
    pub(crate) fn release_abstract(&self, locks: Vec<String>, owner: u64) {
        if locks.is_empty() {
            return;
        }
        if let Some(certifier) = self.certifier() {
            return certifier.release_abstract(owner, locks);
        }
        match self.remote.get() {
            Some(source) => source.release_abstract(owner, locks),
            None => self.abstract_locks.release(&locks, owner),
        }
    }

    /// Whether transactions run under a distributed protocol.
    pub fn is_remote(&self) -> bool {
        self.remote.get().is_some()
    }

    /// The transaction loop under a distributed protocol: the same options, contention
    /// managers, statistics and handlers as the local loop; reads and the commit go remote.
    pub(crate) fn run_remote<R, E>(
        &self,
        source: &Arc<dyn RemoteSource>,
        opts: &TxOptions,
        owner: u64,
        open_nested: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<(R, Option<ForParent>), RunError<E>> {
        let mut st = self.take_state();
        let mut attempts = Attempts::new(self, &mut st, opts, owner, open_nested);
        attempts.remote = true;
        let task = atomos_sched::current();
        loop {
            attempts.begin(self, &mut st);
            st.remote = Some(Box::new(RemoteState::new(source.begin(), opts.read_only)));
            let mut tx = Tx::new(self, st, task);
            let out = catch_unwind(AssertUnwindSafe(|| f(&mut tx)));
            st = tx.into_state();
            let mut rs = st.remote.take().expect("set for the attempt");
            let out = match out {
                Ok(out) => out,
                Err(panic) => {
                    rs.abort();
                    self.abandon(st);
                    resume_unwind(panic);
                }
            };
            let cause = match (out, rs.conflict) {
                (Ok(r), None) => match rs.commit() {
                    Ok(wrote) => {
                        st.bump(if wrote {
                            Event::Commit
                        } else {
                            Event::ReadOnlyCommit
                        });
                        st.end_attempt();
                        return Ok((r, self.finish(st, true).run(self)));
                    }
                    Err(CommitOutcome::Conflict(cause)) => cause,
                    Err(CommitOutcome::Error(e)) => {
                        self.end_with_user_error(st);
                        return Err(RunError::Tx(e));
                    }
                },
                (Err(e), None) => {
                    rs.abort();
                    self.end_with_user_error(st);
                    return Err(RunError::User(e));
                }
                (_, Some(cause)) => {
                    rs.abort();
                    cause
                }
            };
            if let Err(e) = attempts.aborted(self, &mut st, cause) {
                self.finish(st, false).run(self);
                return Err(RunError::Tx(e));
            }
        }
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Counters since the engine started.
    pub fn stats(&self) -> Stats {
        self.slots.stats()
    }

    /// The commit history, when the engine records one.
    pub fn history(&self) -> Option<&HistoryLog> {
        self.history.as_ref()
    }

    /// The version clock: the timestamp of the latest commit.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Number of object cells (objects that exist, existed, or were looked up).
    pub fn object_cells(&self) -> usize {
        self.store.len()
    }

    /// How many versions of the object `key` are kept (1 when no snapshot needs older ones;
    /// 0 for an unknown key). For tests and memory accounting; call it while no transaction
    /// writes the object.
    pub fn version_count(&self, key: &crate::Key) -> usize {
        // SAFETY: the store keeps its cells for the engine's lifetime.
        unsafe { &*self.store.cell(key) }.number_of_versions()
    }

    /// Whether the named abstract lock is held by some transaction.
    pub fn abstract_lock_held(&self, name: &str) -> bool {
        self.abstract_locks.is_held(name)
    }

    // Never inlined, like every thread-local access of code that runs inside transactions: a
    // transaction suspended at a safe point may resume on another thread, and an inlined
    // access could reuse the old thread's address (see `atomos_sched::task`).
    #[inline(never)]
    pub(crate) fn take_state(&self) -> Box<TxState> {
        let hot = HOT_STATE
            .try_with(|h| match h.take() {
                Some(st) if st.engine_id == self.id => Some(st),
                other => {
                    h.set(other);
                    None
                }
            })
            .ok()
            .flatten();
        if let Some(st) = hot {
            return st;
        }
        let cached = STATES
            .try_with(|s| {
                let mut s = s.borrow_mut();
                let pos = s.iter().position(|t| t.engine_id == self.id)?;
                Some(s.swap_remove(pos))
            })
            .ok()
            .flatten();
        cached.unwrap_or_else(|| Box::new(TxState::new(self)))
    }

    /// Commits `st`. A commit is never suspended; in a scheduled task it is marked as a
    /// non-preemptable region, which steers preemption to a worker that can yield sooner.
    #[inline]
    fn commit_in_task(
        &self,
        st: &mut TxState,
        task: Option<&atomos_sched::TaskHandle>,
    ) -> Result<(), CommitFailure> {
        let _commit = task.map(atomos_sched::TaskHandle::non_preemptable);
        st.commit(self)
    }

    /// Returns the state of a transaction that has ended, forgetting its family identity.
    #[inline]
    fn put_state_reset(&self, mut st: Box<TxState>) {
        st.owner = 0;
        st.open_nested = false;
        self.put_state(st);
    }

    #[inline(never)]
    pub(crate) fn put_state(&self, mut st: Box<TxState>) {
        // The transaction has ended: it is urgent no more.
        if st.urgent != 0 {
            self.urgent.release(st.urgent);
            st.urgent = 0;
        }
        let Ok(Some(previous)) = HOT_STATE.try_with(|h| h.replace(Some(st))) else {
            return;
        };
        let _ = STATES.try_with(move |s| {
            let mut s = s.borrow_mut();
            if s.len() >= CACHED_STATES {
                s.remove(0);
            }
            s.push(previous);
        });
    }

    /// Runs `f` as a transaction with the engine's default options; see [`Engine::run`].
    pub fn atomically<R>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        self.run(&self.config.default_options, f)
    }

    /// Runs `f` as a transaction until it commits, and returns its result.
    ///
    /// On a conflict the attempt is rolled back and `f` runs again (after the contention
    /// manager's back-off); after `tx.retry()` it runs again once something it read changed.
    /// If `f` returns an error that is not such a signal, the transaction aborts and the error
    /// is returned unchanged. The error type is the caller's, so the closure can use `?` both on
    /// transactional operations and on its own fallible calls.
    pub fn run<R, E: From<TxError>>(
        &self,
        opts: &TxOptions,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        match self.run_as(opts, 0, false, None, f) {
            // Only an open-nested block hands actions and locks to a parent; matching `None`
            // here keeps the drop of the hand-over out of the common path.
            Ok((r, None)) => Ok(r),
            Ok((r, Some(handed))) => {
                drop(handed);
                Ok(r)
            }
            Err(RunError::User(e)) => Err(e),
            Err(RunError::Tx(e)) => Err(E::from(e)),
        }
    }

    /// The transaction loop. `owner` is the abstract-lock identity inherited from an open-nesting
    /// parent (0 for a top-level transaction).
    pub(crate) fn run_as<R, E>(
        &self,
        opts: &TxOptions,
        owner: u64,
        open_nested: bool,
        mut link: Option<(
            &crate::linked::LinkBase,
            &mut Option<crate::linked::Deferred>,
        )>,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<(R, Option<ForParent>), RunError<E>> {
        if let Some(source) = self.remote.get() {
            return self.run_remote(source, opts, owner, open_nested, f);
        }
        if opts.linearizable {
            self.sync().map_err(RunError::Tx)?;
        }
        let mut st = self.take_state();
        let mut attempts = Attempts::new(self, &mut st, opts, owner, open_nested);
        // Between attempts a transaction holds nothing: a safe point (see `atomos_sched`).
        let task = atomos_sched::current();
        loop {
            if let Some(task) = &task {
                task.safe_point();
            }
            attempts.begin(self, &mut st);
            if let Some((base, _)) = &link {
                // It sees its base through its write set: never a snapshot attempt.
                st.mode = Mode::Update;
                st.seed_link(self, base);
            }
            let mut tx = Tx::new(self, st, task);
            let out = catch_unwind(AssertUnwindSafe(|| f(&mut tx)));
            st = tx.into_state();
            let out = match out {
                Ok(out) => out,
                Err(panic) => {
                    self.abandon(st);
                    resume_unwind(panic);
                }
            };
            let cause = match out {
                Ok(r) => match st.abort.take() {
                    None => match self.commit_in_task(&mut st, task.as_ref()) {
                        Ok(()) => {
                            if let Some((_, out)) = link.as_mut() {
                                **out = st.link.take().and_then(|l| l.result);
                            }
                            st.after_commit(self);
                            // `finish` handles this case too; checking here keeps the common
                            // path inline (measured: ~5% on the hash table benchmark).
                            if st.handlers.is_empty() && st.abstract_locks.is_empty() {
                                self.put_state_reset(st);
                                return Ok((r, None));
                            }
                            return Ok((r, self.finish(st, true).run(self)));
                        }
                        Err(CommitFailure::Abort(cause)) => cause,
                        Err(CommitFailure::Fatal(e)) => {
                            self.end_undecided(st);
                            return Err(RunError::Tx(e));
                        }
                    },
                    Some(cause) => cause,
                },
                Err(e) => match st.abort.take() {
                    Some(cause) => cause,
                    None => {
                        self.end_with_user_error(st);
                        return Err(RunError::User(e));
                    }
                },
            };
            if st.link.as_ref().is_some_and(|l| l.doomed) {
                // What its base read was replaced: its caller waits for the base's commits
                // and runs it again over what they came to.
                self.end_undecided(st);
                return Err(RunError::Tx(TxError::Conflict));
            }
            if let Err(e) = attempts.aborted(self, &mut st, cause) {
                self.finish(st, false).run(self);
                return Err(RunError::Tx(e));
            }
        }
    }

    /// Ends a top-level transaction (or an open-nested one): returns the state to the cache and
    /// the handlers to run and locks to release. An open-nested transaction that committed keeps
    /// its handlers and locks for its parent.
    #[inline]
    pub(crate) fn finish(&self, mut st: Box<TxState>, committed: bool) -> Finished {
        if st.handlers.is_empty() && st.abstract_locks.is_empty() {
            // The common case: no actions, no abstract locks.
            self.put_state_reset(st);
            return Finished::Nothing;
        }
        let (owner, open_nested) = (st.owner, st.open_nested);
        let mut handlers = std::mem::take(&mut st.handlers);
        let locks = std::mem::take(&mut st.abstract_locks);
        self.put_state_reset(st);
        if open_nested && committed {
            return Finished::ForParent(ForParent { handlers, locks });
        }
        if open_nested {
            // The block's effects never committed: there is nothing to compensate.
            handlers.clear();
        }
        handlers.retain(|h| h.on_commit == committed);
        if !committed {
            handlers.reverse();
        }
        Finished::Done {
            handlers,
            locks,
            owner,
        }
    }

    /// Ends a transaction that the application aborted with its own error: nothing it wrote is
    /// installed, its compensations run, its abstract locks are released.
    pub(crate) fn end_with_user_error(&self, mut st: Box<TxState>) {
        st.bump(Event::UserAbort);
        st.end_attempt();
        self.finish(st, false).run(self);
    }

    /// Ends a transaction whose commit may or may not have happened: nothing is installed
    /// here, its abstract locks are released, its actions are dropped (neither kind can be
    /// right).
    pub(crate) fn end_undecided(&self, mut st: Box<TxState>) {
        st.end_attempt();
        st.handlers.clear();
        self.finish(st, false).run(self);
    }

    /// Cleans up after a closure that panicked: nothing it wrote is installed, its abstract
    /// locks are released, its actions are dropped (none runs: the program is unwinding).
    pub(crate) fn abandon(&self, mut st: Box<TxState>) {
        st.end_attempt();
        st.handlers.clear();
        self.finish(st, false).run(self);
    }

    /// Runs the handlers of an abort inside a transaction (nested rollback), latest first.
    pub(crate) fn run_handlers(&self, handlers: Vec<HandlerEntry>) {
        for mut h in handlers {
            if self.atomically(|tx| (h.run)(tx)).is_err() {
                // Counted, not returned: the transaction that registered it has ended.
                self.slots.count_rare(Event::HandlerFailure);
            }
        }
    }

    /// Waits until one of `reads` changes (or, with none, until the clock passes `since`).
    pub(crate) fn wait_for_change(
        &self,
        reads: &[ReadEntry],
        since: u64,
        deadline: Option<Instant>,
    ) -> bool {
        self.retry_signal.wait_until(deadline, || {
            if reads.is_empty() {
                return self.clock() > since;
            }
            reads.iter().any(|r| !r.is_current())
        })
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(EngineConfig::default())
    }
}
