//! Transactions whose commit is decided by a totally ordered log (the replicated protocols).
//!
//! Every replica holds every object in its engine. A transaction runs locally as under the
//! local engine; if it wrote, its commit does not install anything: it sends a
//! [`Certification`] (the version of every object it read, its writes encoded once) to a
//! [`Certifier`] ([`Engine::set_certifier`]), which orders it and answers with a [`Verdict`].
//! Every replica applies the ordered entries with the same deterministic rule, through one
//! thread ([`Engine::apply_certified`]): the reads must still be the newest versions; the
//! winners' writes are installed with a version taken from the log position. Readers never
//! lock: the applier locks the cells it installs into like a local committer would, so
//! snapshot reads and validation work unchanged.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rustc_hash::FxHashSet;

use crate::cell::{decode, owner_word, Cell, LockState};
use crate::engine::Engine;
use crate::error::TxError;
use crate::key::Key;
use crate::tx::{Mode, TxState};
use crate::version::OwnedVersion;

/// How long a caller waits for its own replica to apply a position the log already decided
/// (a committer's own commit, a barrier).
pub(crate) const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a transaction that wrote asks the log to certify.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Certification {
    /// Every object the transaction read, with the version it read (0: never written).
    pub reads: Vec<(Key, u64)>,
    /// Its writes, each key once: the new value as tagged bytes, or `None` to delete.
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
}

/// How the log decided a certification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every read was still the newest version: the writes are installed with `version`.
    Committed {
        /// The version the writes got (also the position the replica must have applied
        /// before the caller may go on).
        version: u64,
    },
    /// Something read had a newer version by then: nothing was installed; the transaction
    /// re-runs.
    Conflict,
}

/// Why a certification has no verdict.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertifyError {
    /// The request may or may not have been ordered (the replica lost the cluster, or
    /// stopped): the transaction may have committed, and must not be re-run blindly.
    #[error("{reason}")]
    OutcomeUnknown {
        /// What happened.
        reason: String,
        /// What to ask the node about later, if it can tell (see
        /// [`TxError::OutcomeUnknown`](crate::TxError::OutcomeUnknown)).
        ticket: Option<u64>,
    },
    /// The protocol will never commit the transaction as it is: nothing was ordered.
    #[error("refused: {0}")]
    Refused(String),
}

impl CertifyError {
    /// An unknown outcome nobody can be asked about later.
    pub fn unknown(reason: impl Into<String>) -> CertifyError {
        CertifyError::OutcomeUnknown {
            reason: reason.into(),
            ticket: None,
        }
    }
}

/// How a request for an abstract lock in the replicated lock table was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOutcome {
    /// The family took the lock now.
    Taken,
    /// The family held it already.
    AlreadyHeld,
    /// Another family holds it.
    HeldByAnother,
}

/// Orders certifications: called by the thread whose transaction commits, and blocks until
/// the verdict is known.
pub trait Certifier: Send + Sync {
    /// Orders `certification` and returns how every replica decided it. A
    /// [`Verdict::Committed`] may be returned before this replica applied it; the engine
    /// waits for that.
    fn certify(&self, certification: Certification) -> Result<Verdict, CertifyError>;

    /// Orders an entry that changes nothing and returns its log position: once this replica
    /// has applied it, it has applied everything committed before the call.
    fn barrier(&self) -> Result<u64, CertifyError>;

    /// Takes the abstract lock `name` for transaction family `owner` (unique on this node) in
    /// the lock table every replica keeps, in log order (open nesting across replicas).
    fn abstract_lock(&self, owner: u64, name: &str) -> Result<LockOutcome, CertifyError>;

    /// Releases the family's abstract locks `names` (those it holds).
    fn release_abstract(&self, owner: u64, names: Vec<String>);
}

/// An object as a replicated store's snapshot holds it: key, version, value as tagged bytes
/// (`None`: a deletion, kept so that certification against it stays the same everywhere).
pub type SnapshotObject = (Key, u64, Option<Vec<u8>>);

/// A [`SnapshotObject`] whose value is lent by the engine where it can be (it encodes as the
/// same bytes).
pub type SnapshotObjectRef<'a> = (Key, u64, Option<std::borrow::Cow<'a, [u8]>>);

impl Engine {
    /// Commits every later update transaction through `certifier` instead of installing it
    /// here. Needs an engine made with [`EngineConfig::replicated`](crate::EngineConfig);
    /// `false` if it was not, or a certifier or remote protocol was set before.
    pub fn set_certifier(&self, certifier: std::sync::Arc<dyn Certifier>) -> bool {
        self.config().replicated && !self.is_remote() && self.certifier.set(certifier).is_ok()
    }

    /// The certifier update transactions commit through, once set.
    pub(crate) fn certifier(&self) -> Option<&dyn Certifier> {
        self.certifier.get().map(|c| &**c)
    }

    /// Waits until this replica has applied everything committed anywhere before the call
    /// (under a certifier; otherwise every commit is visible already). Fails with
    /// [`TxError::ClusterUnavailable`] if the log cannot be reached or applied in time.
    pub fn sync(&self) -> Result<(), TxError> {
        let Some(certifier) = self.certifier() else {
            return Ok(());
        };
        let position = certifier
            .barrier()
            .map_err(|e| TxError::ClusterUnavailable {
                reason: e.to_string(),
            })?;
        if self.wait_applied(position, Some(Instant::now() + APPLY_WAIT)) {
            Ok(())
        } else {
            Err(TxError::ClusterUnavailable {
                reason: format!("this replica did not apply the log up to {position} in time"),
            })
        }
    }

    /// The newest version of `key` (0: never written). Waits out a committer that holds it.
    pub fn version_of(&self, key: &Key) -> u64 {
        // SAFETY: the store keeps its cells for the engine's lifetime.
        let cell = unsafe { &*self.store.cell(key) };
        free_version(cell)
    }

    /// Whether every `(key, version)` names the newest committed version of its key: the
    /// certification rule.
    pub fn version_of_all(&self, reads: &[(Key, u64)]) -> bool {
        reads.iter().all(|(k, v)| self.version_of(k) == *v)
    }

    /// The log position applied so far (see [`Engine::apply_certified`]).
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Marks `position` applied without changing any object (an entry that is not a
    /// certification, or one that changed nothing), and wakes whoever waits for it.
    pub fn mark_applied(&self, position: u64) {
        self.applied.fetch_max(position, Ordering::AcqRel);
        self.retry_signal.notify();
    }

    /// Waits until the log is applied through `position`, or `deadline` passes (false).
    pub fn wait_applied(&self, position: u64, deadline: Option<Instant>) -> bool {
        self.applied() >= position
            || self
                .retry_signal
                .wait_until(deadline, || self.applied() >= position)
    }

    /// Applies the ordered certification at log position `version` (positions increase by at
    /// least one per entry): if every read is still the newest version, installs the writes
    /// with `version` and returns true; else changes nothing and returns false. Either way the
    /// position counts as applied. Deterministic: replicas that applied the same entries in the
    /// same order decide the same. One thread at a time may apply.
    pub fn apply_certified(
        &self,
        version: u64,
        reads: &[(Key, u64)],
        writes: Vec<(Key, Option<Vec<u8>>)>,
    ) -> bool {
        let current = self.version_of_all(reads);
        if current {
            let writes = writes
                .into_iter()
                .map(|(k, bytes)| (self.store.cell(&k), OwnedVersion::from_bytes(bytes)));
            self.install_all(version, writes.collect());
        }
        self.mark_applied(version);
        current
    }

    /// Every object that was ever written, at its newest version, sorted by key: what a
    /// replicated store's snapshot holds. Read as a consistent snapshot of the engine.
    pub fn snapshot_objects(&self) -> Result<Vec<SnapshotObject>, String> {
        self.with_snapshot_objects(|objects| {
            objects
                .iter()
                .map(|(k, v, b)| (k.clone(), *v, b.as_deref().map(<[u8]>::to_vec)))
                .collect()
        })
    }

    /// Hands every object that was ever written, at its newest version, in key order, to `f`:
    /// the objects [`Engine::snapshot_objects`] returns, without copying their values (a value
    /// that arrived as bytes is lent as it lies; only typed values are encoded). Read as a
    /// consistent snapshot of the engine. Fails, without calling `f`, if a value's type
    /// cannot be encoded.
    pub fn with_snapshot_objects<R>(
        &self,
        f: impl FnOnce(&[SnapshotObjectRef<'_>]) -> R,
    ) -> Result<R, String> {
        let mut st = self.take_state();
        st.begin(self, Mode::ReadOnly);
        let result = objects_seen(self, &mut st, f);
        st.end_attempt();
        self.put_state(st);
        result
    }

    /// A view of the engine's objects as they are now, which the applier does not change:
    /// see [`PinnedView`].
    pub fn pin(self: &std::sync::Arc<Self>) -> PinnedView {
        let mut st = self.take_state();
        st.begin(self, Mode::ReadOnly);
        PinnedView {
            engine: self.clone(),
            st: Some(st),
        }
    }

    /// Makes the engine's objects those of a snapshot taken at log position `position`
    /// ([`Engine::snapshot_objects`] of a replica that applied the same log that far): objects
    /// whose version differs get the snapshot's, objects the snapshot lacks become never
    /// written. Running transactions see it as one commit. One thread at a time may apply.
    /// Values are kept as given: as [`bytes::Bytes`] slices of one snapshot's bytes, the engine
    /// shares that buffer instead of holding a second copy of the state. An object whose
    /// version did not change gets the snapshot's node too (the same value at the same
    /// version), so that no value keeps an earlier snapshot's bytes alive.
    pub fn install_snapshot<V: Into<bytes::Bytes>>(
        &self,
        position: u64,
        objects: Vec<(Key, u64, Option<V>)>,
    ) {
        let mut named = FxHashSet::default();
        let mut changes = Vec::new();
        for (key, version, bytes) in objects {
            let cell = self.store.cell(&key);
            named.insert(cell as usize);
            // SAFETY: the store keeps its cells for the engine's lifetime.
            if bytes.is_some() || free_version(unsafe { &*cell }) != version {
                changes.push((cell, version, OwnedVersion::from_bytes(bytes)));
            }
        }
        self.store.for_each(|_, cell| {
            let cell: *const Cell = cell;
            // SAFETY: as above.
            if !named.contains(&(cell as usize)) && free_version(unsafe { &*cell }) != 0 {
                changes.push((cell, 0, OwnedVersion::from_bytes(None::<Vec<u8>>)));
            }
        });
        self.install_versions(position, changes);
        self.mark_applied(position);
    }

    /// Installs `writes` as one commit at `version`.
    fn install_all(&self, version: u64, writes: Vec<(*const Cell, OwnedVersion)>) {
        let changes = writes.into_iter().map(|(c, n)| (c, version, n)).collect();
        self.install_versions(version, changes);
    }

    /// Locks every cell, moves the clock to `clock`, installs each node with its own version,
    /// unlocks: readers see all of it or none of it. A cell named twice gets its last node.
    fn install_versions(&self, clock: u64, mut changes: Vec<(*const Cell, u64, OwnedVersion)>) {
        if changes.is_empty() {
            return;
        }
        if changes.len() > 1 {
            let mut seen = FxHashSet::default();
            let mut keep: Vec<bool> = changes
                .iter()
                .rev()
                .map(|(c, _, _)| seen.insert(*c as usize))
                .collect();
            keep.reverse();
            let mut keep = keep.into_iter();
            changes.retain(|_| keep.next().unwrap_or(true));
        }
        let owner = owner_word(u16::MAX, 0);
        for (cell, _, _) in &changes {
            // SAFETY: the store keeps its cells for the engine's lifetime.
            let cell = unsafe { &**cell };
            loop {
                let word = cell.lock_word();
                if let LockState::Free(_) = decode(word) {
                    if cell.try_lock(word, owner) {
                        break;
                    }
                }
                std::hint::spin_loop();
            }
        }
        self.clock.fetch_max(clock, Ordering::AcqRel);
        let horizon = self.slots.horizon();
        let mut st = self.take_state();
        for (cell, version, node) in changes {
            // SAFETY: as above; we hold the lock.
            let cell = unsafe { &*cell };
            let retired = cell.install(node, version, horizon);
            cell.unlock(version);
            if !retired.is_empty() {
                st.retire(retired);
            }
        }
        self.retry_signal.notify();
        st.count_commit();
        st.after_commit(self);
        self.put_state(st);
    }
}

/// The newest version of `cell`, once no committer holds it.
fn free_version(cell: &Cell) -> u64 {
    loop {
        if let LockState::Free(v) = decode(cell.lock_word()) {
            return v;
        }
        std::hint::spin_loop();
    }
}

/// The objects `st`'s attempt sees, at their versions, in key order, handed to `f` as
/// [`Engine::with_snapshot_objects`] says.
fn objects_seen<R>(
    engine: &Engine,
    st: &mut TxState,
    f: impl FnOnce(&[SnapshotObjectRef<'_>]) -> R,
) -> Result<R, String> {
    let mut versions = Vec::new();
    engine.store.for_each(|key, cell| {
        if let Some(v) = st.snapshot_version(engine, cell) {
            versions.push((key.clone(), v));
        }
    });
    versions.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut objects = Vec::with_capacity(versions.len());
    for (key, v) in versions {
        // SAFETY: the attempt's published start keeps the version alive until it ends, after
        // this returns.
        let v = unsafe { &*v };
        if v.ts == 0 {
            // Reset to never written by an installed snapshot.
            continue;
        }
        match v.encoded() {
            Ok(bytes) => objects.push((key, v.ts, bytes)),
            Err(e) => return Err(format!("object {key}: {e}")),
        }
    }
    Ok(f(&objects))
}

/// The engine's objects as they were when [`Engine::pin`] was called: the applier goes on
/// committing newer versions, and the view keeps every version it sees alive until it is
/// dropped. It may be read on another thread (a replica's snapshot is encoded off its
/// applier this way), and read more than once: it sees the same objects each time, unless
/// [`Engine::install_snapshot`] ran meanwhile (a snapshot's versions may be older than the
/// view's clock; memory stays safe, the objects seen are then mixed).
pub struct PinnedView {
    engine: std::sync::Arc<Engine>,
    /// The read-only attempt whose published start pins the view (taken on drop).
    st: Option<Box<TxState>>,
}

// SAFETY: the view owns its attempt's state and is the only one to use it; the state's slot is
// shared through an `Arc` of atomics, and what the attempt reads is reached through versions
// its published start keeps alive whichever thread reads them.
unsafe impl Send for PinnedView {}

impl PinnedView {
    /// The engine's clock the view was taken at: it sees every version up to it.
    pub fn clock(&self) -> u64 {
        self.st.as_ref().map_or(0, |st| st.ub)
    }

    /// Hands the objects the view sees to `f`, as [`Engine::with_snapshot_objects`] does.
    pub fn with_objects<R>(
        &mut self,
        f: impl FnOnce(&[SnapshotObjectRef<'_>]) -> R,
    ) -> Result<R, String> {
        match self.st.as_mut() {
            Some(st) => objects_seen(&self.engine, st, f),
            None => Err("the view was released".into()),
        }
    }
}

impl Drop for PinnedView {
    fn drop(&mut self) {
        if let Some(mut st) = self.st.take() {
            st.end_attempt();
            self.engine.put_state(st);
        }
    }
}
