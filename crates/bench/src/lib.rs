//! The benchmark harness: workloads written once against the public API, run by many threads
//! for a fixed time, reported as throughput, abort rate, latency percentiles and an invariant
//! check.

#![deny(missing_docs)]

pub mod footprint;
pub mod harness;
pub mod net;
pub mod order;
pub mod workloads;

pub use harness::{run, BenchConfig, BenchError, BenchReport, Latency};
pub use workloads::{Workload, WorkloadKind, WorkloadParams};
