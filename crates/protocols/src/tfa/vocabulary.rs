//! What a TFA node answers its application, what it counts, and why it cannot start.

use atomos_core::{AbortCause, Key};
use atomos_seam::Output;

use super::directory::NodeId;
use super::msg::TfaMsg;

/// Why a transaction failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A conflict: re-run the transaction.
    Conflict(AbortCause),
    /// Forwarding or commit-time validation found these reads no longer current. The
    /// transaction is still open (holding no locks): drop the reads of whatever part of it
    /// covers them ([`TfaNode::forget`](super::TfaNode::forget)) and go on, or abort it.
    Stale(Vec<Key>),
    /// A node did not answer in time about `key`; if it crashed, the objects it owned are lost.
    Unavailable {
        /// The object the request was about.
        key: Key,
        /// The node that did not answer.
        node: NodeId,
    },
    /// `key`'s object was lost with `node`: it restarted (or stopped answering) while it held
    /// the object, of which TFA keeps one copy. It is not re-created silently: writing the key
    /// fails the same way. One exception: a transaction that had read the object for a write
    /// and locked it before the loss may still commit its write (nobody else could change the
    /// object meanwhile, so the write follows the last committed value); the key then reads
    /// again, at that write.
    Lost {
        /// The object.
        key: Key,
        /// The node it was lost with.
        node: NodeId,
    },
}

/// An answer to the application, for the transaction with handle `h`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// An abstract lock: taken now (`true`), already the family's (`false`), or held by
    /// another family (`Failure::Conflict(AbortCause::AbstractLock)`).
    Abstract(Result<bool, Failure>),
    /// The committed value read (`None`: the object does not exist).
    Read(Result<Option<Vec<u8>>, Failure>),
    /// The transaction committed, or failed (and then nothing it wrote is visible).
    Commit(Result<(), Failure>),
}

/// An answer to the application's transaction `h`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The handle the application chose at `begin`.
    pub h: u64,
    /// The answer.
    pub reply: Reply,
}

/// What the node asks its driver to do: send messages, answer the application (a
/// [`Answer`] delivered), persist its home records (see [`super::durable`]), warn an
/// operator (objects given up as lost).
pub type Action = Output<TfaMsg, Answer>;

/// Counters of a node since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TfaCounters {
    /// Transactions committed, read-only ones included.
    pub commits: u64,
    /// Aborts because a read met a locked object.
    pub aborts_busy_read: u64,
    /// Aborts because the read set was invalid when forwarding.
    pub aborts_forward: u64,
    /// Aborts because a lock was busy at commit.
    pub aborts_lock_busy: u64,
    /// Aborts because validation failed at commit.
    pub aborts_validation: u64,
    /// Transactions failed because a node did not answer.
    pub unavailable: u64,
    /// Reads answered by another node.
    pub remote_reads: u64,
    /// Forwardings that succeeded.
    pub forwards: u64,
    /// Objects that moved here from another owner.
    pub migrations_in: u64,
    /// Locks given up without hearing a decision (the committer was presumed gone): their
    /// objects were dropped as lost.
    pub abandoned_locks: u64,
    /// Objects this node dropped as lost (in doubt after their committer restarted or was
    /// given up on).
    pub dropped_lost: u64,
    /// Home records marked lost (their owner restarted holding them, or dropped them).
    pub marked_lost: u64,
    /// Messages dropped because they came from an earlier run of their sender.
    pub stale_dropped: u64,
    /// Transactions that gave up the locks they took with reads: to wait for another lock, or
    /// because they held them past the lease without committing (an owner asked, or the
    /// object is this node's).
    pub locks_given_up: u64,
    /// Redirects this node's reads followed: answers of a node that did not own the object
    /// and did not pass the request on, or this node's own forwarding address.
    pub redirects: u64,
    /// Reads of other nodes this node passed on to the object's owner (as it knew it).
    pub reads_forwarded: u64,
}

/// Builds a `TfaCounters` whose every field is `op(a.field, b.field)`.
macro_rules! counters_fieldwise {
    ($a:expr, $b:expr, $op:expr, $($field:ident),+) => {
        TfaCounters { $($field: $op($a.$field, $b.$field)),+ }
    };
}

impl TfaCounters {
    fn fieldwise(&self, other: &TfaCounters, op: fn(u64, u64) -> u64) -> TfaCounters {
        counters_fieldwise!(
            self,
            other,
            op,
            commits,
            aborts_busy_read,
            aborts_forward,
            aborts_lock_busy,
            aborts_validation,
            unavailable,
            remote_reads,
            forwards,
            migrations_in,
            abandoned_locks,
            dropped_lost,
            marked_lost,
            stale_dropped,
            locks_given_up,
            redirects,
            reads_forwarded
        )
    }

    /// The sum of both, field by field (several nodes' counters together).
    pub fn plus(&self, other: &TfaCounters) -> TfaCounters {
        self.fieldwise(other, u64::saturating_add)
    }

    /// What was counted since `before` (an earlier reading of the same counters).
    pub fn since(&self, before: &TfaCounters) -> TfaCounters {
        self.fieldwise(before, u64::saturating_sub)
    }
}

/// Why a node cannot start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The member list lacks the node.
    #[error("node {0} is not in the member list")]
    NotAMember(NodeId),
    /// The log cannot be read.
    #[error(transparent)]
    Corrupt(#[from] super::durable::CorruptLog),
    /// Incarnations number transactions and requests in the top 32 bits of 64.
    #[error("incarnation {0} does not fit in 32 bits")]
    IncarnationTooLarge(u64),
    /// The incarnation is not newer than one the log already saw.
    #[error("incarnation {given} is not newer than {last}, which this node's log already ran")]
    OldIncarnation {
        /// The incarnation given.
        given: u64,
        /// The last one in the log.
        last: u64,
    },
}
