//! What OSS nodes say to each other, and what a node keeps on its disk.

use atomos_core::Key;
use atomos_order::OrderMsg;
use serde::{Deserialize, Serialize};

use super::control::DomainState;
use super::image::{DomainImage, ImagePart};
use super::sequencer::{CommitRequest, Conflict};
use super::write_set::{CommitId, DomainId, Epoch, TxId, WriteSet};

/// A message between OSS nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OssMsg {
    /// The control log's order layer.
    Order(OrderMsg),
    /// A commit asked of the domain's sequencer in `epoch`.
    Commit {
        /// The domain.
        domain: DomainId,
        /// The epoch the sender believes current.
        epoch: Epoch,
        /// The transaction's reads and writes in the domain.
        request: CommitRequest,
    },
    /// The sequencer did not number the commit: a conflict, or it is not the sequencer of
    /// the sender's epoch (`conflict: None`; the sender waits for the current epoch).
    Refused {
        /// The domain.
        domain: DomainId,
        /// The epoch the request was sent in (a refusal of another epoch's is stale).
        epoch: Epoch,
        /// The transaction.
        tx: TxId,
        /// Why, when it was a conflict.
        conflict: Option<Conflict>,
    },
    /// Numbered write sets, for every node (one bulk message per sequencer step).
    WriteSets(Vec<WriteSet>),
    /// The sender holds every write set of `domain` through `through` (in `epoch`).
    Held {
        /// The domain.
        domain: DomainId,
        /// The sender's epoch.
        epoch: Epoch,
        /// Its held watermark.
        through: CommitId,
    },
    /// Send me the write sets of `domain` in `from..=to` that you have.
    Fetch {
        /// The domain.
        domain: DomainId,
        /// The first id wanted.
        from: CommitId,
        /// The last id wanted.
        to: CommitId,
    },
    /// A node that lost its log asks how far the others hold write sets (`run`: its run, so
    /// answers to an earlier run's probe are told apart).
    RejoinProbe {
        /// The asking run.
        run: u64,
    },
    /// The answer to a [`OssMsg::RejoinProbe`].
    RejoinAnswer {
        /// The run that asked.
        run: u64,
        /// Whether the answering node rejoins itself (its answer then does not count).
        rejoining: bool,
        /// Its held watermark in each domain.
        held: Vec<CommitId>,
    },
    /// After `epoch` of `domain` was suspected, the sender holds (or knows committed) every id
    /// through `mark` and takes no more of that epoch.
    Report {
        /// The domain.
        domain: DomainId,
        /// The suspected epoch.
        epoch: Epoch,
        /// The sender's mark.
        mark: CommitId,
    },
    /// The commit token of `domain` in `epoch`, passed to the receiver (token modes).
    Token(Token),
    /// The receiver of a token says it has it (or had it): the sender stops sending it.
    TokenAck {
        /// The domain.
        domain: DomainId,
        /// The token's epoch.
        epoch: Epoch,
        /// The token's hop.
        hop: u64,
    },
    /// Node `node` wants the token of `domain` in `epoch` (token modes).
    TokenRequest {
        /// The domain.
        domain: DomainId,
        /// The epoch the requester is in.
        epoch: Epoch,
        /// The node that wants it (the sender may be forwarding).
        node: u64,
        /// How many times it was forwarded already (0: the requester sent it; `None`: sent
        /// to every node, never to be forwarded).
        forwarded: Option<u8>,
    },
    /// A part of an image of a domain, for a node that lacks write sets the sender no longer
    /// keeps (see [`super::image`]).
    ImagePart(ImagePart),
}

/// Every kind of message here was spoken by wire version 17, the oldest a build still speaks
/// (0: every version spoken has it); the control log's messages say their own. A variant added
/// later says the version that introduced it (the match is exhaustive so that adding one asks).
impl atomos_seam::WireMessage for OssMsg {
    fn since(&self) -> u16 {
        match self {
            OssMsg::Order(msg) => atomos_seam::WireMessage::since(msg),
            OssMsg::Commit { .. }
            | OssMsg::Refused { .. }
            | OssMsg::WriteSets { .. }
            | OssMsg::Held { .. }
            | OssMsg::Fetch { .. }
            | OssMsg::RejoinProbe { .. }
            | OssMsg::RejoinAnswer { .. }
            | OssMsg::Report { .. }
            | OssMsg::Token { .. }
            | OssMsg::TokenAck { .. }
            | OssMsg::TokenRequest { .. }
            | OssMsg::ImagePart { .. } => 0,
        }
    }
}

/// The commit token of one domain in one epoch: whoever holds it numbers its own commits
/// from `next` on. Each pass increments `hop`; a node takes a token only with a hop above
/// every one it took or passed in that epoch (and logs it first), so a token duplicated or
/// sent again by the network is never used twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The domain.
    pub domain: DomainId,
    /// The epoch it belongs to.
    pub epoch: Epoch,
    /// Passes since the epoch started (0: the epoch's start made it).
    pub hop: u64,
    /// The id the next commit numbered with it gets.
    pub next: CommitId,
    /// The nodes waiting for it, in the order they get it (OSS IV-A, the in-token list).
    pub requests: Vec<u64>,
}

/// A record of a node's write-ahead log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OssRecord {
    /// The node started its `n`-th run (transaction ids of each run differ).
    Incarnation(u64),
    /// A write set received.
    WriteSet(WriteSet),
    /// A commit of node-local keys only (validated when it was written: replayed as is,
    /// once every domain is applied through `applied`, as it was when it committed).
    Local {
        /// Its writes.
        writes: Vec<(Key, Option<Vec<u8>>)>,
        /// Each domain's applied watermark when it committed.
        applied: Vec<CommitId>,
    },
    /// A commit with node-local writes as it was sent (written before, so a restart keeps
    /// it: its local writes are installed with its write set, and it guards its local keys
    /// until its fate is known).
    LocalOf {
        /// Its domain.
        domain: DomainId,
        /// The epoch it was sent in.
        epoch: Epoch,
        /// What was asked of the sequencer.
        request: CommitRequest,
        /// Its writes to node-local keys.
        writes: Vec<(Key, Option<Vec<u8>>)>,
        /// The node-local keys it read.
        local_reads: Vec<Key>,
        /// Each domain's applied watermark when it was sent.
        applied: Vec<CommitId>,
    },
    /// A domain was fenced in an epoch.
    Fenced {
        /// The domain.
        domain: DomainId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A domain's epoch started (as the control log decided).
    Started {
        /// The domain.
        domain: DomainId,
        /// Its state.
        state: DomainState,
    },
    /// A record of the control log's order replica.
    Order(Vec<u8>),
    /// Commit `tx`, logged with [`OssRecord::LocalOf`], was refused: it never commits (a
    /// replay does not send it again).
    Refused(TxId),
    /// The node lost its log and rejoins: it reports no mark until it holds what the others
    /// hold (`true`), or it got there (`false`).
    Rejoining(bool),
    /// The node took the token of `domain` in `epoch` at hop `hop` (it takes none at that
    /// hop or below again, and uses it only once this record is durable).
    TokenTaken {
        /// The domain.
        domain: DomainId,
        /// The epoch.
        epoch: Epoch,
        /// The token's hop.
        hop: u64,
    },
    /// An image of a domain received whole: installed once durable, in its place on replay.
    Image(DomainImage),
}

impl OssRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    /// A record from its bytes.
    pub fn decode(bytes: &[u8]) -> Result<OssRecord, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

/// What the node tells the application about one of its commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OssDelivery {
    /// Transaction `tx` (the caller's number) committed; its writes are installed here with
    /// engine version `version`.
    Committed {
        /// The caller's number for it.
        tx: u64,
        /// The engine version of its writes.
        version: u64,
    },
    /// It did not commit and wrote nothing: run it again (or report `reason`).
    Aborted {
        /// The caller's number for it.
        tx: u64,
        /// Why.
        reason: AbortReason,
    },
}

/// Why a commit did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// It read a version a commit before it replaced (first wins).
    Conflict(Key),
    /// It touches more than one consistency domain.
    CrossDomain,
    /// The node restarted and has not installed everything its log held yet: run it again
    /// shortly.
    Recovering,
    /// Whether it committed cannot be told: an image of its domain passed it, and the image's
    /// latest commits of this node (at most [`super::domain_log::RECENT_PER_NODE`]) do not
    /// go back that far. It is not sent again; its node-local writes are not installed.
    Unknown,
}
