//! atomos: a distributed transactional memory.
//!
//! Application threads run *atomic sections* over shared objects named by keys; atomos makes
//! them appear to run one at a time. This crate is the API applications are written against:
//!
//! ```
//! use atomos::{Node, TRef, TxError};
//!
//! let node = Node::local();
//! let a: TRef<i64> = TRef::new("alice");
//! let b: TRef<i64> = TRef::new("bob");
//! node.atomically(|tx| {
//!     tx.create(&a, 100)?;
//!     tx.create(&b, 0)
//! })?;
//! node.atomically(|tx| {
//!     let amount = 30;
//!     if *tx.read(&a)? < amount {
//!         return Err(TxError::abort("insufficient funds"));
//!     }
//!     tx.modify(&a, |v| *v -= amount)?;
//!     tx.modify(&b, |v| *v += amount)
//! })?;
//! let total = node.atomically_read(|tx| Ok(*tx.read(&a)? + *tx.read(&b)?))?;
//! assert_eq!(total, 100);
//! # Ok::<(), TxError>(())
//! ```

#![deny(missing_docs)]

mod answer;
mod background;
pub mod backup;
mod backups;
mod certify;
mod client;
mod client_service;
mod cluster;
pub mod config;
pub mod disk;
mod driver;
pub mod endpoint;
pub mod health;
mod host;
pub mod hot_spots;
mod linked;
pub mod membership;
mod node;
mod node_metrics;
pub mod ordering;
mod oss;
pub mod runtime;
pub mod service;
pub mod status;
mod tfa;
pub mod trust;
mod wire;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use atomos_core::history;
pub use atomos_core::{
    decode_result, encode_arguments, AbortCause, AbortCounts, ContentionPolicy, Engine,
    EngineConfig, ExecutorStats, Invocation, Key, Message, Object, Outcome, Procedure,
    ProcedureKind, Procedures, RegisterError, SerialExecutor, Stats, Step, StoredName, TRef, Tx,
    TxError, TxOptions, Value, ValueError,
};
/// Networking: wire format, transports, requests (re-exported from `atomos-net`).
pub use atomos_net as net;
/// The order layer: total order with optimistic delivery (re-exported from `atomos-order`).
pub use atomos_order as order;
/// Distributed protocols as deterministic state machines (re-exported from `atomos-protocols`).
pub use atomos_protocols as protocols;
/// Fibers: blocking-style code (transactions) run as a future on an async runtime's threads
/// (re-exported from `atomos-sched`).
pub use atomos_sched::fiber;
pub use atomos_sched::fiber::Fiber;
pub use certify::{CertifyOptions, CommitOutcome, DEFAULT_COMMIT_LIMIT, DIGEST_COST_FACTOR};
pub use client::{BlockingClient, Client, ClientConfig, ClientError};
pub use cluster::{Cluster, ClusterError};
pub use linked::{Linked, LinkedHandle};
pub use node::{Node, NodeConfig, Protocol, Steps, TxBuilder};
pub use oss::OssDriver;
pub use runtime::{NodeRuntime, PeerState, ProtocolPlan, RuntimeError};
pub use service::TxService;
pub use tfa::TfaDriver;
pub use wire::NodeMsg;
pub use wire::{MemberRefusal, MemberRequest, Refusal};
