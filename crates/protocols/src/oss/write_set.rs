//! What a commit sends to every node: its writes, numbered in its domain.

use atomos_core::Key;
use serde::{Deserialize, Serialize};

/// A consistency domain's number (its index in the cluster's domain list).
pub type DomainId = u32;

/// A commit id: the position of a write set in its domain's order, from 1.
pub type CommitId = u64;

/// An epoch of a domain: one sequencer and a first commit id, decided through the order
/// layer. Epoch 0 is the time before the first one started.
pub type Epoch = u64;

/// A transaction's cluster-wide identity: the node that ran it and a number unique there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TxId {
    /// The committing node.
    pub node: u64,
    /// Its run: drawn from the node's seed and incarnation, different for every run (a run
    /// after a lost disk starts its incarnations over, not its seed).
    pub run: u64,
    /// Unique among the run's commits.
    pub n: u64,
}

/// One committed transaction's writes, as every node applies them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteSet {
    /// The domain it was ordered in.
    pub domain: DomainId,
    /// The epoch whose sequencer gave it its commit id.
    pub epoch: Epoch,
    /// Its place in the domain's order.
    pub cid: CommitId,
    /// The transaction.
    pub tx: TxId,
    /// Each written key once: the new value as tagged bytes, or `None` for a deletion.
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
}
