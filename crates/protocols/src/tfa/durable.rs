//! What a TFA node keeps on disk: its records as a home (who owns each key it tracks, and
//! which objects were lost) and the incarnations it has seen of the other nodes. Objects
//! themselves are not kept: a node's own objects are lost with it, and its home records say so
//! after it restarts, so a key is never re-created silently while another copy may exist.
//!
//! The log is a sequence of [`TfaRecord`]s, each written before anything that depends on it is
//! sent (the protocol seam's gate), read back in order at start (a later record of a key
//! replaces an earlier one); it is rewritten whole once it holds many more records than keys.

use std::collections::BTreeMap;

use atomos_core::Key;
use serde::{Deserialize, Serialize};

use super::directory::{NodeId, OwnerRecord, Tracker};

/// One record of a TFA node's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TfaRecord {
    /// The home's record of `key`.
    Home {
        /// The key.
        key: Key,
        /// Its record.
        record: OwnerRecord,
    },
    /// The latest incarnation seen of node `node` (this node's own included).
    Peer {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
    },
}

impl TfaRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        // A key, integers and flags always encode.
        postcard::to_stdvec(self).unwrap_or_default()
    }
}

/// A log this build cannot read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("record {index} of the TFA log does not decode: {reason}")]
pub struct CorruptLog {
    /// The record's place in the log.
    pub index: usize,
    /// Why.
    pub reason: String,
}

/// The state a log holds.
#[derive(Debug, Default)]
pub(super) struct Recovered {
    pub(super) tracker: Tracker,
    pub(super) peers: BTreeMap<NodeId, u64>,
}

/// Reads a log's records in order.
pub(super) fn recover(log: &[Vec<u8>]) -> Result<Recovered, CorruptLog> {
    let mut state = Recovered::default();
    for (index, payload) in log.iter().enumerate() {
        let record: TfaRecord = postcard::from_bytes(payload).map_err(|e| CorruptLog {
            index,
            reason: e.to_string(),
        })?;
        match record {
            TfaRecord::Home { key, record } => state.tracker.restore(key, record),
            TfaRecord::Peer { node, incarnation } => {
                let known = state.peers.entry(node).or_default();
                *known = (*known).max(incarnation);
            }
        }
    }
    Ok(state)
}

/// The records that say everything `tracker` and `peers` hold (a compacted log).
pub(super) fn snapshot(tracker: &Tracker, peers: &BTreeMap<NodeId, u64>) -> Vec<Vec<u8>> {
    let peers = peers
        .iter()
        .map(|(&node, &incarnation)| TfaRecord::Peer { node, incarnation });
    let homes = tracker
        .records()
        .into_iter()
        .map(|(key, record)| TfaRecord::Home { key, record });
    peers.chain(homes).map(|r| r.encode()).collect()
}
