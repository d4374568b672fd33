//! The transaction programs every simulated node runs: account and list keys, the bank and
//! list-append transactions, and what each does with the values it read.

use std::collections::BTreeMap;

use atomos_core::history::list_append::ListOp;
use atomos_core::Key;
use atomos_protocols::tfa::Failure;
use atomos_sim::workload::{BankOp, ListAppendTxn};

pub(crate) const ACCOUNTS: u64 = 6;
pub(crate) const LIST_KEYS: u64 = 4;
pub(crate) const INITIAL: i64 = 100;
pub(crate) const MAX_ATTEMPTS: u32 = 60;
/// Final reads of list `i` have id `FINAL_READ + i`.
pub(crate) const FINAL_READ: u64 = 2_000_000;

pub(crate) fn account(i: u64) -> Key {
    Key::with_index("acct/", i)
}

pub(crate) fn list(i: u64) -> Key {
    Key::with_index("list/", i)
}

#[derive(Clone, Debug)]
pub(crate) enum Txn {
    /// Creates every account (run first, on one node).
    Setup,
    Lists(ListAppendTxn),
    Bank {
        id: u64,
        op: BankOp,
    },
    /// A family holding abstract locks (see `exclusive`).
    Exclusive(super::Exclusive),
}

impl Txn {
    pub(crate) fn id(&self) -> u64 {
        match self {
            Txn::Setup => 0,
            Txn::Lists(t) => t.id,
            Txn::Bank { id, .. } => *id,
            Txn::Exclusive(ex) => ex.id,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    Created,
    Lists(Vec<ListOp>),
    Transfer { done: bool },
    Audit(Vec<i64>),
}

#[derive(Clone, Debug)]
pub(crate) enum Note {
    Committed {
        id: u64,
        answer: Answer,
    },
    Failed {
        id: u64,
        failure: Failure,
    },
    /// The accounts were never there (the setup's node crashed before creating them).
    NeverCreated {
        id: u64,
    },
    /// Family `id` heard that it holds the abstract lock `name`, asked for since `asked_at`.
    Holds {
        id: u64,
        name: String,
        asked_at: u64,
    },
    /// Family `id` gave these abstract locks back.
    Frees {
        id: u64,
        names: Vec<String>,
    },
}

/// What a transaction program needs next, given what it has read so far.
pub(crate) enum Next {
    Read(Key),
    /// The accounts are not created yet: abandon this attempt and try again later.
    NotYet,
    Commit {
        writes: Vec<(Key, Option<Vec<u8>>)>,
        answer: Answer,
    },
}

pub(crate) fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("encodes")
}

pub(crate) fn dec<T: serde::de::DeserializeOwned>(b: &[u8]) -> T {
    postcard::from_bytes(b).expect("decodes")
}

/// Whether `txn` reads `key` to write it (then the node may lock it with the read). A list
/// transaction in two reads every key so, written or not: its locks on keys it leaves
/// unwritten are released at its end, and must not move those keys.
pub(crate) fn reads_to_write(txn: &Txn, key: &Key) -> bool {
    match txn {
        Txn::Setup
        | Txn::Bank {
            op: BankOp::Transfer { .. },
            ..
        } => true,
        Txn::Bank {
            op: BankOp::Audit, ..
        } => false,
        Txn::Exclusive(_) => unreachable!("a family reads no objects"),
        Txn::Lists(t) => {
            t.id % 2 == 0
                || t.ops
                    .iter()
                    .any(|op| matches!(op, ListOp::Append { key: k, .. } if list(*k) == *key))
        }
    }
}

/// Runs the program of `txn` over the reads made so far (`None`: missing object); like an
/// atomic section re-run by its closure, it asks for the first key it has not read yet.
pub(crate) fn program(txn: &Txn, seen: &BTreeMap<Key, Option<Vec<u8>>>) -> Next {
    macro_rules! get {
        ($key:expr) => {
            match seen.get(&$key) {
                Some(v) => v.clone(),
                None => return Next::Read($key),
            }
        };
    }
    match txn {
        Txn::Exclusive(_) => unreachable!("a family runs no object program"),
        Txn::Setup => {
            for i in 0..ACCOUNTS {
                get!(account(i));
            }
            Next::Commit {
                writes: (0..ACCOUNTS)
                    .map(|i| (account(i), Some(enc(&INITIAL))))
                    .collect(),
                answer: Answer::Created,
            }
        }
        Txn::Lists(t) => {
            let mut buffered: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            let mut ops = Vec::new();
            for op in &t.ops {
                let key = match op {
                    ListOp::Read { key, .. } | ListOp::Append { key, .. } => *key,
                };
                let l = match buffered.entry(key) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let v = get!(list(key));
                        e.insert(v.map(|b| dec(&b)).unwrap_or_default())
                    }
                };
                match op {
                    ListOp::Read { .. } => ops.push(ListOp::Read {
                        key,
                        seen: l.clone(),
                    }),
                    ListOp::Append { value, .. } => {
                        l.push(*value);
                        ops.push(op.clone());
                    }
                }
            }
            let writes = t
                .ops
                .iter()
                .filter_map(|op| match op {
                    ListOp::Append { key, .. } => Some(*key),
                    ListOp::Read { .. } => None,
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|k| (list(k), Some(enc(&buffered[&k]))))
                .collect();
            Next::Commit {
                writes,
                answer: Answer::Lists(ops),
            }
        }
        Txn::Bank {
            op: BankOp::Transfer { from, to, amount },
            ..
        } => {
            let (Some(a), Some(b)) = (get!(account(*from)), get!(account(*to))) else {
                return Next::NotYet;
            };
            let (a, b): (i64, i64) = (dec(&a), dec(&b));
            let amount = *amount as i64;
            if a < amount {
                return Next::Commit {
                    writes: vec![],
                    answer: Answer::Transfer { done: false },
                };
            }
            Next::Commit {
                writes: vec![
                    (account(*from), Some(enc(&(a - amount)))),
                    (account(*to), Some(enc(&(b + amount)))),
                ],
                answer: Answer::Transfer { done: true },
            }
        }
        Txn::Bank {
            op: BankOp::Audit, ..
        } => {
            let mut balances = Vec::new();
            for i in 0..ACCOUNTS {
                match get!(account(i)) {
                    Some(b) => balances.push(dec::<i64>(&b)),
                    None => return Next::NotYet,
                }
            }
            Next::Commit {
                writes: vec![],
                answer: Answer::Audit(balances),
            }
        }
    }
}
