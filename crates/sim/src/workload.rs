//! Workload generators for simulated clusters, driven by the simulation's seeded generator so a
//! seed fixes the workload too, and the glue that turns a run into a checkable history.

use std::collections::{BTreeMap, BTreeSet};

use atomos_core::history::list_append::{self, ListOp, ListTxn, Outcome};
use atomos_core::{Engine, Key, TRef, Tx, TxError, TxOptions};

use atomos_seam::NodeId;
use serde::{Deserialize, Serialize};

use crate::rng::SimRng;

/// A bank operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BankOp {
    /// Move `amount` from one account to another, if the source holds that much.
    Transfer {
        /// Source account.
        from: u64,
        /// Destination account (never the source).
        to: u64,
        /// Amount, at least 1.
        amount: u64,
    },
    /// Read every balance at once; the total must never change.
    Audit,
}

/// Transfers between random accounts, with audits mixed in.
#[derive(Clone, Debug)]
pub struct BankWorkload {
    /// Number of accounts (at least 2).
    pub accounts: u64,
    /// Largest amount moved by one transfer.
    pub max_amount: u64,
    /// Fraction of operations that are audits.
    pub audit_ratio: f64,
}

impl BankWorkload {
    /// The next operation.
    pub fn next(&self, rng: &mut SimRng) -> BankOp {
        if rng.chance(self.audit_ratio) {
            return BankOp::Audit;
        }
        let accounts = self.accounts.max(2);
        let from = rng.below(accounts);
        let to = (from + 1 + rng.below(accounts - 1)) % accounts;
        BankOp::Transfer {
            from,
            to,
            amount: 1 + rng.below(self.max_amount.max(1)),
        }
    }
}

/// A list-append transaction as submitted: reads carry nothing yet; whoever executes it fills
/// in what each read saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListAppendTxn {
    /// Unique in the run.
    pub id: u64,
    /// The operations, in program order.
    pub ops: Vec<ListOp>,
}

/// Transactions of 1..=`max_ops` reads and appends over keys `0..keys`; every appended value is
/// unique in the run, which is what lets the checker recover version orders.
#[derive(Clone, Debug)]
pub struct ListAppendWorkload {
    keys: u64,
    max_ops: u64,
    read_ratio: f64,
    next_id: u64,
    next_value: u64,
}

impl ListAppendWorkload {
    /// A generator over `keys` keys (few keys make conflicts, which is the point).
    pub fn new(keys: u64, max_ops: u64, read_ratio: f64) -> ListAppendWorkload {
        ListAppendWorkload {
            keys: keys.max(1),
            max_ops: max_ops.max(1),
            read_ratio,
            next_id: 1,
            next_value: 1,
        }
    }

    /// The next transaction.
    pub fn next(&mut self, rng: &mut SimRng) -> ListAppendTxn {
        let len = 1 + rng.below(self.max_ops);
        let ops = (0..len)
            .map(|_| {
                let key = rng.below(self.keys);
                if rng.chance(self.read_ratio) {
                    ListOp::Read {
                        key,
                        seen: Vec::new(),
                    }
                } else {
                    self.next_value += 1;
                    ListOp::Append {
                        key,
                        value: self.next_value,
                    }
                }
            })
            .collect();
        self.next_id += 1;
        ListAppendTxn {
            id: self.next_id,
            ops,
        }
    }
}

/// Account `i` of the simulations' bank, as an object.
pub fn bank_account(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("acct/", i))
}

/// The total of accounts `0..accounts` read as one snapshot of `engine` (`None` while the
/// accounts do not exist yet).
pub fn bank_total(engine: &Engine, accounts: u64) -> Result<Option<i64>, TxError> {
    let opts = TxOptions {
        read_only: true,
        ..TxOptions::default()
    };
    engine.run(&opts, |tx| {
        if !tx.exists(&bank_account(0))? {
            return Ok(None);
        }
        let mut sum = 0;
        for i in 0..accounts {
            sum += *tx.read(&bank_account(i))?;
        }
        Ok(Some(sum))
    })
}

/// List `key` of the list-append workload, as an object.
pub fn list(key: u64) -> TRef<Vec<u64>> {
    TRef::new(Key::with_index("list/", key))
}

/// Runs a list-append transaction's operations in `tx` (a missing list reads as empty and is
/// made by its first append) and returns them as executed: reads with what they saw.
pub fn execute_list_ops(tx: &mut Tx<'_>, ops: &[ListOp]) -> Result<Vec<ListOp>, TxError> {
    execute_list_ops_on(tx, ops, list)
}

/// [`execute_list_ops`] with the object of each list key given by `list`.
pub fn execute_list_ops_on(
    tx: &mut Tx<'_>,
    ops: &[ListOp],
    list: impl Fn(u64) -> TRef<Vec<u64>>,
) -> Result<Vec<ListOp>, TxError> {
    let mut done = Vec::with_capacity(ops.len());
    for op in ops {
        match op {
            ListOp::Read { key, .. } => {
                let r = list(*key);
                let seen = if tx.exists(&r)? {
                    tx.read(&r)?.clone()
                } else {
                    Vec::new()
                };
                done.push(ListOp::Read { key: *key, seen });
            }
            ListOp::Append { key, value } => {
                let r = list(*key);
                if tx.exists(&r)? {
                    tx.modify(&r, |l| l.push(*value))?;
                } else {
                    tx.create(&r, vec![*value])?;
                }
                done.push(op.clone());
            }
        }
    }
    Ok(done)
}

/// Checks a run's list-append history: `runs` are the transactions started, `aborted` the ids
/// known not to have committed, `done` the reports of committed ones (as for
/// [`list_history`]). Returns how many committed, or the anomaly found.
pub fn check_list_run(
    runs: impl IntoIterator<Item = ListAppendTxn>,
    aborted: &BTreeSet<u64>,
    done: impl IntoIterator<Item = (NodeId, u64, Vec<ListOp>)>,
) -> Result<usize, String> {
    let submitted: Vec<ListAppendTxn> = runs
        .into_iter()
        .filter(|t| !aborted.contains(&t.id))
        .collect();
    let history = list_history(&submitted, done);
    list_append::check(&history).map_err(|a| format!("list-append history: {a}"))?;
    Ok(history
        .iter()
        .filter(|t| t.outcome == Outcome::Committed)
        .count())
}

/// The history of a run: every submitted transaction, committed with what its reads saw if some
/// node reported it done, of unknown outcome otherwise (it may have taken effect unreported).
/// `done` yields (reporting node, transaction id, executed operations); a transaction reported
/// twice keeps its first report.
pub fn list_history(
    submitted: &[ListAppendTxn],
    done: impl IntoIterator<Item = (NodeId, u64, Vec<ListOp>)>,
) -> Vec<ListTxn> {
    let mut reported: BTreeMap<u64, (NodeId, Vec<ListOp>)> = BTreeMap::new();
    for (node, id, ops) in done {
        reported.entry(id).or_insert((node, ops));
    }
    submitted
        .iter()
        .map(|txn| match reported.remove(&txn.id) {
            Some((node, ops)) => ListTxn {
                node,
                id: txn.id,
                outcome: Outcome::Committed,
                ops,
            },
            None => ListTxn {
                node: u64::MAX,
                id: txn.id,
                outcome: Outcome::Unknown,
                ops: txn.ops.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_deterministic_and_values_unique() {
        let gen = |seed| {
            let mut rng = SimRng::new(seed);
            let mut w = ListAppendWorkload::new(4, 5, 0.5);
            (0..200).map(|_| w.next(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(gen(7), gen(7));
        assert_ne!(gen(7), gen(8));
        let mut values: Vec<u64> = gen(7)
            .iter()
            .flat_map(|t| t.ops.iter())
            .filter_map(|op| match op {
                ListOp::Append { value, .. } => Some(*value),
                ListOp::Read { .. } => None,
            })
            .collect();
        let n = values.len();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), n);

        let bank = BankWorkload {
            accounts: 5,
            max_amount: 10,
            audit_ratio: 0.2,
        };
        let mut rng = SimRng::new(1);
        for _ in 0..1000 {
            if let BankOp::Transfer { from, to, amount } = bank.next(&mut rng) {
                assert!(from != to && from < 5 && to < 5 && (1..=10).contains(&amount));
            }
        }
    }
}

/// A certifier that keeps the certification it is handed instead of ordering it, so that a
/// simulated replica orders it through its own client without blocking the one thread the
/// simulation runs on: the transaction's commit fails with `OutcomeUnknown`, and the node
/// takes the certification with [`Capture::take`].
#[derive(Default)]
pub struct Capture(std::sync::Mutex<Option<atomos_core::Certification>>);

impl Capture {
    /// The certification kept since the last call, if any.
    pub fn take(&self) -> Option<atomos_core::Certification> {
        self.0.lock().ok().and_then(|mut kept| kept.take())
    }
}

impl atomos_core::Certifier for Capture {
    fn certify(
        &self,
        c: atomos_core::Certification,
    ) -> Result<atomos_core::Verdict, atomos_core::CertifyError> {
        if let Ok(mut kept) = self.0.lock() {
            *kept = Some(c);
        }
        Err(atomos_core::CertifyError::unknown(
            "captured for the simulation",
        ))
    }
    fn barrier(&self) -> Result<u64, atomos_core::CertifyError> {
        Err(atomos_core::CertifyError::unknown(
            "no barriers in the simulation",
        ))
    }
    fn abstract_lock(
        &self,
        _: u64,
        _: &str,
    ) -> Result<atomos_core::LockOutcome, atomos_core::CertifyError> {
        Err(atomos_core::CertifyError::unknown(
            "no abstract locks in the simulation",
        ))
    }
    fn release_abstract(&self, _: u64, _: Vec<String>) {}
}
