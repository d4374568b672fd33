//! Recording committed transactions and checking that they are serializable.
//!
//! A history is a list of committed transactions, each with the versions it read and the
//! versions it wrote (a version is the commit timestamp that produced it; 0 is "never written").
//! The checker builds the direct serialization graph (write-read, write-write and read-write
//! edges) and reports a cycle if there is one: a history is conflict-serializable exactly when
//! that graph is acyclic.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::key::Key;

pub mod list_append;

/// One committed transaction as the checker sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// Objects read, with the version seen.
    pub reads: Vec<(Key, u64)>,
    /// Objects written (created, updated or deleted), with the version produced.
    pub writes: Vec<(Key, u64)>,
}

/// Thread-safe log of committed transactions, in the order they were recorded.
#[derive(Default)]
pub struct HistoryLog {
    records: Mutex<Vec<CommitRecord>>,
}

impl HistoryLog {
    /// An empty log.
    pub fn new() -> HistoryLog {
        HistoryLog::default()
    }

    /// Appends one committed transaction.
    pub fn record(&self, r: CommitRecord) {
        self.records.lock().push(r);
    }

    /// Takes every record so far, leaving the log empty.
    pub fn take(&self) -> Vec<CommitRecord> {
        std::mem::take(&mut *self.records.lock())
    }

    /// How many records the log holds.
    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a history is not serializable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// A transaction read a version that no recorded transaction wrote.
    #[error("transaction {reader} read version {version} of {key}, which nobody wrote")]
    PhantomRead {
        /// Index of the reading transaction.
        reader: usize,
        /// The key.
        key: Key,
        /// The version read.
        version: u64,
    },
    /// Two transactions wrote the same version of a key.
    #[error("transactions {first} and {second} both wrote version {version} of {key}")]
    DuplicateVersion {
        /// The key.
        key: Key,
        /// The version.
        version: u64,
        /// One writer.
        first: usize,
        /// The other writer.
        second: usize,
    },
    /// The serialization graph has a cycle through these transactions (indexes into the history).
    #[error("dependency cycle through transactions {0:?}")]
    Cycle(Vec<usize>),
}

/// Checks a history for conflict-serializability. `Ok` means an equivalent serial order exists.
pub fn check_serializable(history: &[CommitRecord]) -> Result<(), HistoryError> {
    // Per key: versions in order, each with its writer.
    let mut writers: HashMap<&Key, Vec<(u64, usize)>> = HashMap::new();
    for (t, rec) in history.iter().enumerate() {
        for (k, v) in &rec.writes {
            writers.entry(k).or_default().push((*v, t));
        }
    }
    for (k, vs) in writers.iter_mut() {
        vs.sort_unstable();
        if let Some(w) = vs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(HistoryError::DuplicateVersion {
                key: (*k).clone(),
                version: w[0].0,
                first: w[0].1,
                second: w[1].1,
            });
        }
    }
    let n = history.len();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    // Write-write: each version's writer precedes the next version's writer.
    for vs in writers.values() {
        for w in vs.windows(2) {
            edges[w[0].1].push(w[1].1);
        }
    }
    for (t, rec) in history.iter().enumerate() {
        for (k, v) in &rec.reads {
            let vs = writers.get(k).map(Vec::as_slice).unwrap_or(&[]);
            // Position of the first version newer than the one read.
            let next = vs.partition_point(|&(ver, _)| ver <= *v);
            if *v != 0 {
                match next.checked_sub(1).map(|i| vs[i]) {
                    Some((ver, writer)) if ver == *v => {
                        if writer != t {
                            edges[writer].push(t); // write-read
                        }
                    }
                    _ => {
                        return Err(HistoryError::PhantomRead {
                            reader: t,
                            key: k.clone(),
                            version: *v,
                        })
                    }
                }
            }
            if let Some(&(_, overwriter)) = vs.get(next) {
                if overwriter != t {
                    edges[t].push(overwriter); // read-write (anti-dependency)
                }
            }
        }
    }
    match find_cycle(&edges) {
        Some(c) => Err(HistoryError::Cycle(c)),
        None => Ok(()),
    }
}

/// A cycle in a directed graph given as adjacency lists (`edges[a]` holds every `b` with an edge
/// `a -> b`), if there is one: the nodes along it, in edge order. Iterative depth-first search,
/// so deep graphs do not overflow the stack.
pub fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Color {
        White,
        Grey,
        Black,
    }
    let n = edges.len();
    let mut color = vec![Color::White; n];
    let mut parent = vec![usize::MAX; n];
    for root in 0..n {
        if color[root] != Color::White {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        color[root] = Color::Grey;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if *next < edges[node].len() {
                let to = edges[node][*next];
                *next += 1;
                match color[to] {
                    Color::White => {
                        color[to] = Color::Grey;
                        parent[to] = node;
                        stack.push((to, 0));
                    }
                    Color::Grey => {
                        let mut cycle = vec![to];
                        let mut cur = node;
                        while cur != to {
                            cycle.push(cur);
                            cur = parent[cur];
                        }
                        cycle.reverse();
                        return Some(cycle);
                    }
                    Color::Black => {}
                }
            } else {
                color[node] = Color::Black;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(reads: &[(&str, u64)], writes: &[(&str, u64)]) -> CommitRecord {
        CommitRecord {
            reads: reads.iter().map(|(k, v)| (Key::from(*k), *v)).collect(),
            writes: writes.iter().map(|(k, v)| (Key::from(*k), *v)).collect(),
        }
    }

    #[test]
    fn serial_history_passes() {
        let h = vec![
            rec(&[("x", 0)], &[("x", 1)]),
            rec(&[("x", 1)], &[("x", 2), ("y", 2)]),
            rec(&[("x", 2), ("y", 2)], &[]),
        ];
        assert_eq!(check_serializable(&h), Ok(()));
    }

    #[test]
    fn lost_update_is_a_cycle() {
        // Both read x at 0 and both write it: T0 -rw-> T1 and T1 -rw-> T0 through the versions.
        let h = vec![rec(&[("x", 0)], &[("x", 1)]), rec(&[("x", 0)], &[("x", 2)])];
        assert!(matches!(
            check_serializable(&h),
            Err(HistoryError::Cycle(_))
        ));
    }

    #[test]
    fn write_skew_is_a_cycle() {
        let h = vec![
            rec(&[("x", 0), ("y", 0)], &[("x", 1)]),
            rec(&[("x", 0), ("y", 0)], &[("y", 2)]),
        ];
        assert!(matches!(
            check_serializable(&h),
            Err(HistoryError::Cycle(_))
        ));
    }

    #[test]
    fn reading_an_unwritten_version_is_reported() {
        let h = vec![rec(&[("x", 7)], &[])];
        assert!(matches!(
            check_serializable(&h),
            Err(HistoryError::PhantomRead { .. })
        ));
    }
}
