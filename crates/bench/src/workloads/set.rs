//! Integer-set workloads: `contains` at the read ratio, otherwise `add` or `remove` (even odds)
//! of a random value from a key range twice the set's size.

use std::sync::atomic::{AtomicI64, Ordering};

use atomos::{Node, TxError};
use rand::distr::{Bernoulli, Distribution};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{below, coin, Check, Workload, WorkloadParams};

/// A transactional set of integers.
pub trait IntSet: Send + Sync {
    /// Creates the set's fixed objects (sentinels, buckets).
    fn init(&self, node: &Node) -> Result<(), TxError>;
    /// Whether `v` is in the set (a read-only transaction).
    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError>;
    /// Adds `v`; false if it was there.
    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError>;
    /// Removes `v`; false if it was not there.
    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError>;
    /// Every element, in the structure's order, read as one snapshot. `Err(msg)` inside when the
    /// structure is malformed.
    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError>;
    /// Whether `elements` lists values in increasing order (false for hash tables).
    fn ordered(&self) -> bool {
        true
    }
}

#[repr(align(64))]
#[derive(Default)]
struct PaddedCounter(AtomicI64);

/// An update made of several operations (the nesting experiments): runs one and returns the
/// change in the set's size.
pub type Updates = Box<dyn Fn(&Node, &mut SmallRng) -> Result<i64, TxError> + Send + Sync>;

/// Runs an [`IntSet`] as a workload. Invariant: the structure is well formed and its size equals
/// the initial size plus successful adds minus successful removes.
pub struct SetWorkload<S> {
    set: S,
    updates: Option<Updates>,
    range: i64,
    initial: usize,
    /// Whether an operation is a lookup (else an update).
    lookup: Bernoulli,
    /// Whether an update adds (else it removes).
    adds: Bernoulli,
    /// Net size change per worker thread.
    net: Vec<PaddedCounter>,
}

impl<S: IntSet> SetWorkload<S> {
    /// A workload over `set` with `p.objects` initial elements drawn from `0..2 * p.objects`.
    pub fn new(set: S, p: &WorkloadParams) -> SetWorkload<S> {
        SetWorkload {
            set,
            updates: None,
            range: (p.objects.max(1) * 2) as i64,
            initial: p.objects.max(1),
            lookup: coin(p.read_ratio),
            adds: coin(0.5),
            net: (0..p.threads.max(1))
                .map(|_| PaddedCounter::default())
                .collect(),
        }
    }
}

impl<S> SetWorkload<S> {
    /// Runs updates through `updates` instead of one add or remove per transaction.
    pub fn with_updates(mut self, updates: Updates) -> Self {
        self.updates = Some(updates);
        self
    }
}

impl<S: IntSet> Workload for SetWorkload<S> {
    fn setup(&self, node: &Node) -> Result<(), TxError> {
        self.set.init(node)?;
        let mut rng = SmallRng::seed_from_u64(0x5e7);
        let mut added = 0;
        while added < self.initial {
            if self.set.add(node, rng.random_range(0..self.range))? {
                added += 1;
            }
        }
        Ok(())
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["update", "contains"]
    }

    fn op(&self, node: &Node, thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        let v = below(rng, self.range as u64) as i64;
        if self.lookup.sample(rng) {
            return self.set.contains(node, v).map(|_| 1);
        }
        let delta = if let Some(updates) = &self.updates {
            updates(node, rng)?
        } else if self.adds.sample(rng) {
            i64::from(self.set.add(node, v)?)
        } else {
            -i64::from(self.set.remove(node, v)?)
        };
        // Only this worker's operations change its counter, one at a time: a load and a store
        // do, without the locked instruction of an atomic add.
        let net = &self.net[thread].0;
        net.store(net.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
        Ok(0)
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        let expected = self.initial as i64
            + self
                .net
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum::<i64>();
        let mut elements = match self.set.elements(node)? {
            Ok(e) => e,
            Err(msg) => {
                return Ok(Check {
                    ok: false,
                    detail: msg,
                })
            }
        };
        if !self.set.ordered() {
            elements.sort_unstable();
        }
        let strictly_increasing = elements.windows(2).all(|w| w[0] < w[1]);
        let in_range = elements.iter().all(|v| (0..self.range).contains(v));
        let ok = strictly_increasing && in_range && elements.len() as i64 == expected;
        Ok(Check {
            ok,
            detail: format!(
                "set size {} (expected {expected}), {} order, values {} range",
                elements.len(),
                if strictly_increasing {
                    "strict"
                } else {
                    "BROKEN"
                },
                if in_range { "in" } else { "OUT OF" },
            ),
        })
    }
}
