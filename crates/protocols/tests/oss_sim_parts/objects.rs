//! The objects the simulated transactions use: accounts, shared and node-local lists, a
//! node-local counter, and how a transaction reads and writes them.

use atomos_core::{Key, TRef, TxError};
use atomos_sim::workload::list;

pub(crate) const NODES: usize = 3;
pub(crate) const ACCOUNTS: u64 = 5;
pub(crate) const INITIAL: i64 = 100;
/// Transactions each incarnation of a node starts at most.
pub(crate) const TX_PER_RUN: u64 = 40;

/// List keys from `LOCAL_LISTS * node` on are node `node`'s own (under `local/`).
pub(crate) const LOCAL_LISTS: u64 = 1_000;

/// The object of list `key`: a shared list, or a node's own.
pub(crate) fn list_object(key: u64) -> TRef<Vec<u64>> {
    if key >= LOCAL_LISTS {
        TRef::new(Key::with_index("local/list/", key))
    } else {
        list(key)
    }
}

pub(crate) fn counter() -> TRef<u64> {
    TRef::new("local/counter")
}

/// How many transfers this node committed (written with each transfer: a commit of
/// replicated and node-local keys at once).
pub(crate) fn transfers_here() -> TRef<u64> {
    TRef::new("local/transfers")
}

/// Reads a u64 that may not exist yet.
pub(crate) fn read_or_zero(tx: &mut atomos_core::Tx<'_>, r: &TRef<u64>) -> Result<u64, TxError> {
    Ok(if tx.exists(r)? { *tx.read(r)? } else { 0 })
}

pub(crate) fn write_u64(
    tx: &mut atomos_core::Tx<'_>,
    r: &TRef<u64>,
    v: u64,
) -> Result<(), TxError> {
    if tx.exists(r)? {
        tx.write(r, v)
    } else {
        tx.create(r, v)
    }
}
