//! Transactions with priorities (PRESTO; see ARCHITECTURE.md, "Scheduling"). Being built; so
//! far:
//!
//! - [`queue`]: the transaction service's priority queue: per level an *active* list (started
//!   transactions, preempted and waiting to resume) and a *standing* list (not started yet),
//!   and bitmaps that find the highest non-empty level in one instruction.

pub mod queue;

pub use queue::{Level, PriorityQueue, QueueError, Taken};
