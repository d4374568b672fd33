//! TFA (HyflowCPP thesis, chapter 5): objects live on one owner node at a time and move to the
//! node that commits a write to them; transactions stay opaque across nodes with node clocks
//! instead of a global one.
//!
//! - [`clock`]: each node's clock, advanced by its write commits and by larger clocks seen in
//!   messages.
//! - [`directory`]: where an object lives: its home node (by hash of its key) tracks the current
//!   owner; other nodes cache owners and correct the cache when redirected.
//! - [`owner`]: the objects a node owns, with versions, commit locks held until the committer's
//!   decision is known, and forwarding addresses of objects that left.
//! - [`msg`]: what nodes say to each other; every message carries the sender's clock and
//!   incarnation.
//! - [`durable`]: what a node keeps on disk: its home records and the incarnations it saw.
//! - `recovery`: restarts: incarnations learned from messages, what an earlier run held marked
//!   lost, objects in doubt dropped as lost, a lost key never re-created.
//! - [`node`]: one node as a deterministic state machine: reads with forwarding, the commit of
//!   figure 5.2 with migration to the committer, directory updates, lock recovery; behind the
//!   protocol seam ([`atomos_seam::Machine`]) with the application's calls as [`TfaRequest`]s.

mod abstract_locks;
pub mod clock;
mod config;
mod coordinator;
pub mod directory;
pub mod durable;
mod machine;
pub mod msg;
pub mod node;
pub mod owner;
mod recovery;
mod roles;
mod server;
mod timers;
mod vocabulary;

pub use machine::TfaRequest;
pub use msg::{Body, Decision, FetchAnswer, PassedRead, TfaMsg};
pub use node::{
    Action, Answer, Failure, OpenError, PlantedBug, Reply, TfaConfig, TfaCounters, TfaNode,
};
pub use owner::TxId;
