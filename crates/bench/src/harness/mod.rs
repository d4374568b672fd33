//! Runs a workload on a node with many threads for a fixed time and reports what it measured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::disk::FsyncPolicy;
use atomos::protocols::oss::CommitMode;
use atomos::protocols::tfa::TfaCounters;
use atomos::{ContentionPolicy, Protocol, Stats, TxError};
use hdrhistogram::Histogram;

/// The most nodes a benchmark runs (in one process, or one process each).
pub const MAX_NODES: usize = 64;

mod closed_loop;
mod measured;
mod sampler;

pub(crate) use closed_loop::closed_loop;

use measured::hot_spots;
pub use measured::{BenchReport, HotSpot, Latency, ProfileReport};

use crate::cluster::{BenchNodes, ClusterSpec, TransportKind};
use crate::workloads::{Check, NestingModel, TpccMix, TpccScale, WorkloadKind, WorkloadParams};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The workload.
    pub workload: WorkloadKind,
    /// The protocol.
    pub protocol: Protocol,
    /// Nodes in the cluster (1 for `local`).
    pub nodes: usize,
    /// How the nodes are linked (ignored for one `local` node).
    pub transport: TransportKind,
    /// Every link between nodes waits this long before sending.
    pub link_delay: Duration,
    /// Worker threads per node.
    pub threads: usize,
    /// Object count (see [`WorkloadParams::objects`]).
    pub objects: usize,
    /// Fraction of read-only operations.
    pub read_ratio: f64,
    /// Bank: accounts read by a balance operation (`None`: all).
    pub balance_k: Option<usize>,
    /// Bank and hash table: how an update's inner operations are composed.
    pub nesting: NestingModel,
    /// Bank and hash table: inner operations per update transaction.
    pub inner: usize,
    /// Vacation: resources a reservation or an offer update touches.
    pub queries: usize,
    /// TPC-C: warehouses (`None`: one per node).
    pub warehouses: Option<usize>,
    /// TPC-C: the transaction mix.
    pub mix: TpccMix,
    /// TPC-C: the population per warehouse.
    pub scale: TpccScale,
    /// Measured run time.
    pub duration: Duration,
    /// Contention manager.
    pub contention: ContentionPolicy,
    /// Seed of the workers' random generators.
    pub seed: u64,
    /// Print a live progress line to standard error.
    pub progress: bool,
    /// `certify`: when the replicas' write-ahead logs (in a temporary directory) are fsynced.
    pub fsync: FsyncPolicy,
    /// `oss`: how commits are numbered.
    pub oss_commit: CommitMode,
    /// `tfa`: how long an application thread waiting for the protocol's answer polls
    /// for it before it sleeps (see `NodeRuntime::set_answer_poll`).
    pub answer_poll: Duration,
    /// TCP: how long each node's transport keeps a runtime worker awake after activity (see
    /// `TcpConfig::busy_poll`).
    pub busy_poll: Duration,
    /// Counters: how long each transaction works after its increment.
    pub work: Duration,
    /// Each worker pauses this long between two operations (not counted in their latency).
    pub pause: Duration,
    /// Run each worker's operations as linked transactions with this many commits
    /// outstanding (0: plain transactions, each committed before the next starts).
    pub linked: usize,
    /// Open loop: requests arrive as a Poisson process at this rate (per second, over the
    /// cluster) and run on each node's transaction service with `threads` workers (`None`:
    /// closed loop, each worker running operations back to back).
    pub arrival_rate: Option<f64>,
    /// Open loop: the transaction service's policy.
    pub sched: atomos::service::Policy,
    /// Open loop: the transaction service's context pool per node.
    pub contexts: usize,
    /// Run each node in a process of its own (see [`crate::processes`]); the report says so.
    pub processes: bool,
    /// Run the closed-loop workers as fibers on the nodes' network runtime (see
    /// [`atomos::fiber`]) instead of as threads of their own (distributed protocols).
    pub fibers: bool,
    /// Worker threads of the runtime the nodes' networking runs on, in each process (1 to
    /// [`crate::MAX_RUNTIME_THREADS`]; a local node has none).
    pub runtime_threads: usize,
}

impl Default for BenchConfig {
    /// Bank on one `local` node with two threads for five seconds, the workload's default
    /// objects, half reads, no progress line.
    fn default() -> Self {
        BenchConfig {
            workload: WorkloadKind::Bank,
            protocol: Protocol::Local,
            nodes: 1,
            transport: TransportKind::Memory,
            link_delay: Duration::ZERO,
            threads: 2,
            objects: WorkloadKind::Bank.default_objects(),
            read_ratio: 0.5,
            balance_k: None,
            nesting: NestingModel::Flat,
            inner: 1,
            queries: 10,
            warehouses: None,
            mix: TpccMix::Standard,
            scale: TpccScale::SMALL,
            duration: Duration::from_secs(5),
            contention: ContentionPolicy::Backoff,
            seed: 1,
            progress: false,
            fsync: FsyncPolicy::Never,
            oss_commit: CommitMode::UltraPeer,
            answer_poll: atomos::runtime::DEFAULT_ANSWER_POLL,
            busy_poll: atomos::net::tcp::DEFAULT_BUSY_POLL,
            work: Duration::ZERO,
            pause: Duration::ZERO,
            linked: 0,
            arrival_rate: None,
            sched: atomos::service::Policy::None,
            contexts: 64,
            processes: false,
            fibers: false,
            runtime_threads: crate::DEFAULT_RUNTIME_THREADS,
        }
    }
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The configuration is not usable.
    #[error("invalid benchmark configuration: {0}")]
    Config(String),
    /// A transaction failed with an error that is not a conflict.
    #[error("transaction failed: {0}")]
    Tx(#[from] TxError),
    /// Requests still had not ended long after the last one arrived: the system under test
    /// stopped making progress.
    #[error("{0}")]
    Stuck(String),
}

impl BenchConfig {
    pub(crate) fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Config(m));
        if self.threads == 0 {
            return bad("--threads must be at least 1".into());
        }
        if self.objects < 2 && self.workload.sized_by_objects() {
            return bad("--objects must be at least 2".into());
        }
        if self.warehouses == Some(0) {
            return bad("--warehouses must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return bad(format!(
                "--read-ratio must be within 0..=1, not {}",
                self.read_ratio
            ));
        }
        if self.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        if let Some(rate) = self.arrival_rate {
            if !(rate.is_finite() && rate > 0.0 && rate <= 10_000_000.0) {
                return bad(format!(
                    "--arrival-rate must be a positive number of requests per second (at most \
                     10,000,000), not {rate}"
                ));
            }
            if self.linked > 0 {
                return bad("--arrival-rate and --linked do not go together".into());
            }
            if self.contexts < self.threads || self.contexts > 65_536 {
                return bad(format!(
                    "--contexts must be from --threads ({}) to 65536, not {}",
                    self.threads, self.contexts
                ));
            }
        }
        if self.nodes == 0 || self.nodes > MAX_NODES {
            return bad(format!(
                "--nodes must be from 1 to {MAX_NODES}, not {}",
                self.nodes
            ));
        }
        if self.protocol == Protocol::Local && self.nodes != 1 {
            return bad(format!(
                "protocol local runs on one node, not {}",
                self.nodes
            ));
        }
        if self.linked > 0 && !self.workload.links() {
            return bad(format!(
                "--linked: {} has no linked form (the counters do)",
                self.workload
            ));
        }
        if self.balance_k == Some(0) {
            return bad("--balance-k must be at least 1".into());
        }
        if !(1..=crate::MAX_RUNTIME_THREADS).contains(&self.runtime_threads) {
            return bad(format!(
                "--runtime-threads must be from 1 to {}, not {}",
                crate::MAX_RUNTIME_THREADS,
                self.runtime_threads
            ));
        }
        if self.fibers {
            // Every distributed protocol's waits suspend a fiber; a local node has no runtime,
            // and a sleep would hold one of the runtime threads the nodes' networking needs.
            if self.protocol == Protocol::Local {
                return bad(
                    "--fibers runs workers on the nodes' network runtime: protocol local has none"
                        .into(),
                );
            }
            if self.arrival_rate.is_some() {
                return bad("--fibers is for closed-loop workers (not --arrival-rate)".into());
            }
            if !self.pause.is_zero() || !self.work.is_zero() {
                return bad("--fibers: workers that sleep (--pause-ms, --work-ms) would hold the runtime's threads".into());
            }
        }
        Ok(())
    }
}

/// The cluster `cfg` runs on.
pub(crate) fn cluster_spec(cfg: &BenchConfig) -> ClusterSpec {
    ClusterSpec {
        protocol: cfg.protocol,
        nodes: cfg.nodes,
        transport: cfg.transport,
        link_delay: cfg.link_delay,
        contention: cfg.contention,
        fsync: cfg.fsync,
        oss_commit: cfg.oss_commit,
        answer_poll: cfg.answer_poll,
        busy_poll: cfg.busy_poll,
        runtime_threads: cfg.runtime_threads,
    }
}

/// The workload `cfg` names, for `slots` workers over the cluster (each has an index below).
pub(crate) fn workload_for(
    cfg: &BenchConfig,
    slots: usize,
    nodes: usize,
) -> Result<Arc<dyn crate::Workload>, BenchError> {
    let params = WorkloadParams {
        objects: cfg.objects,
        read_ratio: cfg.read_ratio,
        balance_k: cfg.balance_k,
        threads: slots,
        nesting: cfg.nesting,
        inner: cfg.inner,
        queries: cfg.queries,
        warehouses: cfg.warehouses.unwrap_or(nodes),
        mix: cfg.mix,
        scale: cfg.scale,
        work: cfg.work,
    };
    Ok(Arc::from(
        cfg.workload.build(&params).map_err(BenchError::Config)?,
    ))
}

/// Runs the benchmark.
pub fn run(cfg: &BenchConfig) -> Result<BenchReport, BenchError> {
    cfg.validate()?;
    let cluster = BenchNodes::start(&cluster_spec(cfg)).map_err(BenchError::Config)?;
    let nodes = cluster.nodes();
    let threads = cfg.threads * nodes.len();
    // Open loop: a request runs with a slot of its own (one per context) as its "thread".
    let slots = match cfg.arrival_rate {
        Some(_) => cfg.contexts * nodes.len(),
        None => threads,
    };
    let workload = workload_for(cfg, slots, nodes.len())?;
    for node in nodes.iter() {
        workload
            .register(node)
            .map_err(|e| BenchError::Config(e.to_string()))?;
    }
    workload.setup(&nodes[0])?;
    // Under a replicated protocol every replica starts from the whole setup.
    cluster.sync().map_err(BenchError::Config)?;

    let stats_now = || {
        nodes
            .iter()
            .fold(Stats::default(), |sum, n| sum.plus(&n.stats()))
    };
    let before = stats_now();
    let tfa_before = tfa_counters(&cluster);
    let start = Instant::now();
    let (per_kind, open) = match cfg.arrival_rate {
        Some(rate) => {
            let (tallies, report) = crate::open_loop::run(cfg, rate, nodes, &workload)?;
            (tallies, Some(report))
        }
        None => {
            let workers = (0..threads).map(|t| (t, nodes[t % nodes.len()].clone()));
            (
                closed_loop(cfg, workers.collect(), &workload, cluster.runtime())?,
                None,
            )
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    let stats = stats_now().since(&before);
    let tfa = tfa_counters(&cluster)
        .zip(tfa_before)
        .map(|(after, before)| after.since(&before));
    let check = check_replicas(cfg.protocol, nodes, &*workload)?;
    Ok(report(
        cfg,
        Measured {
            nodes: nodes.len(),
            profiles: workload.profiles(),
            per_kind,
            elapsed,
            stats,
            check,
            hot_spots: hot_spots(nodes),
            sched: open,
            tfa,
        },
    ))
}

/// The TFA counters of every node of `cluster` together (`None` without TFA nodes here).
fn tfa_counters(cluster: &BenchNodes) -> Option<TfaCounters> {
    cluster
        .members()
        .iter()
        .filter_map(|m| m.tfa().map(|t| t.counters()))
        .reduce(|sum, c| sum.plus(&c))
}

/// What a run measured, before it is reported.
pub(crate) struct Measured {
    pub(crate) nodes: usize,
    pub(crate) profiles: &'static [&'static str],
    /// Per kind of operation, in the order of `profiles`.
    pub(crate) per_kind: Vec<Tally>,
    pub(crate) elapsed: f64,
    pub(crate) stats: Stats,
    pub(crate) check: Check,
    pub(crate) hot_spots: Vec<HotSpot>,
    pub(crate) sched: Option<crate::open_loop::SchedReport>,
    /// TFA's counters over the run, every node's summed (nodes in this process only).
    pub(crate) tfa: Option<TfaCounters>,
}

/// The report of a run of `cfg` that measured `m`.
pub(crate) fn report(cfg: &BenchConfig, m: Measured) -> BenchReport {
    let mut all = Tally::new();
    for t in &m.per_kind {
        all.add(t);
    }
    let committed = all.ops;
    let (elapsed, stats, check) = (m.elapsed, m.stats, m.check);
    let aborted = stats.aborts.total();
    let tpcc = cfg.workload == WorkloadKind::Tpcc;
    BenchReport {
        workload: cfg.workload.name().to_string(),
        protocol: cfg.protocol.to_string(),
        nodes: m.nodes,
        transport: if cfg.protocol == Protocol::Local {
            "none".to_string()
        } else {
            cfg.transport.to_string()
        },
        threads: cfg.threads,
        objects: cfg.objects,
        read_ratio: cfg.read_ratio,
        balance_k: cfg.balance_k,
        nesting: cfg.nesting.to_string(),
        inner: cfg.inner.max(1),
        queries: (cfg.workload == WorkloadKind::Vacation).then_some(cfg.queries),
        warehouses: tpcc.then_some(cfg.warehouses.unwrap_or(m.nodes)),
        mix: tpcc.then(|| cfg.mix.to_string()),
        scale: tpcc.then(|| cfg.scale.to_string()),
        contention: format!("{:?}", cfg.contention),
        // Every protocol between nodes keeps a log (TFA its home records).
        fsync: if cfg.protocol != Protocol::Local {
            cfg.fsync.to_string()
        } else {
            String::new()
        },
        oss_commit: (cfg.protocol == Protocol::Oss).then(|| cfg.oss_commit.name().to_string()),
        answer_poll_us: (cfg.protocol == Protocol::Tfa)
            .then_some(cfg.answer_poll.as_secs_f64() * 1e6),
        busy_poll_us: (cfg.protocol != Protocol::Local && cfg.transport == TransportKind::Tcp)
            .then_some(cfg.busy_poll.as_secs_f64() * 1e6),
        link_delay_ms: cfg.link_delay.as_secs_f64() * 1000.0,
        work_ms: cfg.work.as_secs_f64() * 1000.0,
        pause_ms: cfg.pause.as_secs_f64() * 1000.0,
        linked: cfg.linked,
        processes: cfg.processes,
        fibers: cfg.fibers,
        runtime_threads: (cfg.protocol != Protocol::Local).then_some(cfg.runtime_threads),
        duration_s: elapsed,
        committed,
        aborted,
        throughput_tps: committed as f64 / elapsed,
        abort_rate: if committed + aborted == 0 {
            0.0
        } else {
            aborted as f64 / (committed + aborted) as f64
        },
        latency_us: all.latency(),
        profiles: m
            .profiles
            .iter()
            .zip(&m.per_kind)
            .map(|(name, t)| ProfileReport {
                name: name.to_string(),
                committed: t.ops,
                share: if committed == 0 {
                    0.0
                } else {
                    t.ops as f64 / committed as f64
                },
                throughput_tps: t.ops as f64 / elapsed,
                latency_us: t.latency(),
            })
            .collect(),
        invariant_ok: check.ok,
        invariant: check.detail,
        stats,
        hot_spots: m.hot_spots,
        sched: m.sched,
        tfa: m.tfa,
    }
}

/// The workload's invariant: on the first node, or under a replicated protocol on every
/// replica once each has applied everything (the first failure is reported).
fn check_replicas(
    protocol: Protocol,
    nodes: &[atomos::Node],
    workload: &dyn crate::Workload,
) -> Result<Check, BenchError> {
    if !protocol.is_replicated() {
        return Ok(workload.check(&nodes[0])?);
    }
    let mut checks = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        n.sync()?;
        let c = workload.check(n)?;
        if !c.ok {
            return Ok(Check {
                ok: false,
                detail: format!("replica {}: {}", i + 1, c.detail),
            });
        }
        checks.push(c.detail);
    }
    checks.dedup();
    Ok(Check {
        ok: true,
        detail: checks.join("; "),
    })
}

/// Operations of one kind a worker completed, and a sample of their latencies.
pub(crate) struct Tally {
    pub(crate) ops: u64,
    pub(crate) hist: Histogram<u64>,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            ops: 0,
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
        }
    }

    pub(crate) fn add(&mut self, other: &Tally) {
        self.ops += other.ops;
        self.hist
            .add(&other.hist)
            .expect("histograms with equal bounds");
    }

    /// The latency samples, encoded (hdrhistogram's V2 format) to cross a process boundary.
    pub(crate) fn encoded_samples(&self) -> Result<Vec<u8>, String> {
        let mut bytes = Vec::new();
        use hdrhistogram::serialization::Serializer;
        hdrhistogram::serialization::V2Serializer::new()
            .serialize(&self.hist, &mut bytes)
            .map_err(|e| format!("cannot encode latency samples: {e:?}"))?;
        Ok(bytes)
    }

    /// A tally of `ops` operations with the latency samples `bytes` (from
    /// [`Tally::encoded_samples`]).
    pub(crate) fn decode(ops: u64, bytes: &[u8]) -> Result<Tally, String> {
        let samples: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut &bytes[..])
            .map_err(|e| format!("cannot decode latency samples: {e:?}"))?;
        let mut tally = Tally::new();
        tally
            .hist
            .add(&samples)
            .map_err(|e| format!("latency samples out of range: {e:?}"))?;
        tally.ops = ops;
        Ok(tally)
    }

    fn latency(&self) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        let h = &self.hist;
        Latency {
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            max: us(h.max()),
            samples: h.len(),
        }
    }
}

#[cfg(test)]
mod tests;
