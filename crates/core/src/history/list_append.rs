//! Checking list-append histories recorded on any number of nodes.
//!
//! Each transaction reads whole lists and appends unique values to lists. Because every value is
//! appended once, the lists a history observed reveal the order of versions of every key without
//! any clock: the longest list read of a key orders all its appends seen so far, and every other
//! read of that key must be a prefix of it. From that order the checker derives the dependency
//! graph (write-write between consecutive appends, write-read from the append a read ends with,
//! read-write from a read to the append that follows what it saw) and looks for a cycle. Records
//! carry the node that recorded them, so histories from all nodes are simply concatenated.
//!
//! Transactions whose outcome is unknown (the client never heard back) are included with
//! [`Outcome::Unknown`]: their appends explain values others read, but their reads are not
//! checked and they add no read dependencies.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::find_cycle;

/// One operation of a list-append transaction, with what a read returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ListOp {
    /// Read the whole list at `key`; `seen` is what it held (empty before the first append).
    Read {
        /// The key.
        key: u64,
        /// The list read.
        seen: Vec<u64>,
    },
    /// Append `value` (unique in the history) to the list at `key`.
    Append {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
    },
}

/// Whether a transaction is known to have committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The client was told it committed.
    Committed,
    /// The client never heard back: it may or may not have committed.
    Unknown,
}

/// One transaction of a list-append history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTxn {
    /// The node that recorded it.
    pub node: u64,
    /// Unique within the history.
    pub id: u64,
    /// Its outcome.
    pub outcome: Outcome,
    /// Its operations in program order.
    pub ops: Vec<ListOp>,
}

/// What is wrong with a list-append history.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListAnomaly {
    /// A value appears twice in one list: an append took effect twice.
    #[error("value {value} appears twice in key {key}, read by transaction {reader}")]
    DuplicateAppend {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
        /// The transaction that read it.
        reader: u64,
    },
    /// A read saw a value that no transaction of the history appended.
    #[error("transaction {reader} read value {value} in key {key}, which nobody appended")]
    GarbageRead {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
        /// The reader.
        reader: u64,
    },
    /// Two reads of one key are not prefixes of one order.
    #[error("reads of key {key} disagree on its order: {a:?} and {b:?}")]
    IncompatibleOrder {
        /// The key.
        key: u64,
        /// One list read.
        a: Vec<u64>,
        /// Another, neither a prefix of the other.
        b: Vec<u64>,
    },
    /// A transaction did not see its own earlier append.
    #[error("transaction {txn} read key {key} without its own append of {value}")]
    LostOwnWrite {
        /// The transaction.
        txn: u64,
        /// The key.
        key: u64,
        /// Its append.
        value: u64,
    },
    /// The same value was appended by two transactions (the workload must use unique values).
    #[error("value {value} was appended by transactions {first} and {second}")]
    AmbiguousValue {
        /// The value.
        value: u64,
        /// One appender.
        first: u64,
        /// The other.
        second: u64,
    },
    /// The dependency graph has a cycle: no serial order explains the history.
    #[error("dependency cycle through transactions {} (node:id)", describe(.0))]
    Cycle(Vec<(u64, u64)>),
}

fn describe(cycle: &[(u64, u64)]) -> String {
    cycle
        .iter()
        .map(|(n, t)| format!("{n}:{t}"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// Checks that the history is serializable; see the module documentation.
pub fn check(history: &[ListTxn]) -> Result<(), ListAnomaly> {
    // Who appended each value, and each transaction's own appends per key.
    let mut appender: HashMap<u64, usize> = HashMap::new();
    for (t, txn) in history.iter().enumerate() {
        for op in &txn.ops {
            if let ListOp::Append { value, .. } = op {
                if let Some(&other) = appender.get(value) {
                    return Err(ListAnomaly::AmbiguousValue {
                        value: *value,
                        first: history[other].id,
                        second: txn.id,
                    });
                }
                appender.insert(*value, t);
            }
        }
    }
    let committed = || {
        history
            .iter()
            .enumerate()
            .filter(|(_, t)| t.outcome == Outcome::Committed)
    };

    // Per key, the longest list read: the version order.
    let mut order: HashMap<u64, &[u64]> = HashMap::new();
    for (_, txn) in committed() {
        let mut own: HashMap<u64, Vec<u64>> = HashMap::new();
        for op in &txn.ops {
            match op {
                ListOp::Append { key, value } => own.entry(*key).or_default().push(*value),
                ListOp::Read { key, seen } => {
                    check_read(txn, *key, seen, &appender, own.get(key))?;
                    let longest = order.entry(*key).or_insert(&[]);
                    if seen.len() > longest.len() {
                        *longest = seen;
                    }
                }
            }
        }
    }
    for (_, txn) in committed() {
        for op in &txn.ops {
            if let ListOp::Read { key, seen } = op {
                let longest = order[key];
                if !longest.starts_with(seen) {
                    return Err(ListAnomaly::IncompatibleOrder {
                        key: *key,
                        a: longest.to_vec(),
                        b: seen.clone(),
                    });
                }
            }
        }
    }

    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); history.len()];
    let mut edge = |from: usize, to: usize| {
        if from != to {
            edges[from].push(to);
        }
    };
    for versions in order.values() {
        for pair in versions.windows(2) {
            edge(appender[&pair[0]], appender[&pair[1]]); // write-write
        }
    }
    for (t, txn) in committed() {
        // Reads of a key after the transaction's own append see its value last; what it read
        // before that append is what matters for dependencies.
        let mut appended: Vec<u64> = Vec::new();
        for op in &txn.ops {
            match op {
                ListOp::Append { key, .. } => appended.push(*key),
                ListOp::Read { key, seen } if !appended.contains(key) => {
                    let versions = order[key];
                    if let Some(last) = seen.last() {
                        edge(appender[last], t); // write-read
                    }
                    if let Some(next) = versions.get(seen.len()) {
                        edge(t, appender[next]); // read-write
                    }
                }
                ListOp::Read { .. } => {}
            }
        }
    }
    match find_cycle(&edges) {
        Some(cycle) => Err(ListAnomaly::Cycle(
            cycle
                .into_iter()
                .map(|t| (history[t].node, history[t].id))
                .collect(),
        )),
        None => Ok(()),
    }
}

fn check_read(
    txn: &ListTxn,
    key: u64,
    seen: &[u64],
    appender: &HashMap<u64, usize>,
    own: Option<&Vec<u64>>,
) -> Result<(), ListAnomaly> {
    let mut distinct = std::collections::HashSet::with_capacity(seen.len());
    for &value in seen {
        if !distinct.insert(value) {
            return Err(ListAnomaly::DuplicateAppend {
                key,
                value,
                reader: txn.id,
            });
        }
        if !appender.contains_key(&value) {
            return Err(ListAnomaly::GarbageRead {
                key,
                value,
                reader: txn.id,
            });
        }
    }
    if let Some(own) = own {
        if !seen.ends_with(own) {
            return Err(ListAnomaly::LostOwnWrite {
                txn: txn.id,
                key,
                value: own[own.len() - 1],
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(node: u64, id: u64, ops: Vec<ListOp>) -> ListTxn {
        ListTxn {
            node,
            id,
            outcome: Outcome::Committed,
            ops,
        }
    }
    fn r(key: u64, seen: &[u64]) -> ListOp {
        ListOp::Read {
            key,
            seen: seen.to_vec(),
        }
    }
    fn a(key: u64, value: u64) -> ListOp {
        ListOp::Append { key, value }
    }

    #[test]
    fn a_serial_history_across_nodes_passes() {
        let h = vec![
            txn(1, 1, vec![r(1, &[]), a(1, 10)]),
            txn(2, 2, vec![r(1, &[10]), a(1, 11), a(2, 20), r(1, &[10, 11])]),
            txn(3, 3, vec![r(1, &[10, 11]), r(2, &[20])]),
        ];
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn write_skew_is_a_cycle() {
        // Both read both keys empty and each appends to one: no serial order gives that.
        let h = vec![
            txn(1, 1, vec![r(1, &[]), r(2, &[]), a(1, 10)]),
            txn(2, 2, vec![r(1, &[]), r(2, &[]), a(2, 20)]),
            txn(3, 3, vec![r(1, &[10]), r(2, &[20])]),
        ];
        assert!(matches!(check(&h), Err(ListAnomaly::Cycle(c)) if c.len() == 2));
    }

    #[test]
    fn lost_update_and_fractured_reads_are_found() {
        // T2 saw T1's append to key 1 but not its append to key 2, which T3 saw after T2's own.
        let h = vec![
            txn(1, 1, vec![a(1, 10), a(2, 20)]),
            txn(2, 2, vec![r(1, &[10]), r(2, &[]), a(2, 21)]),
            txn(3, 3, vec![r(2, &[20, 21])]),
        ];
        assert!(matches!(check(&h), Err(ListAnomaly::Cycle(_))));
    }

    #[test]
    fn duplicates_garbage_and_disagreements_are_reported() {
        let dup = vec![txn(1, 1, vec![a(1, 10)]), txn(1, 2, vec![r(1, &[10, 10])])];
        assert!(matches!(
            check(&dup),
            Err(ListAnomaly::DuplicateAppend { value: 10, .. })
        ));
        let garbage = vec![txn(1, 1, vec![r(1, &[99])])];
        assert!(matches!(
            check(&garbage),
            Err(ListAnomaly::GarbageRead { value: 99, .. })
        ));
        let split = vec![
            txn(1, 1, vec![a(1, 10)]),
            txn(1, 2, vec![a(1, 11)]),
            txn(2, 3, vec![r(1, &[10])]),
            txn(3, 4, vec![r(1, &[11])]),
        ];
        assert!(matches!(
            check(&split),
            Err(ListAnomaly::IncompatibleOrder { key: 1, .. })
        ));
        let own = vec![txn(1, 1, vec![a(1, 10), r(1, &[])])];
        assert!(matches!(check(&own), Err(ListAnomaly::LostOwnWrite { .. })));
    }

    #[test]
    fn unknown_outcomes_explain_reads_but_are_not_checked() {
        let h = vec![
            ListTxn {
                node: 1,
                id: 1,
                outcome: Outcome::Unknown,
                ops: vec![r(1, &[42]), a(1, 10)],
            },
            txn(2, 2, vec![r(1, &[10])]),
        ];
        assert_eq!(check(&h), Ok(()));
    }
}
