//! Closed nesting and checkpoints: partial rollback inside one transaction.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use crate::contention::pause;
use crate::engine::{Attempts, Engine, RunError, TxOptions};
use crate::error::TxError;
use crate::remote::{CommitOutcome, RemoteMark};
use crate::stats::{AbortCause, Event};
use crate::tx::{CommitFailure, Mark, Tx};

/// Whether an abort cause can be handled by rolling back part of the transaction.
fn partially_recoverable(cause: AbortCause) -> bool {
    matches!(
        cause,
        AbortCause::ReadLocked
            | AbortCause::ReadValidation
            | AbortCause::LockConflict
            | AbortCause::CommitValidation
    )
}

impl<'e> Tx<'e> {
    /// Runs `f` as a closed-nested transaction. If a conflict arises inside and everything the
    /// enclosing transaction read before the block is still valid, only the block is rolled back
    /// and re-run; otherwise the whole transaction aborts. On success the block's reads and
    /// writes become the parent's. If `f` returns an application error, the block's effects are
    /// undone and the error is returned to the parent, which may handle it.
    pub fn nested<R>(
        &mut self,
        mut f: impl FnMut(&mut Tx<'e>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        if self.remote().is_some() {
            return self.remote_block(f);
        }
        let mut rollbacks = 0;
        loop {
            let st = self.st();
            if st.abort.is_some() {
                return Err(TxError::Conflict);
            }
            let mark = st.mark();
            st.open_scope();
            let out = f(self);
            let st = self.st();
            match st.abort.take() {
                None => match out {
                    Ok(r) => {
                        st.close_scope(&mark);
                        return Ok(r);
                    }
                    Err(e) => {
                        let compensations = st.rollback_to(&mark);
                        self.engine.run_handlers(compensations);
                        return Err(e);
                    }
                },
                Some(cause)
                    if partially_recoverable(cause)
                        && st.extend_prefix(self.engine, mark.reads) =>
                {
                    let compensations = st.rollback_to(&mark);
                    st.bump(Event::NestedRollback);
                    rollbacks += 1;
                    let wait = st.policy.backoff(rollbacks, st.priority, st.jitter.next());
                    self.engine.run_handlers(compensations);
                    pause(wait);
                }
                Some(cause) => {
                    st.abort = Some(cause);
                    st.close_scope(&mark);
                    return Err(out.err().unwrap_or(TxError::Conflict));
                }
            }
        }
    }
}

impl<'e> Tx<'e> {
    /// A closed-nested block under a distributed protocol (TFACN, thesis figure 5.3). When a
    /// read in the block cannot forward because reads made inside the block are no longer
    /// current, only the block is rolled back and re-run; stale reads of the parent abort the
    /// whole transaction. An application error undoes the block's writes and runs the
    /// compensations it registered.
    pub(crate) fn remote_block<R>(
        &mut self,
        mut f: impl FnMut(&mut Tx<'e>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        let mut rollbacks = 0;
        loop {
            let (mark, handlers) = match self.remote() {
                Some(rs) => (rs.mark(), self.st().handlers.len()),
                None => unreachable!("called for remote attempts only"),
            };
            let out = f(self);
            let st = self.st();
            let Some(rs) = st.remote.as_deref_mut() else {
                unreachable!("called for remote attempts only")
            };
            let conflict = rs.conflict.is_some();
            let repair = conflict && rs.repairable_from(&[mark]) == Some(0);
            if repair {
                rs.repair(mark);
            } else if out.is_ok() || conflict {
                // Done, or a conflict the whole transaction must handle.
                return out;
            } else {
                rs.rollback_to(mark);
            }
            let mut compensations: Vec<_> = st
                .handlers
                .drain(handlers..)
                .filter(|h| !h.on_commit)
                .collect();
            compensations.reverse();
            self.engine.run_handlers(compensations);
            if !repair {
                return out;
            }
            st.bump(Event::NestedRollback);
            rollbacks += 1;
            pause(st.policy.backoff(rollbacks, st.priority, st.jitter.next()));
        }
    }
}

/// One step of a checkpointed transaction.
pub type Step<'a, S> = Box<dyn FnMut(&mut Tx<'_>, &mut S) -> Result<(), TxError> + 'a>;

impl Engine {
    /// Runs a transaction written as steps over a state `S`. Before each step the state is
    /// cloned as a checkpoint; when a conflict arises (during a step or at commit), the
    /// transaction resumes from the latest checkpoint whose earlier reads are all still valid,
    /// instead of restarting from the first step. Returns the final state once committed.
    pub fn run_steps<S: Clone>(
        &self,
        opts: &TxOptions,
        init: S,
        steps: &mut [Step<'_, S>],
    ) -> Result<S, TxError> {
        if self.is_remote() {
            return self.run(opts, |tx| remote_steps(tx, &init, steps));
        }
        if opts.linearizable {
            self.sync()?;
        }
        let mut st = self.take_state();
        let mut attempts = Attempts::new(self, &mut st, opts, 0, false);
        let mut checkpoints: Vec<(Mark, S)> = Vec::with_capacity(steps.len());
        let task = atomos_sched::current();
        loop {
            attempts.begin(self, &mut st);
            let mut tx = Tx::new(self, st, task);
            checkpoints.clear();
            let mut state = init.clone();
            let mut i = 0;
            let outcome: Result<(), RunError<TxError>> = loop {
                if i == steps.len() {
                    let s = tx.st();
                    if s.abort.is_none() {
                        match s.commit(self) {
                            Ok(()) => break Ok(()),
                            Err(CommitFailure::Abort(cause)) => s.abort = Some(cause),
                            Err(CommitFailure::Fatal(e)) => break Err(RunError::Tx(e)),
                        }
                    }
                } else {
                    checkpoints.truncate(i);
                    checkpoints.push((tx.st().mark(), state.clone()));
                    // Writes from here on that replace earlier ones are undo-logged, so that
                    // resuming at this checkpoint restores what the earlier steps wrote.
                    tx.st().open_scope();
                    let out =
                        match catch_unwind(AssertUnwindSafe(|| (steps[i])(&mut tx, &mut state))) {
                            Ok(out) => out,
                            Err(panic) => {
                                self.abandon(tx.into_state());
                                resume_unwind(panic);
                            }
                        };
                    match (out, tx.st().abort) {
                        (Ok(()), None) => {
                            i += 1;
                            continue;
                        }
                        (Err(e), None) => break Err(RunError::User(e)),
                        _ => {}
                    }
                }
                // A conflict: find the latest checkpoint after the first whose reads still hold.
                let s = tx.st();
                let cause = s.abort.expect("conflict without a cause");
                if !partially_recoverable(cause) {
                    break Err(RunError::Tx(TxError::Conflict));
                }
                let resume = (1..checkpoints.len())
                    .rev()
                    .find(|&k| s.reads_valid(checkpoints[k].0.reads));
                match resume {
                    Some(k) if s.extend_prefix(self, checkpoints[k].0.reads) => {
                        s.bump(Event::Abort(cause));
                        let compensations = s.rollback_to(&checkpoints[k].0);
                        s.bump(Event::CheckpointResume);
                        self.run_handlers(compensations);
                        state = checkpoints[k].1.clone();
                        i = k;
                    }
                    _ => break Err(RunError::Tx(TxError::Conflict)),
                }
            };
            st = tx.into_state();
            match outcome {
                Ok(()) => {
                    st.after_commit(self);
                    self.finish(st, true).run(self);
                    return Ok(state);
                }
                Err(RunError::User(e)) => {
                    self.end_with_user_error(st);
                    return Err(e);
                }
                Err(RunError::Tx(e)) if !e.is_signal() => {
                    self.end_undecided(st);
                    return Err(e);
                }
                Err(RunError::Tx(_)) => {
                    let cause = st.abort.take().unwrap_or(AbortCause::CommitValidation);
                    if let Err(e) = attempts.aborted(self, &mut st, cause) {
                        self.finish(st, false).run(self);
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// Checkpointed steps under a distributed protocol (TFACP, thesis figures 5.4-5.5): when a read
/// cannot forward, or the commit finds reads no longer current, the attempt resumes from the
/// latest checkpoint before the first stale read, instead of restarting. The steps commit here,
/// so that a failed commit can resume too.
fn remote_steps<S: Clone>(
    tx: &mut Tx<'_>,
    init: &S,
    steps: &mut [Step<'_, S>],
) -> Result<S, TxError> {
    let mut checkpoints: Vec<(RemoteMark, S)> = Vec::with_capacity(steps.len());
    let mut state = init.clone();
    let mut i = 0;
    loop {
        if i == steps.len() {
            let Some(rs) = tx.remote() else {
                unreachable!("called for remote attempts only")
            };
            match rs.commit() {
                Ok(_) => return Ok(state),
                Err(CommitOutcome::Error(e)) => return Err(e),
                Err(CommitOutcome::Conflict(_)) => {
                    let marks: Vec<_> = checkpoints.iter().map(|(m, _)| *m).collect();
                    let Some(k) = rs.repairable_from(&marks) else {
                        return Err(TxError::Conflict);
                    };
                    rs.repair(marks[k]);
                    tx.st().bump(Event::CheckpointResume);
                    state = checkpoints[k].1.clone();
                    i = k;
                    continue;
                }
            }
        }
        let Some(rs) = tx.remote() else {
            unreachable!("called for remote attempts only")
        };
        checkpoints.truncate(i);
        checkpoints.push((rs.mark(), state.clone()));
        match (steps[i])(tx, &mut state) {
            Ok(()) => i += 1,
            Err(e) => {
                let Some(rs) = tx.remote() else {
                    unreachable!("called for remote attempts only")
                };
                if rs.conflict.is_none() {
                    return Err(e);
                }
                let marks: Vec<_> = checkpoints.iter().map(|(m, _)| *m).collect();
                let Some(k) = rs.repairable_from(&marks) else {
                    return Err(e);
                };
                rs.repair(marks[k]);
                let st = tx.st();
                st.bump(Event::CheckpointResume);
                state = checkpoints[k].1.clone();
                i = k;
            }
        }
    }
}
