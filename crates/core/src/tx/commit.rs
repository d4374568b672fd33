//! Ending an attempt that wrote: locking, validating, installing and unlocking; the records a
//! replicated engine certifies; reclaiming the versions commits unlinked.

use super::*;

impl TxState {
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
            Err(crate::ordered::CertifyError::OutcomeUnknown { reason, ticket }) => {
                Err(CommitFailure::Fatal(TxError::OutcomeUnknown {
                    reason,
                    ticket,
                }))
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
    pub(super) fn validate_forward(&mut self, engine: &Engine) -> Result<(), Signal> {
        let applied = engine.applied.load(Ordering::Acquire);
        if applied == self.applied_seen {
            return Ok(());
        }
        self.applied_seen = applied;
        self.validate_now(engine)
    }

    /// Fails the attempt if something it read (or its linked base read) was replaced.
    pub(super) fn validate_now(&mut self, engine: &Engine) -> Result<(), Signal> {
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
        // The garbage is in stamp order (appended unstamped, stamped in order with a clock
        // that never goes back), so what may be freed is a prefix.
        debug_assert!(self.garbage.windows(2).all(|w| w[0].0 <= w[1].0));
        let free = self.garbage.partition_point(|(stamp, _)| *stamp < oldest);
        // Freeing reads each version's header, often last written by another core: ask for
        // all those lines first, so that their transfers overlap instead of following each
        // other.
        for (_, chain) in &self.garbage[..free] {
            prefetch(chain.0);
        }
        let pool = &mut self.pool;
        for (_, chain) in self.garbage.drain(..free) {
            chain.recycle(pool);
        }
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

/// Asks for the cache line at `p` ahead of its use (a hint: nothing happens on other targets).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; it never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
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
        Some(Err(e)) => Err(CommitFailure::Fatal(TxError::from_encoding(&key, e))),
        None => Ok((key, None)),
    }
}
