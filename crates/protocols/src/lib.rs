//! Distributed consistency protocols, each a deterministic state machine behind the protocol
//! seam (`atomos_seam::Machine`): no I/O of its own, run by the node runtime's driver in
//! production and by the simulator in tests.
//!
//! Built: [`tfa`], the Transaction Forwarding Algorithm of HyflowCPP: node clocks, the tracker
//! directory, owners with commit locks that expire, reads with forwarding, commits that migrate
//! objects to the committer, closed and open nesting and checkpoints across nodes.
//!
//! [`replicated`]: the replicated store of `certify` (Paxos STM's deferred update): every
//! replica holds every object; the order layer's state machine applies certification requests
//! in log order through one thread.
//!
//! [`oss`] (being built): the Object Sharing Service's commits: sequencers per consistency
//! domain, write sets applied everywhere in commit-id order once a majority holds them.

#![deny(missing_docs)]

pub mod oss;
pub mod replicated;
pub mod tfa;
