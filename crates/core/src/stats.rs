//! Engine statistics, counted per thread without shared writes and summed on demand.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Why an attempt aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum AbortCause {
    /// A read met a cell locked by a committer.
    ReadLocked = 0,
    /// A read found a newer version and the snapshot could not be extended.
    ReadValidation = 1,
    /// Commit could not lock its write set.
    LockConflict = 2,
    /// Commit-time validation of the read set failed.
    CommitValidation = 3,
    /// An abstract lock (open nesting) was held by another transaction.
    AbstractLock = 4,
    /// The transaction called `retry()`.
    ExplicitRetry = 5,
    /// A read-only attempt wanted to write and was re-run as an update transaction.
    Upgrade = 6,
}

const CAUSES: usize = 7;

/// Counters of one thread slot. Only the owning thread writes them.
#[derive(Default)]
pub(crate) struct Counters {
    commits: AtomicU64,
    read_only_commits: AtomicU64,
    aborts: [AtomicU64; CAUSES],
    retry_waits: AtomicU64,
    nested_rollbacks: AtomicU64,
    checkpoint_resumes: AtomicU64,
    snapshot_extensions: AtomicU64,
    user_aborts: AtomicU64,
    handler_failures: AtomicU64,
}

/// A counter a transaction bumps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Commit,
    ReadOnlyCommit,
    Abort(AbortCause),
    RetryWait,
    NestedRollback,
    CheckpointResume,
    SnapshotExtension,
    UserAbort,
    HandlerFailure,
}

impl Counters {
    #[inline]
    fn counter(&self, e: Event) -> &AtomicU64 {
        match e {
            Event::Commit => &self.commits,
            Event::ReadOnlyCommit => &self.read_only_commits,
            Event::Abort(c) => &self.aborts[c as usize],
            Event::RetryWait => &self.retry_waits,
            Event::NestedRollback => &self.nested_rollbacks,
            Event::CheckpointResume => &self.checkpoint_resumes,
            Event::SnapshotExtension => &self.snapshot_extensions,
            Event::UserAbort => &self.user_aborts,
            Event::HandlerFailure => &self.handler_failures,
        }
    }

    /// Counts one event. Single writer: a plain load and store, no read-modify-write.
    #[inline]
    pub(crate) fn bump(&self, e: Event) {
        let c = self.counter(e);
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Counts one event from any thread (read-modify-write: for rare events only).
    pub(crate) fn add(&self, e: Event) {
        self.counter(e).fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_into(&self, s: &mut Stats) {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.commits += r(&self.commits);
        s.read_only_commits += r(&self.read_only_commits);
        s.aborts.read_locked += r(&self.aborts[0]);
        s.aborts.read_validation += r(&self.aborts[1]);
        s.aborts.lock_conflict += r(&self.aborts[2]);
        s.aborts.commit_validation += r(&self.aborts[3]);
        s.aborts.abstract_lock += r(&self.aborts[4]);
        s.aborts.explicit_retry += r(&self.aborts[5]);
        s.aborts.upgrade += r(&self.aborts[6]);
        s.retry_waits += r(&self.retry_waits);
        s.nested_rollbacks += r(&self.nested_rollbacks);
        s.checkpoint_resumes += r(&self.checkpoint_resumes);
        s.snapshot_extensions += r(&self.snapshot_extensions);
        s.user_aborts += r(&self.user_aborts);
        s.handler_failures += r(&self.handler_failures);
    }

    /// Adds `other`'s counts to these (used when a thread slot is retired). Not single-writer:
    /// uses read-modify-write.
    pub(crate) fn absorb(&self, other: &Counters) {
        let pairs = [
            (&self.commits, &other.commits),
            (&self.read_only_commits, &other.read_only_commits),
            (&self.retry_waits, &other.retry_waits),
            (&self.nested_rollbacks, &other.nested_rollbacks),
            (&self.checkpoint_resumes, &other.checkpoint_resumes),
            (&self.snapshot_extensions, &other.snapshot_extensions),
            (&self.user_aborts, &other.user_aborts),
            (&self.handler_failures, &other.handler_failures),
        ];
        for (a, b) in pairs {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (a, b) in self.aborts.iter().zip(other.aborts.iter()) {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// Aborted attempts by cause.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortCounts {
    /// A read met a locked cell.
    pub read_locked: u64,
    /// A read met a newer version and the snapshot could not be extended.
    pub read_validation: u64,
    /// Commit could not lock its write set.
    pub lock_conflict: u64,
    /// Commit-time read-set validation failed.
    pub commit_validation: u64,
    /// An abstract lock was held by another transaction.
    pub abstract_lock: u64,
    /// The transaction called `retry()`.
    pub explicit_retry: u64,
    /// A read-only attempt wrote and was re-run as an update transaction.
    pub upgrade: u64,
}

impl AbortCounts {
    /// All aborted attempts.
    pub fn total(&self) -> u64 {
        self.read_locked
            + self.read_validation
            + self.lock_conflict
            + self.commit_validation
            + self.abstract_lock
            + self.explicit_retry
            + self.upgrade
    }
}

impl Stats {
    /// The counts between `earlier` and this snapshot (of the same engine).
    pub fn since(&self, earlier: &Stats) -> Stats {
        self.zip(earlier, u64::saturating_sub)
    }

    /// The counts of two engines together (the nodes of a cluster).
    pub fn plus(&self, other: &Stats) -> Stats {
        self.zip(other, u64::saturating_add)
    }

    fn zip(&self, other: &Stats, f: impl Fn(u64, u64) -> u64) -> Stats {
        let (a, b) = (&self.aborts, &other.aborts);
        Stats {
            commits: f(self.commits, other.commits),
            read_only_commits: f(self.read_only_commits, other.read_only_commits),
            aborts: AbortCounts {
                read_locked: f(a.read_locked, b.read_locked),
                read_validation: f(a.read_validation, b.read_validation),
                lock_conflict: f(a.lock_conflict, b.lock_conflict),
                commit_validation: f(a.commit_validation, b.commit_validation),
                abstract_lock: f(a.abstract_lock, b.abstract_lock),
                explicit_retry: f(a.explicit_retry, b.explicit_retry),
                upgrade: f(a.upgrade, b.upgrade),
            },
            retry_waits: f(self.retry_waits, other.retry_waits),
            nested_rollbacks: f(self.nested_rollbacks, other.nested_rollbacks),
            checkpoint_resumes: f(self.checkpoint_resumes, other.checkpoint_resumes),
            snapshot_extensions: f(self.snapshot_extensions, other.snapshot_extensions),
            user_aborts: f(self.user_aborts, other.user_aborts),
            handler_failures: f(self.handler_failures, other.handler_failures),
        }
    }
}

/// A snapshot of an engine's counters since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Committed transactions (read-only ones included).
    pub commits: u64,
    /// Of those, transactions committed as read-only snapshots.
    pub read_only_commits: u64,
    /// Aborted attempts by cause.
    pub aborts: AbortCounts,
    /// Times a transaction blocked in `retry()`.
    pub retry_waits: u64,
    /// Closed-nested blocks rolled back and re-run without aborting their parent.
    pub nested_rollbacks: u64,
    /// Transactions resumed from a checkpoint other than the start.
    pub checkpoint_resumes: u64,
    /// Snapshots extended instead of aborting (LSA).
    pub snapshot_extensions: u64,
    /// Transactions ended by an application error.
    pub user_aborts: u64,
    /// On-commit or on-abort handlers that failed.
    pub handler_failures: u64,
}
