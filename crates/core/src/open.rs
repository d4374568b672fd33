//! Open nesting: inner blocks that commit at once, abstract locks held until the outermost
//! transaction ends, and on-commit / on-abort (compensating) actions.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::engine::{RunError, TxOptions};
use crate::error::TxError;
use crate::ordered::{CertifyError, LockOutcome};
use crate::stats::AbortCause;
use crate::tx::Tx;

/// Named semantic locks, each held by one transaction family (a top-level transaction and its
/// open-nested blocks) at a time.
pub(crate) struct AbstractLocks {
    held: Mutex<FxHashMap<String, u64>>,
    next_owner: AtomicU64,
}

impl AbstractLocks {
    pub(crate) fn new() -> AbstractLocks {
        AbstractLocks {
            held: Mutex::new(FxHashMap::default()),
            next_owner: AtomicU64::new(1),
        }
    }

    /// A fresh owner identity.
    pub(crate) fn new_owner(&self) -> u64 {
        self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes `name` for `owner`: `Ok(true)` if newly taken, `Ok(false)` if `owner` held it
    /// already, `Err(())` if another owner holds it.
    pub(crate) fn acquire(&self, name: &str, owner: u64) -> Result<bool, ()> {
        let mut held = self.held.lock();
        match held.get(name) {
            Some(&o) if o == owner => Ok(false),
            Some(_) => Err(()),
            None => {
                held.insert(name.to_string(), owner);
                Ok(true)
            }
        }
    }

    /// Releases the named locks if `owner` holds them.
    pub(crate) fn release(&self, names: &[String], owner: u64) {
        if names.is_empty() {
            return;
        }
        let mut held = self.held.lock();
        for n in names {
            if held.get(n.as_str()) == Some(&owner) {
                held.remove(n.as_str());
            }
        }
    }

    /// Whether `name` is held by anyone.
    pub(crate) fn is_held(&self, name: &str) -> bool {
        self.held.lock().contains_key(name)
    }
}

impl<'e> Tx<'e> {
    /// This transaction family's abstract-lock identity, made on first need.
    fn owner(&self) -> u64 {
        let st = self.st();
        if st.owner == 0 {
            st.owner = self.engine.abstract_locks.new_owner();
        }
        st.owner
    }

    /// Takes the named abstract lock until the top-level transaction ends. If another
    /// transaction holds it, this transaction (inside an open-nested block: its parent) aborts
    /// and re-runs after a back-off.
    pub fn abstract_lock(&self, name: &str) -> Result<(), TxError> {
        let owner = self.owner();
        let st = self.st();
        if let Some(rs) = st.remote.as_deref_mut() {
            if rs.confined() {
                return Err(rs.refuse("abstract_lock"));
            }
            // Under a distributed protocol the lock lives on the home of its name.
            if rs.abstract_lock(owner, name)? {
                st.abstract_locks.push(name.to_string());
            }
            return Ok(());
        }
        if st.abort.is_some() {
            return Err(TxError::Conflict);
        }
        if let Some(certifier) = self.engine.certifier() {
            // Under a replicated protocol the lock table is replicated, changed in log order.
            return match certifier.abstract_lock(owner, name) {
                Ok(LockOutcome::Taken) => {
                    st.abstract_locks.push(name.to_string());
                    Ok(())
                }
                Ok(LockOutcome::AlreadyHeld) => Ok(()),
                Ok(LockOutcome::HeldByAnother) => {
                    st.abort = Some(AbortCause::AbstractLock);
                    Err(TxError::Conflict)
                }
                Err(CertifyError::OutcomeUnknown { reason, .. }) => {
                    // It may be held now: releasing it at the end covers that case.
                    st.abstract_locks.push(name.to_string());
                    Err(TxError::ClusterUnavailable { reason })
                }
                Err(CertifyError::Refused(reason)) => Err(TxError::Refused { reason }),
            };
        }
        match self.engine.abstract_locks.acquire(name, owner) {
            Ok(true) => {
                st.abstract_locks.push(name.to_string());
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(()) => {
                st.abort = Some(AbortCause::AbstractLock);
                Err(TxError::Conflict)
            }
        }
    }

    /// Runs `f` as an open-nested transaction: it commits on its own as soon as it returns
    /// `Ok` (its writes become visible to everyone at once), while the abstract locks it took
    /// and the on-commit / on-abort actions it registered pass to this transaction, to be
    /// released and run when this transaction ends. Conflicts inside `f` re-run only `f`; an
    /// abstract lock held elsewhere aborts this transaction. The block reads the newest state,
    /// not this transaction's uncommitted writes.
    pub fn open_nested<R>(
        &mut self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        let owner = self.owner();
        let st = self.st();
        if let Some(rs) = st.remote.as_deref_mut().filter(|rs| rs.confined()) {
            return Err(rs.refuse("open_nested"));
        }
        if st.abort.is_some() {
            return Err(TxError::Conflict);
        }
        if st.link.is_some() {
            // It would commit at once, without the chain's writes it builds on.
            return Err(TxError::Refused {
                reason: "open nesting inside a linked transaction".into(),
            });
        }
        let opts = TxOptions {
            priority: st.priority,
            contention: Some(st.policy),
            ..TxOptions::default()
        };
        let engine = self.engine;
        match engine.run_as(&opts, owner, true, None, f) {
            Ok((r, handed)) => {
                if let Some(p) = handed {
                    let st = self.st();
                    st.handlers.extend(p.handlers);
                    st.abstract_locks.extend(p.locks);
                }
                Ok(r)
            }
            Err(RunError::User(e)) | Err(RunError::Tx(e)) => {
                if matches!(e, TxError::Conflict) {
                    let st = self.st();
                    match st.remote.as_deref_mut() {
                        Some(rs) => rs.conflict.get_or_insert(AbortCause::AbstractLock),
                        None => st.abort.get_or_insert(AbortCause::AbstractLock),
                    };
                }
                Err(e)
            }
        }
    }
}
