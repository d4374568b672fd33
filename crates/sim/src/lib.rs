//! A deterministic, single-threaded discrete-event simulator for protocol state machines.
//!
//! Nodes are [`Machine`]s: deterministic values that react to inputs (start, message, timer
//! tick, client request) with outputs (messages to send, notes for the checker). The simulator
//! owns time, the network and the faults: message loss, duplication, delay (and so reordering),
//! partitions that come and go, and crashes with restarts (a machine keeps only what it
//! persisted). Every random choice comes from one generator seeded by a `u64`, so a seed
//! reproduces a run exactly, trace and all.

#![deny(missing_docs)]

mod rng;
mod sim;

pub use rng::SimRng;
pub use sim::{Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig};
