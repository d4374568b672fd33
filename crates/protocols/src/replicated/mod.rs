//! The replicated store: every object on every replica, changed only by the entries of a
//! totally ordered log (the order layer's final deliveries), applied by one thread.
//!
//! `certify` (Paxos STM) puts certification requests in the log: a transaction runs on its
//! caller's replica, and if it wrote, the versions it read and its writes are ordered; every
//! replica applies the same rule to each entry ([`atomos_core::Engine::apply_certified`]).
//! Entries are a tagged enum ([`Entry`]) so that other kinds (procedure invocations for
//! `active`, collection and digest entries) join the same log and store.
//!
//! Anonymous objects ([`atomos_core::Tx::new_object`]) that no named object reaches are
//! reclaimed by collection entries in the log, at the same position on every replica
//! (`collect`).
//!
//! A node certifies and invokes through [`client::StoreClient`], which turns its requests into
//! entries and the store's answers into verdicts; the node only orders bytes
//! ([`client::Orderer`]).
//!
//! [`ReplicatedStore`] is the order layer's [`atomos_order::StateMachine`]: its snapshots are
//! the engine's objects at a log position (deletions kept), from which a restarted replica
//! recovers and a replica that was away too long is brought up to date.

pub mod client;
mod collect;
mod entry;
mod store;

pub use entry::{node_bits, owner_node, owner_run, Answer, Entry, LockOwner};
pub use store::{check_state, PlantedBug, ReplicatedStore, StoreStats};
