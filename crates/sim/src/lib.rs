//! A deterministic, single-threaded discrete-event simulator for protocol state machines.
//!
//! Nodes are the same [`Machine`]s the production driver runs (the protocol seam,
//! `atomos-seam`): they react to messages, ticks, local requests and persistence confirmations
//! with messages, disk writes and deliveries. The simulator owns time, the network, the disks
//! and the faults: message loss, duplication, delay (and so reordering), partitions that come
//! and go, crashes with restarts, and disks that fail like real ones ([`SimDisk`]: unsynced
//! writes lost, torn final records, failing fsyncs, records damaged in the middle). It keeps
//! the seam's rule that whatever a machine emits after a disk write waits until that write is
//! durable. A crashed node's machine is dropped; it restarts by being built again from the
//! records its disk kept ([`Boot`]), so nothing survives a crash that was not persisted. Every
//! random choice comes from one generator seeded by a `u64`, so a seed reproduces a run
//! exactly, trace and all.
//!
//! [`fuzz`] is the harness of the decoder fuzzing (a counting heap, a generator, mutated
//! inputs). [`check`] holds the checks every protocol's simulation shares (a planted bug caught,
//! replicas that agree position by position, survivors that converged). [`workload`] generates bank transfers and list-append transactions from the same seed, and
//! turns what the nodes reported into a history for
//! [`list_append::check`](atomos_core::history::list_append::check), which needs no clock and
//! so takes records from every node.

#![deny(missing_docs)]

pub mod check;
mod disk;
pub mod fuzz;
mod rng;
mod seeds;
mod setup;
mod sim;
pub mod workload;

pub use atomos_seam::{Input, Machine, NodeId, Output, Write};
pub use check::{converged, first_caught, Agreement};
pub use disk::SimDisk;
pub use rng::SimRng;
pub use seeds::{check_seeds, seeds, SEEDS_VAR, SEED_VAR};
pub use setup::{Boot, BootFn, Faults, Run, SimConfig};
pub use sim::Sim;
