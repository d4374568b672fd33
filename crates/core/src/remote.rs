//! Transactions whose objects live on other nodes: the same [`Tx`](crate::Tx) API, with reads
//! and the commit delegated to a distributed protocol.
//!
//! A protocol plugs in with [`RemoteSource`] ([`Engine::set_remote`](crate::Engine::set_remote)):
//! each attempt gets a [`RemoteAttempt`] that fetches committed objects as bytes and commits a
//! write set. Values are decoded once per attempt and kept until it ends, so `read` still hands
//! out references; writes are buffered here, typed, and encoded at commit.

use std::any::Any;

use rustc_hash::FxHashMap;

use crate::codec::CodecError;
use crate::error::TxError;
use crate::key::Key;
use crate::object::Object;
use crate::stats::AbortCause;

/// Why a remote operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteError {
    /// A conflict: the attempt is over and the transaction re-runs.
    Conflict(AbortCause),
    /// These reads are no longer current, so a read could not extend the snapshot. The attempt
    /// is still open: the engine drops the reads of a nested block or checkpoint that covers
    /// them ([`RemoteAttempt::forget`]) and re-runs that part, or aborts the attempt.
    Stale {
        /// The reads no longer current.
        keys: Vec<Key>,
    },
    /// The node holding `key` did not answer; the transaction fails with
    /// [`TxError::Unavailable`].
    Unavailable {
        /// The object.
        key: Key,
        /// The node that did not answer.
        node: u64,
    },
    /// `key`'s object was lost with node `node`; the transaction fails with
    /// [`TxError::Lost`].
    Lost {
        /// The object.
        key: Key,
        /// The node it was lost with.
        node: u64,
    },
}

/// One attempt of a transaction under a distributed protocol.
pub trait RemoteAttempt: Send {
    /// The committed value of `key` as this attempt sees it (`None`: it does not exist).
    fn read(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError>;
    /// Like [`RemoteAttempt::read`], for an object the attempt is about to write (its first
    /// access to it is a write): a protocol may lock it with the read. Default: a read.
    fn read_for_write(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError> {
        self.read(key)
    }
    /// Commits the attempt with its writes (`None` deletes), every key once.
    fn commit(&mut self, writes: Vec<(Key, Option<Vec<u8>>)>) -> Result<(), RemoteError>;
    /// Takes the abstract lock `name` for the transaction family `family` (open nesting): `true`
    /// if taken now, `false` if the family held it already; a lock held by another family is
    /// `RemoteError::Conflict(AbortCause::AbstractLock)`.
    fn abstract_lock(&mut self, family: u64, name: &str) -> Result<bool, RemoteError>;
    /// Drops these reads after [`RemoteError::Stale`]; the attempt goes on without them.
    fn forget(&mut self, keys: &[Key]);
    /// The attempt ends without committing.
    fn abort(&mut self);
    /// Whether the attempt runs a procedure on every replica, where only its reads and writes
    /// may happen (see [`TxError::NotInProcedure`]). Default: no.
    fn confined(&self) -> bool {
        false
    }
}

/// Starts attempts of a distributed protocol.
pub trait RemoteSource: Send + Sync {
    /// A new attempt.
    fn begin(&self) -> Box<dyn RemoteAttempt>;
    /// The family's transaction ended: its abstract locks are released.
    fn release_abstract(&self, family: u64, names: Vec<String>);
}

/// A value of any object type, encodable.
trait Erased: Any + Send + Sync {
    fn encode(&self) -> Result<Vec<u8>, CodecError>;
    fn as_any(&self) -> &dyn Any;
}

impl<T: Object> Erased for T {
    fn encode(&self) -> Result<Vec<u8>, CodecError> {
        crate::codec::encode(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

type Value = Option<Box<dyn Erased>>;

/// The state of one remote attempt.
pub(crate) struct RemoteState {
    attempt: Box<dyn RemoteAttempt>,
    read_only: bool,
    /// What was read, decoded (`None`: missing).
    seen: FxHashMap<Key, Value>,
    /// Buffered writes in order (a later one for the same key wins); `index` finds the latest.
    /// Values stay here until the attempt ends: references to them may still be held.
    writes: Vec<(Key, Value)>,
    index: FxHashMap<Key, usize>,
    /// Values rolled back during the attempt: references to them may still be held.
    retired: Vec<Box<dyn Erased>>,
    /// Keys in the order first read (a nested block's or step's reads are a suffix).
    read_log: Vec<Key>,
    /// Set when an operation met a conflict: every later operation fails the same way.
    pub(crate) conflict: Option<AbortCause>,
    /// With a conflict from a failed forward or commit: the reads no longer current.
    stale: Vec<Key>,
    /// Committed already (checkpointed steps commit themselves): whether it wrote.
    committed: Option<bool>,
    /// An operation a confined attempt may not use was called: the attempt fails with it.
    refused: Option<&'static str>,
}

/// Where a nested block or step began: how much had been written and read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteMark {
    writes: usize,
    reads: usize,
}

fn typed<'a, T: Object>(key: &Key, v: &'a Value) -> Result<&'a T, TxError> {
    match v {
        None => Err(TxError::NotFound { key: key.clone() }),
        Some(b) => b
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| wrong_type::<T>(key)),
    }
}

fn wrong_type<T>(key: &Key) -> TxError {
    TxError::WrongType {
        key: key.clone(),
        expected: std::any::type_name::<T>(),
    }
}

fn decode<T: Object>(key: &Key, bytes: &[u8]) -> Result<T, TxError> {
    crate::codec::decode(bytes).map_err(|e| TxError::from_codec::<T>(key, e))
}

impl RemoteState {
    pub(crate) fn new(attempt: Box<dyn RemoteAttempt>, read_only: bool) -> RemoteState {
        RemoteState {
            attempt,
            read_only,
            seen: FxHashMap::default(),
            writes: Vec::new(),
            index: FxHashMap::default(),
            retired: Vec::new(),
            read_log: Vec::new(),
            conflict: None,
            stale: Vec::new(),
            committed: None,
            refused: None,
        }
    }

    /// Whether the attempt runs a procedure on every replica (see [`RemoteAttempt::confined`]).
    pub(crate) fn confined(&self) -> bool {
        self.attempt.confined()
    }

    /// Fails the attempt: `what` was called, which a confined attempt may not use.
    pub(crate) fn refuse(&mut self, what: &'static str) -> TxError {
        self.refused.get_or_insert(what);
        TxError::NotInProcedure { what: what.into() }
    }

    fn live(&self) -> Result<(), TxError> {
        if let Some(what) = self.refused {
            return Err(TxError::NotInProcedure { what: what.into() });
        }
        match self.conflict {
            None => Ok(()),
            Some(AbortCause::ExplicitRetry) => Err(TxError::Retry),
            Some(_) => Err(TxError::Conflict),
        }
    }

    /// Fetches `key` if this attempt has not seen it, decoding it as a `T` (`for_write`: the
    /// attempt is about to write it).
    fn fetch<T: Object>(&mut self, key: &Key, for_write: bool) -> Result<(), TxError> {
        if self.index.contains_key(key) || self.seen.contains_key(key) {
            return Ok(());
        }
        let read = if for_write {
            self.attempt.read_for_write(key)
        } else {
            self.attempt.read(key)
        };
        match read {
            Ok(None) => {
                self.seen.insert(key.clone(), None);
                self.read_log.push(key.clone());
                Ok(())
            }
            Ok(Some(bytes)) => {
                let v: T = decode(key, &bytes)?;
                self.seen.insert(key.clone(), Some(Box::new(v)));
                self.read_log.push(key.clone());
                Ok(())
            }
            Err(RemoteError::Conflict(cause)) => {
                self.conflict = Some(cause);
                Err(TxError::Conflict)
            }
            Err(RemoteError::Stale { keys }) => {
                self.conflict = Some(AbortCause::ReadValidation);
                self.stale = keys;
                Err(TxError::Conflict)
            }
            Err(RemoteError::Unavailable { key, node }) => Err(TxError::Unavailable { key, node }),
            Err(RemoteError::Lost { key, node }) => Err(TxError::Lost { key, node }),
        }
    }

    /// What the attempt sees of `key`: its own latest write, else what it read
    /// (`for_write`: the attempt is about to write it).
    fn visible<T: Object>(&mut self, key: &Key, for_write: bool) -> Result<&Value, TxError> {
        self.live()?;
        self.fetch::<T>(key, for_write)?;
        Ok(match self.index.get(key) {
            Some(&i) => &self.writes[i].1,
            None => &self.seen[key],
        })
    }

    pub(crate) fn read<T: Object>(&mut self, key: &Key) -> Result<&T, TxError> {
        let v = self.visible::<T>(key, false)?;
        typed(key, v)
    }

    /// What the attempt sees of `key`, which it is about to overwrite.
    fn read_for_write<T: Object>(&mut self, key: &Key) -> Result<&T, TxError> {
        let v = self.visible::<T>(key, true)?;
        typed(key, v)
    }

    pub(crate) fn exists<T: Object>(&mut self, key: &Key) -> Result<bool, TxError> {
        Ok(self.visible::<T>(key, false)?.is_some())
    }

    /// Buffers a write. Earlier writes of the key stay in the log (a nested block rolled back
    /// returns to them); the index points at the latest.
    fn buffer(&mut self, key: &Key, value: Value) {
        self.index.insert(key.clone(), self.writes.len());
        self.writes.push((key.clone(), value));
    }

    fn writable(&self, key: &Key) -> Result<(), TxError> {
        if self.read_only {
            return Err(TxError::WriteInReadOnly { key: key.clone() });
        }
        Ok(())
    }

    pub(crate) fn write<T: Object>(&mut self, key: &Key, value: T) -> Result<(), TxError> {
        self.writable(key)?;
        self.read_for_write::<T>(key)?;
        self.buffer(key, Some(Box::new(value)));
        Ok(())
    }

    pub(crate) fn modify<T: Object, R>(
        &mut self,
        key: &Key,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, TxError> {
        self.writable(key)?;
        let mut v = self.read_for_write::<T>(key)?.clone();
        let out = f(&mut v);
        self.buffer(key, Some(Box::new(v)));
        Ok(out)
    }

    pub(crate) fn create<T: Object>(&mut self, key: &Key, value: T) -> Result<(), TxError> {
        self.writable(key)?;
        if self.visible::<T>(key, true)?.is_some() {
            return Err(TxError::AlreadyExists { key: key.clone() });
        }
        self.buffer(key, Some(Box::new(value)));
        Ok(())
    }

    pub(crate) fn delete<T: Object>(&mut self, key: &Key) -> Result<(), TxError> {
        self.writable(key)?;
        self.read_for_write::<T>(key)?;
        self.buffer(key, None);
        Ok(())
    }

    /// Takes an abstract lock for `family` (see [`RemoteAttempt::abstract_lock`]).
    pub(crate) fn abstract_lock(&mut self, family: u64, name: &str) -> Result<bool, TxError> {
        self.live()?;
        match self.attempt.abstract_lock(family, name) {
            Ok(taken) => Ok(taken),
            Err(RemoteError::Conflict(cause)) => {
                self.conflict = Some(cause);
                Err(TxError::Conflict)
            }
            Err(RemoteError::Stale { .. }) => {
                self.conflict = Some(AbortCause::AbstractLock);
                Err(TxError::Conflict)
            }
            Err(RemoteError::Unavailable { key, node }) => Err(TxError::Unavailable { key, node }),
            Err(RemoteError::Lost { key, node }) => Err(TxError::Lost { key, node }),
        }
    }

    pub(crate) fn retry(&mut self) -> TxError {
        if self.conflict.is_none() {
            self.conflict = Some(AbortCause::ExplicitRetry);
        }
        self.live().err().unwrap_or(TxError::Retry)
    }

    /// A mark to roll back to (a nested block's or step's start).
    pub(crate) fn mark(&self) -> RemoteMark {
        RemoteMark {
            writes: self.writes.len(),
            reads: self.read_log.len(),
        }
    }

    /// After a failed forward, the first of `marks` (in order) from which on every stale read
    /// was made: rolling back to it repairs the attempt.
    pub(crate) fn repairable_from(&self, marks: &[RemoteMark]) -> Option<usize> {
        if self.stale.is_empty() {
            return None;
        }
        let first_stale = self
            .stale
            .iter()
            .map(|k| self.read_log.iter().position(|r| r == k))
            .collect::<Option<Vec<usize>>>()?
            .into_iter()
            .min()?;
        marks.iter().rposition(|m| m.reads <= first_stale)
    }

    /// Rolls the attempt back to `mark` after a failed forward: the reads since are dropped
    /// (here and in the protocol) and the writes since undone; the attempt is live again.
    pub(crate) fn repair(&mut self, mark: RemoteMark) {
        let dropped: Vec<Key> = self.read_log.drain(mark.reads..).collect();
        for k in &dropped {
            if let Some(Some(v)) = self.seen.remove(k) {
                self.retired.push(v);
            }
        }
        self.attempt.forget(&dropped);
        self.rollback_to(mark);
        self.conflict = None;
        self.stale.clear();
    }

    /// Undoes the writes buffered since `mark` (the reads stay: they were consistent).
    pub(crate) fn rollback_to(&mut self, mark: RemoteMark) {
        let mark = mark.writes;
        if mark >= self.writes.len() {
            return;
        }
        for (_, v) in self.writes.drain(mark..) {
            if let Some(v) = v {
                self.retired.push(v);
            }
        }
        self.index.clear();
        for (i, (k, _)) in self.writes.iter().enumerate() {
            self.index.insert(k.clone(), i);
        }
    }

    /// Encodes the writes and commits them (once: a committed attempt answers the same again).
    /// A commit that found stale reads leaves the attempt open for [`RemoteState::repair`].
    pub(crate) fn commit(&mut self) -> Result<bool, CommitOutcome> {
        if let Some(wrote) = self.committed {
            return Ok(wrote);
        }
        if let Some(what) = self.refused {
            return Err(CommitOutcome::Error(TxError::NotInProcedure {
                what: what.into(),
            }));
        }
        let mut latest: Vec<usize> = self.index.values().copied().collect();
        latest.sort_unstable();
        let mut writes = Vec::with_capacity(latest.len());
        for (k, v) in latest.into_iter().map(|i| &self.writes[i]) {
            let bytes = match v {
                None => None,
                Some(v) => Some(
                    v.encode()
                        .map_err(|e| CommitOutcome::Error(TxError::from_encoding(k, e)))?,
                ),
            };
            writes.push((k.clone(), bytes));
        }
        let wrote = !writes.is_empty();
        match self.attempt.commit(writes) {
            Ok(()) => {
                self.committed = Some(wrote);
                Ok(wrote)
            }
            Err(RemoteError::Conflict(c)) => {
                self.conflict = Some(c);
                Err(CommitOutcome::Conflict(c))
            }
            Err(RemoteError::Stale { keys }) => {
                self.conflict = Some(AbortCause::CommitValidation);
                self.stale = keys;
                Err(CommitOutcome::Conflict(AbortCause::CommitValidation))
            }
            Err(RemoteError::Unavailable { key, node }) => {
                Err(CommitOutcome::Error(TxError::Unavailable { key, node }))
            }
            Err(RemoteError::Lost { key, node }) => {
                Err(CommitOutcome::Error(TxError::Lost { key, node }))
            }
        }
    }

    pub(crate) fn abort(&mut self) {
        self.attempt.abort();
    }
}

/// Why a remote commit did not happen.
pub(crate) enum CommitOutcome {
    Conflict(AbortCause),
    Error(TxError),
}
