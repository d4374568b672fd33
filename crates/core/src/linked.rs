//! Linked transactions (OSS III-C): a transaction that runs before the commits of its thread's
//! earlier transactions are decided. It sees their writes (its *base*) as if they had
//! committed, and ends without committing: what it read and wrote becomes a [`Deferred`]
//! certification, sent once the earlier commits are decided (the caller, `atomos::Linked`,
//! orders that). If one of them fails, every later one that touched its writes re-runs.

use crate::engine::Engine;
use crate::error::TxError;
use crate::key::Key;
use crate::ordered::{Certification, Verdict};
use crate::stats::AbortCause;
use crate::tx::{encoded_write, name_of, CommitFailure, ReadEntry, Tx, TxState};
use crate::version::{OwnedVersion, Version};

/// What a linked transaction builds on: the earlier transactions of its chain whose commits
/// are not decided yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkBase {
    /// Their writes, each key once (later writes replace earlier ones): the value as tagged
    /// bytes, `None` for a deletion. The linked transaction sees them as committed.
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
    /// What they read, with the versions read. Once one is replaced, one of them will fail to
    /// commit and what they wrote is not a state any serial order produces next to the newer
    /// values: the linked transaction stops at once (opacity), and `run_linked` returns
    /// [`TxError::Conflict`] for its caller to wait for them and run it again.
    pub reads: Vec<(Key, u64)>,
}

/// What a linked transaction leaves to certify once the commits it built on are decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deferred {
    /// Its reads (the committed versions it read) and its own writes.
    pub certification: Certification,
    /// Keys of its base it read or wrote: it saw the earlier transactions' values there, so
    /// it reads them at the version their commit gets (added to the certification then).
    pub inherited: Vec<Key>,
}

/// A linked attempt's base on the transaction state: the first `seeded` writes came from it.
#[derive(Debug, Default)]
pub(crate) struct LinkState {
    pub(crate) seeded: usize,
    /// Each seeded write's version as seeded (a replaced one was written again).
    seeded_nodes: Vec<*const Version>,
    /// Whether the attempt read or wrote each seeded key.
    touched: Vec<bool>,
    /// The base's reads (but of keys it writes): each must stay current.
    guards: Vec<ReadEntry>,
    /// A guard was found replaced: the base is doomed, the attempt is not re-run here.
    pub(crate) doomed: bool,
    /// Set by the commit: what to certify (`None`: nothing, it neither wrote nor saw its base).
    pub(crate) result: Option<Deferred>,
}

// SAFETY: the pointers identify versions owned by the same transaction state, which moves
// between threads only as a whole and never while an attempt runs elsewhere.
unsafe impl Send for LinkState {}

impl TxState {
    /// Seeds the attempt's write set with `base` (at the start of an attempt).
    pub(crate) fn seed_link(&mut self, engine: &Engine, base: &LinkBase) {
        let mut link = LinkState::default();
        for (key, bytes) in &base.writes {
            let cell = engine.store.cell(key);
            let node = OwnedVersion::from_bytes(bytes.clone());
            link.seeded_nodes.push(node.as_ptr());
            self.push_write(cell, node);
        }
        for (key, version) in &base.reads {
            if base.writes.iter().all(|(k, _)| k != key) {
                link.guards.push(ReadEntry {
                    cell: engine.store.cell(key),
                    version: *version,
                });
            }
        }
        link.seeded = base.writes.len();
        link.touched = vec![false; base.writes.len()];
        self.link = Some(Box::new(link));
        if !self.link_guards_hold() {
            self.abort = Some(AbortCause::ReadValidation);
        }
    }

    /// Whether nothing the base read was replaced (true outside a linked attempt); marks the
    /// base doomed otherwise.
    pub(crate) fn link_guards_hold(&mut self) -> bool {
        let Some(link) = self.link.as_deref_mut() else {
            return true;
        };
        if link.guards.iter().all(ReadEntry::is_current) {
            return true;
        }
        link.doomed = true;
        false
    }

    /// The attempt read or wrote its write set's entry `i`.
    #[inline]
    pub(crate) fn note_link_touch(&mut self, i: usize) {
        if let Some(link) = self.link.as_deref_mut() {
            if let Some(t) = link.touched.get_mut(i) {
                *t = true;
            }
        }
    }

    /// A linked attempt's commit: nothing is installed or sent; its reads are checked as a
    /// certified commit checks them, and what to certify is kept in the link state.
    pub(crate) fn commit_linked(&mut self, engine: &Engine) -> Result<(), CommitFailure> {
        if !self.handlers.is_empty() || !self.abstract_locks.is_empty() {
            return Err(CommitFailure::Fatal(TxError::abort(
                "a linked transaction cannot register handlers or take abstract locks",
            )));
        }
        if !self.reads_valid(self.reads.len()) || !self.link_guards_hold() {
            engine.note_conflict_of(None, &self.reads);
            return Err(AbortCause::CommitValidation.into());
        }
        let Some(link) = self.link.as_deref() else {
            return Ok(());
        };
        let mut inherited = Vec::new();
        let mut writes = Vec::new();
        for (i, w) in self.writes.iter().enumerate() {
            if i < link.seeded {
                if link.touched[i] {
                    inherited.push(name_of(engine, w.cell)?);
                }
                let node = w
                    .node
                    .as_ref()
                    .map_or(std::ptr::null(), OwnedVersion::as_ptr);
                if std::ptr::eq(node, link.seeded_nodes[i]) {
                    // The base's write, not written again: the earlier transaction commits it.
                    continue;
                }
            }
            writes.push(encoded_write(engine, w)?);
        }
        let reads = self.named_reads(engine)?;
        let result = (!writes.is_empty() || !inherited.is_empty()).then_some(Deferred {
            certification: Certification { reads, writes },
            inherited,
        });
        if let Some(link) = self.link.as_deref_mut() {
            link.result = result;
        }
        Ok(())
    }
}

impl Engine {
    /// Whether update transactions commit through a certifier (a replicated protocol).
    pub fn has_certifier(&self) -> bool {
        self.certifier().is_some()
    }

    /// Runs `f` as a linked transaction over `base` (the writes of this thread's earlier
    /// transactions whose commits are not decided yet), re-running it on conflicts as
    /// [`Engine::atomically`] does, and returns its result with what must be certified for it
    /// to commit (`None`: nothing; it only read committed objects, and is done). It installs
    /// nothing: the caller certifies the [`Deferred`] with [`Engine::certify_deferred`] once
    /// the earlier commits are decided, and throws the result away (re-running `f`) if one of
    /// them fails. Needs a certifier (the replicated protocols).
    pub fn run_linked<R>(
        &self,
        base: &LinkBase,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>,
    ) -> Result<(R, Option<Deferred>), TxError> {
        // (A base whose reads were replaced ends the call with `TxError::Conflict`.)
        if self.certifier().is_none() {
            return Err(TxError::Refused {
                reason: "linked transactions need a protocol that certifies commits (certify, \
                         active or oss)"
                    .into(),
            });
        }
        let mut out = None;
        let opts = self.config().default_options.clone();
        match self.run_as(&opts, 0, false, Some((base, &mut out)), f) {
            Ok((r, _)) => Ok((r, out)),
            Err(crate::engine::RunError::User(e)) | Err(crate::engine::RunError::Tx(e)) => Err(e),
        }
    }

    /// Certifies a linked transaction's `certification` (its inherited reads completed by the
    /// caller) and waits until this replica applied it: the version its writes got.
    /// [`TxError::Conflict`] if something it read changed first (it re-runs).
    pub fn certify_deferred(&self, certification: Certification) -> Result<u64, TxError> {
        let Some(certifier) = self.certifier() else {
            return Err(TxError::Refused {
                reason: "no certifier".into(),
            });
        };
        let stale = |c: &Certification| {
            c.reads
                .iter()
                .find(|(k, v)| self.version_of(k) != *v)
                .map(|(k, _)| k.clone())
        };
        if let Some(key) = stale(&certification) {
            self.note_conflict(&key);
            return Err(TxError::Conflict);
        }
        let reads = certification.clone();
        match certifier.certify(certification) {
            Ok(Verdict::Committed { version }) => {
                let limit = std::time::Instant::now() + crate::ordered::APPLY_WAIT;
                self.wait_applied(version, Some(limit));
                Ok(version)
            }
            Ok(Verdict::Conflict) => {
                if let Some(key) = stale(&reads) {
                    self.note_conflict(&key);
                }
                Err(TxError::Conflict)
            }
            Err(crate::ordered::CertifyError::OutcomeUnknown { reason, ticket }) => {
                Err(TxError::OutcomeUnknown { reason, ticket })
            }
            Err(crate::ordered::CertifyError::Refused(reason)) => Err(TxError::Refused { reason }),
        }
    }
}
