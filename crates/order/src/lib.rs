//! Total order with optimistic delivery (OS-Paxos, HiperTM section 3.1) on a Raft core.
//!
//! Consensus is raft-rs, driven as a sans-I/O `RawNode`; around it, S-Paxos dissemination
//! (replicas batch their clients' requests and send batches to each other; the leader orders
//! batch ids only), two deliveries (`Opt` as soon as the leader's proposal and its batches are
//! here, `Final` at commit, `Revoke` when a leader change replaces optimistically delivered
//! entries), at-most-once delivery of client requests, a checksummed write-ahead log, snapshots
//! with log compaction, and state transfer to replicas that fell behind.
//!
//! Everything here is a deterministic state machine ([`Replica::step`], [`Client::step`]): the
//! simulator drives it with simulated time and faults, the node runtime with real ones.

#![deny(missing_docs)]

mod client;
pub mod disk;
mod log_store;
mod logging;
mod register;
mod replica;
mod types;

pub use client::{Client, ClientAction, ClientInput};
pub use disk::{Disk, FileDisk, FsyncPolicy, MemDisk, Record};
pub use log_store::LogStore;
pub use logging::raft_logger;
pub use register::{Register, RegisterOp};
pub use replica::{Input, OrderError, OrderStats, Replica, ReplicaConfig};
pub use types::{Action, Addr, BatchId, Delivery, OrderMsg, Request, StateMachine};
