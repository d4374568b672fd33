//! The benchmark harness: workloads written once against the public API, run by many threads
//! for a fixed time, reported as throughput, abort rate, latency percentiles and an invariant
//! check; and the report that draws results as figures.

#![deny(missing_docs)]

pub mod cluster;
pub mod executor;
pub mod footprint;
pub mod harness;
pub mod keys;
pub mod net;
pub mod open_loop;
pub mod order;
pub mod processes;
pub mod report;
pub mod soak;
pub mod workloads;

pub use cluster::{BenchNodes, ClusterSpec, TransportKind};
pub use harness::{run, BenchConfig, BenchError, BenchReport, Latency};
pub use workloads::{NestingModel, Workload, WorkloadKind, WorkloadParams};

/// Worker threads of the runtime the networked benchmarks run their nodes on, unless told
/// otherwise (`--runtime-threads`): two, like the machine the targets are set for.
pub const DEFAULT_RUNTIME_THREADS: usize = 2;

/// The most runtime worker threads a benchmark may ask for.
pub const MAX_RUNTIME_THREADS: usize = 64;

/// The runtime the networked benchmarks run their nodes on, with `workers` worker threads.
pub(crate) fn network_runtime(workers: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}
