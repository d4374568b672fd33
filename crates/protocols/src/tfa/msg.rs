//! Messages between TFA nodes. Every message carries the sender's clock (thesis 5.1).

use atomos_core::Key;
use serde::{Deserialize, Serialize};

use super::directory::NodeId;
use super::owner::{Refusal, TxId};

/// A message, the clock of the node that sent it and the sender's incarnation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TfaMsg {
    /// The sender's clock when it sent the message.
    pub clock: u64,
    /// The sender's incarnation (grows each time it restarts): a receiver that sees a newer
    /// one knows the sender lost what it held, and drops messages of older ones.
    pub incarnation: u64,
    /// What the message says.
    pub body: Body,
}

/// What TFA nodes say to each other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Body {
    /// Asks for the committed copy of `key`.
    Fetch {
        /// Matches the answer to the request.
        req: u64,
        /// The object.
        key: Key,
    },
    /// Asks for the committed copy of `key` and its commit lock for `tx`, which read it to
    /// write it (answered by `Fetched`; a `Found` answer with a value means the lock is held,
    /// until the decision; a missing object is not locked). Asked again by the same
    /// transaction, it answers the same.
    FetchLock {
        /// Matches the answer to the request.
        req: u64,
        /// The transaction that will write the object.
        tx: TxId,
        /// The object.
        key: Key,
    },
    /// The answer to a `Fetch` or a `FetchLock`.
    Fetched {
        /// The request answered.
        req: u64,
        /// What the node has.
        answer: FetchAnswer,
    },
    /// Asks the owner to lock the written objects it owns, checking the versions read.
    Lock {
        /// Matches the answer to the request.
        req: u64,
        /// The committing transaction.
        tx: TxId,
        /// Each key with the version the transaction read (`None`: written without reading).
        items: Vec<(Key, Option<u64>)>,
    },
    /// The answer to a `Lock`: all granted, or refused (then nothing was taken).
    Locked {
        /// The request answered.
        req: u64,
        /// Granted, or why not.
        result: Result<(), Refusal>,
    },
    /// Asks whether reads are still current (same version, not locked by another committer).
    Validate {
        /// Matches the answer to the request.
        req: u64,
        /// The transaction asking.
        tx: TxId,
        /// Each key with the version read.
        items: Vec<(Key, u64)>,
    },
    /// The answer to a `Validate`: the keys no longer current.
    Validated {
        /// The request answered.
        req: u64,
        /// Keys whose read is no longer current (empty: all valid).
        invalid: Vec<Key>,
    },
    /// The committer's decision for a transaction whose locks the receiver holds; also the
    /// answer to `Ask`. Re-sent until the owner confirms with `Done`.
    Decided {
        /// The transaction.
        tx: TxId,
        /// Commit (the objects named in `taken` move to the committer) or abort (locks
        /// released).
        decision: Decision,
        /// With a commit: the receiver's objects the committer wrote, each with the version it
        /// read (`None`: written unread, any version). The transaction's other locks there
        /// are released. Empty otherwise.
        taken: Vec<(Key, Option<u64>)>,
    },
    /// The owner applied the decisions for these transactions (sent in batches, on the
    /// owner's timer).
    Done {
        /// The transactions.
        txs: Vec<TxId>,
    },
    /// An owner whose lock outlived its lease asks the committer for its decision.
    Ask {
        /// The transaction.
        tx: TxId,
    },
    /// Tells the receiver, the home of these keys, that the sender committed each at its
    /// version (sent in batches, on the committer's timer).
    Track {
        /// Each object with the version written.
        entries: Vec<(Key, u64)>,
    },
    /// Tells the receiver, the home of these keys, that the sender dropped its copy of each
    /// at its version as lost: the copy was locked by a transaction whose outcome nobody can
    /// tell any more (its committer restarted, or never answered). Confirmed by `Tracked`.
    Lost {
        /// Each object with the version the sender held and the node it was lost with.
        entries: Vec<(Key, u64, NodeId)>,
    },
    /// The sender (re)started: sent to every member until each answers `Welcome`.
    Hello,
    /// The answer to `Hello`, naming the incarnation greeted (an answer to an earlier run's
    /// `Hello` does not end a later run's greeting).
    Welcome {
        /// The incarnation of the node that said `Hello`.
        incarnation: u64,
    },
    /// The home recorded these `Track` or `Lost` entries (each with whether it was a loss).
    Tracked {
        /// Each object with the version recorded.
        entries: Vec<(Key, u64, bool)>,
    },
    /// Asks the lock's home for an abstract lock (open nesting) for a transaction family of
    /// the sender.
    AbstractLock {
        /// Matches the answer to the request.
        req: u64,
        /// The family (a top-level transaction and its open-nested children) on the sender.
        family: u64,
        /// The lock's name.
        name: String,
    },
    /// The answer to `AbstractLock`: taken now (`Some(true)`), already the family's
    /// (`Some(false)`), or held by another family (`None`).
    AbstractLocked {
        /// The request answered.
        req: u64,
        /// The outcome.
        granted: Option<bool>,
    },
    /// The family gave these abstract locks back (its transaction, or one of its open-nested
    /// blocks, ended): they are free here unless granted again since.
    AbstractRelease {
        /// The family.
        family: u64,
        /// The locks.
        names: Vec<String>,
        /// Every ask of the family numbered from `before` on came after this release: a grant
        /// to one of those stays (messages between two nodes may arrive out of order).
        before: u64,
    },
    /// A home whose abstract lock outlived its lease asks whether the family still runs.
    FamilyAlive {
        /// The family.
        family: u64,
    },
    /// The answer to `FamilyAlive`.
    FamilyState {
        /// The family.
        family: u64,
        /// Whether it holds abstract locks or asks for one.
        alive: bool,
        /// As for `AbstractRelease`: what a family that does not run held from asks numbered
        /// below `before` is free; a grant to a later ask stays.
        before: u64,
    },
    /// A `Fetch` or `FetchLock`, passed on by a node that does not own the object to the node
    /// it believes does; the receiver answers the reader directly (`Fetched`), or passes it on
    /// again. The message's clock is the passer's, which had seen the reader's.
    Forwarded(PassedRead),
}

/// Every kind of message here was spoken by wire version 17, the oldest a build still speaks
/// (0: every version spoken has it). A variant added later says the version that introduced it
/// (the match is exhaustive so that adding one asks the question).
impl atomos_seam::WireMessage for TfaMsg {
    fn since(&self) -> u16 {
        match &self.body {
            Body::Fetch { .. }
            | Body::FetchLock { .. }
            | Body::Fetched { .. }
            | Body::Lock { .. }
            | Body::Locked { .. }
            | Body::Validate { .. }
            | Body::Validated { .. }
            | Body::Decided { .. }
            | Body::Done { .. }
            | Body::Ask { .. }
            | Body::Track { .. }
            | Body::Lost { .. }
            | Body::Hello
            | Body::Welcome { .. }
            | Body::Tracked { .. }
            | Body::AbstractLock { .. }
            | Body::AbstractLocked { .. }
            | Body::AbstractRelease { .. }
            | Body::FamilyAlive { .. }
            | Body::FamilyState { .. }
            | Body::Forwarded { .. } => 0,
        }
    }
}

/// A read of another node (its `Fetch` or `FetchLock`), as a node serves it or passes it on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PassedRead {
    /// The node that asked.
    pub origin: NodeId,
    /// Its incarnation when it asked (checked as if the origin had sent the message).
    pub origin_incarnation: u64,
    /// The origin's request.
    pub req: u64,
    /// With `Some`, a `FetchLock` for this transaction of the origin.
    pub lock: Option<TxId>,
    /// The object.
    pub key: Key,
    /// Times the request was passed on so far.
    pub hops: u32,
}

/// What a node answers to a `Fetch`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum FetchAnswer {
    /// The receiver owns the object: its committed copy (`None`: it does not exist).
    Found {
        /// The encoded value, or `None` if the object does not exist.
        value: Option<Vec<u8>>,
        /// Its version.
        version: u64,
    },
    /// A commit holds the object's lock: its value is about to change.
    Busy,
    /// The receiver does not own the object; ask this node.
    Redirect(NodeId),
    /// The object was lost with this node (it restarted, or stopped answering, holding it).
    Lost(NodeId),
}

/// A committer's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Decision {
    /// Committed at `version`: the objects it wrote move to the committer (the others it
    /// locked are released).
    Commit {
        /// The version the committer wrote.
        version: u64,
    },
    /// Aborted: release its locks.
    Abort,
    /// The committer restarted since and cannot tell: the locked objects are in doubt (they
    /// may have moved to the committer and died with it) and are dropped as lost.
    Unknown,
}
