//! A deterministic, single-threaded discrete-event simulator for protocol state machines.
//!
//! Nodes are [`Machine`]s: deterministic values that react to inputs (start, message, timer
//! tick, client request) with outputs (messages to send, notes for the checker). The simulator
//! owns time, the network and the faults: message loss, duplication, delay (and so reordering),
//! partitions that come and go, and crashes with restarts (a machine keeps only what it
//! persisted). Every random choice comes from one generator seeded by a `u64`, so a seed
//! reproduces a run exactly, trace and all.
//!
//! [`workload`] generates bank transfers and list-append transactions from the same seed, and
//! turns what the nodes reported into a history for
//! [`list_append::check`](atomos_core::history::list_append::check), which needs no clock and
//! so takes records from every node.

#![deny(missing_docs)]

mod rng;
mod seeds;
mod sim;
pub mod workload;

pub use rng::SimRng;
pub use seeds::{check_seeds, seeds, SEEDS_VAR, SEED_VAR};
pub use sim::{Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig};
