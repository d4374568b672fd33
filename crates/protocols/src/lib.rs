//! Distributed consistency protocols, each a deterministic state machine over `atomos-core`.
//!
//! Built so far: the building blocks of [`tfa`] (the Transaction Forwarding Algorithm of
//! HyflowCPP): node clocks and the forwarding rule, the tracker directory, and the owner's
//! object table with commit locks that expire. The transaction path that uses them across nodes
//! is not built yet.

#![deny(missing_docs)]

pub mod tfa;
