//! Counters (OSS VI-A): every transaction increments one counter and then works for a while
//! inside the transaction (`--work-ms`, 50 ms in the paper, a sleep after the increment).
//! The work checks every millisecond whether a commit already doomed it (forward validation).
//! With a shared counter every transaction of every node conflicts with every other (the
//! lower bound of throughput); with private counters (one per worker thread, replicated like
//! any object, so each commit goes over the network) none does (the protocol's own cost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atomos::{Key, Node, TRef, TxError};
use rand::rngs::SmallRng;

use super::{Check, Workload, WorkloadParams};

/// Works for `time` inside `tx` (a sleep, as OSS's experiments do), checking every
/// millisecond whether an incoming commit already doomed the transaction (forward validation:
/// it then re-runs at once instead of sleeping on).
fn work(tx: &mut atomos::Tx<'_>, time: Duration) -> Result<(), TxError> {
    let step = Duration::from_millis(1);
    let mut left = time;
    while !left.is_zero() {
        let now = left.min(step);
        std::thread::sleep(now);
        left -= now;
        tx.check()?;
    }
    Ok(())
}

/// The counters workloads. Invariant: the counters sum to the increments committed.
pub struct Counters {
    counters: Vec<TRef<u64>>,
    work: Duration,
    committed: AtomicU64,
}

impl Counters {
    /// One counter every worker increments (`shared`), or one per worker thread.
    pub fn new(p: &WorkloadParams, shared: bool) -> Counters {
        let n = if shared { 1 } else { p.threads.max(1) };
        Counters {
            counters: (0..n as u64)
                .map(|i| TRef::new(Key::with_index("counter/", i)))
                .collect(),
            work: p.work,
            committed: AtomicU64::new(0),
        }
    }
}

impl Workload for Counters {
    fn setup(&self, node: &Node) -> Result<(), TxError> {
        node.atomically(|tx| {
            for c in &self.counters {
                tx.create(c, 0)?;
            }
            Ok(())
        })
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["increment"]
    }

    fn op(&self, node: &Node, thread: usize, _rng: &mut SmallRng) -> Result<usize, TxError> {
        let counter = &self.counters[thread % self.counters.len()];
        node.atomically(|tx| {
            tx.modify(counter, |v| *v += 1)?;
            work(tx, self.work)
        })?;
        self.committed.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }

    fn op_linked(
        &self,
        chain: &mut atomos::Linked,
        thread: usize,
        _rng: &mut SmallRng,
    ) -> Option<Result<usize, TxError>> {
        let counter = self.counters[thread % self.counters.len()].clone();
        let time = self.work;
        let run = chain.run(move |tx| {
            tx.modify(&counter, |v| *v += 1)?;
            work(tx, time)
        });
        // Counted once it runs: the chain re-runs it until it commits, or its finish fails.
        Some(run.map(|_| {
            self.committed.fetch_add(1, Ordering::Relaxed);
            0
        }))
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        let sum: u64 = node.atomically_read(|tx| {
            let mut sum = 0;
            for c in &self.counters {
                sum += *tx.read(c)?;
            }
            Ok(sum)
        })?;
        let committed = self.committed.load(Ordering::Relaxed);
        Ok(Check {
            ok: sum == committed,
            detail: format!("counters sum to {sum}, {committed} increments committed"),
        })
    }
}
