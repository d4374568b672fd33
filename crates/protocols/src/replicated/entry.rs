//! What the replicated store's log carries, and what it answers.

use atomos_core::Key;
use serde::{Deserialize, Serialize};

/// One entry of the replicated store's log (a request's payload, postcard-encoded).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Entry {
    /// Certify a transaction that ran on one replica: commit its writes if every read is still
    /// the newest version.
    Certify {
        /// Every object read, with the version read (0: never written).
        reads: Vec<(Key, u64)>,
        /// The writes, each key once: tagged value bytes, or `None` to delete.
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// Changes nothing: once a replica has applied it, it has applied everything ordered
    /// before it (linearizable reads wait for one).
    Barrier,
    /// Take abstract lock `name` for transaction family `owner` (open nesting). Written by
    /// builds whose owners packed the node and the run in 16 bits each: still read (as
    /// [`LockOwner::from_packed`]), no longer written; see [`Entry::LockFor`].
    Lock {
        /// The family, packed as `node << 48 | run << 32 | family`.
        owner: u64,
        /// The lock.
        name: String,
    },
    /// Release the family's abstract locks among `names`. Read as written by earlier builds
    /// (see [`Entry::Lock`]); see [`Entry::UnlockFor`].
    Unlock {
        /// The family, packed.
        owner: u64,
        /// The locks.
        names: Vec<String>,
    },
    /// Delete the anonymous objects that no named object reaches (garbage collection).
    Collect,
    /// Release every abstract lock held by a family of node `node` ([`node_bits`]) other than
    /// those of its run `keep` (a restarted node's earlier run held them and is gone); later
    /// requests of the node's other runs are refused. Read as written by earlier builds (see
    /// [`Entry::Lock`]); see [`Entry::ReleaseStaleRuns`].
    ReleaseStale {
        /// The node.
        node: u64,
        /// Its current run (families of this run keep their locks).
        keep: u64,
    },
    // Entries added later come last: postcard numbers variants by position, and logs and
    // snapshots written before must decode as they were written.
    /// A digest entry of earlier builds, whose `reported` digest was FNV-1a: every replica
    /// computes its own digest (as [`Entry::ContentsDigest`]) but compares nothing (the
    /// reported one was computed another way).
    Digest {
        /// A digest a replica computed before: (its node, the position, the digest).
        reported: Option<(u64, u64, u64)>,
    },
    /// Run procedure `procedure` on `arguments` (encoded) at this position on every replica
    /// (the `active` protocol): speculatively when the entry is delivered optimistically,
    /// committed when it is final.
    Invoke {
        /// The registered name.
        procedure: String,
        /// The encoded arguments.
        arguments: Vec<u8>,
    },
    /// Take abstract lock `name` for transaction family `owner` (open nesting).
    LockFor {
        /// The family, unique in the cluster.
        owner: LockOwner,
        /// The lock.
        name: String,
    },
    /// Release the family's abstract locks among `names`.
    UnlockFor {
        /// The family.
        owner: LockOwner,
        /// The locks.
        names: Vec<String>,
    },
    /// Release every abstract lock held by a family of node `node` other than those of its
    /// run `keep` (a restarted node's earlier run held them and is gone); later requests of
    /// the node's other runs are refused.
    ReleaseStaleRuns {
        /// The node.
        node: u64,
        /// Its current run (families of this run keep their locks).
        keep: u64,
    },
    /// Every replica computes the digest of its store's contents at this position (XXH3, see
    /// `ReplicatedStore::contents_digest`) and compares `reported` with its own digest at that
    /// position: replicas must never diverge silently.
    ContentsDigest {
        /// A digest a replica computed before: (its node, the position, the digest).
        reported: Option<(u64, u64, u64)>,
    },
    /// Changes nothing, like [`Entry::Barrier`], and is answered with the order log's position
    /// it was finally delivered at ([`Answer::Marked`]): a backup waits for a snapshot that
    /// covers it.
    Mark,
}

/// Who holds an abstract lock: transaction family `family` of run `run` (one start) of node
/// `node`, each at full width, so no two nodes, runs or families share an owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LockOwner {
    /// The node.
    pub node: u64,
    /// The node's run.
    pub run: u64,
    /// The family, numbered by the node's engine.
    pub family: u64,
}

impl LockOwner {
    /// An owner as earlier builds packed it: `node << 48 | run << 32 | family`, the node and
    /// the run in 16 bits each ([`owner_node`], [`owner_run`]), the family in 32.
    pub fn from_packed(owner: u64) -> LockOwner {
        LockOwner {
            node: owner_node(owner),
            run: owner_run(owner),
            family: owner & 0xFFFF_FFFF,
        }
    }
}

/// The node a packed lock owner (of [`Entry::Lock`]) belongs to: packed owners are
/// `node << 48 | run << 32 | family`, with the node's id in 16 bits ([`node_bits`]).
pub fn owner_node(owner: u64) -> u64 {
    owner >> 48
}

/// A node's id as packed lock owners carry it (16 bits).
pub fn node_bits(node: u64) -> u64 {
    node & 0xFFFF
}

/// The run (one start of a node) a packed lock owner belongs to.
pub fn owner_run(owner: u64) -> u64 {
    (owner >> 32) & 0xFFFF
}

impl Entry {
    /// The entry as a request payload.
    pub fn encode(&self) -> Vec<u8> {
        // Encoding into a vector fails only on a serializer error, which these types do not
        // produce.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// The entry a payload holds.
    pub fn decode(payload: &[u8]) -> Result<Entry, postcard::Error> {
        postcard::from_bytes(payload)
    }
}

/// What the store answers for an entry (the answer's bytes go back to the client that sent
/// it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The certification passed; its writes have this version (the entry's log position).
    Committed {
        /// The version.
        version: u64,
    },
    /// A read was no longer the newest version: nothing changed.
    Conflict {
        /// The entry's log position.
        position: u64,
    },
    /// The abstract lock is held by the family now (`taken`: it was not before).
    Locked {
        /// The entry's log position.
        position: u64,
        /// Whether it was taken by this entry.
        taken: bool,
    },
    /// The abstract lock is held by another family.
    LockHeld {
        /// The entry's log position.
        position: u64,
    },
    /// A collection deleted `reclaimed` unreachable anonymous objects.
    Collected {
        /// The entry's log position (the deletions' version).
        position: u64,
        /// How many objects it deleted.
        reclaimed: u64,
    },
    /// A barrier (or another entry without an outcome) was applied at this position.
    Applied {
        /// The position.
        position: u64,
    },
    /// The payload is not an entry this build reads: nothing changed.
    Refused {
        /// The position it was ordered at.
        position: u64,
        /// Why.
        reason: String,
    },
    // Answers added later come last (see `Entry`).
    /// A procedure invocation was applied at this position and came to `outcome`.
    Invoked {
        /// The entry's log position (the version of its writes).
        position: u64,
        /// Its result, or why it failed (then it wrote nothing).
        outcome: atomos_core::Outcome,
    },
    /// This replica's digest of its store at this position.
    Digested {
        /// The position.
        position: u64,
        /// The digest (equal on every replica that applied the same log).
        digest: u64,
    },
    /// An [`Entry::Mark`] was applied at this position, finally delivered at order log
    /// position `seq` (0 where it was applied outside a final delivery).
    Marked {
        /// The store's position.
        position: u64,
        /// The order log's position of the entry that carried it.
        seq: u64,
    },
}

impl Answer {
    /// The answer as response bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// The answer response bytes hold.
    pub fn decode(bytes: &[u8]) -> Result<Answer, postcard::Error> {
        postcard::from_bytes(bytes)
    }

    /// The log position the answer was given at.
    pub fn position(&self) -> u64 {
        match self {
            Answer::Committed { version } => *version,
            Answer::Conflict { position }
            | Answer::Locked { position, .. }
            | Answer::LockHeld { position }
            | Answer::Collected { position, .. }
            | Answer::Invoked { position, .. }
            | Answer::Digested { position, .. }
            | Answer::Applied { position }
            | Answer::Marked { position, .. }
            | Answer::Refused { position, .. } => *position,
        }
    }
}
