//! Transactions with priorities (PRESTO; see docs/design/scheduler.md).
//!
//! - [`queue`]: the priority queue: per level an *active* list (started transactions,
//!   preempted and waiting to resume) and a *standing* list (not started yet), and bitmaps
//!   that find the highest non-empty level in one instruction.
//! - [`service`]: the transaction service: worker threads that run requests as stackful
//!   coroutines from a context pool, most urgent first, and preempt less urgent ones.
//! - [`task`]: what runs inside a request: its safe points ([`yield_now`], and the engine's
//!   transactional reads and writes) and non-preemptable regions.
//! - [`policy`]: when a running transaction gives way (none, preemptive, C_max, lazy).
//! - [`fiber`]: blocking-style code run as a future on an async runtime's threads, suspended
//!   where it waits (for a protocol's answer, a back-off) instead of blocking its thread.

pub mod fiber;
pub mod outcome;
pub mod policy;
pub mod queue;
pub mod service;
pub mod task;
mod worker;

pub use outcome::{Ticket, TicketError, Timing};
pub use policy::{Policy, PolicyError, DEFAULT_CMAX};
pub use queue::{Level, PriorityQueue, QueueError, Taken};
pub use service::{ServiceConfig, ServiceError, ServiceStats, TxService};
pub use task::{current, yield_now, NonPreemptable, TaskHandle};
