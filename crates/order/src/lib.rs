//! Total order with optimistic delivery (OS-Paxos, HiperTM section 3.1) on a Raft core.
//!
//! Consensus is raft-rs, driven as a sans-I/O `RawNode`; around it, S-Paxos dissemination
//! (replicas batch their clients' requests and send batches to each other; the leader orders
//! batch ids only), two deliveries (`Opt` as soon as the leader's proposal and its batches are
//! here, `Final` at commit, `Revoke` when a leader change replaces optimistically delivered
//! entries), at-most-once delivery of client requests, a checksummed write-ahead log, snapshots
//! with log compaction, and state transfer to replicas that fell behind.
//!
//! Everything here is a deterministic state machine behind the protocol seam
//! ([`atomos_seam::Machine`]: [`Replica`], [`Endpoint`] (the replica with its node's clients), and [`Client::step`]) with no I/O of its own: the
//! replica's log reads come in as records when it opens and its writes go out as
//! [`atomos_seam::Output::Persist`]. The simulator drives it with simulated time, network and
//! disk faults, the node runtime with real ones.

#![deny(missing_docs)]

mod client;
mod endpoint;
mod error;
mod log_store;
mod logging;
mod lost_log;
mod membership;
mod raft_guard;
mod record;
mod register;
mod replica;
mod types;

pub use client::{Client, ClientAction, ClientInput};
pub use endpoint::{
    Endpoint, EndpointConfig, EndpointDelivery, EndpointRequest, Outcome, REQUEST_LIFETIME_MS,
};
pub use error::OrderError;
pub use log_store::{AppendOutside, LogStore};
pub use logging::raft_logger;
pub use membership::{ChangeRefused, MemberChange, Membership};
pub use record::{decode_log, Record};
pub use register::{Register, RegisterOp};
pub use replica::{
    Command, Input, OrderStats, PlantedBug, Replica, ReplicaConfig, SnapshotCopy, StreamProgress,
};
pub use types::{
    Action, Addr, BatchId, Delivery, EncodeJob, OrderMsg, Request, RequestWithoutDeadline,
    SnapshotJob, StateMachine, StreamHeader, StreamKind, NO_DEADLINE,
};
