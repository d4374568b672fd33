//! A transaction state's attempts: beginning and ending one, its write set, its reads, and the
//! marks that closed nesting and checkpoints roll back to.

use super::*;

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
        // An attempt that buffered nothing (every read-only one) has only its start left to
        // unpublish.
        if !self.writes.is_empty() || !self.retired.is_empty() || !self.undo.is_empty() {
            self.drop_buffers();
        }
        self.write_filter = 0;
        self.undo_floor = 0;
        if self.link.is_some() {
            // Only a linked attempt has one: the check keeps its drop off the common path.
            self.link = None;
        }
        if self.in_attempt {
            self.slot.end();
            self.in_attempt = false;
        }
    }

    /// Forgets an attempt's write set, undo log and replaced versions, keeping their blocks.
    #[inline(never)]
    fn drop_buffers(&mut self) {
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
        for (_, node) in &mut self.undo {
            if let Some(node) = node.take() {
                node.recycle(&mut self.pool);
            }
        }
        self.undo.clear();
        while let Some(node) = self.retired.pop() {
            node.recycle(&mut self.pool);
        }
    }

    #[inline]
    pub(super) fn fail(&mut self, cause: AbortCause) -> Signal {
        if self.abort.is_none() {
            self.abort = Some(cause);
        }
        Signal::Conflict
    }

    #[inline]
    pub(super) fn check_live(&self) -> Result<(), Signal> {
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

    pub(super) fn replace_write(&mut self, idx: usize, node: OwnedVersion) {
        let old = self.writes[idx].node.replace(node);
        if idx < self.undo_floor {
            self.undo.push((idx, old));
        } else if let Some(old) = old {
            self.retired.push(old);
        }
    }

    /// Multi-version read at the snapshot: waits out a committer, never aborts.
    #[inline(always)]
    pub(super) fn read_snapshot(&mut self, engine: &Engine, cell: &Cell) -> Seen {
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
    ///
    /// Inlined for the common case (the cell unlocked and unchanged since the snapshot); a
    /// locked cell or a newer version goes out of line, where the spinning and the snapshot
    /// extension are.
    #[inline(always)]
    pub(super) fn read_latest(&mut self, engine: &Engine, cell: &Cell) -> Result<Seen, Signal> {
        let l1 = cell.lock_word();
        if let LockState::Free(version) = decode(l1) {
            debug_assert!(self.in_attempt, "read outside an attempt");
            // The head is kept alive by our published start (see `read_snapshot`).
            let seen = seen_of(cell.head());
            if version <= self.ub && cell.lock_word() == l1 {
                self.reads.push(ReadEntry { cell, version });
                return Ok(seen);
            }
        }
        self.read_latest_slow(engine, cell)
    }

    /// [`TxState::read_latest`] for a cell that was locked, changed while it was read, or
    /// holds a version past the snapshot.
    #[inline(never)]
    fn read_latest_slow(&mut self, engine: &Engine, cell: &Cell) -> Result<Seen, Signal> {
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
}
