//! `atomos bench executor`: the speculative serial executor alone (no network, no log), as
//! HiperTM measures its standalone SCC. Bank transfers are invoked as procedures: each window
//! of invocations is run speculatively (as optimistic deliveries would be) and then finalized
//! in the same order (a failure-free run: every speculation is confirmed). Meanwhile reader
//! threads run read-only procedures (a balance of `balance_k` random accounts) on snapshots of
//! the committed objects, never waiting for the executor.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::{
    Engine, EngineConfig, Invocation, Key, Outcome, ProcedureKind, Procedures, SerialExecutor,
    TRef, Tx, TxError, TxOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Settings of an executor benchmark.
#[derive(Clone, Debug)]
pub struct ExecutorBenchConfig {
    /// Bank accounts.
    pub accounts: u64,
    /// How long to measure.
    pub duration: Duration,
    /// Threads running read-only procedures beside the executor.
    pub readers: usize,
    /// Accounts a read-only procedure reads.
    pub balance_k: usize,
    /// Invocations speculated before the first of them is finalized (the optimistic lead).
    pub window: usize,
}

/// What `atomos bench executor` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecutorReport {
    /// Always "executor".
    pub workload: String,
    /// Bank accounts.
    pub accounts: u64,
    /// Seconds measured.
    pub duration_s: f64,
    /// Invocations speculated before the first of them is finalized.
    pub window: usize,
    /// Transfers run speculatively and finalized, per second (the executor's thread).
    pub procedures_per_s: f64,
    /// Read-only procedures per second over all reader threads.
    pub read_only_per_s: f64,
    /// Reader threads.
    pub readers: usize,
    /// Share of finalized invocations whose speculative run was committed as it was.
    pub confirmed_ratio: f64,
    /// Whether the money was conserved (checked at the end).
    pub invariant_ok: bool,
}

impl ExecutorReport {
    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "executor: {} accounts, window {}: {:.0} procedures/s on the executor, {:.0} read-only procedures/s on {} threads, {:.1}% of speculations confirmed; money {}",
            self.accounts,
            self.window,
            self.procedures_per_s,
            self.read_only_per_s,
            self.readers,
            self.confirmed_ratio * 100.0,
            if self.invariant_ok { "conserved" } else { "NOT CONSERVED" }
        )
    }
}

const START: i64 = 1_000;

fn account(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("acct/", i))
}

fn procedures() -> Result<Procedures, String> {
    let p = Procedures::new();
    p.register(
        "transfer",
        ProcedureKind::Update,
        |tx: &mut Tx<'_>, &(from, to, amount): &(u64, u64, i64)| {
            let balance = *tx.read(&account(from))?;
            if balance < amount {
                return Ok(false);
            }
            tx.write(&account(from), balance - amount)?;
            tx.modify(&account(to), |b| *b += amount)?;
            Ok(true)
        },
    )
    .map_err(|e| e.to_string())?;
    p.register(
        "balance",
        ProcedureKind::ReadOnly,
        |tx: &mut Tx<'_>, accounts: &Vec<u64>| {
            let mut sum = 0i64;
            for &i in accounts {
                sum += *tx.read(&account(i))?;
            }
            Ok(sum)
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(p)
}

/// Runs the benchmark.
pub fn run(cfg: &ExecutorBenchConfig) -> Result<ExecutorReport, String> {
    if cfg.accounts < 2 || cfg.duration.is_zero() || cfg.window == 0 {
        return Err("--objects must be at least 2, --duration and the window positive".into());
    }
    let engine = Arc::new(Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    }));
    let procedures = procedures()?;
    engine
        .atomically(|tx| {
            for i in 0..cfg.accounts {
                tx.create(&account(i), START)?;
            }
            Ok(())
        })
        .map_err(|e| format!("setting up the accounts: {e}"))?;
    // The invocations, encoded beforehand: a client's work, not the executor's.
    let mut rng = StdRng::seed_from_u64(7);
    let invocations: Vec<Invocation> = (0..65_536)
        .map(|_| {
            let from = rng.random_range(0..cfg.accounts);
            let to = (from + rng.random_range(1..cfg.accounts)) % cfg.accounts;
            let args = (from, to, rng.random_range(1..50i64));
            atomos::encode_arguments("transfer", &args).map(|arguments| Invocation {
                procedure: "transfer".into(),
                arguments,
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..cfg.readers)
        .map(|t| {
            let (engine, procedures) = (engine.clone(), procedures.clone());
            let (stop, reads) = (stop.clone(), reads.clone());
            let (accounts, k) = (cfg.accounts, cfg.balance_k.max(1));
            std::thread::spawn(move || {
                read_loop(&engine, &procedures, &stop, &reads, t, accounts, k)
            })
        })
        .collect();
    let mut executor = SerialExecutor::new(engine.clone(), procedures);
    let started = Instant::now();
    let (mut seq, mut position, mut finalized) = (0u64, 0u64, 0u64);
    let mut failed = None;
    while started.elapsed() < cfg.duration {
        let first = seq;
        for _ in 0..cfg.window {
            seq += 1;
            executor.speculate((seq, 0), &invocations[(seq as usize) % invocations.len()]);
        }
        for s in first + 1..=seq {
            position += 1;
            let inv = &invocations[(s as usize) % invocations.len()];
            if let Outcome::Failed(why) = executor.finalize((s, 0), position, inv, |_, _| {}) {
                failed.get_or_insert(why);
            }
            finalized += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join()
            .map_err(|_| "a reader thread panicked".to_string())??;
    }
    if let Some(why) = failed {
        return Err(format!("a transfer failed: {why}"));
    }
    let total: i64 = engine
        .run(
            &TxOptions {
                read_only: true,
                ..TxOptions::default()
            },
            |tx| {
                let mut sum = 0;
                for i in 0..cfg.accounts {
                    sum += *tx.read(&account(i))?;
                }
                Ok::<i64, TxError>(sum)
            },
        )
        .map_err(|e| e.to_string())?;
    let stats = executor.stats();
    Ok(ExecutorReport {
        workload: "executor".into(),
        accounts: cfg.accounts,
        duration_s: elapsed,
        window: cfg.window,
        procedures_per_s: finalized as f64 / elapsed,
        read_only_per_s: reads.load(Ordering::Relaxed) as f64 / elapsed,
        readers: cfg.readers,
        confirmed_ratio: stats.confirmed as f64 / (stats.confirmed + stats.rerun).max(1) as f64,
        invariant_ok: total == START * cfg.accounts as i64,
    })
}

/// Runs read-only procedures until told to stop.
fn read_loop(
    engine: &Engine,
    procedures: &Procedures,
    stop: &AtomicBool,
    reads: &AtomicU64,
    thread: usize,
    accounts: u64,
    k: usize,
) -> Result<(), String> {
    let balance = procedures.get("balance").map_err(|e| e.to_string())?;
    let opts = TxOptions {
        read_only: true,
        ..TxOptions::default()
    };
    let mut rng = StdRng::seed_from_u64(thread as u64 + 100);
    let mut done = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let picked: Vec<u64> = (0..k).map(|_| rng.random_range(0..accounts)).collect();
        let args = atomos::encode_arguments("balance", &picked).map_err(|e| e.to_string())?;
        engine
            .run(&opts, |tx| balance.call(tx, &args))
            .map_err(|e: TxError| format!("a read-only procedure failed: {e}"))?;
        done += 1;
    }
    reads.fetch_add(done, Ordering::Relaxed);
    Ok(())
}
