//! The handle an atomic section's closure receives, and the operations it calls.

use super::*;

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
    /// A handle on an attempt of `state`, which runs in `task` (see `atomos_sched::current`,
    /// read once per transaction by the caller: a transaction stays in the task it started in).
    pub(crate) fn new(
        engine: &'e Engine,
        state: Box<TxState>,
        task: Option<atomos_sched::TaskHandle>,
    ) -> Tx<'e> {
        Tx {
            engine,
            state: UnsafeCell::new(state),
            task,
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
            Seen::Present(p) => {
                // SAFETY: as above.
                let version = unsafe { &*p };
                match version.get::<T>() {
                    Ok(Some(v)) => Ok(v),
                    Ok(None) => Err(TxError::NotFound { key: key.clone() }),
                    Err(()) => Err(TxError::from_codec::<T>(key, version.mismatch::<T>())),
                }
            }
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

    /// The local part every write operation starts with: the object's cell, after the
    /// read-only check, with what the transaction sees of it and its own earlier write to it.
    #[inline(always)]
    fn write_target<T>(&self, r: &TRef<T>) -> Result<(&'e Cell, Seen, Option<usize>), TxError> {
        let cell = self.cell(r);
        self.upgrade_check(r.key())?;
        let (seen, earlier) = self.see_entry(cell)?;
        Ok((cell, seen, earlier))
    }

    /// Replaces the value of an existing object.
    pub fn write<T: Object>(&self, r: &TRef<T>, value: T) -> Result<(), TxError> {
        self.safe_point()?;
        if let Some(rs) = self.remote() {
            return rs.write(r.key(), value);
        }
        let (cell, seen, earlier) = self.write_target(r)?;
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
        let (cell, seen, earlier) = self.write_target(r)?;
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
        let (cell, seen, earlier) = self.write_target(r)?;
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
        let (cell, seen, earlier) = self.write_target(r)?;
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
        self.register(true, "on_commit", Box::new(f));
    }

    /// Registers a compensating action to run, as its own transaction, if the top-level
    /// transaction aborts (or the closed-nested block around this call rolls back). Actions run
    /// latest first.
    pub fn on_abort(&self, f: impl FnMut(&mut Tx<'_>) -> Result<(), TxError> + Send + 'static) {
        self.register(false, "on_abort", Box::new(f));
    }

    /// Keeps a handler of either kind (`what` names the call a procedure may not make).
    fn register(&self, on_commit: bool, what: &'static str, run: Handler) {
        if let Some(rs) = self.remote().filter(|rs| rs.confined()) {
            rs.refuse(what);
            return;
        }
        self.st().handlers.push(HandlerEntry { on_commit, run });
    }
}
