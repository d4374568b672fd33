//! A running transaction: its snapshot, read set, write set, and the operations the closure of an
//! atomic section calls.

use std::cell::UnsafeCell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::cell::{decode, owner_word, Cell, LockState, Retired};
use crate::contention::{ContentionPolicy, Jitter, OnLocked, LOCK_WAIT_SPINS};
use crate::engine::Engine;
use crate::error::TxError;
use crate::history::CommitRecord;
use crate::key::Key;
use crate::pool::BlockPool;
use crate::remote::RemoteState;
use crate::slots::{Garbage, Slot, UNSTAMPED};
use crate::stats::{AbortCause, Event};
use crate::tref::{Object, TRef};
use crate::version::{OwnedVersion, Version};

/// Write sets up to this size are searched linearly; larger ones through a hash index.
const LINEAR_WRITES: usize = 16;
/// A thread recomputes the reclamation horizon and frees its garbage after this many commits,
/// or once it holds this many retired chains.
const HORIZON_EVERY: u32 = 64;
const GARBAGE_LIMIT: usize = 256;

/// How an attempt reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Reads the multi-version snapshot at `TxState::ub`; never aborts; keeps no read set.
    ReadOnly,
    /// Reads the newest versions, validated against `TxState::ub`, extended when possible.
    Update,
}

/// A read of a committed version.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadEntry {
    pub(crate) cell: *const Cell,
    pub(crate) version: u64,
}

impl ReadEntry {
    /// The cell's lock word as it is while the version read is still the newest and unlocked.
    #[inline]
    fn current_word(&self) -> u64 {
        self.version << 1
    }

    /// Whether the version read is still the cell's newest, and the cell is unlocked.
    #[inline]
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: cells live as long as their engine's store.
        unsafe { &*self.cell }.lock_word() == self.current_word()
    }
}

/// A buffered write: the version node it will install (a deletion marker deletes the object).
/// `None` once installed.
pub(crate) struct WriteEntry {
    pub(crate) cell: *const Cell,
    pub(crate) node: Option<OwnedVersion>,
    /// The lock word the cell had when commit locked it.
    pub(crate) locked_from: u64,
}

/// Why a commit did not happen.
pub(crate) enum CommitFailure {
    /// A conflict: the attempt is rolled back and re-run (or resumed).
    Abort(AbortCause),
    /// The transaction ends with this error, not re-run.
    Fatal(TxError),
}

impl From<AbortCause> for CommitFailure {
    fn from(c: AbortCause) -> Self {
        CommitFailure::Abort(c)
    }
}

/// Why an operation stopped early: the attempt must be abandoned. Small, so the read path
/// returns it in registers; it becomes a [`TxError`] at the public boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    Conflict,
    Retry,
}

impl From<Signal> for TxError {
    #[inline]
    fn from(s: Signal) -> TxError {
        match s {
            Signal::Conflict => TxError::Conflict,
            Signal::Retry => TxError::Retry,
        }
    }
}

/// What a transaction sees of an object: no version at all, or a version, which may be a
/// deletion marker (its type table says so; checking it is left to the caller, so the plain read
/// path reads the table only once).
pub(crate) enum Seen {
    Absent,
    Present(*const Version),
}

impl Seen {
    /// Whether the object exists.
    #[inline]
    fn exists(&self) -> bool {
        match self {
            Seen::Absent => false,
            // SAFETY: the version is kept alive until the attempt ends.
            Seen::Present(p) => unsafe { &**p }.is_present(),
        }
    }
}

/// What a version pointer (null: never written) shows.
#[inline]
fn seen_of(v: *const Version) -> Seen {
    if v.is_null() {
        Seen::Absent
    } else {
        Seen::Present(v)
    }
}

/// Action run as its own transaction after the top-level transaction commits or aborts.
pub(crate) type Handler = Box<dyn FnMut(&mut Tx<'_>) -> Result<(), TxError> + Send>;

pub(crate) struct HandlerEntry {
    pub(crate) on_commit: bool,
    pub(crate) run: Handler,
}

/// A point a transaction can roll back to (closed nesting, checkpoints).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    pub(crate) reads: usize,
    pub(crate) writes: usize,
    pub(crate) undo: usize,
    pub(crate) handlers: usize,
    pub(crate) undo_floor: usize,
}

/// The reusable per-thread state behind a [`Tx`]. Its vectors keep their capacity between
/// transactions, so a warmed-up thread allocates nothing for bookkeeping.
pub(crate) struct TxState {
    pub(crate) engine_id: u64,
    pub(crate) slot: Arc<Slot>,
    pub(crate) mode: Mode,
    /// Read-only was asked for by the caller (a write is then an error, not an upgrade).
    pub(crate) explicit_read_only: bool,
    /// Snapshot upper bound: every version read is at or below it.
    pub(crate) ub: u64,
    pub(crate) reads: Vec<ReadEntry>,
    pub(crate) writes: Vec<WriteEntry>,
    write_index: FxHashMap<usize, usize>,
    write_filter: u64,
    /// Values replaced inside a nested block or checkpointed step: (write index, old value).
    undo: Vec<(usize, Option<OwnedVersion>)>,
    /// Writes below this index belong to an enclosing block and are undo-logged when replaced.
    undo_floor: usize,
    /// Replaced values kept alive until the attempt ends: references to them may be held.
    retired: Vec<OwnedVersion>,
    /// Version chains this thread unlinked, waiting until no attempt can hold them.
    garbage: Garbage,
    /// Blocks of freed versions, for the versions this state makes next.
    pub(crate) pool: BlockPool,
    /// Garbage size that triggers the next scan (see `after_commit`).
    garbage_limit: usize,
    /// Inside an attempt (its start is published in the slot).
    in_attempt: bool,
    /// Set when the attempt must abort; every later operation fails fast.
    pub(crate) abort: Option<AbortCause>,
    pub(crate) priority: u16,
    /// Start clock of the first attempt: the transaction's age for contention management.
    pub(crate) age: u64,
    pub(crate) policy: ContentionPolicy,
    pub(crate) jitter: Jitter,
    pub(crate) handlers: Vec<HandlerEntry>,
    /// Abstract locks this transaction acquired (released when the top-level transaction ends).
    pub(crate) abstract_locks: Vec<String>,
    /// Identity under which abstract locks are held (0 until first needed).
    pub(crate) owner: u64,
    /// Open-nested transactions hand their locks and handlers to their parent.
    pub(crate) open_nested: bool,
    /// The attempt called a writing operation (even if it aborted before buffering the write).
    pub(crate) wants_write: bool,
    /// This transaction's claim on being urgent (0: none; see `urgent`).
    pub(crate) urgent: u64,
    /// A linked attempt's base (see `linked`).
    pub(crate) link: Option<Box<crate::linked::LinkState>>,
    /// Forward validation (replicated engines): the attempt re-validates its reads at its
    /// next operation once a commit was applied since it last looked.
    forward: bool,
    /// The engine's applied position when the attempt last validated.
    applied_seen: u64,
    commits_since_horizon: u32,
    /// Set while the attempt runs under a distributed protocol (see `remote`).
    pub(crate) remote: Option<Box<RemoteState>>,
}

impl TxState {
    pub(crate) fn new(engine: &Engine) -> TxState {
        let slot = engine.slots.register();
        let seed = Arc::as_ptr(&slot) as u64 ^ engine.id.rotate_left(32);
        TxState {
            engine_id: engine.id,
            slot,
            mode: Mode::Update,
            explicit_read_only: false,
            ub: 0,
            reads: Vec::new(),
            writes: Vec::new(),
            write_index: FxHashMap::default(),
            write_filter: 0,
            undo: Vec::new(),
            undo_floor: 0,
            retired: Vec::new(),
            garbage: Vec::new(),
            pool: BlockPool::new(),
            garbage_limit: GARBAGE_LIMIT,
            in_attempt: false,
            abort: None,
            priority: 0,
            age: 0,
            policy: ContentionPolicy::default(),
            jitter: Jitter::new(seed),
            handlers: Vec::new(),
            abstract_locks: Vec::new(),
            owner: 0,
            open_nested: false,
            wants_write: false,
            urgent: 0,
            link: None,
            forward: false,
            applied_seen: 0,
            commits_since_horizon: 0,
            remote: None,
        }
    }

    #[inline]
    pub(crate) fn bump(&self, e: Event) {
        self.slot.counters.bump(e);
    }

    /// Starts an attempt in `mode`.
    pub(crate) fn begin(&mut self, engine: &Engine, mode: Mode) {
        self.mode = mode;
        self.abort = None;
        self.wants_write = false;
        self.forward = engine.config().replicated;
        self.applied_seen = engine.applied.load(Ordering::Acquire);
        // Publishing the start protects every version this attempt reaches (see `slots`), and
        // is the snapshot of a read-only attempt.
        self.ub = self.slot.begin(&engine.slots, &engine.clock);
        self.in_attempt = true;
    }

    /// Ends an attempt: forgets everything it read and wrote and unpublishes its start, after
    /// which it holds no reference to any version.
    #[inline]
    pub(crate) fn end_attempt(&mut self) {
        self.reads.clear();
        // Versions still buffered (an attempt that did not commit) and replaced ones: nothing
        // outside this state ever saw them.
        for w in &mut self.writes {
            if let Some(node) = w.node.take() {
                node.recycle(&mut self.pool);
            }
        }
        self.writes.clear();
        if !self.write_index.is_empty() {
            self.write_index.clear();
        }
        self.write_filter = 0;
        self.link = None;
        if !self.undo.is_empty() {
            for (_, node) in &mut self.undo {
                if let Some(node) = node.take() {
                    node.recycle(&mut self.pool);
                }
            }
            self.undo.clear();
        }
        self.undo_floor = 0;
        while let Some(node) = self.retired.pop() {
            node.recycle(&mut self.pool);
        }
        if self.in_attempt {
            self.slot.end();
            self.in_attempt = false;
        }
    }

    #[inline]
    fn fail(&mut self, cause: AbortCause) -> Signal {
        if self.abort.is_none() {
            self.abort = Some(cause);
        }
        Signal::Conflict
    }

    #[inline]
    fn check_live(&self) -> Result<(), Signal> {
        match self.abort {
            None => Ok(()),
            Some(AbortCause::ExplicitRetry) => Err(Signal::Retry),
            Some(_) => Err(Signal::Conflict),
        }
    }

    #[inline]
    fn filter_bit(cell: *const Cell) -> u64 {
        1u64 << ((cell as usize >> 4) & 63)
    }

    #[inline]
    pub(crate) fn find_write(&self, cell: *const Cell) -> Option<usize> {
        if self.write_filter & Self::filter_bit(cell) == 0 {
            return None;
        }
        if self.writes.len() <= LINEAR_WRITES {
            self.writes.iter().rposition(|w| std::ptr::eq(w.cell, cell))
        } else {
            self.write_index.get(&(cell as usize)).copied()
        }
    }

    #[inline]
    pub(crate) fn push_write(&mut self, cell: *const Cell, node: OwnedVersion) {
        let idx = self.writes.len();
        self.writes.push(WriteEntry {
            cell,
            node: Some(node),
            locked_from: 0,
        });
        self.write_filter |= Self::filter_bit(cell);
        if idx >= LINEAR_WRITES {
            self.index_write(idx);
        }
    }

    /// Keeps the hash index of a write set past its linear size up to date with entry `idx`.
    #[cold]
    fn index_write(&mut self, idx: usize) {
        if idx == LINEAR_WRITES {
            for (i, w) in self.writes.iter().enumerate() {
                self.write_index.insert(w.cell as usize, i);
            }
        } else {
            self.write_index.insert(self.writes[idx].cell as usize, idx);
        }
    }

    fn replace_write(&mut self, idx: usize, node: OwnedVersion) {
        let old = self.writes[idx].node.replace(node);
        if idx < self.undo_floor {
            self.undo.push((idx, old));
        } else if let Some(old) = old {
            self.retired.push(old);
        }
    }

    /// Multi-version read at the snapshot: waits out a committer, never aborts.
    #[inline(always)]
    fn read_snapshot(&mut self, engine: &Engine, cell: &Cell) -> Seen {
        let mut spins = 0u32;
        // A committer that holds the lock may be installing a version at or below our snapshot
        // (it took its timestamp before we took ours): wait for it. Lock hold times are short.
        while let LockState::Held { .. } = decode(cell.lock_word()) {
            spins += 1;
            if spins < LOCK_WAIT_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        debug_assert!(self.in_attempt, "read outside an attempt");
        let mut cur = cell.head();
        let mut found = (0, Seen::Absent);
        // SAFETY: our published start keeps every version we can reach from being freed, and the
        // horizon keeps the one our snapshot needs linked.
        while let Some(v) = unsafe { cur.as_ref() } {
            if v.ts <= self.ub {
                found = (v.ts, seen_of(cur));
                break;
            }
            cur = v.prev.load(Ordering::Acquire);
        }
        let (version, seen) = found;
        if engine.history.is_some() {
            self.reads.push(ReadEntry { cell, version });
        }
        seen
    }

    /// Read of the newest version, validated against the snapshot bound.
    fn read_latest(&mut self, engine: &Engine, cell: &Cell) -> Result<Seen, Signal> {
        let mut spins = 0u32;
        loop {
            let l1 = cell.lock_word();
            let version = match decode(l1) {
                LockState::Free(v) => v,
                LockState::Held { priority, age } => {
                    spins += 1;
                    if spins < LOCK_WAIT_SPINS
                        && self
                            .policy
                            .on_locked(self.priority, self.age, priority, age)
                            == OnLocked::Wait
                    {
                        std::hint::spin_loop();
                        continue;
                    }
                    engine.note_conflict_of(Some(cell), &[]);
                    return Err(self.fail(AbortCause::ReadLocked));
                }
            };
            debug_assert!(self.in_attempt, "read outside an attempt");
            // The head is kept alive by our published start (see `read_snapshot`).
            let seen = seen_of(cell.head());
            if cell.lock_word() != l1 {
                continue;
            }
            // Record the read first: an extension must validate it too, or a commit that takes
            // a timestamp at or below the new bound after this read could write this object
            // unseen (found by `transactions_never_observe_inconsistent_state`).
            self.reads.push(ReadEntry { cell, version });
            if version > self.ub && !self.extend(engine) {
                engine.note_conflict_of(None, &self.reads);
                return Err(self.fail(AbortCause::ReadValidation));
            }
            return Ok(seen);
        }
    }

    /// Whether every read in `reads[..upto]` still names the newest version of its cell.
    pub(crate) fn reads_valid(&self, upto: usize) -> bool {
        self.reads[..upto].iter().all(ReadEntry::is_current)
    }

    /// Lazy snapshot extension: move the bound to now if nothing read has changed.
    pub(crate) fn extend(&mut self, engine: &Engine) -> bool {
        self.extend_prefix(engine, self.reads.len())
    }

    /// Extends the snapshot to now if `reads[..upto]` are unchanged (those after are about to be
    /// dropped by a partial rollback).
    pub(crate) fn extend_prefix(&mut self, engine: &Engine, upto: usize) -> bool {
        let now = engine.clock.load(Ordering::Acquire);
        if self.reads_valid(upto) && self.link_guards_hold() {
            self.ub = now;
            self.bump(Event::SnapshotExtension);
            true
        } else {
            false
        }
    }

    /// A mark to roll back to later.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            reads: self.reads.len(),
            writes: self.writes.len(),
            undo: self.undo.len(),
            handlers: self.handlers.len(),
            undo_floor: self.undo_floor,
        }
    }

    /// Makes writes made from now on undo-logged when they replace earlier ones.
    pub(crate) fn open_scope(&mut self) {
        self.undo_floor = self.writes.len();
    }

    /// Ends the scope opened after `mark` without rolling back.
    pub(crate) fn close_scope(&mut self, mark: &Mark) {
        self.undo_floor = mark.undo_floor;
    }

    /// Undoes everything done since `mark` and returns the on-abort handlers registered since
    /// then (to be run by the caller, latest first).
    pub(crate) fn rollback_to(&mut self, mark: &Mark) -> Vec<HandlerEntry> {
        self.reads.truncate(mark.reads);
        // The versions written since the mark were never published: their blocks go back to
        // the pool.
        while self.undo.len() > mark.undo {
            let (idx, old) = self.undo.pop().expect("undo entry");
            if let Some(node) = std::mem::replace(&mut self.writes[idx].node, old) {
                node.recycle(&mut self.pool);
            }
        }
        if self.writes.len() > mark.writes {
            for w in self.writes.drain(mark.writes..) {
                self.write_index.remove(&(w.cell as usize));
                if let Some(node) = w.node {
                    node.recycle(&mut self.pool);
                }
            }
            if self.writes.len() <= LINEAR_WRITES {
                self.write_index.clear();
            }
            self.write_filter = self
                .writes
                .iter()
                .fold(0, |f, w| f | Self::filter_bit(w.cell));
        }
        self.undo_floor = mark.undo_floor;
        self.abort = None;
        let mut aborted: Vec<HandlerEntry> = self
            .handlers
            .drain(mark.handlers..)
            .filter(|h| !h.on_commit)
            .collect();
        aborted.reverse();
        aborted
    }

    /// Commit: lock the write set, take a timestamp, validate the read set, install, unlock.
    /// On failure every lock is released and the read and write sets are kept (a checkpointed
    /// transaction may resume from them).
    ///
    /// Inlined: a transaction that wrote nothing (most of them in read-mostly workloads) ends
    /// here without a call; the write path is out of line.
    #[inline]
    pub(crate) fn commit(&mut self, engine: &Engine) -> Result<(), CommitFailure> {
        if self.link.is_some() {
            return self.commit_linked(engine);
        }
        if self.mode == Mode::ReadOnly || self.writes.is_empty() {
            if let Some(h) = &engine.history {
                h.record(self.record(engine, None));
            }
            self.bump(Event::Commit);
            if self.mode == Mode::ReadOnly {
                self.bump(Event::ReadOnlyCommit);
            }
            return Ok(());
        }
        self.commit_writes(engine)
    }

    /// The commit of a transaction that wrote (see [`TxState::commit`]).
    #[inline(never)]
    fn commit_writes(&mut self, engine: &Engine) -> Result<(), CommitFailure> {
        if let Some(certifier) = engine.certifier() {
            return self.commit_certified(engine, certifier);
        }
        engine.urgent.yield_to_higher(self.priority, self.urgent);
        let owner = owner_word(self.priority, self.age);
        for i in 0..self.writes.len() {
            // SAFETY: cells live as long as their engine's store.
            let cell = unsafe { &*self.writes[i].cell };
            let mut spins = 0u32;
            loop {
                let word = cell.lock_word();
                match decode(word) {
                    LockState::Free(_) => {
                        if cell.try_lock(word, owner) {
                            self.writes[i].locked_from = word;
                            break;
                        }
                    }
                    LockState::Held { priority, age } => {
                        spins += 1;
                        if spins >= LOCK_WAIT_SPINS
                            || self
                                .policy
                                .on_locked(self.priority, self.age, priority, age)
                                == OnLocked::Abort
                        {
                            self.unlock_first(i);
                            engine.note_conflict_of(Some(self.writes[i].cell), &[]);
                            return Err(AbortCause::LockConflict.into());
                        }
                        std::hint::spin_loop();
                    }
                }
            }
        }
        // Global version clock (TL2's GV1): one fetch-and-add, which never fails and moves the
        // clock's cache line once (a load then a compare-and-swap moved it twice under
        // contention). Nothing committed since the snapshot if the clock still stood at its bound.
        let cur = engine.clock.fetch_add(1, Ordering::AcqRel);
        let (wv, alone) = (cur + 1, cur == self.ub);
        if !alone && !self.validate_locked() {
            self.unlock_first(self.writes.len());
            engine.note_conflict_of(None, &self.reads);
            return Err(AbortCause::CommitValidation.into());
        }
        let horizon = engine.slots.horizon();
        for w in &mut self.writes {
            // SAFETY: cells live as long as their engine's store; we hold the lock.
            let cell = unsafe { &*w.cell };
            let retired = cell.install(w.node.take().expect("write installed twice"), wv, horizon);
            cell.unlock(wv);
            if !retired.is_empty() {
                // Stamped at the next scan (see `after_commit`).
                self.garbage.push((UNSTAMPED, retired));
            }
        }
        if let Some(h) = &engine.history {
            h.record(self.record(engine, Some(wv)));
        }
        engine.retry_signal.notify();
        self.bump(Event::Commit);
        self.commits_since_horizon += 1;
        Ok(())
    }

    /// Commit through the ordered log (see `ordered`): abort early if a read is already stale,
    /// else send the reads' versions and the encoded writes to be certified, and wait for the
    /// verdict and for this replica to apply it. The write set stays buffered here (a
    /// checkpointed transaction may resume from it after a conflict).
    fn commit_certified(
        &mut self,
        engine: &Engine,
        certifier: &dyn crate::ordered::Certifier,
    ) -> Result<(), CommitFailure> {
        use crate::ordered::{Certification, Verdict};
        if !self.reads_valid(self.reads.len()) {
            engine.note_conflict_of(None, &self.reads);
            return Err(AbortCause::CommitValidation.into());
        }
        let reads = self.named_reads(engine)?;
        let mut writes = Vec::with_capacity(self.writes.len());
        for w in &self.writes {
            writes.push(encoded_write(engine, w)?);
        }
        match certifier.certify(Certification { reads, writes }) {
            Ok(Verdict::Committed { version }) => {
                // The commit is decided; waiting gives read-your-writes on this replica, and
                // after the limit the caller goes on anyway.
                let limit = std::time::Instant::now() + crate::ordered::APPLY_WAIT;
                engine.wait_applied(version, Some(limit));
                if let Some(h) = &engine.history {
                    h.record(self.record(engine, Some(version)));
                }
                self.bump(Event::Commit);
                Ok(())
            }
            Ok(Verdict::Conflict) => {
                engine.note_conflict_of(None, &self.reads);
                Err(AbortCause::CommitValidation.into())
            }
            Err(crate::ordered::CertifyError::OutcomeUnknown(reason)) => {
                Err(CommitFailure::Fatal(TxError::OutcomeUnknown { reason }))
            }
            Err(crate::ordered::CertifyError::Refused(reason)) => {
                Err(CommitFailure::Fatal(TxError::Refused { reason }))
            }
        }
    }

    /// Forward validation (OSS: an incoming write set aborts the running transactions whose
    /// reads it meets, first wins): once a commit was applied since this attempt last looked,
    /// it checks that nothing it read was replaced, and fails at once if something was.
    #[inline]
    fn validate_forward(&mut self, engine: &Engine) -> Result<(), Signal> {
        let applied = engine.applied.load(Ordering::Acquire);
        if applied == self.applied_seen {
            return Ok(());
        }
        self.applied_seen = applied;
        self.validate_now(engine)
    }

    /// Fails the attempt if something it read (or its linked base read) was replaced.
    fn validate_now(&mut self, engine: &Engine) -> Result<(), Signal> {
        if self.reads_valid(self.reads.len()) && self.link_guards_hold() {
            return Ok(());
        }
        engine.note_conflict_of(None, &self.reads);
        Err(self.fail(AbortCause::ReadValidation))
    }

    /// Every read, named by its key, with the version read (a replicated engine keeps keys).
    pub(crate) fn named_reads(&self, engine: &Engine) -> Result<Vec<(Key, u64)>, CommitFailure> {
        self.reads
            .iter()
            .map(|r| Ok((name_of(engine, r.cell)?, r.version)))
            .collect()
    }

    /// Read-set validation while holding the write set's locks.
    fn validate_locked(&self) -> bool {
        self.reads.iter().all(|r| {
            // SAFETY: cells live as long as their engine's store.
            let word = unsafe { &*r.cell }.lock_word();
            if word == r.current_word() {
                return true;
            }
            match decode(word) {
                // Locked by us: valid if it was current when we locked it.
                LockState::Held { .. } => match self.find_write(r.cell) {
                    Some(i) => self.writes[i].locked_from == r.current_word(),
                    None => false,
                },
                LockState::Free(_) => false,
            }
        })
    }

    fn unlock_first(&self, n: usize) {
        for w in &self.writes[..n] {
            // SAFETY: cells live as long as their engine's store; we hold these locks.
            let cell = unsafe { &*w.cell };
            cell.unlock(w.locked_from >> 1);
        }
    }

    fn record(&self, engine: &Engine, wv: Option<u64>) -> CommitRecord {
        CommitRecord {
            reads: self
                .reads
                .iter()
                .map(|r| (engine.store.key_of(r.cell), r.version))
                .collect(),
            writes: match wv {
                Some(wv) => self
                    .writes
                    .iter()
                    .map(|w| (engine.store.key_of(w.cell), wv))
                    .collect(),
                None => Vec::new(),
            },
        }
    }

    /// Keeps a chain unlinked from a cell until no attempt can hold it.
    pub(crate) fn retire(&mut self, retired: Retired) {
        // Stamped at the next scan (see `after_commit`).
        self.garbage.push((UNSTAMPED, retired));
    }

    /// Counts an install made outside a transaction (the ordered applier) towards the next
    /// reclamation scan.
    pub(crate) fn count_commit(&mut self) {
        self.commits_since_horizon += 1;
    }

    /// The version of `cell` this read-only attempt's snapshot sees (`None`: never written).
    pub(crate) fn snapshot_version(
        &mut self,
        engine: &Engine,
        cell: &Cell,
    ) -> Option<*const Version> {
        match self.read_snapshot(engine, cell) {
            Seen::Absent => None,
            Seen::Present(v) => Some(v),
        }
    }

    /// Bookkeeping after a successful commit: every so often, advance the horizon and free the
    /// garbage no attempt can hold any more.
    #[inline]
    pub(crate) fn after_commit(&mut self, engine: &Engine) {
        self.end_attempt();
        if self.commits_since_horizon >= HORIZON_EVERY || self.garbage.len() >= self.garbage_limit {
            self.reclaim(engine);
        }
    }

    /// Advances the horizon and frees the garbage no attempt can hold any more.
    #[inline(never)]
    fn reclaim(&mut self, engine: &Engine) {
        self.commits_since_horizon = 0;
        // Stamp what was unlinked since the last scan with a clock value read after the
        // unlinking (behind a fence): any such value is a valid, conservative stamp.
        fence(Ordering::SeqCst);
        let stamp = engine.clock.load(Ordering::Relaxed);
        for g in self.garbage.iter_mut().rev() {
            if g.0 != UNSTAMPED {
                break;
            }
            g.0 = stamp;
        }
        let oldest = engine.slots.scan(&engine.clock);
        let pool = &mut self.pool;
        self.garbage.retain_mut(|(stamp, chain)| {
            if *stamp >= oldest {
                return true;
            }
            std::mem::replace(chain, Retired(std::ptr::null_mut())).recycle(pool);
            false
        });
        // While an old attempt (a long or preempted transaction) blocks freeing, scan
        // again only once the garbage has doubled: linear work per commit stays constant.
        self.garbage_limit = GARBAGE_LIMIT.max(2 * self.garbage.len());
    }
}

impl Drop for TxState {
    fn drop(&mut self) {
        self.end_attempt();
        self.slot.orphan(std::mem::take(&mut self.garbage));
    }
}

/// The handle an atomic section's closure receives.
///
/// Every operation validates what it reads: the closure never observes a state that no serial
/// execution produces (opacity), even in an attempt that later aborts. When an operation returns
/// [`TxError::Conflict`] or [`TxError::Retry`], return it with `?`; the engine re-runs the
/// closure. References handed out by [`Tx::read`] stay valid until the closure returns.
pub struct Tx<'e> {
    pub(crate) engine: &'e Engine,
    pub(crate) state: UnsafeCell<Box<TxState>>,
    /// The scheduled task this transaction runs in, if any: its operations are safe points.
    task: Option<atomos_sched::TaskHandle>,
}

impl<'e> Tx<'e> {
    pub(crate) fn new(engine: &'e Engine, state: Box<TxState>) -> Tx<'e> {
        Tx {
            engine,
            state: UnsafeCell::new(state),
            task: atomos_sched::current(),
        }
    }

    pub(crate) fn into_state(self) -> Box<TxState> {
        self.state.into_inner()
    }

    /// The transaction's state.
    ///
    /// SAFETY (for every caller): `Tx` is `!Sync`, no operation calls back into application code
    /// while it holds this borrow, and references handed to the application point into heap
    /// values that the state keeps alive until the attempt ends, never into the state itself.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) fn st(&self) -> &mut TxState {
        unsafe { &mut *self.state.get() }
    }

    /// A safe point: in a scheduled task (see `atomos_sched`), the transaction is suspended
    /// here if a more urgent request waits for its worker. Every operation starts with one,
    /// before it touches anything, so an operation itself is never interrupted.
    /// After a suspension it checks what it read (as [`Tx::check`] does): an attempt whose
    /// reads were replaced meanwhile stops here rather than finish work that cannot commit.
    #[inline]
    fn safe_point(&self) -> Result<(), TxError> {
        match &self.task {
            Some(task) if task.safe_point() => self.validate_reads(),
            _ => Ok(()),
        }
    }

    /// An explicit safe point between operations (for a long computation that reads nothing):
    /// under a transaction service with preemption, a more urgent request may take the worker
    /// here; the transaction resumes later, perhaps on another worker, with its snapshot
    /// intact, and fails with [`TxError::Conflict`] (re-running it) if something it read was
    /// replaced while it waited. Does nothing outside the service.
    pub fn yield_now(&self) -> Result<(), TxError> {
        self.safe_point()
    }

    /// Validates the reads so far (a snapshot and a remote attempt have nothing to check here).
    #[cold]
    fn validate_reads(&self) -> Result<(), TxError> {
        if self.remote().is_some() {
            return Ok(());
        }
        let st = self.st();
        if st.mode == Mode::ReadOnly {
            return Ok(());
        }
        st.check_live()?;
        Ok(st.validate_now(self.engine)?)
    }

    /// The engine this transaction runs on.
    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    /// The remote state, when the attempt runs under a distributed protocol.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn remote(&self) -> Option<&mut RemoteState> {
        self.st().remote.as_deref_mut()
    }

    #[inline]
    fn cell<T>(&self, r: &TRef<T>) -> &'e Cell {
        let cell: *const Cell = match r.cached(self.engine.id) {
            Some(c) => c,
            None => {
                let c = self.engine.store.cell(r.key());
                r.remember(self.engine.id, c);
                c
            }
        };
        // SAFETY: the store holds every cell for the engine's lifetime.
        unsafe { &*cell }
    }

    /// What the transaction sees of `cell`: its own buffered write, else the committed state.
    #[inline(always)]
    fn see(&self, cell: &Cell) -> Result<Seen, Signal> {
        self.see_entry(cell).map(|(seen, _)| seen)
    }

    /// As [`Tx::see`], with the index of the transaction's own buffered write to `cell`, if it
    /// has one (a writing operation then replaces it without searching again).
    #[inline(always)]
    fn see_entry(&self, cell: &Cell) -> Result<(Seen, Option<usize>), Signal> {
        let st = self.st();
        if st.mode == Mode::ReadOnly {
            // A snapshot read: no write set to consult, no conflict to fail fast on.
            return Ok((st.read_snapshot(self.engine, cell), None));
        }
        st.check_live()?;
        if st.forward {
            st.validate_forward(self.engine)?;
        }
        if let Some(i) = st.find_write(cell) {
            st.note_link_touch(i);
            let node = st.writes[i]
                .node
                .as_ref()
                .map_or(std::ptr::null(), OwnedVersion::as_ptr);
            return Ok((seen_of(node), Some(i)));
        }
        Ok((st.read_latest(self.engine, cell)?, None))
    }

    #[inline]
    /// The value `seen` shows as a `T`. The caller bounds `'a` by its borrow of the transaction,
    /// which keeps the version alive.
    fn typed<'a, T: Object>(key: &Key, seen: Seen) -> Result<&'a T, TxError> {
        match seen {
            Seen::Absent => Err(TxError::NotFound { key: key.clone() }),
            // SAFETY: the version is kept alive until the attempt ends (see `Tx::st`).
            Seen::Present(p) => match unsafe { &*p }.get::<T>() {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(TxError::NotFound { key: key.clone() }),
                Err(()) => Err(TxError::WrongType {
                    key: key.clone(),
                    expected: std::any::type_name::<T>(),
                }),
            },
        }
    }

    /// The object's value, shared (not copied).
    #[inline(always)]
    pub fn read<T: Object>(&self, r: &TRef<T>) -> Result<&T, TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.read(r.key());
        }
        let cell = self.cell(r);
        let seen = self.see(cell)?;
        Self::typed(r.key(), seen)
    }

    /// Whether the object exists.
    pub fn exists<T: Object>(&self, r: &TRef<T>) -> Result<bool, TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.exists::<T>(r.key());
        }
        let cell = self.cell(r);
        Ok(self.see(cell)?.exists())
    }

    /// Buffers a write; the caller has passed `upgrade_check` and seen the object, finding
    /// its own earlier write to it at `earlier` (see [`Tx::see_entry`]).
    #[inline]
    fn buffer(&self, cell: &Cell, earlier: Option<usize>, node: OwnedVersion) {
        let st = self.st();
        match earlier {
            Some(i) => st.replace_write(i, node),
            None => st.push_write(cell, node),
        }
    }

    /// A new version of the object, made from this transaction's block pool.
    #[inline]
    fn new_version<T: Object>(&self, value: Option<T>) -> OwnedVersion {
        OwnedVersion::new_in(value, &mut self.st().pool)
    }

    /// Called before any write: a read-only attempt cannot write (an explicit one fails, a
    /// detected one re-runs as an update transaction); an update attempt notes that it writes.
    fn upgrade_check(&self, key: &Key) -> Result<(), TxError> {
        let st = self.st();
        st.wants_write = true;
        if st.mode == Mode::ReadOnly {
            st.check_live()?;
            if st.explicit_read_only {
                return Err(TxError::WriteInReadOnly { key: key.clone() });
            }
            return Err(st.fail(AbortCause::Upgrade).into());
        }
        Ok(())
    }

    /// Replaces the value of an existing object.
    pub fn write<T: Object>(&self, r: &TRef<T>, value: T) -> Result<(), TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.write(r.key(), value);
        }
        let cell = self.cell(r);
        self.upgrade_check(r.key())?;
        let (seen, earlier) = self.see_entry(cell)?;
        Self::typed::<T>(r.key(), seen)?;
        self.buffer(cell, earlier, self.new_version(Some(value)));
        Ok(())
    }

    /// Applies `f` to a copy of the object's value and writes the result back; returns what `f`
    /// returned.
    pub fn modify<T: Object, R>(
        &self,
        r: &TRef<T>,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.modify(r.key(), f);
        }
        let cell = self.cell(r);
        self.upgrade_check(r.key())?;
        let (seen, earlier) = self.see_entry(cell)?;
        let mut value = Self::typed::<T>(r.key(), seen)?.clone();
        let buffered = self.st().writes.len();
        let out = f(&mut value);
        // `f` may itself write through the transaction (entries are only ever appended while
        // it runs): an entry for this object made meanwhile is the one to replace.
        let earlier = match earlier {
            None if self.st().writes.len() != buffered => self.st().find_write(cell),
            found => found,
        };
        self.buffer(cell, earlier, self.new_version(Some(value)));
        Ok(out)
    }

    /// Creates (publishes) a new object; fails with [`TxError::AlreadyExists`] if it exists.
    pub fn create<T: Object>(&self, r: &TRef<T>, value: T) -> Result<(), TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.create(r.key(), value);
        }
        let cell = self.cell(r);
        self.upgrade_check(r.key())?;
        let (seen, earlier) = self.see_entry(cell)?;
        if seen.exists() {
            return Err(TxError::AlreadyExists {
                key: r.key().clone(),
            });
        }
        self.buffer(cell, earlier, self.new_version(Some(value)));
        Ok(())
    }

    /// Creates an anonymous object holding `value` and returns its reference: store the
    /// reference inside another object to keep it. Under `certify`, the replicated store's
    /// garbage collection reclaims an anonymous object once no object with a name reaches it
    /// through the references stored in objects (every other key is a root).
    pub fn new_object<T: Object>(&self, value: T) -> Result<TRef<T>, TxError> {
        if let Some(rs) = self.remote().filter(|rs| rs.confined()) {
            // Its key would differ from one replica to the next.
            return Err(rs.refuse("new_object"));
        }
        let r = TRef::new(self.engine.fresh_anonymous_key());
        self.create(&r, value)?;
        Ok(r)
    }

    /// Deletes an existing object; later reads find it missing.
    pub fn delete<T: Object>(&self, r: &TRef<T>) -> Result<(), TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.delete::<T>(r.key());
        }
        let cell = self.cell(r);
        self.upgrade_check(r.key())?;
        let (seen, earlier) = self.see_entry(cell)?;
        Self::typed::<T>(r.key(), seen)?;
        self.buffer(cell, earlier, self.new_version::<T>(None));
        Ok(())
    }

    /// Abandons this attempt and blocks until an object it read changes, then re-runs the
    /// transaction (or fails with [`TxError::Timeout`] once its time limit passes). Use as
    /// `return tx.retry();`. Under a distributed protocol without change notification across
    /// nodes (`tfa`) it waits a back-off instead, then re-runs.
    pub fn retry<R>(&self) -> Result<R, TxError> {
        if let Some(rs) = self.remote() {
            return Err(rs.retry());
        }
        let st = self.st();
        st.check_live()?;
        if st.link.is_some() {
            // It would wait over a base that cannot change while it waits.
            return Err(TxError::Refused {
                reason: "retry() inside a linked transaction (finish the chain, then retry in \
                         a plain transaction)"
                    .into(),
            });
        }
        st.abort = Some(AbortCause::ExplicitRetry);
        Err(TxError::Retry)
    }

    /// Forward validation at a point the application chooses (OSS: an incoming write set
    /// aborts the running transactions whose reads it meets, first wins): fails with
    /// [`TxError::Conflict`] now, re-running the transaction, if something this attempt read
    /// was replaced since by a commit (of this node, or one applied from another), instead of
    /// finishing work that cannot commit. A long transaction calls it between steps. A
    /// read-only snapshot never conflicts, and under `tfa` the check waits for the commit.
    pub fn check(&self) -> Result<(), TxError> {
        self.safe_point()?;
        self.validate_reads()
    }

    /// Whether this attempt reads a read-only snapshot.
    pub fn is_read_only(&self) -> bool {
        let st = self.st();
        if st.remote.is_some() {
            return st.explicit_read_only;
        }
        st.mode == Mode::ReadOnly
    }

    /// This transaction's priority.
    pub fn priority(&self) -> u16 {
        self.st().priority
    }

    /// Registers an action to run, as its own transaction, after the top-level transaction
    /// commits. In an open-nested block it is handed to the parent when the block commits.
    pub fn on_commit(&self, f: impl FnMut(&mut Tx<'_>) -> Result<(), TxError> + Send + 'static) {
        if let Some(rs) = self.remote().filter(|rs| rs.confined()) {
            rs.refuse("on_commit");
            return;
        }
        self.st().handlers.push(HandlerEntry {
            on_commit: true,
            run: Box::new(f),
        });
    }

    /// Registers a compensating action to run, as its own transaction, if the top-level
    /// transaction aborts (or the closed-nested block around this call rolls back). Actions run
    /// latest first.
    pub fn on_abort(&self, f: impl FnMut(&mut Tx<'_>) -> Result<(), TxError> + Send + 'static) {
        if let Some(rs) = self.remote().filter(|rs| rs.confined()) {
            rs.refuse("on_abort");
            return;
        }
        self.st().handlers.push(HandlerEntry {
            on_commit: false,
            run: Box::new(f),
        });
    }
}

/// The key of `cell`, which a replicated engine keeps.
pub(crate) fn name_of(engine: &Engine, cell: *const Cell) -> Result<Key, CommitFailure> {
    engine.store.name_of(cell).ok_or_else(|| {
        CommitFailure::Fatal(TxError::abort(
            "a replicated engine found a cell without its key",
        ))
    })
}

/// A buffered write as a certification carries it: its key and its value's tagged bytes
/// (`None`: a deletion).
pub(crate) fn encoded_write(
    engine: &Engine,
    w: &WriteEntry,
) -> Result<(Key, Option<Vec<u8>>), CommitFailure> {
    let key = name_of(engine, w.cell)?;
    let node = w
        .node
        .as_ref()
        .map_or(std::ptr::null(), OwnedVersion::as_ptr);
    // SAFETY: buffered nodes are owned by this write set.
    match unsafe { node.as_ref() }.map(Version::encode) {
        Some(Ok(bytes)) => Ok((key, bytes)),
        Some(Err(e)) => Err(CommitFailure::Fatal(TxError::abort(format!(
            "cannot encode {key}: {e}"
        )))),
        None => Ok((key, None)),
    }
}
