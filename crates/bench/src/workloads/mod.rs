//! The workloads: Bank and five integer sets (linked list, skip list, binary search tree,
//! red-black tree, hash table), and the macro workloads Vacation, Loan and TPC-C. Each is written once against the
//! public API, so it runs on any protocol.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use atomos::{Node, TxError};
use rand::distr::Bernoulli;
use rand::rngs::SmallRng;
use rand::RngCore;

mod bank;
mod bst;
mod counters;
mod hashtable;
mod linkedlist;
mod loan;
mod nesting;
mod rbtree;
mod set;
mod skiplist;
pub mod tpcc;
mod vacation;
mod wordcount;

pub use bank::Bank;
pub use bst::Bst;
pub use counters::Counters;
pub use hashtable::HashTable;
pub use linkedlist::LinkedList;
pub use loan::Loan;
pub use nesting::{run_composed, InnerOp, NestingModel};
pub use rbtree::RbTree;
pub use set::{IntSet, SetWorkload};
pub use skiplist::SkipList;
pub use tpcc::{Tpcc, TpccMix, TpccScale};
pub use vacation::Vacation;
pub use wordcount::WordCount;

/// The outcome of a workload's end-of-run check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Whether the invariant holds.
    pub ok: bool,
    /// What was checked and found.
    pub detail: String,
}

/// A benchmark workload.
pub trait Workload: Send + Sync {
    /// Registers the workload's procedures on `node` (called on every node before
    /// [`Workload::setup`]). Under `active` the update transactions run as these procedures;
    /// under the other protocols they stay closures. Default: none.
    fn register(&self, node: &Node) -> Result<(), atomos::RegisterError> {
        let _ = node;
        Ok(())
    }
    /// Creates the initial objects.
    fn setup(&self, node: &Node) -> Result<(), TxError>;
    /// The kinds of operation the workload reports separately (transfer and balance; the five
    /// TPC-C profiles). [`Workload::op`] answers an index into this list.
    fn profiles(&self) -> &'static [&'static str];
    /// Runs one operation (one transaction, or a business transaction the workload rolled back
    /// on purpose) and says which of [`Workload::profiles`] it was. `thread` is the calling
    /// worker's index.
    fn op(&self, node: &Node, thread: usize, rng: &mut SmallRng) -> Result<usize, TxError>;
    /// The next request of an open-loop run: which profile, at which priority (1 lowest, 5
    /// highest). `None`: the workload has no priorities (no open-loop runs).
    fn next_request(&self, rng: &mut SmallRng) -> Option<(usize, u8)> {
        let _ = rng;
        None
    }
    /// Runs one operation of `profile` (as [`Workload::op`] does once it picked one). `thread`
    /// is the caller's slot: no two operations run with the same slot at once.
    fn op_profile(
        &self,
        node: &Node,
        thread: usize,
        profile: usize,
        rng: &mut SmallRng,
    ) -> Result<usize, TxError> {
        let _ = profile;
        self.op(node, thread, rng)
    }
    /// Checks the workload's invariant after the run.
    fn check(&self, node: &Node) -> Result<Check, TxError>;
    /// Runs one operation as the next transaction of `chain` (linked transactions: it
    /// returns before its commit is decided; the chain's `finish` reports failures). `None`:
    /// the workload has no linked form.
    fn op_linked(
        &self,
        chain: &mut atomos::Linked,
        thread: usize,
        rng: &mut SmallRng,
    ) -> Option<Result<usize, TxError>> {
        let _ = (chain, thread, rng);
        None
    }
}

/// Parameters shared by the workloads.
#[derive(Clone, Debug)]
pub struct WorkloadParams {
    /// Objects: accounts for Bank; the expected set size for the integer sets (their key range
    /// is twice that).
    pub objects: usize,
    /// Fraction of operations that only read (balance, contains).
    pub read_ratio: f64,
    /// Bank: the balance operation reads this many random accounts (`None`: all of them).
    pub balance_k: Option<usize>,
    /// Worker threads (workloads keep per-thread counters).
    pub threads: usize,
    /// Bank and hash table: how an update's inner operations are composed.
    pub nesting: NestingModel,
    /// Bank and hash table: inner operations (transfers, adds/removes) per update transaction.
    pub inner: usize,
    /// Vacation: resources a reservation or an offer update touches.
    pub queries: usize,
    /// TPC-C: warehouses.
    pub warehouses: usize,
    /// TPC-C: the transaction mix.
    pub mix: TpccMix,
    /// TPC-C: the population per warehouse.
    pub scale: TpccScale,
    /// Counters: how long each transaction works (sleeps) after its increment.
    pub work: Duration,
}

impl Default for WorkloadParams {
    /// 1,000 objects, half of the operations read-only, balances of every account, one
    /// thread, flat single operations, 10 queries, one small TPC-C warehouse, standard mix.
    fn default() -> Self {
        WorkloadParams {
            objects: 1_000,
            read_ratio: 0.5,
            balance_k: None,
            threads: 1,
            nesting: NestingModel::Flat,
            inner: 1,
            queries: 10,
            warehouses: 1,
            mix: TpccMix::Standard,
            scale: TpccScale::SMALL,
            work: Duration::ZERO,
        }
    }
}

/// The workloads by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    /// Transfers between accounts and balance reads.
    Bank,
    /// Sorted singly linked list set.
    LinkedList,
    /// Skip list set.
    SkipList,
    /// Unbalanced binary search tree set.
    Bst,
    /// Red-black tree set (a balanced binary search tree).
    RbTree,
    /// Bucketed hash table set.
    HashTable,
    /// Loans: a borrower takes money from five lenders in nested steps.
    Loan,
    /// STAMP's travel reservations: customers, cars, flights, rooms.
    Vacation,
    /// TPC-C's five transaction profiles over warehouses, districts, customers, orders, stock.
    Tpcc,
    /// One counter every worker of every node increments (OSS VI-A: always in conflict).
    SharedCounter,
    /// One replicated counter per worker (OSS VI-A: never in conflict, every commit remote).
    PrivateCounters,
    /// Word count (OSS VI-B): each worker counts lines of a text into its own tree of
    /// counters; a master merges them.
    WordCount,
}

impl WorkloadKind {
    /// Whether `--objects` sizes it (TPC-C is sized by warehouses, the counters by threads).
    pub fn sized_by_objects(self) -> bool {
        !matches!(
            self,
            WorkloadKind::Tpcc | WorkloadKind::SharedCounter | WorkloadKind::PrivateCounters
        )
    }

    /// Whether its invariant is checked against the store alone, so that it holds whichever
    /// processes the workers ran in (`--processes`); the others check against counts their
    /// process's workers kept.
    pub fn checks_the_store_alone(self) -> bool {
        matches!(
            self,
            WorkloadKind::Bank | WorkloadKind::Loan | WorkloadKind::Vacation | WorkloadKind::Tpcc
        )
    }

    /// Whether its operations can run as linked transactions (`--linked`).
    pub fn links(self) -> bool {
        matches!(
            self,
            WorkloadKind::SharedCounter | WorkloadKind::PrivateCounters
        )
    }
}

impl WorkloadKind {
    /// Every workload.
    pub const ALL: [WorkloadKind; 12] = [
        WorkloadKind::Bank,
        WorkloadKind::LinkedList,
        WorkloadKind::SkipList,
        WorkloadKind::Bst,
        WorkloadKind::RbTree,
        WorkloadKind::HashTable,
        WorkloadKind::Loan,
        WorkloadKind::Vacation,
        WorkloadKind::Tpcc,
        WorkloadKind::SharedCounter,
        WorkloadKind::PrivateCounters,
        WorkloadKind::WordCount,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Bank => "bank",
            WorkloadKind::LinkedList => "linkedlist",
            WorkloadKind::SkipList => "skiplist",
            WorkloadKind::Bst => "bst",
            WorkloadKind::RbTree => "rbtree",
            WorkloadKind::HashTable => "hashtable",
            WorkloadKind::Loan => "loan",
            WorkloadKind::Vacation => "vacation",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::SharedCounter => "shared-counter",
            WorkloadKind::PrivateCounters => "private-counters",
            WorkloadKind::WordCount => "wordcount",
        }
    }

    /// Default object count (HyflowCPP thesis 6.2: 10,000 accounts, 2,000 hash buckets, 1,000
    /// Vacation customers; the thesis's 50-element sets are scaled up so one node has work for
    /// its threads). TPC-C sizes itself by warehouses and scale instead.
    pub fn default_objects(self) -> usize {
        match self {
            WorkloadKind::Bank => 10_000,
            WorkloadKind::LinkedList => 256,
            WorkloadKind::SkipList => 4_096,
            WorkloadKind::Bst => 4_096,
            WorkloadKind::RbTree => 4_096,
            WorkloadKind::HashTable => 2_000,
            WorkloadKind::Loan => 10_000,
            WorkloadKind::Vacation => 1_000,
            WorkloadKind::Tpcc => 1,
            // Sized by the threads instead.
            WorkloadKind::SharedCounter | WorkloadKind::PrivateCounters => 1,
            // Distinct words.
            WorkloadKind::WordCount => 1_000,
        }
    }

    /// Builds the workload, or says why its parameters do not fit.
    pub fn build(self, p: &WorkloadParams) -> Result<Box<dyn Workload>, String> {
        Ok(match self {
            WorkloadKind::Bank => Box::new(Bank::new(p)),
            WorkloadKind::Loan => Box::new(Loan::new(p)),
            WorkloadKind::Vacation => Box::new(Vacation::new(p)),
            WorkloadKind::Tpcc => Box::new(Tpcc::new(p)?),
            WorkloadKind::SharedCounter => Box::new(Counters::new(p, true)),
            WorkloadKind::PrivateCounters => Box::new(Counters::new(p, false)),
            WorkloadKind::WordCount => Box::new(WordCount::new(p)),
            WorkloadKind::LinkedList => Box::new(SetWorkload::new(LinkedList::new("ll"), p)),
            WorkloadKind::SkipList => {
                Box::new(SetWorkload::new(SkipList::new("sl", p.objects * 2), p))
            }
            WorkloadKind::Bst => Box::new(SetWorkload::new(Bst::new("bst"), p)),
            WorkloadKind::RbTree => Box::new(SetWorkload::new(RbTree::new("rb"), p)),
            WorkloadKind::HashTable => {
                let table = HashTable::new("ht", p.objects);
                let (model, inner, range) =
                    (p.nesting, p.inner.max(1), (p.objects.max(1) * 2) as i64);
                if model == NestingModel::Flat && inner == 1 {
                    // One add or remove per transaction: the set's own, as for the other sets.
                    return Ok(Box::new(SetWorkload::new(table, p)));
                }
                let ops = table.clone();
                Box::new(
                    SetWorkload::new(table, p).with_updates(Box::new(move |node, rng| {
                        let batch: Vec<_> = (0..inner).map(|_| ops.random_op(rng, range)).collect();
                        run_composed(node, model, &batch)
                    })),
                )
            }
        })
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WorkloadKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workload {s:?} (known: {})",
                    WorkloadKind::ALL.map(WorkloadKind::name).join(", ")
                )
            })
    }
}

/// A coin that comes up true with probability `p` (clamped to [0, 1]; NaN counts as 0), made
/// once per workload: `rng.random_bool(p)` builds one on every call. Draws the same values as
/// `random_bool` would.
pub(crate) fn coin(p: f64) -> Bernoulli {
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    Bernoulli::new(p).expect("a probability in [0, 1]")
}

/// A number drawn uniformly from `0..n` (`n > 0`; 0 for `n == 0`) with one multiplication:
/// Lemire's multiply-shift without its rejection step. Its bias, under `n / 2^64` per value,
/// is far below anything a run can see, and a draw costs a few instructions where
/// `random_range`, exact by rejection, costs about forty: the hot workloads draw two or three
/// per transaction, which would otherwise be a tenth of a bank transfer's work.
#[inline]
pub(crate) fn below(rng: &mut SmallRng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn draws_below_a_bound_are_in_range_and_even() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[below(&mut rng, 10) as usize] += 1;
        }
        // Each value's share stays within 5% of a tenth.
        assert!(
            counts.iter().all(|&c| (9_500..=10_500).contains(&c)),
            "{counts:?}"
        );
        assert!((0..1_000).all(|_| below(&mut rng, 1) == 0));
        assert_eq!(below(&mut rng, 0), 0);
        let big = 1u64 << 40;
        assert!((0..1_000).all(|_| below(&mut rng, big) < big));
    }
}
