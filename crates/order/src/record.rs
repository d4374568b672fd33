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
    /// The next record is [`Record::Image`]: the state machine's state at the snapshot of
    /// `index` (the [`Record::Installed`] before it). Logs written before hold the state inside
    /// the snapshot instead.
    ImageFollows {
        /// The snapshot's index.
        index: u64,
    },
    /// The state machine's state at a snapshot, as it encodes it: written raw (not as a
    /// postcard record, so that a state of any size is written from where it lies), always
    /// right after [`Record::ImageFollows`].
    #[serde(skip)]
    Image(Vec<u8>),
}

impl Record {
    /// The record's payload in the log.
    pub fn encode(&self) -> Vec<u8> {
        if let Record::Image(image) = self {
            return image.clone();
        }
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
/// read is an error (its checksum was good, so it is not damage the disk can explain). The
/// payload after a [`Record::ImageFollows`] is taken raw, as a [`Record::Image`] (a marker at
/// the log's end, its state torn off, stays: the replica reads past it). Payloads given by
/// value are taken apart without copying (a snapshot's state is moved, not copied: what a
/// node restarting from a large log needs); borrowed ones are copied.
pub fn decode_log<'a, P>(payloads: impl IntoIterator<Item = P>) -> Result<Vec<Record>, OrderError>
where
    P: Into<std::borrow::Cow<'a, [u8]>>,
{
    let payloads = payloads.into_iter();
    let mut records = Vec::with_capacity(payloads.size_hint().0);
    let mut image_next = false;
    for p in payloads {
        let p = p.into();
        if std::mem::take(&mut image_next) {
            records.push(Record::Image(p.into_owned()));
            continue;
        }
        let record = Record::decode(&p)?;
        image_next = matches!(record, Record::ImageFollows { .. });
        records.push(record);
    }
    Ok(records)
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

    /// The state after an image marker is read raw, whatever its bytes; a marker at the log's
    /// end stays a marker.
    #[test]
    fn an_image_follows_its_marker_raw() {
        let marker = Record::ImageFollows { index: 7 };
        let raw = vec![0xff, 0xfe, 0x00];
        let log = decode_log(&[marker.encode(), raw.clone(), Record::Rejoined.encode()]).unwrap();
        assert_eq!(
            log,
            vec![marker.clone(), Record::Image(raw), Record::Rejoined]
        );
        assert_eq!(
            decode_log(&[Record::Rejoined.encode(), marker.encode()]).unwrap(),
            vec![Record::Rejoined, marker]
        );
        assert_eq!(Record::Image(vec![1, 2]).encode(), vec![1, 2]);
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
