//! `atomos demo`: what atomos does, in one command. Three replicas in this process (no ports,
//! no files) move money between accounts from several threads with a live progress line; a
//! third of the way in the leader is killed (its log is lost with it), two thirds in it comes
//! back with an empty log and catches up from the others; at the end every replica must hold
//! the same balances, adding up to what the accounts started with. `--protocol local` runs the
//! single-node engine instead.

use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::{Cluster, Node, Protocol, TRef, TxError};
use atomos_bench::{BenchConfig, WorkloadKind};
use std::sync::RwLock;

/// Accounts the money moves between, and what each starts with.
const ACCOUNTS: usize = 64;
const OPENING_BALANCE: i64 = 1_000;
const REPLICAS: u64 = 3;

/// Runs the demo; returns whether the invariant held everywhere.
pub fn run(protocol: Protocol, duration: Duration, threads: usize) -> Result<bool, String> {
    match protocol {
        Protocol::Local => local(duration, threads),
        _ => cluster(protocol, duration, threads),
    }
}

/// The single-node engine: the bench's bank workload on an embedded node.
fn local(duration: Duration, threads: usize) -> Result<bool, String> {
    println!(
        "atomos demo (local): {threads} threads move money between 1,024 accounts on an \
         embedded node;"
    );
    println!("a fifth of the transactions read every balance as one snapshot.");
    let report = atomos_bench::run(&BenchConfig {
        workload: WorkloadKind::Bank,
        protocol: Protocol::Local,
        nodes: 1,
        transport: Default::default(),
        link_delay: Duration::ZERO,
        threads,
        objects: 1024,
        read_ratio: 0.2,
        duration,
        progress: true,
        ..BenchConfig::default()
    })
    .map_err(|e| e.to_string())?;
    println!(
        "{} transactions committed ({:.0}/s), {} aborted attempts, p50 {:.2} us, p99 {:.2} us",
        report.committed,
        report.throughput_tps,
        report.aborted,
        report.latency_us.p50,
        report.latency_us.p99
    );
    println!(
        "invariant: {} ({})",
        if report.invariant_ok {
            "OK"
        } else {
            "VIOLATED"
        },
        report.invariant
    );
    Ok(report.invariant_ok)
}

/// What the transfer threads share with the main thread: what they count, and the run's
/// state.
struct Run {
    /// When the run started.
    start: Instant,
    /// Set when the threads must stop.
    stop: AtomicBool,
    /// The node that is down (0: none).
    killed: AtomicU64,
    committed: AtomicU64,
    /// Closure runs beyond the first of each transfer (conflicts re-run).
    aborted: AtomicU64,
    /// Transfers that failed: their node was down, or their outcome is unknown (money is
    /// conserved either way: a transfer commits whole or not at all).
    failed: AtomicU64,
    /// Milliseconds since the start at which a node that was not killed last committed.
    last_commit_ms: AtomicU64,
}

/// Each replica's current [`Node`] (`None` while it is down).
type Handles = Vec<Arc<RwLock<Option<Node>>>>;

fn accounts() -> Vec<TRef<i64>> {
    (0..ACCOUNTS)
        .map(|i| TRef::new(format!("demo/account/{i}")))
        .collect()
}

fn cluster(protocol: Protocol, duration: Duration, threads: usize) -> Result<bool, String> {
    let restarts = matches!(protocol, Protocol::Certify | Protocol::Active);
    println!(
        "atomos demo ({protocol}): {REPLICAS} nodes in this process, {threads} threads move \
         money between {ACCOUNTS} accounts for {:.0} s.",
        duration.as_secs_f64()
    );
    let mut cluster =
        Cluster::in_process(REPLICAS as usize, protocol).map_err(|e| e.to_string())?;
    let accounts = accounts();
    let first = cluster.node(1).ok_or("node 1 did not start")?.clone();
    first
        .atomically(|tx| {
            for a in &accounts {
                tx.create(a, OPENING_BALANCE)?;
            }
            Ok(())
        })
        .map_err(|e| format!("opening the accounts: {e}"))?;
    for id in cluster.ids() {
        if let Some(node) = cluster.node(id) {
            node.sync()
                .map_err(|e| format!("node {id} did not catch up: {e}"))?;
        }
    }
    let handles: Handles = (1..=REPLICAS)
        .map(|id| Arc::new(RwLock::new(cluster.node(id).cloned())))
        .collect();
    let run = Arc::new(Run {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        killed: AtomicU64::new(0),
        committed: AtomicU64::new(0),
        aborted: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        last_commit_ms: AtomicU64::new(0),
    });
    let (counts, killed, start) = (&run, &run.killed, run.start);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let handle = handles[t % REPLICAS as usize].clone();
            let (run, accounts) = (run.clone(), accounts.clone());
            let node_id = (t as u64 % REPLICAS) + 1;
            std::thread::spawn(move || transfers(node_id, t as u64, &handle, &accounts, &run))
        })
        .collect();

    let kill_at = duration / 3;
    let restart_at = duration * 2 / 3;
    let mut victim = None;
    let mut pause = Duration::ZERO;
    let mut last_print = Instant::now();
    let mut last_committed = 0;
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(20));
        let now = start.elapsed();
        if restarts && victim.is_none() && now >= kill_at {
            let leader = (1..=REPLICAS)
                .find(|&id| {
                    cluster
                        .member(id)
                        .and_then(|m| m.order())
                        .is_some_and(|o| o.stats().leader)
                })
                .unwrap_or(1);
            killed.store(leader, Ordering::Relaxed);
            counts
                .last_commit_ms
                .store(now.as_millis() as u64, Ordering::Relaxed);
            *handles[leader as usize - 1]
                .write()
                .map_err(|_| "a handle lock was poisoned")? = None;
            cluster.kill(leader).map_err(|e| e.to_string())?;
            victim = Some(leader);
            println!("\n-- killed node {leader}, the leader: its log is gone with it");
        }
        if let Some(id) = victim {
            if killed.load(Ordering::Relaxed) != 0 {
                let since = now.as_millis() as u64
                    - counts
                        .last_commit_ms
                        .load(Ordering::Relaxed)
                        .min(now.as_millis() as u64);
                pause = pause.max(Duration::from_millis(since));
                if now >= restart_at {
                    cluster.restart(id).map_err(|e| e.to_string())?;
                    *handles[id as usize - 1]
                        .write()
                        .map_err(|_| "a handle lock was poisoned")? = cluster.node(id).cloned();
                    killed.store(0, Ordering::Relaxed);
                    println!(
                        "\n-- node {id} restarted with an empty log: it catches up from the \
                         others and serves again"
                    );
                }
            }
        }
        if last_print.elapsed() >= Duration::from_millis(250) {
            let committed = counts.committed.load(Ordering::Relaxed);
            let rate = (committed - last_committed) as f64 / last_print.elapsed().as_secs_f64();
            print!(
                "\r{:5.1} s  {committed:>8} transfers committed  {rate:>8.0}/s  {:>6} aborted \
                 attempts  {:>4} failed   ",
                now.as_secs_f64(),
                counts.aborted.load(Ordering::Relaxed),
                counts.failed.load(Ordering::Relaxed)
            );
            let _ = std::io::stdout().flush();
            last_print = Instant::now();
            last_committed = committed;
        }
    }
    run.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().map_err(|_| "a transfer thread panicked")?;
    }
    println!();
    let elapsed = start.elapsed().as_secs_f64();
    let committed = counts.committed.load(Ordering::Relaxed);
    println!(
        "{committed} transfers committed ({:.0}/s), {} aborted attempts (conflicts, re-run), \
         {} failed (their node was down, or their outcome unknown)",
        committed as f64 / elapsed,
        counts.aborted.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed)
    );
    match victim {
        Some(id) => println!(
            "after node {id} was killed, the longest time no transfer committed: {} ms \
             (electing a new leader)",
            pause.as_millis()
        ),
        None => println!(
            "no replica was killed: under {protocol} a node's loss loses what only it held \
             (use certify or active to see a failover)"
        ),
    }
    audit(&cluster, &accounts)
}

/// Transfers from one thread through the replica it is bound to, until told to stop.
fn transfers(
    node_id: u64,
    seed: u64,
    handle: &RwLock<Option<Node>>,
    accounts: &[TRef<i64>],
    run: &Run,
) {
    let (counts, stop, killed, start) = (run, &run.stop, &run.killed, run.start);
    let mut rng = SplitMix64::seed_from_u64(seed);
    let mut next = move || rng.next_u64();
    while !stop.load(Ordering::Relaxed) {
        let Some(node) = handle.read().ok().and_then(|h| h.clone()) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let from = &accounts[next() as usize % accounts.len()];
        let to = &accounts[next() as usize % accounts.len()];
        let amount = 1 + (next() % 10) as i64;
        let mut runs = 0;
        let result = node.atomically(|tx| {
            runs += 1;
            tx.modify(from, |b| *b -= amount)?;
            tx.modify(to, |b| *b += amount)
        });
        counts.aborted.fetch_add(runs.max(1) - 1, Ordering::Relaxed);
        match result {
            Ok(()) => {
                counts.committed.fetch_add(1, Ordering::Relaxed);
                if killed.load(Ordering::Relaxed) != node_id {
                    counts
                        .last_commit_ms
                        .fetch_max(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            }
            Err(_) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Every replica caught up, holds the same balances, and they add up to what they started
/// with.
fn audit(cluster: &Cluster, accounts: &[TRef<i64>]) -> Result<bool, String> {
    let expected = OPENING_BALANCE * accounts.len() as i64;
    let mut ok = true;
    let mut reference: Option<(u64, Vec<i64>)> = None;
    for id in cluster.ids() {
        let node = cluster
            .node(id)
            .ok_or(format!("node {id} is not running"))?;
        let caught_up = Instant::now() + Duration::from_secs(30);
        while let Err(e) = node.sync() {
            if Instant::now() >= caught_up {
                return Err(format!("node {id} did not catch up: {e}"));
            }
        }
        let balances = node
            .atomically_read(|tx| {
                accounts
                    .iter()
                    .map(|a| Ok(*tx.read(a)?))
                    .collect::<Result<Vec<i64>, TxError>>()
            })
            .map_err(|e| format!("reading node {id}'s balances: {e}"))?;
        let total: i64 = balances.iter().sum();
        let same = reference.as_ref().is_none_or(|(_, r)| *r == balances);
        let good = total == expected && same;
        ok &= good;
        let compared = match &reference {
            None => String::new(),
            Some((first, _)) if same => format!(", the same balances as node {first}"),
            Some((first, _)) => format!(", balances that differ from node {first}'s"),
        };
        println!(
            "node {id}: total {total} (expected {expected}){compared}: {}",
            if good { "OK" } else { "VIOLATED" }
        );
        reference.get_or_insert((id, balances));
    }
    println!("invariant: {}", if ok { "OK" } else { "VIOLATED" });
    Ok(ok)
}
