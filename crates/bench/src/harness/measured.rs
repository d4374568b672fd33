//! What a run measured: the report, its latency figures and hot spots, and its summary.

use atomos::Stats;
use serde::{Deserialize, Serialize};

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest sample.
    pub max: f64,
    /// Operations the figures stand for: every operation of an open-loop run; in a closed loop
    /// a timed operation stands for each operation of its stride (see `harness::sampler`).
    pub samples: u64,
}

/// What a run measured for one kind of operation (a TPC-C profile, a transfer, a balance).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileReport {
    /// The operation's name.
    pub name: String,
    /// Operations of this kind completed.
    pub committed: u64,
    /// Their share of all operations.
    pub share: f64,
    /// Completed per second.
    pub throughput_tps: f64,
    /// Latency of one operation (all its attempts).
    pub latency_us: Latency,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Workload name.
    pub workload: String,
    /// Protocol name.
    pub protocol: String,
    /// Nodes.
    pub nodes: usize,
    /// How the nodes were linked.
    pub transport: String,
    /// Worker threads per node.
    pub threads: usize,
    /// Objects.
    pub objects: usize,
    /// Read-only fraction.
    pub read_ratio: f64,
    /// Bank balance width (`null`: all accounts).
    pub balance_k: Option<usize>,
    /// How updates were composed.
    pub nesting: String,
    /// Inner operations per update.
    pub inner: usize,
    /// Vacation: resources per reservation or offer update.
    pub queries: Option<usize>,
    /// TPC-C: warehouses.
    pub warehouses: Option<usize>,
    /// TPC-C: transaction mix.
    pub mix: Option<String>,
    /// TPC-C: population per warehouse.
    pub scale: Option<String>,
    /// Contention manager.
    pub contention: String,
    /// `certify`: when the replicas' logs were fsynced (empty for other protocols).
    pub fsync: String,
    /// `oss`: how commits were numbered (`null` for other protocols).
    pub oss_commit: Option<String>,
    /// `tfa`: microseconds a waiting application thread polled for an answer before
    /// it slept (`null` for other protocols).
    pub answer_poll_us: Option<f64>,
    /// TCP: microseconds each transport kept a worker awake after activity (`null` without
    /// TCP links).
    pub busy_poll_us: Option<f64>,
    /// Every link between nodes waited this long before sending.
    pub link_delay_ms: f64,
    /// Counters: milliseconds each transaction worked after its increment.
    pub work_ms: f64,
    /// Milliseconds each worker paused between two operations.
    pub pause_ms: f64,
    /// Each node ran in a process of its own (`--processes`).
    pub processes: bool,
    /// The workers ran as fibers on the nodes' network runtime (`--fibers`).
    #[serde(default)]
    pub fibers: bool,
    /// Worker threads of the nodes' network runtime in each process (`null` for a local node).
    #[serde(default)]
    pub runtime_threads: Option<usize>,
    /// Linked transactions: commits outstanding per worker (0: none).
    pub linked: usize,
    /// Measured seconds.
    pub duration_s: f64,
    /// Committed transactions (one per operation).
    pub committed: u64,
    /// Aborted attempts.
    pub aborted: u64,
    /// Committed transactions per second.
    pub throughput_tps: f64,
    /// Aborted attempts per attempt.
    pub abort_rate: f64,
    /// Latency of a whole operation (all its attempts).
    pub latency_us: Latency,
    /// Throughput and latency per kind of operation.
    pub profiles: Vec<ProfileReport>,
    /// Whether the workload's invariant held at the end.
    pub invariant_ok: bool,
    /// What the invariant check found.
    pub invariant: String,
    /// Engine counters over the measured run.
    pub stats: Stats,
    /// The objects that caused the most conflicts (every node's counts summed), most first.
    pub hot_spots: Vec<HotSpot>,
    /// Open-loop runs (`--arrival-rate`): the transaction service's policy, turnaround and
    /// reaction times per priority. Flattened: `turnaround_us.<priority>.mean` and so on.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub sched: Option<crate::open_loop::SchedReport>,
    /// TFA's counters over the measured run, every node's summed (TFA nodes in this process
    /// only: absent for other protocols and with a process per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfa: Option<atomos::protocols::tfa::TfaCounters>,
}

/// An object and how many conflicts it caused.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HotSpot {
    /// The object's key.
    pub key: String,
    /// Its conflicts.
    pub conflicts: u64,
}

/// How many hot spots a report lists.
const HOT_SPOTS: usize = 5;

/// The hot spots of `nodes` together: each node's counts summed per object.
pub(super) fn hot_spots(nodes: &[atomos::Node]) -> Vec<HotSpot> {
    let mut sums: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for n in nodes {
        for (key, c) in n.hot_spots(HOT_SPOTS * 4) {
            *sums.entry(key.to_string()).or_default() += c;
        }
    }
    let mut all: Vec<HotSpot> = sums
        .into_iter()
        .map(|(key, conflicts)| HotSpot { key, conflicts })
        .collect();
    all.sort_by(|a, b| {
        b.conflicts
            .cmp(&a.conflicts)
            .then_with(|| a.key.cmp(&b.key))
    });
    all.truncate(HOT_SPOTS);
    all
}

impl BenchReport {
    /// A short human-readable summary: one line for the run, then one per kind of operation.
    pub fn summary(&self) -> String {
        let size = match (&self.warehouses, &self.scale, &self.mix) {
            (Some(w), Some(scale), Some(mix)) => {
                format!("{w} warehouses of {scale} scale, {mix} mix")
            }
            _ => format!("{} objects, read ratio {}", self.objects, self.read_ratio),
        };
        let protocol = match self.fsync.as_str() {
            "" => self.protocol.clone(),
            fsync => format!("{} (fsync {fsync})", self.protocol),
        };
        let mut text = format!(
            "{} on {} ({} node, {} transport{}, {} {} per node, {size}): {:.0} tx/s, {} committed, abort rate {:.4}, \
             latency p50 {:.2} us p99 {:.2} us; invariant {}: {}",
            self.workload,
            protocol,
            self.nodes,
            self.transport,
            if self.processes { ", a process per node" } else { "" },
            self.threads,
            if self.fibers { "fibers" } else { "threads" },
            self.throughput_tps,
            self.committed,
            self.abort_rate,
            self.latency_us.p50,
            self.latency_us.p99,
            if self.invariant_ok { "OK" } else { "VIOLATED" },
            self.invariant
        );
        for p in &self.profiles {
            text.push_str(&format!(
                "\n  {:<16} {:>6.2}%  {:>12.0} tx/s  p50 {:>9.2} us  p90 {:>9.2} us  p99 {:>9.2} us",
                p.name,
                p.share * 100.0,
                p.throughput_tps,
                p.latency_us.p50,
                p.latency_us.p90,
                p.latency_us.p99
            ));
        }
        if !self.hot_spots.is_empty() {
            let spots: Vec<String> = self
                .hot_spots
                .iter()
                .map(|h| format!("{} ({})", h.key, h.conflicts))
                .collect();
            text.push_str(&format!("\n  hot spots (conflicts): {}", spots.join(", ")));
        }
        if let Some(t) = &self.tfa {
            text.push_str(&format!(
                "\n  tfa: {} remote reads, {} redirected, {} passed on by a node without the \
                 object; {} objects moved; {} aborts of reads that met a lock, {} lock sets given up",
                t.remote_reads,
                t.redirects,
                t.reads_forwarded,
                t.migrations_in,
                t.aborts_busy_read,
                t.locks_given_up
            ));
        }
        text
    }
}
