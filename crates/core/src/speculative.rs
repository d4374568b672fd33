//! Speculative serial execution of ordered procedures (HiperTM's SCC).
//!
//! Every replica runs the same update procedures in the same order on one thread, so no two of
//! them ever conflict. The order arrives twice: optimistically first (an entry is in the log but
//! not committed), finally later. [`SerialExecutor`] runs each invocation when its optimistic
//! delivery arrives, on the objects as the invocations before it in that order left them, and
//! holds its reads and writes; when the final delivery arrives it commits them if what the
//! invocation read is still what the final order gives, and otherwise runs it again on the
//! committed objects and commits that. The time a procedure takes to run thus overlaps the
//! time the order takes to become final, and an invocation never aborts because of another.
//!
//! - **Complete buffers.** Besides the committed versions, each object has at most one
//!   speculative version: the newest write of an invocation that ran but is not final yet. A
//!   speculative run reads that version if there is one, else the newest committed version.
//! - **Validation by identity.** A run records, for each object it read, which version it saw:
//!   a committed version (its number), or the speculative version of an earlier invocation. At
//!   final delivery the first must still be the newest committed version, and the second must
//!   have been committed as speculated (its writer's run was confirmed) and still be the newest.
//! - **No cascades.** An invocation whose run is not confirmed is run again at its final
//!   position, on committed objects only, and commits without validation (nothing else writes
//!   meanwhile). Runs that read its speculative writes fail their own validation later.
//! - **Revocation.** When optimistic deliveries are revoked (a new leader replaced them), their
//!   runs are dropped and the complete buffers rebuilt from the runs that remain.
//!
//! Committed versions are numbered by log position, as under certification, so read-only
//! transactions on other threads read consistent snapshots of the committed objects and never
//! see a speculative version. Procedures must be deterministic (see [`crate::Procedures`]).
//! The executor is a deterministic state machine over its engine: no threads, no clock.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, TxOptions};
use crate::error::TxError;
use crate::key::Key;
use crate::procedure::Procedures;
use crate::remote::{RemoteAttempt, RemoteError, RemoteSource};
use crate::stats::AbortCause;
use crate::tx::Mode;

/// A procedure invocation, as ordered: the procedure's name and its encoded arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    /// The registered name.
    pub procedure: String,
    /// The arguments, encoded (see [`crate::encode_arguments`]).
    pub arguments: Vec<u8>,
}

/// What an invocation came to. Deterministic: every replica computes the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// It committed and returned this encoded result.
    Returned(Vec<u8>),
    /// It failed (the procedure's own error, an unknown procedure, arguments that do not
    /// decode): nothing of it was written.
    Failed(String),
}

/// Where an optimistic delivery sits: the log entry and the invocation's index in it.
pub type Slot = (u64, u32);

/// Counters of a [`SerialExecutor`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    /// Invocations run speculatively.
    pub speculated: u64,
    /// Finally delivered invocations whose speculative run was committed as it was.
    pub confirmed: u64,
    /// Finally delivered invocations run again at their final position (their speculative run
    /// read what the final order changed, was revoked, or never happened).
    pub rerun: u64,
    /// Speculative runs dropped by revocations.
    pub revoked: u64,
}

/// Which version a run saw of an object it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// The committed version with this number (0: never written).
    Committed(u64),
    /// The speculative version of the run with this id.
    Speculative(u64),
}

/// One speculative run, waiting for its final delivery.
struct Run {
    id: u64,
    slot: Slot,
    reads: Vec<(Key, Seen)>,
    writes: Vec<(Key, Option<Vec<u8>>)>,
    outcome: Outcome,
}

/// The newest speculative write of an object.
struct Buffered {
    run: u64,
    value: Option<Vec<u8>>,
}

/// What an execution reads besides the committed objects, and what it recorded.
#[derive(Default)]
struct Scratch {
    /// The complete buffers (absent when running on committed objects only).
    buffers: Option<FxHashMap<Key, Buffered>>,
    reads: Vec<(Key, Seen)>,
    writes: Vec<(Key, Option<Vec<u8>>)>,
}

/// Runs ordered procedure invocations speculatively and commits them in final order. See the
/// module documentation.
pub struct SerialExecutor {
    engine: Arc<Engine>,
    procedures: Procedures,
    /// Speculative runs in optimistic order, not yet finally delivered.
    pending: VecDeque<Run>,
    /// Shared with the executions' attempts (only one runs at a time, on this thread).
    scratch: Arc<Mutex<Scratch>>,
    /// Runs that were confirmed and that a pending run read from: the version their writes got,
    /// and how many pending runs' reads still name them.
    confirmed: FxHashMap<u64, (u64, usize)>,
    /// How many pending runs' reads name each unconfirmed run.
    readers: FxHashMap<u64, usize>,
    next_id: u64,
    stats: ExecutorStats,
}

impl SerialExecutor {
    /// An executor committing into `engine` (made with [`crate::EngineConfig::replicated`]) and
    /// running the procedures of `procedures`. One thread at a time may use it, and nothing
    /// else may install versions into the engine meanwhile except through it (or through
    /// [`Engine::apply_certified`] in the same order).
    pub fn new(engine: Arc<Engine>, procedures: Procedures) -> SerialExecutor {
        SerialExecutor {
            engine,
            procedures,
            pending: VecDeque::new(),
            scratch: Arc::new(Mutex::new(Scratch {
                buffers: Some(FxHashMap::default()),
                ..Scratch::default()
            })),
            confirmed: FxHashMap::default(),
            readers: FxHashMap::default(),
            next_id: 1,
            stats: ExecutorStats::default(),
        }
    }

    /// Counters since the executor was made.
    pub fn stats(&self) -> ExecutorStats {
        self.stats
    }

    /// Whether a procedure of that name is registered here.
    pub fn knows(&self, procedure: &str) -> bool {
        self.procedures.get(procedure).is_ok()
    }

    /// Speculative runs waiting for their final delivery.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The optimistic delivery of `invocation` at `slot`: runs it on the objects as the runs
    /// before it left them. Slots must grow from one call to the next (a revocation resets
    /// that: slots from its bound on may come again).
    pub fn speculate(&mut self, slot: Slot, invocation: &Invocation) {
        let id = self.next_id;
        self.next_id += 1;
        let (reads, writes, outcome) = self.execute(invocation, true);
        {
            let mut scratch = self.scratch.lock();
            let buffers = scratch.buffers.get_or_insert_with(FxHashMap::default);
            for (key, value) in &writes {
                buffers.insert(
                    key.clone(),
                    Buffered {
                        run: id,
                        value: value.clone(),
                    },
                );
            }
        }
        for (_, seen) in &reads {
            if let Seen::Speculative(writer) = seen {
                self.name(*writer, 1);
            }
        }
        self.pending.push_back(Run {
            id,
            slot,
            reads,
            writes,
            outcome,
        });
        self.stats.speculated += 1;
    }

    /// The final delivery of `invocation` at `slot`, to be committed at log position
    /// `position` (positions grow with every commit): commits its speculative run if what it
    /// read is what the final order gives, else runs it again on the committed objects and
    /// commits that. Returns what it came to; the position counts as applied either way.
    /// `on_write` hears of each write committed (its key and tagged bytes, `None` deleting).
    pub fn finalize(
        &mut self,
        slot: Slot,
        position: u64,
        invocation: &Invocation,
        mut on_write: impl FnMut(&Key, Option<&[u8]>),
    ) -> Outcome {
        // Runs before this slot were revoked without a new optimistic delivery: they never
        // come; runs of this slot are its speculation.
        while self.pending.front().is_some_and(|r| r.slot < slot) {
            if let Some(stale) = self.pending.pop_front() {
                self.drop_run(stale);
            }
        }
        let speculated = match self.pending.front() {
            Some(r) if r.slot == slot => self.pending.pop_front(),
            _ => None,
        };
        let outcome = match speculated {
            Some(run) => {
                let reads: Vec<(Key, u64)> = run
                    .reads
                    .iter()
                    .map(|(key, seen)| (key.clone(), self.version_meant(*seen)))
                    .collect();
                let id = run.id;
                let outcome = run.outcome.clone();
                let writes = run.writes.clone();
                self.drop_run(run);
                if self.engine.version_of_all(&reads) {
                    for (key, value) in &writes {
                        on_write(key, value.as_deref());
                    }
                    self.engine.apply_certified(position, &[], writes);
                    self.stats.confirmed += 1;
                    if let Some(n) = self.readers.remove(&id) {
                        self.confirmed.insert(id, (position, n));
                    }
                    outcome
                } else {
                    self.rerun(position, invocation, on_write)
                }
            }
            None => self.rerun(position, invocation, on_write),
        };
        outcome
    }

    /// Optimistic deliveries from slot `from` on were revoked: their runs are dropped and the
    /// complete buffers rebuilt from the runs before them.
    pub fn revoke(&mut self, from: Slot) {
        while self.pending.back().is_some_and(|r| r.slot >= from) {
            if let Some(run) = self.pending.pop_back() {
                self.stats.revoked += 1;
                self.drop_run(run);
            }
        }
        let mut buffers = FxHashMap::default();
        for run in &self.pending {
            for (key, value) in &run.writes {
                buffers.insert(
                    key.clone(),
                    Buffered {
                        run: run.id,
                        value: value.clone(),
                    },
                );
            }
        }
        self.scratch.lock().buffers = Some(buffers);
    }

    /// Runs `invocation` at `position` on the committed objects and commits it without
    /// validation (nothing else writes meanwhile).
    fn rerun(
        &mut self,
        position: u64,
        invocation: &Invocation,
        mut on_write: impl FnMut(&Key, Option<&[u8]>),
    ) -> Outcome {
        self.stats.rerun += 1;
        let (_, writes, outcome) = self.execute(invocation, false);
        for (key, value) in &writes {
            on_write(key, value.as_deref());
        }
        self.engine.apply_certified(position, &[], writes);
        outcome
    }

    /// The committed version a recorded read stands for now (`u64::MAX`, which no version has,
    /// for a speculative version that was never committed as such).
    fn version_meant(&self, seen: Seen) -> u64 {
        match seen {
            Seen::Committed(v) => v,
            Seen::Speculative(writer) => self.confirmed.get(&writer).map_or(u64::MAX, |c| c.0),
        }
    }

    /// Counts `n` more (or, negative, fewer) pending reads of run `writer`'s versions; a
    /// confirmed run nobody reads any more is forgotten.
    fn name(&mut self, writer: u64, n: isize) {
        if let Some((_, count)) = self.confirmed.get_mut(&writer) {
            *count = count.saturating_add_signed(n);
            if *count == 0 {
                self.confirmed.remove(&writer);
            }
            return;
        }
        let count = self.readers.entry(writer).or_insert(0);
        *count = count.saturating_add_signed(n);
        if *count == 0 {
            self.readers.remove(&writer);
        }
    }

    /// Forgets a run that left the queue: its reads no longer name other runs, and its
    /// speculative versions still in the complete buffers go (once it is final they are
    /// committed or dead; later reads take the committed versions).
    fn drop_run(&mut self, run: Run) {
        for (_, seen) in &run.reads {
            if let Seen::Speculative(writer) = seen {
                self.name(*writer, -1);
            }
        }
        let mut scratch = self.scratch.lock();
        if let Some(buffers) = scratch.buffers.as_mut() {
            for (key, _) in &run.writes {
                if buffers.get(key).is_some_and(|b| b.run == run.id) {
                    buffers.remove(key);
                }
            }
        }
    }

    /// Runs `invocation` once, reading the complete buffers first when `speculative`, and
    /// returns what it read, what it wrote and what it came to.
    #[allow(clippy::type_complexity)]
    fn execute(
        &mut self,
        invocation: &Invocation,
        speculative: bool,
    ) -> (Vec<(Key, Seen)>, Vec<(Key, Option<Vec<u8>>)>, Outcome) {
        let procedure = match self.procedures.get(&invocation.procedure) {
            Ok(p) => p,
            Err(e) => return (Vec::new(), Vec::new(), Outcome::Failed(e.to_string())),
        };
        let stashed = {
            let mut scratch = self.scratch.lock();
            scratch.reads.clear();
            scratch.writes.clear();
            if speculative {
                None
            } else {
                Some(scratch.buffers.take())
            }
        };
        let source: Arc<dyn RemoteSource> = Arc::new(ExecutionSource {
            engine: self.engine.clone(),
            scratch: self.scratch.clone(),
        });
        let opts = TxOptions {
            max_attempts: Some(1),
            ..TxOptions::default()
        };
        // A panicking body fails its invocation on every replica alike; it must not take the
        // replica (and, replayed from the log at restart, take it again).
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.engine.run_on(&source, &opts, |tx| {
                procedure.call(tx, &invocation.arguments)
            })
        }));
        let result = run.unwrap_or_else(|_| {
            Err(TxError::abort(format!(
                "procedure {:?} panicked",
                invocation.procedure
            )))
        });
        let mut scratch = self.scratch.lock();
        if let Some(buffers) = stashed {
            scratch.buffers = buffers;
        }
        let reads = std::mem::take(&mut scratch.reads);
        match result {
            Ok(bytes) => (
                reads,
                std::mem::take(&mut scratch.writes),
                Outcome::Returned(bytes),
            ),
            Err(e) => {
                scratch.writes.clear();
                (reads, Vec::new(), Outcome::Failed(e.to_string()))
            }
        }
    }
}

/// Attempts of executions: reads from the complete buffers (when present) or the committed
/// objects, writes recorded instead of committed.
struct ExecutionSource {
    engine: Arc<Engine>,
    scratch: Arc<Mutex<Scratch>>,
}

impl RemoteSource for ExecutionSource {
    fn begin(&self) -> Box<dyn RemoteAttempt> {
        Box::new(ExecutionAttempt {
            engine: self.engine.clone(),
            scratch: self.scratch.clone(),
        })
    }

    fn release_abstract(&self, _family: u64, _names: Vec<String>) {}
}

struct ExecutionAttempt {
    engine: Arc<Engine>,
    scratch: Arc<Mutex<Scratch>>,
}

impl RemoteAttempt for ExecutionAttempt {
    fn read(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError> {
        let mut scratch = self.scratch.lock();
        if let Some(b) = scratch.buffers.as_ref().and_then(|b| b.get(key)) {
            let (run, value) = (b.run, b.value.clone());
            scratch.reads.push((key.clone(), Seen::Speculative(run)));
            return Ok(value);
        }
        drop(scratch);
        let (version, value) = self
            .engine
            .newest_encoded(key)
            .map_err(|_| RemoteError::Conflict(AbortCause::ReadValidation))?;
        self.scratch
            .lock()
            .reads
            .push((key.clone(), Seen::Committed(version)));
        Ok(value)
    }

    fn commit(&mut self, writes: Vec<(Key, Option<Vec<u8>>)>) -> Result<(), RemoteError> {
        self.scratch.lock().writes = writes;
        Ok(())
    }

    fn abstract_lock(&mut self, _family: u64, _name: &str) -> Result<bool, RemoteError> {
        // Never reached: a confined attempt refuses abstract locks before asking.
        Ok(false)
    }

    fn forget(&mut self, keys: &[Key]) {
        self.scratch.lock().reads.retain(|(k, _)| !keys.contains(k));
    }

    fn abort(&mut self) {}

    fn confined(&self) -> bool {
        true
    }
}

impl Engine {
    /// Runs `f` as one transaction whose reads and commit go through `source` (see
    /// [`RemoteSource`]), whatever protocol the engine runs otherwise. Errors as
    /// [`Engine::run`].
    pub fn run_on<R, E: From<TxError>>(
        &self,
        source: &Arc<dyn RemoteSource>,
        opts: &TxOptions,
        f: impl FnMut(&mut crate::tx::Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        match self.run_remote(source, opts, 0, false, f) {
            Ok((r, _)) => Ok(r),
            Err(crate::engine::RunError::User(e)) => Err(e),
            Err(crate::engine::RunError::Tx(e)) => Err(E::from(e)),
        }
    }

    /// The newest committed version of `key` (0: never written) and its value as tagged
    /// bytes (`None`: absent or deleted). Fails if the value cannot be encoded.
    pub fn newest_encoded(&self, key: &Key) -> Result<(u64, Option<Vec<u8>>), String> {
        let cell = self.store.cell(key);
        let mut st = self.take_state();
        st.begin(self, Mode::ReadOnly);
        // SAFETY: the store keeps its cells for the engine's lifetime.
        let found = st.snapshot_version(self, unsafe { &*cell });
        let out = match found {
            None => Ok((self.version_of(key), None)),
            Some(v) => {
                // SAFETY: the attempt's published start keeps the version alive.
                let v = unsafe { &*v };
                v.encode()
                    .map(|bytes| (v.ts, bytes))
                    .map_err(|e| e.to_string())
            }
        };
        st.end_attempt();
        self.put_state(st);
        out
    }
}
