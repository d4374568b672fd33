//! The benchmark harness: workloads written once against the public API, run by many threads
//! for a fixed time, reported as throughput, abort rate, latency percentiles and an invariant
//! check; and the report that draws results as figures.

#![deny(missing_docs)]

pub mod cluster;
pub mod executor;
pub mod footprint;
pub mod harness;
pub mod net;
pub mod open_loop;
pub mod order;
pub mod processes;
pub mod report;
pub mod workloads;

pub use cluster::{BenchNodes, ClusterSpec, TransportKind};
pub use harness::{run, BenchConfig, BenchError, BenchReport, Latency};
pub use workloads::{NestingModel, Workload, WorkloadKind, WorkloadParams};

/// The runtime the networked benchmarks run their nodes on: two workers, like the machine the
/// targets are set for.
pub(crate) fn network_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}
