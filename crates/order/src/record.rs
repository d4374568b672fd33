//! What a replica persists: the [`Record`]s of its write-ahead log, encoded with postcard.
//!
//! The replica emits records as disk writes ([`atomos_seam::Output::Persist`]); the driver's
//! disk frames and checksums them ([`atomos_seam::wal`]) and hands their payloads back when the
//! replica restarts ([`decode_log`]).

use serde::{Deserialize, Serialize};

use crate::error::OrderError;
use crate::types::{BatchId, Request, RequestWithoutDeadline};

/// One durable fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// Raft entries (protobuf-encoded), replacing the log from the first one's index on.
    Entries(Vec<Vec<u8>>),
    /// Raft's hard state.
    HardState {
        /// Current term.
        term: u64,
        /// Vote in that term.
        vote: u64,
        /// Commit index.
        commit: u64,
    },
    /// A snapshot (protobuf), received from the leader or taken here at compaction: it replaces
    /// the whole log before the records that follow it.
    Installed(Vec<u8>),
    /// A batch this replica formed or received, as logs written before requests had
    /// deadlines hold it (read, never written).
    BatchWithoutDeadlines {
        /// Its id.
        id: BatchId,
        /// Its requests.
        requests: Vec<RequestWithoutDeadline>,
    },
    /// This replica lost its log and rejoins: it votes for nobody until it has caught up
    /// (see `lost_log`); kept across restarts until [`Record::Rejoined`].
    Rejoining,
    /// It caught up after losing its log.
    Rejoined,
    /// A batch this replica formed or received.
    Batch {
        /// Its id.
        id: BatchId,
        /// Its requests.
        requests: Vec<Request>,
    },
    /// The replicas that founded the cluster, as this replica first started with them: the
    /// configuration its log starts from, whatever it is configured with later (written once,
    /// first, by a founding replica; logs written before hold none and start from the
    /// configured list).
    Founders(Vec<u64>),
}

impl Record {
    /// The record's payload in the log.
    pub fn encode(&self) -> Vec<u8> {
        // Encoding into a vector fails only for types postcard cannot represent; these are
        // plain data.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// A record from its payload in the log.
    pub fn decode(payload: &[u8]) -> Result<Record, OrderError> {
        postcard::from_bytes(payload).map_err(|e| OrderError::Corrupt(format!("log record: {e}")))
    }
}

/// Every record of a log, from the payloads the disk read back; a payload this build cannot
/// read is an error (its checksum was good, so it is not damage the disk can explain).
pub fn decode_log(payloads: &[Vec<u8>]) -> Result<Vec<Record>, OrderError> {
    payloads.iter().map(|p| Record::decode(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_an_error() {
        let r = Record::Batch {
            id: BatchId { origin: 1, n: 2 },
            requests: vec![Request {
                client: 9,
                seq: 1,
                payload: vec![1, 2, 3],
                deadline_ms: 1_700_000_000_000,
            }],
        };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert!(decode_log(&[r.encode(), vec![0xff; 3]]).is_err());
    }

    /// A batch written before requests had deadlines (variant 3, requests without the field)
    /// is still read, as requests that never expire.
    #[test]
    fn batches_written_without_deadlines_are_read() {
        let old = [3u8, 1, 2, 1, 9, 1, 3, 1, 2, 3];
        assert_eq!(
            Record::decode(&old).unwrap(),
            Record::BatchWithoutDeadlines {
                id: BatchId { origin: 1, n: 2 },
                requests: vec![RequestWithoutDeadline {
                    client: 9,
                    seq: 1,
                    payload: vec![1, 2, 3],
                }],
            }
        );
    }
}
