//! A replica's latest snapshot as a copy that leaves the replica (a backup), and the log that
//! starts a new cluster from one: every member of the new cluster opens the same records, so
//! they start at the snapshot's position with its state, its clients' sessions and its log
//! time, and with the new cluster's members as voters.

use atomos_seam::Bytes;
use prost::Message as _;
use raft::eraftpb::{ConfState, Snapshot};

use super::snapshot::SnapshotData;
use super::Replica;
use crate::error::OrderError;
use crate::record::Record;
use crate::types::{Addr, StateMachine};

/// A replica's snapshot and the state machine's state at it: everything a replica needs to
/// start at its position. The state is shared, not copied.
#[derive(Clone, Debug)]
pub struct SnapshotCopy {
    /// The position the snapshot covers: every entry through it, and none after.
    pub index: u64,
    /// The Raft term of that entry.
    pub term: u64,
    /// The log's time there.
    pub log_time: u64,
    /// The replica's tables there (clients' sessions, delivered batches, members), as the
    /// snapshot holds them.
    pub tables: Vec<u8>,
    /// The state machine's state there, as it encoded it.
    pub state: Bytes,
}

impl SnapshotCopy {
    /// Checks that the tables decode (the state is the state machine's to check).
    pub fn check(&self) -> Result<(), OrderError> {
        SnapshotData::decode(&self.tables)
            .map(|_| ())
            .map_err(|e| OrderError::Corrupt(format!("the snapshot's tables: {e}")))
    }

    /// The write-ahead log records that start a member of a new cluster of `voters` (ids, in
    /// any order, at least one) from this snapshot: the founders, the snapshot with `voters`
    /// as its configuration, its state, and Raft's hard state committed through it. The
    /// members that joined the old cluster through its log, and those it removed, are not
    /// carried over: the new cluster's members are its founders.
    pub fn seed_records(&self, voters: &[Addr]) -> Result<Vec<Record>, OrderError> {
        if voters.is_empty() || voters.contains(&0) {
            return Err(OrderError::Corrupt(
                "a new cluster needs one member or more, none of id 0".into(),
            ));
        }
        let mut voters = voters.to_vec();
        voters.sort_unstable();
        voters.dedup();
        let mut data = SnapshotData::decode(&self.tables)
            .map_err(|e| OrderError::Corrupt(format!("the snapshot's tables: {e}")))?;
        data.forget_members();
        let tables = postcard::to_stdvec(&data).map_err(|e| OrderError::Corrupt(e.to_string()))?;
        let mut snap = Snapshot {
            data: tables,
            ..Snapshot::default()
        };
        let meta = snap.mut_metadata();
        meta.index = self.index;
        meta.term = self.term;
        meta.set_conf_state(ConfState {
            voters: voters.clone(),
            ..ConfState::default()
        });
        Ok(vec![
            Record::Founders(voters),
            Record::Installed(snap.encode_to_vec()),
            Record::ImageFollows { index: self.index },
            Record::Image(self.state.to_vec()),
            Record::HardState {
                term: self.term,
                vote: 0,
                commit: self.index,
            },
        ])
    }
}

impl<S: StateMachine> Replica<S> {
    /// A copy of the latest snapshot this replica holds, with the state at it (none before
    /// the first, or while the state of a snapshot just installed is not beside it).
    pub fn snapshot_copy(&self) -> Option<SnapshotCopy> {
        let snap = self.raft.store().latest_snapshot();
        let meta = snap.get_metadata();
        if meta.index == 0 || self.image.index != meta.index {
            return None;
        }
        let data = SnapshotData::decode(&snap.data).ok()?;
        Some(SnapshotCopy {
            index: meta.index,
            term: meta.term,
            log_time: data.log_time,
            tables: snap.data.clone(),
            state: self.image.bytes.clone(),
        })
    }
}
