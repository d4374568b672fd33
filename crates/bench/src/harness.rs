//! Runs a workload on a node with many threads for a fixed time and reports what it measured.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use atomos::disk::FsyncPolicy;
use atomos::protocols::oss::CommitMode;
use atomos::{ContentionPolicy, Protocol, Stats, TxError};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// The most nodes a benchmark runs in one process.
pub const MAX_NODES: usize = 64;

use crate::cluster::{BenchNodes, ClusterSpec, TransportKind};
use crate::workloads::{Check, NestingModel, TpccMix, TpccScale, WorkloadKind, WorkloadParams};

/// One latency sample is taken every this many operations (timing every one would cost a
/// noticeable share of a sub-microsecond transaction).
const SAMPLE_EVERY: u64 = 8;
/// Workers publish their operation counts this often, for the progress line.
const PUBLISH_EVERY: u64 = 1024;

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
            work: Duration::ZERO,
            pause: Duration::ZERO,
            linked: 0,
            arrival_rate: None,
            sched: atomos::service::Policy::None,
            contexts: 64,
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
}

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
    /// Number of samples (one per `SAMPLE_EVERY` operations).
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
    /// Every link between nodes waited this long before sending.
    pub link_delay_ms: f64,
    /// Counters: milliseconds each transaction worked after its increment.
    pub work_ms: f64,
    /// Milliseconds each worker paused between two operations.
    pub pause_ms: f64,
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
fn hot_spots(nodes: &[atomos::Node]) -> Vec<HotSpot> {
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

impl BenchConfig {
    fn validate(&self) -> Result<(), BenchError> {
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
                "--nodes must be from 1 to {MAX_NODES} (nodes run in this process), not {}",
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
        Ok(())
    }
}

/// Runs the benchmark.
pub fn run(cfg: &BenchConfig) -> Result<BenchReport, BenchError> {
    cfg.validate()?;
    let cluster = BenchNodes::start(&ClusterSpec {
        protocol: cfg.protocol,
        nodes: cfg.nodes,
        transport: cfg.transport,
        link_delay: cfg.link_delay,
        contention: cfg.contention,
        fsync: cfg.fsync,
        oss_commit: cfg.oss_commit,
        answer_poll: cfg.answer_poll,
    })
    .map_err(BenchError::Config)?;
    let nodes = cluster.nodes();
    let threads = cfg.threads * nodes.len();
    // Open loop: a request runs with a slot of its own (one per context) as its "thread".
    let slots = match cfg.arrival_rate {
        Some(_) => cfg.contexts * nodes.len(),
        None => threads,
    };
    let warehouses = cfg.warehouses.unwrap_or(nodes.len());
    let params = WorkloadParams {
        objects: cfg.objects,
        read_ratio: cfg.read_ratio,
        balance_k: cfg.balance_k,
        threads: slots,
        nesting: cfg.nesting,
        inner: cfg.inner,
        queries: cfg.queries,
        warehouses,
        mix: cfg.mix,
        scale: cfg.scale,
        work: cfg.work,
    };
    let workload: Arc<dyn crate::Workload> =
        Arc::from(cfg.workload.build(&params).map_err(BenchError::Config)?);
    for node in nodes.iter() {
        workload
            .register(node)
            .map_err(|e| BenchError::Config(e.to_string()))?;
    }
    workload.setup(&nodes[0])?;
    // Under a replicated protocol every replica starts from the whole setup.
    cluster.sync().map_err(BenchError::Config)?;
    let profiles = workload.profiles();

    let stats_now = || {
        nodes
            .iter()
            .fold(Stats::default(), |sum, n| sum.plus(&n.stats()))
    };
    let before = stats_now();
    let start = Instant::now();
    let (per_kind, open) = match cfg.arrival_rate {
        Some(rate) => {
            let (tallies, report) = crate::open_loop::run(cfg, rate, nodes, &workload)?;
            (tallies, Some(report))
        }
        None => (closed_loop(cfg, nodes, &workload, threads)?, None),
    };
    let mut all = Tally::new();
    for t in &per_kind {
        all.add(t);
    }
    let committed = all.ops;
    let elapsed = start.elapsed().as_secs_f64();
    let stats = stats_now().since(&before);
    let aborted = stats.aborts.total();
    let check = check_replicas(cfg.protocol, nodes, &*workload)?;
    let tpcc = cfg.workload == WorkloadKind::Tpcc;
    Ok(BenchReport {
        workload: cfg.workload.name().to_string(),
        protocol: cfg.protocol.to_string(),
        nodes: nodes.len(),
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
        warehouses: tpcc.then_some(warehouses),
        mix: tpcc.then(|| cfg.mix.to_string()),
        scale: tpcc.then(|| cfg.scale.to_string()),
        contention: format!("{:?}", cfg.contention),
        fsync: if cfg.protocol.is_replicated() {
            cfg.fsync.to_string()
        } else {
            String::new()
        },
        oss_commit: (cfg.protocol == Protocol::Oss).then(|| cfg.oss_commit.name().to_string()),
        answer_poll_us: (cfg.protocol == Protocol::Tfa)
            .then_some(cfg.answer_poll.as_secs_f64() * 1e6),
        link_delay_ms: cfg.link_delay.as_secs_f64() * 1000.0,
        work_ms: cfg.work.as_secs_f64() * 1000.0,
        pause_ms: cfg.pause.as_secs_f64() * 1000.0,
        linked: cfg.linked,
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
        profiles: profiles
            .iter()
            .zip(&per_kind)
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
        hot_spots: hot_spots(nodes),
        sched: open,
    })
}

/// Runs `threads` workers, each running operations back to back, for the configured time;
/// returns what each kind of operation measured.
fn closed_loop(
    cfg: &BenchConfig,
    nodes: &[atomos::Node],
    workload: &Arc<dyn crate::Workload>,
    threads: usize,
) -> Result<Vec<Tally>, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let profiles = workload.profiles();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (node, workload, stop, done_ops) = (
                nodes[t % nodes.len()].clone(),
                workload.clone(),
                stop.clone(),
                done_ops.clone(),
            );
            let seed = cfg.seed.wrapping_add(t as u64 * 0x9e37_79b9);
            let pause = cfg.pause;
            let linked = cfg.linked;
            thread::spawn(move || -> Result<Vec<Tally>, TxError> {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut tallies: Vec<Tally> =
                    workload.profiles().iter().map(|_| Tally::new()).collect();
                let mut ops = 0u64;
                let mut chain = (linked > 0).then(|| node.linked(linked));
                let mut op = |rng: &mut SmallRng| match chain.as_mut() {
                    Some(chain) => workload.op_linked(chain, t, rng).unwrap_or_else(|| {
                        Err(TxError::Refused {
                            reason: "the workload has no linked form".into(),
                        })
                    }),
                    None => workload.op(&node, t, rng),
                };
                while !stop.load(Ordering::Relaxed) {
                    if ops.is_multiple_of(SAMPLE_EVERY) {
                        let t0 = Instant::now();
                        let kind = op(&mut rng)?;
                        let tally = &mut tallies[kind];
                        tally.hist.saturating_record(t0.elapsed().as_nanos() as u64);
                        tally.ops += 1;
                    } else {
                        tallies[op(&mut rng)?].ops += 1;
                    }
                    ops += 1;
                    if !pause.is_zero() {
                        thread::sleep(pause);
                    }
                    if ops.is_multiple_of(PUBLISH_EVERY) {
                        done_ops.fetch_add(PUBLISH_EVERY, Ordering::Relaxed);
                    }
                }
                if let Some(chain) = chain.as_mut() {
                    chain.finish()?;
                }
                Ok(tallies)
            })
        })
        .collect();

    let mut last_print = Instant::now();
    while start.elapsed() < cfg.duration {
        thread::sleep(Duration::from_millis(50).min(cfg.duration.saturating_sub(start.elapsed())));
        if cfg.progress && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            let ops = done_ops.load(Ordering::Relaxed);
            eprint!(
                "\r  {:>5.1}s  {:>12} tx  {:>10.0} tx/s   ",
                secs,
                ops,
                ops as f64 / secs
            );
            let _ = std::io::stderr().flush();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut per_kind: Vec<Tally> = profiles.iter().map(|_| Tally::new()).collect();
    let mut failure = None;
    for w in workers {
        match w.join().expect("benchmark worker panicked") {
            Ok(tallies) => {
                for (sum, t) in per_kind.iter_mut().zip(tallies) {
                    sum.add(&t);
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    if cfg.progress {
        eprintln!();
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(per_kind),
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
            "{} on {} ({} node, {} transport, {} threads per node, {size}): {:.0} tx/s, {} committed, abort rate {:.4}, \
             latency p50 {:.2} us p99 {:.2} us; invariant {}: {}",
            self.workload,
            protocol,
            self.nodes,
            self.transport,
            self.threads,
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
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TPC-C population that loads in milliseconds.
    const TINY: TpccScale = TpccScale {
        items: 200,
        customers: 30,
        orders: 30,
    };

    fn quick(kind: WorkloadKind, objects: usize, read_ratio: f64) -> BenchReport {
        run(&BenchConfig {
            workload: kind,
            protocol: Protocol::Local,
            nodes: 1,
            threads: 3,
            objects,
            read_ratio,
            duration: Duration::from_millis(300),
            seed: 7,
            scale: TINY,
            ..BenchConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn every_workload_keeps_its_invariant_under_contention() {
        for kind in WorkloadKind::ALL {
            // Small structures, mostly updates: many conflicts.
            let r = quick(kind, 32, 0.2);
            assert!(r.invariant_ok, "{}: {}", kind, r.invariant);
            assert!(r.committed > 0, "{kind} committed nothing");
            assert!(r.latency_us.samples > 0);
        }
    }

    #[test]
    fn every_workload_runs_on_tfa_across_nodes() {
        every_workload_runs_across_nodes(Protocol::Tfa);
    }

    /// Each workload's check runs on every replica (see `check_replicas`).
    #[test]
    fn every_workload_runs_on_certify_across_replicas() {
        every_workload_runs_across_nodes(Protocol::Certify);
    }

    /// Under `active` the workloads' closures are certified between procedures.
    #[test]
    fn every_workload_runs_on_active_across_replicas() {
        every_workload_runs_across_nodes(Protocol::Active);
    }

    /// Under `oss` every workload's commits go through the ultra-peer; the counters through
    /// each commit mode.
    #[test]
    fn every_workload_runs_on_oss_across_nodes() {
        every_workload_runs_across_nodes(Protocol::Oss);
        for oss_commit in [CommitMode::DistributedToken, CommitMode::CoordinatorToken] {
            for workload in [WorkloadKind::SharedCounter, WorkloadKind::PrivateCounters] {
                let r = run(&BenchConfig {
                    workload,
                    protocol: Protocol::Oss,
                    nodes: 3,
                    threads: 2,
                    duration: Duration::from_millis(300),
                    work: Duration::from_millis(1),
                    pause: Duration::from_millis(1),
                    oss_commit,
                    ..BenchConfig::default()
                })
                .unwrap();
                let what = format!("{workload} with {oss_commit:?}");
                assert!(r.invariant_ok, "{what}: {}", r.invariant);
                assert!(r.committed > 0, "{what} committed nothing");
                assert_eq!(r.oss_commit.as_deref(), Some(oss_commit.name()));
            }
        }
    }

    /// The counters as linked transactions keep their sum, and the shared counter is the hot
    /// spot its conflicts name.
    #[test]
    fn linked_counters_keep_their_sum_and_name_their_hot_spot() {
        for workload in [WorkloadKind::PrivateCounters, WorkloadKind::SharedCounter] {
            let r = run(&BenchConfig {
                workload,
                protocol: Protocol::Oss,
                nodes: 3,
                threads: 2,
                duration: Duration::from_millis(400),
                work: Duration::from_millis(1),
                linked: 1,
                ..BenchConfig::default()
            })
            .unwrap();
            assert!(r.invariant_ok, "{workload}: {}", r.invariant);
            assert!(r.committed > 0, "{workload} committed nothing");
            if workload == WorkloadKind::SharedCounter && r.aborted > 0 {
                assert!(
                    r.hot_spots.iter().any(|h| h.key.contains("counter")),
                    "{:?}",
                    r.hot_spots
                );
            }
        }
    }

    fn every_workload_runs_across_nodes(protocol: Protocol) {
        for transport in [TransportKind::Memory, TransportKind::Tcp] {
            for kind in WorkloadKind::ALL {
                let r = run(&BenchConfig {
                    workload: kind,
                    protocol,
                    nodes: 3,
                    transport,
                    threads: 2,
                    objects: 32,
                    read_ratio: 0.3,
                    balance_k: Some(4),
                    duration: Duration::from_millis(300),
                    seed: 3,
                    scale: TINY,
                    ..BenchConfig::default()
                })
                .unwrap();
                let what = format!("{kind} on {protocol} over {transport}");
                assert!(r.invariant_ok, "{what}: {}", r.invariant);
                assert!(r.committed > 0, "{what} committed nothing");
                assert_eq!(r.nodes, 3);
            }
        }
    }

    #[test]
    fn every_nesting_model_keeps_its_invariant_under_contention() {
        for protocol in [Protocol::Local, Protocol::Tfa, Protocol::Certify] {
            for kind in [WorkloadKind::Bank, WorkloadKind::HashTable] {
                for nesting in NestingModel::ALL {
                    let r = run(&BenchConfig {
                        workload: kind,
                        protocol,
                        nodes: if protocol == Protocol::Local { 1 } else { 2 },
                        threads: 3,
                        objects: 16,
                        read_ratio: 0.1,
                        balance_k: Some(4),
                        nesting,
                        inner: 4,
                        duration: Duration::from_millis(300),
                        seed: 5,
                        scale: TINY,
                        ..BenchConfig::default()
                    })
                    .unwrap();
                    let what = format!("{kind} {nesting} on {protocol}");
                    assert!(r.invariant_ok, "{what}: {}", r.invariant);
                    assert!(r.committed > 0, "{what} committed nothing");
                }
            }
        }
    }

    #[test]
    fn tpcc_runs_open_loop_under_every_policy_with_its_checks_passing() {
        use atomos::service::Policy;
        for (protocol, sched) in [
            (Protocol::Local, Policy::None),
            (Protocol::Local, Policy::Preemptive),
            (Protocol::Local, Policy::Cmax(2)),
            (Protocol::Local, Policy::Lazy(2)),
            (Protocol::Certify, Policy::Preemptive),
            (Protocol::Tfa, Policy::Preemptive),
            (Protocol::Oss, Policy::Preemptive),
        ] {
            let r = run(&BenchConfig {
                workload: WorkloadKind::Tpcc,
                protocol,
                nodes: if protocol == Protocol::Local { 1 } else { 2 },
                scale: TINY,
                duration: Duration::from_millis(400),
                arrival_rate: Some(2_000.0),
                sched,
                contexts: 16,
                ..BenchConfig::default()
            })
            .unwrap();
            let what = format!("{sched} on {protocol}");
            assert!(r.invariant_ok, "{what}: {}", r.invariant);
            let open = r.sched.as_ref().expect("an open-loop report");
            assert_eq!(open.sched, sched.name());
            assert!(open.requests > 200, "{what}: {} requests", open.requests);
            assert_eq!(r.committed, open.requests, "{what}: every request ended");
            // Every priority of table 6.1 arrived and has a turnaround, of which its
            // execution (start to end) is a part.
            for level in ["1", "2", "3", "4", "5"] {
                let t = &open.turnaround_us[level];
                assert!(
                    t.count > 0 && t.mean > 0.0 && t.p99 >= t.p50,
                    "{what}: {level}: {t:?}"
                );
                let e = &open.execution_us[level];
                assert!(
                    e.count == t.count && e.mean > 0.0 && e.mean <= t.mean,
                    "{what}: {level}: execution {e:?}, turnaround {t:?}"
                );
                let running = &open.running_us[level];
                assert!(
                    running.count == t.count && running.mean > 0.0 && running.mean <= e.mean,
                    "{what}: {level}: running {running:?}, execution {e:?}"
                );
            }
        }
        let refused = |cfg: BenchConfig| run(&cfg).expect_err("refused");
        assert!(matches!(
            refused(BenchConfig {
                workload: WorkloadKind::Bank,
                arrival_rate: Some(100.0),
                duration: Duration::from_millis(50),
                ..BenchConfig::default()
            }),
            BenchError::Config(_)
        ));
        assert!(matches!(
            refused(BenchConfig {
                workload: WorkloadKind::Tpcc,
                arrival_rate: Some(-1.0),
                ..BenchConfig::default()
            }),
            BenchError::Config(_)
        ));
    }

    #[test]
    fn macro_workloads_run_for_seconds_at_their_defaults_with_checks_passing() {
        for kind in [
            WorkloadKind::Vacation,
            WorkloadKind::Loan,
            WorkloadKind::Tpcc,
        ] {
            let r = run(&BenchConfig {
                workload: kind,
                objects: kind.default_objects(),
                duration: Duration::from_secs(2),
                ..BenchConfig::default()
            })
            .unwrap();
            assert!(r.invariant_ok, "{kind}: {}", r.invariant);
            assert!(r.duration_s >= 2.0);
            // Every kind of operation ran and was timed.
            for p in &r.profiles {
                assert!(p.committed > 0, "{kind}: no {} ran", p.name);
            }
            assert_eq!(
                r.profiles.iter().map(|p| p.committed).sum::<u64>(),
                r.committed
            );
        }
    }

    #[test]
    fn read_only_operations_never_abort() {
        let r = quick(WorkloadKind::Bank, 64, 1.0);
        assert_eq!(r.aborted, 0);
        assert_eq!(r.stats.read_only_commits, r.committed);
    }

    #[test]
    fn bad_configuration_is_refused() {
        let mut cfg = BenchConfig {
            workload: WorkloadKind::Bank,
            protocol: Protocol::Local,
            nodes: 1,
            threads: 1,
            objects: 10,
            read_ratio: 1.5,
            duration: Duration::from_millis(10),
            seed: 1,
            scale: TINY,
            ..BenchConfig::default()
        };
        assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
        cfg.read_ratio = 0.5;
        cfg.nodes = 3;
        assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
    }
}
