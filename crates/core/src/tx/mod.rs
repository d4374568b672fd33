//! A running transaction: its snapshot, read set, write set, and the operations the closure of an
//! atomic section calls.
//!
//! This module holds the types; `state` runs an attempt (beginning and ending it, the write set,
//! reads, marks for partial rollback), `commit` ends an attempt that wrote and reclaims what
//! commits unlinked, and `handle` is [`Tx`], the operations a closure calls. The three share
//! this module's imports.

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
use crate::object::Object;
use crate::pool::BlockPool;
use crate::remote::RemoteState;
use crate::slots::{Garbage, Slot, UNSTAMPED};
use crate::stats::{AbortCause, Event};
use crate::tref::TRef;
use crate::version::{OwnedVersion, Version};

mod commit;
mod handle;
mod state;

pub(crate) use commit::{encoded_write, name_of};
pub use handle::Tx;

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
