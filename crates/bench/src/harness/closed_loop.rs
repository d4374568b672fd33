//! The closed loop: workers that run a workload's operations back to back on their nodes for
//! the configured time, as threads or as fibers on the nodes' network runtime, and what each
//! kind of operation measured.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use atomos::TxError;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{sampler, BenchConfig, BenchError, Tally};

/// Workers publish their operation counts this often, for the progress line.
const PUBLISH_EVERY: u64 = 1024;

/// Runs a worker for each `(index, node)` of `workers`, each running operations back to back
/// on its node, for the configured time; returns what each kind of operation measured. With
/// `cfg.fibers` the workers are fibers on `runtime` (the nodes' network runtime), else threads.
pub(crate) fn closed_loop(
    cfg: &BenchConfig,
    workers: Vec<(usize, atomos::Node)>,
    workload: &Arc<dyn crate::Workload>,
    runtime: Option<tokio::runtime::Handle>,
) -> Result<Vec<Tally>, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let profiles = workload.profiles();
    let runtime = match (cfg.fibers, runtime) {
        (true, Some(rt)) => Some(rt),
        (true, None) => {
            return Err(BenchError::Config(
                "--fibers needs networked nodes (their runtime runs the fibers)".into(),
            ))
        }
        (false, _) => None,
    };
    let mut running: Vec<Running> = Vec::with_capacity(workers.len());
    for (t, node) in workers {
        let worker = Worker {
            t,
            node,
            workload: workload.clone(),
            stop: stop.clone(),
            done_ops: done_ops.clone(),
            seed: cfg.seed.wrapping_add(t as u64 * 0x9e37_79b9),
            pause: cfg.pause,
            linked: cfg.linked,
            fiber: runtime.is_some(),
        };
        running.push(match &runtime {
            // SAFETY: the workloads' operations are transactions and arithmetic: nothing they
            // hold across a transaction is tied to the thread they run on.
            Some(rt) => match unsafe { atomos::Fiber::new(move || worker.run()) } {
                Ok(fiber) => Running::Fiber(rt.clone(), rt.spawn(fiber)),
                Err(e) => {
                    // The workers started stop and are waited for; the run is void.
                    stop.store(true, Ordering::Relaxed);
                    for w in running {
                        let _ = w.join();
                    }
                    return Err(BenchError::Config(format!("cannot start a fiber: {e}")));
                }
            },
            None => Running::Thread(thread::spawn(move || worker.run())),
        });
    }

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
    for w in running {
        match w.join() {
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

/// One closed-loop worker: what it runs and what it reports to.
struct Worker {
    t: usize,
    node: atomos::Node,
    workload: Arc<dyn crate::Workload>,
    stop: Arc<AtomicBool>,
    done_ops: Arc<AtomicU64>,
    seed: u64,
    pause: Duration,
    linked: usize,
    /// Runs as a fiber (and gives the runtime's other tasks their turn).
    fiber: bool,
}

impl Worker {
    /// Runs operations back to back until told to stop; what each kind measured.
    fn run(self) -> Result<Vec<Tally>, TxError> {
        let Worker {
            t,
            node,
            workload,
            stop,
            done_ops,
            seed,
            pause,
            linked,
            fiber,
        } = self;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut tallies: Vec<Tally> = workload.profiles().iter().map(|_| Tally::new()).collect();
        let mut ops = 0u64;
        let mut sampler = sampler::Sampler::new();
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
            if sampler.times(ops) {
                let t0 = Instant::now();
                let kind = op(&mut rng)?;
                let tally = &mut tallies[kind];
                let ns = t0.elapsed().as_nanos() as u64;
                tally.hist.saturating_record_n(ns, sampler.stride());
                tally.ops += 1;
            } else {
                tallies[op(&mut rng)?].ops += 1;
            }
            ops += 1;
            sampler.done(ops);
            if !pause.is_zero() {
                thread::sleep(pause);
            }
            // A fiber whose operations found everything on its node may not have let the
            // runtime's other tasks run for a while (threads need not: the system preempts).
            if fiber {
                atomos::fiber::consume_budget();
            }
            if ops.is_multiple_of(PUBLISH_EVERY) {
                done_ops.fetch_add(PUBLISH_EVERY, Ordering::Relaxed);
            }
        }
        if let Some(chain) = chain.as_mut() {
            chain.finish()?;
        }
        Ok(tallies)
    }
}

/// A worker started: a thread, or a fiber's task on a runtime.
enum Running {
    Thread(thread::JoinHandle<Result<Vec<Tally>, TxError>>),
    Fiber(
        tokio::runtime::Handle,
        tokio::task::JoinHandle<Result<Vec<Tally>, TxError>>,
    ),
}

impl Running {
    /// Waits for the worker to end.
    fn join(self) -> Result<Vec<Tally>, TxError> {
        match self {
            Running::Thread(t) => t.join().expect("benchmark worker panicked"),
            Running::Fiber(rt, task) => rt.block_on(task).expect("benchmark worker panicked"),
        }
    }
}
