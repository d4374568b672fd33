//! Open-loop runs (PRESTO chapter 6): requests arrive as a Poisson process at a set rate, each
//! at its profile's priority, and run on each node's transaction service; what counts is each
//! request's turnaround (waiting, running, time preempted and aborted attempts) per priority,
//! and how soon an urgent request that found every worker busy started (reaction time).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::service::{ServiceConfig, Ticket, Timing};
use atomos::{Node, TxError, TxService};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::Mutex;

use crate::harness::{BenchConfig, BenchError, Tally};
use crate::Workload;

/// Priority levels of the service (PRESTO's five).
const LEVELS: u16 = 5;
/// The arrival thread sleeps until this long before an arrival, then spins to its time
/// (yielding its core to any thread that wants it): a sleep overshoots by the timer slack
/// (tens of microseconds), which would bunch arrivals into bursts.
const SLEEP_SLACK: Duration = Duration::from_micros(200);
/// How long the requests left after the last arrival may go without one of them ending. Past
/// that the system under test stopped making progress: the run fails saying so instead of
/// waiting forever (a backlog that drains slowly, as in an overloaded run, is no failure).
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Turnaround of the requests of one priority, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Turnaround {
    /// Requests of this priority that ended.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// What an open-loop run measured of the transaction service.
#[derive(Clone, Debug, Serialize)]
pub struct SchedReport {
    /// The policy (`none`, `preemptive`, `cmax`, `lazy`).
    pub sched: String,
    /// C_max, under `cmax` and `lazy`.
    pub cmax: Option<u32>,
    /// Requests per second the run offered (over the cluster).
    pub arrival_rate: f64,
    /// Contexts per node.
    pub contexts: usize,
    /// Requests submitted.
    pub requests: u64,
    /// Share of the workers' time spent running requests.
    pub utilization: f64,
    /// Share of the context pool in use (started transactions not ended), as arriving
    /// requests found it.
    pub context_pool_busy: f64,
    /// Turnaround per priority (`"1"` lowest to `"5"`).
    pub turnaround_us: BTreeMap<String, Turnaround>,
    /// Start to end per priority: running, aborted attempts and time preempted, not the wait
    /// to start (for the highest priority, never preempted, its own execution: no policy can
    /// bring its turnaround below this).
    pub execution_us: BTreeMap<String, Turnaround>,
    /// Time on a worker per priority, over all of a request's runs (its execution without
    /// the time it spent preempted): against `none`, what preemption added to the work itself.
    pub running_us: BTreeMap<String, Turnaround>,
    /// Reaction time per priority: from the arrival of a request that found every worker
    /// running less urgent work (and nothing as urgent waiting) until it started.
    pub reaction_us: BTreeMap<String, Turnaround>,
    /// Times a running transaction was preempted.
    pub preemptions: u64,
    /// Times a preempted transaction resumed on another worker.
    pub migrations: u64,
    /// Whether transparent huge pages were on (open-loop runs turn them off: see
    /// `disable_huge_pages`).
    pub transparent_huge_pages: bool,
}

/// One submitted request.
struct Pending {
    profile: usize,
    level: u8,
    ticket: Ticket<Result<usize, TxError>>,
}

/// Offers requests at `rate` per second for the configured time, waits for all of them, and
/// returns what each profile measured (its latency is the turnaround) with the service's
/// report.
pub(crate) fn run(
    cfg: &BenchConfig,
    rate: f64,
    nodes: &[Node],
    workload: &Arc<dyn Workload>,
) -> Result<(Vec<Tally>, SchedReport), BenchError> {
    disable_huge_pages();
    let services = nodes
        .iter()
        .map(|n| {
            TxService::start(
                n,
                ServiceConfig {
                    workers: cfg.threads,
                    levels: LEVELS,
                    contexts: cfg.contexts,
                    policy: cfg.sched,
                    ..ServiceConfig::default()
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BenchError::Config(e.to_string()))?;
    // A request takes a free slot (its workload "thread") while it runs: at most `contexts`
    // run at once on a node.
    let slots: Vec<Arc<Mutex<Vec<usize>>>> = (0..nodes.len())
        .map(|n| {
            let mine = (n * cfg.contexts..(n + 1) * cfg.contexts).collect();
            Arc::new(Mutex::new(mine))
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let mut pending = Vec::new();
    let start = Instant::now();
    let mut next = Duration::ZERO;
    let mut i = 0usize;
    while next < cfg.duration {
        let now = start.elapsed();
        if next > now + SLEEP_SLACK {
            std::thread::sleep(next - now - SLEEP_SLACK);
        }
        while start.elapsed() < next {
            // Other threads (the worker's, the runtime's) may need this core meanwhile.
            std::thread::yield_now();
        }
        let Some((profile, level)) = workload.next_request(&mut rng) else {
            return Err(BenchError::Config(format!(
                "--arrival-rate needs a workload whose requests have priorities (tpcc), not {}",
                cfg.workload.name()
            )));
        };
        let node = i % nodes.len();
        let (work, slots) = (workload.clone(), slots[node].clone());
        let seed = rng.random::<u64>();
        let ticket = services[node]
            .spawn(level, move |node| {
                let Some(slot) = slots.lock().ok().and_then(|mut s| s.pop()) else {
                    return Err(TxError::Refused {
                        reason: "no free workload slot".into(),
                    });
                };
                let mut rng = SmallRng::seed_from_u64(seed);
                let out = work.op_profile(node, slot, profile, &mut rng);
                if let Ok(mut s) = slots.lock() {
                    s.push(slot);
                }
                out
            })
            .map_err(|e| BenchError::Config(e.to_string()))?;
        pending.push(Pending {
            profile,
            level,
            ticket,
        });
        i += 1;
        // Exponential gaps: a Poisson process of the given rate.
        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        next += Duration::from_secs_f64(-u.ln() / rate);
        if cfg.progress && i.is_multiple_of(1000) {
            eprint!(
                "\r  {:>5.1}s  {i:>10} requests   ",
                start.elapsed().as_secs_f64()
            );
        }
    }
    if cfg.progress {
        eprintln!();
    }
    let mut tallies: Vec<Tally> = workload.profiles().iter().map(|_| Tally::new()).collect();
    let mut turnaround: BTreeMap<u8, Histogram<u64>> = BTreeMap::new();
    let mut reaction: BTreeMap<u8, Histogram<u64>> = BTreeMap::new();
    let mut execution: BTreeMap<u8, Histogram<u64>> = BTreeMap::new();
    let mut running: BTreeMap<u8, Histogram<u64>> = BTreeMap::new();
    let histogram = || Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("bounds");
    let requests = pending.len() as u64;
    if let Some(stuck) = drain(&pending) {
        let left = pending.iter().filter(|p| !p.ticket.is_done()).count();
        let profile = workload
            .profiles()
            .get(stuck.profile)
            .copied()
            .unwrap_or("?");
        // The services cannot be stopped while requests run (stopping waits for them): they
        // are left to the process's end.
        std::mem::forget(services);
        return Err(BenchError::Stuck(format!(
            "{left} of {requests} requests went {DRAIN_LIMIT:?} without one of them ending \
             after the last arrival (the oldest: a {profile} at priority {}): under \
             --protocol {} --sched {} the cluster stopped making progress",
            stuck.level,
            cfg.protocol,
            cfg.sched.name(),
        )));
    }
    let mut failure = None;
    for p in pending {
        let (result, timing): (_, Timing) = p
            .ticket
            .wait()
            .map_err(|e| BenchError::Config(e.to_string()))?;
        if let Err(e) = result {
            failure.get_or_insert(e);
            continue;
        }
        let ns = |d: Duration| d.as_nanos().max(1) as u64;
        let tally = &mut tallies[p.profile];
        tally.ops += 1;
        tally.hist.saturating_record(ns(timing.turnaround()));
        turnaround
            .entry(p.level)
            .or_insert_with(histogram)
            .saturating_record(ns(timing.turnaround()));
        execution
            .entry(p.level)
            .or_insert_with(histogram)
            .saturating_record(ns(timing.ended.duration_since(timing.started)));
        running
            .entry(p.level)
            .or_insert_with(histogram)
            .saturating_record(ns(timing.running));
        if timing.needed_preemption {
            reaction
                .entry(p.level)
                .or_insert_with(histogram)
                .saturating_record(ns(timing.reaction()));
        }
    }
    let elapsed = start.elapsed();
    let stats: Vec<_> = services.iter().map(TxService::stats).collect();
    drop(services);
    if let Some(e) = failure {
        return Err(e.into());
    }
    let busy_ns: u64 = stats.iter().map(|s| s.busy_ns).sum();
    let capacity_ns = elapsed.as_nanos() as f64 * (cfg.threads * nodes.len()) as f64;
    Ok((
        tallies,
        SchedReport {
            sched: cfg.sched.name().to_string(),
            cmax: cfg.sched.cmax(),
            arrival_rate: rate,
            contexts: cfg.contexts,
            requests,
            utilization: busy_ns as f64 / capacity_ns.max(1.0),
            context_pool_busy: stats.iter().map(|s| s.contexts_seen).sum::<u64>() as f64
                / (requests.max(1) * cfg.contexts as u64) as f64,
            turnaround_us: summarize(&turnaround),
            execution_us: summarize(&execution),
            running_us: summarize(&running),
            reaction_us: summarize(&reaction),
            preemptions: stats.iter().map(|s| s.preemptions).sum(),
            migrations: stats.iter().map(|s| s.migrations).sum(),
            transparent_huge_pages: !cfg!(target_os = "linux"),
        },
    ))
}

/// Waits until every request has ended, or until [`DRAIN_LIMIT`] passed with none ending;
/// then returns the oldest request still running.
fn drain(pending: &[Pending]) -> Option<&Pending> {
    let ended = || pending.iter().filter(|p| p.ticket.is_done()).count();
    let mut deadline = Instant::now() + DRAIN_LIMIT;
    let mut ended_by_then = ended();
    let mut next = 0;
    while let Some(p) = pending.get(next) {
        if p.ticket.wait_until(deadline) {
            next += 1;
            continue;
        }
        // Any request ending is progress, not only the oldest.
        let now_ended = ended();
        if now_ended == ended_by_then {
            return Some(p);
        }
        ended_by_then = now_ended;
        deadline = Instant::now() + DRAIN_LIMIT;
    }
    None
}

/// Turns transparent huge pages off for this process from now on. A fault on a huge page
/// may compact memory first, which stalls the faulting transaction for milliseconds (measured
/// here: TPC-C transactions of 2-70 us had 5-7 ms outliers, gone without huge pages); in a
/// latency run such stalls, not the scheduling, would decide the turnaround. Throughput runs
/// keep them (they are faster with huge pages).
fn disable_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and changes only this process's
    // page policy.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Per level, the mean, median and 99th percentile in microseconds.
fn summarize(by_level: &BTreeMap<u8, Histogram<u64>>) -> BTreeMap<String, Turnaround> {
    by_level
        .iter()
        .map(|(level, h)| {
            (
                level.to_string(),
                Turnaround {
                    count: h.len(),
                    mean: h.mean() / 1000.0,
                    p50: h.value_at_quantile(0.5) as f64 / 1000.0,
                    p99: h.value_at_quantile(0.99) as f64 / 1000.0,
                },
            )
        })
        .collect()
}
