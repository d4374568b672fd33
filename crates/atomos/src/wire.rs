//! The wire vocabulary between nodes, and between clients and nodes: every message a node's
//! transport carries ([`NodeMsg`]) and why a client's request was not served ([`Refusal`]).
//! The encoding numbers variants in order, so variants are only ever appended.

use atomos_core::{ProcedureKind, TxError};
use atomos_order::OrderMsg;
use atomos_protocols::oss::OssMsg;
use atomos_protocols::tfa::TfaMsg;
use serde::{Deserialize, Serialize};

use crate::status::MemberStatus;

/// Messages of the node runtime itself. Protocols add their own variants as they arrive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeMsg {
    /// Asks the receiver to answer with [`NodeMsg::Pong`] carrying the same value.
    Ping(u64),
    /// The answer to a ping.
    Pong(u64),
    /// A message of the order layer.
    Order(OrderMsg),
    /// A message of the TFA protocol.
    Tfa(TfaMsg),
    // Variants added later come last: the encoding numbers variants in order.
    /// A client asks what the node offers; answered with [`NodeMsg::Catalog`].
    Describe,
    /// The node's protocol and its procedures, by name, with their kinds.
    Catalog {
        /// The protocol the node runs (`local`, `tfa`, `certify`, `active`).
        protocol: String,
        /// Each registered procedure and whether it writes.
        procedures: Vec<(String, ProcedureKind)>,
    },
    /// A client's read-only procedure, run on the receiver from a snapshot; answered with
    /// [`NodeMsg::QueryAnswer`].
    Query {
        /// The procedure's name.
        procedure: String,
        /// Its encoded arguments.
        arguments: Vec<u8>,
    },
    /// The encoded result of a [`NodeMsg::Query`], or why it did not run.
    QueryAnswer(Result<Vec<u8>, Refusal>),
    /// A message of the OSS protocol.
    Oss(OssMsg),
    /// A client's procedure, run on the receiver's transaction service at `priority` (under
    /// every protocol but `active`, whose updates are ordered instead); answered with
    /// [`NodeMsg::SubmitAnswer`]. Sent to one node and never re-sent: an update may have run.
    Submit {
        /// The procedure's name.
        procedure: String,
        /// Its encoded arguments.
        arguments: Vec<u8>,
        /// Its priority (1 lowest).
        priority: u8,
    },
    /// The encoded result of a [`NodeMsg::Submit`], or why it did not run.
    SubmitAnswer(Result<Vec<u8>, Refusal>),
    /// Asks the receiver where it stands; answered with [`NodeMsg::StatusReport`].
    Status,
    /// The receiver's account of itself (boxed: it is larger than the other messages).
    StatusReport(Box<MemberStatus>),
    /// An operator asks the receiver's replica to propose a membership change (it must
    /// lead); answered with [`NodeMsg::MembershipChanged`].
    ChangeMembership(MemberRequest),
    /// The position a [`NodeMsg::ChangeMembership`] was proposed at, or why not.
    MembershipChanged(Result<u64, MemberRefusal>),
    /// A client asks for a backup: the receiver orders a barrier, waits until its replica has
    /// delivered it, takes a snapshot there and keeps it for the client to fetch; answered
    /// with [`NodeMsg::BackupReady`].
    BackupBegin,
    /// The backup a [`NodeMsg::BackupBegin`] asked for, or why there is none.
    BackupReady(Result<BackupOffer, Refusal>),
    /// Up to `len` bytes of backup `id` from `offset`; answered with [`NodeMsg::BackupChunk`].
    BackupFetch {
        /// The backup.
        id: u64,
        /// Where the bytes start in its file.
        offset: u64,
        /// How many are wanted (the receiver may send fewer).
        len: u32,
    },
    /// The bytes a [`NodeMsg::BackupFetch`] asked for (fewer only at the file's end), or why
    /// not.
    BackupChunk(Result<Vec<u8>, Refusal>),
}

impl atomos_net::wire::WireMessage for NodeMsg {
    /// Every message here was spoken by wire version 17, the oldest this build speaks (0: every
    /// version spoken has it); the protocols' messages say their own. A variant added later
    /// says the version that introduced it (the match is exhaustive so that adding one asks).
    fn since(&self) -> u16 {
        match self {
            NodeMsg::Order(msg) => atomos_net::wire::WireMessage::since(msg),
            NodeMsg::Tfa(msg) => atomos_net::wire::WireMessage::since(msg),
            NodeMsg::Oss(msg) => atomos_net::wire::WireMessage::since(msg),
            NodeMsg::Ping(_)
            | NodeMsg::Pong(_)
            | NodeMsg::Describe
            | NodeMsg::Catalog { .. }
            | NodeMsg::Query { .. }
            | NodeMsg::QueryAnswer(_)
            | NodeMsg::Submit { .. }
            | NodeMsg::SubmitAnswer(_)
            | NodeMsg::Status
            | NodeMsg::StatusReport(_)
            | NodeMsg::ChangeMembership(_)
            | NodeMsg::MembershipChanged(_)
            | NodeMsg::BackupBegin
            | NodeMsg::BackupReady(_)
            | NodeMsg::BackupFetch { .. }
            | NodeMsg::BackupChunk(_) => 0,
        }
    }
}

/// A backup a member keeps for a client to fetch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupOffer {
    /// The member's number for it.
    pub id: u64,
    /// What it holds.
    pub header: crate::backup::BackupHeader,
    /// Its file's length in bytes.
    pub total: u64,
}

/// A membership change as an operator asks for it (see `atomos_order::MemberChange`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberRequest {
    /// Add member `id`, listening at `address` and proving one of `public_keys`, as a learner.
    AddLearner {
        /// Its id.
        id: u64,
        /// Where it listens (`ip:port`).
        address: String,
        /// Its public keys, as `atomos keygen` prints them.
        public_keys: Vec<String>,
    },
    /// Make learner `id` a voter.
    Promote {
        /// The learner.
        id: u64,
    },
    /// Remove member `id`.
    Remove {
        /// The member.
        id: u64,
    },
    /// Promote learner `add` and remove voter `remove` in one change.
    Replace {
        /// The voter that goes.
        remove: u64,
        /// The learner that takes its place.
        add: u64,
    },
}

/// Why a membership change was not proposed, as it travels back to the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MemberRefusal {
    /// The receiver does not lead; ask the leader it names, if any.
    #[error("member does not lead (the leader is {leader:?})")]
    NotLeader {
        /// The leader it follows, if it knows one.
        leader: Option<u64>,
    },
    /// The client is not one the members accept membership changes from.
    #[error("{0}")]
    NotOperator(String),
    /// The change was refused (why, in words).
    #[error("{0}")]
    Refused(String),
}

/// Why a node did not run a client's procedure, as it travels back to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// No procedure of that name is registered on the node.
    NoSuchProcedure(String),
    /// The arguments or the result did not fit the procedure's types.
    Types(String),
    /// The procedure failed (its own error, or its transaction could not commit).
    Failed(String),
    /// The request cannot be served here (a write in a read-only query, and the like).
    Refused(String),
    /// The node serves as many client requests as it allows at once: this one was not
    /// started (it never ran); try again later or elsewhere.
    Busy(String),
    /// No outcome within the node's deadline for client requests: it may still run.
    Unknown(String),
}

impl From<TxError> for Refusal {
    fn from(e: TxError) -> Refusal {
        match e {
            TxError::NoSuchProcedure { name } => Refusal::NoSuchProcedure(name),
            TxError::ProcedureTypes { reason, .. } => Refusal::Types(reason),
            other => Refusal::Failed(other.to_string()),
        }
    }
}
