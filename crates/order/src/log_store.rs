//! The Raft log as raft-rs reads it: the latest snapshot, the entries after it (and some before
//! it, kept so that a replica that installed an earlier snapshot catches up from the log), the
//! hard state. Kept in memory; what must survive a crash is also written to a
//! [`Disk`](crate::disk::Disk) by the replica.

use std::cell::Cell;
use std::collections::BTreeMap;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// In-memory Raft log with a snapshot base.
#[derive(Clone, Debug, Default)]
pub struct LogStore {
    hard: HardState,
    conf: ConfState,
    snapshot: Snapshot,
    /// The index of the last entry compacted away (at most the snapshot's), and its term.
    compacted: (u64, u64),
    /// `entries[i].index == compacted index + 1 + i`.
    entries: Vec<Entry>,
    /// Set when raft-rs asked for a snapshot the latest one could not serve (see
    /// [`LogStore::take_snapshot_wanted`]).
    snapshot_wanted: Cell<bool>,
    /// Per member added by a change applied since the log's start (or since a restart, as
    /// the log is delivered again), the position of that change: a snapshot from before it
    /// names the replica, if at all, from an earlier membership (one removed, then added
    /// again with an empty disk).
    added_at: BTreeMap<u64, u64>,
}

impl LogStore {
    /// An empty log for a cluster founded by `voters` (none for a replica that joins an
    /// existing cluster: it learns the configuration from the leader's snapshot).
    pub fn new(voters: Vec<u64>) -> LogStore {
        let conf = ConfState {
            voters,
            ..ConfState::default()
        };
        let mut s = LogStore {
            conf: conf.clone(),
            ..LogStore::default()
        };
        s.snapshot.mut_metadata().set_conf_state(conf);
        s
    }

    /// The log starts from the configuration founded by `voters` (read from the log itself),
    /// unless a snapshot already gave it one.
    pub fn found(&mut self, voters: Vec<u64>) {
        if self.snapshot_index() == 0 {
            *self = LogStore {
                hard: self.hard.clone(),
                entries: std::mem::take(&mut self.entries),
                ..LogStore::new(voters)
            };
        }
    }

    /// Index of the snapshot the log starts after.
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// The latest snapshot.
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Replaces the latest snapshot's data, its metadata kept (a snapshot of an earlier layout
    /// rewritten on opening).
    pub fn replace_snapshot_data(&mut self, data: Vec<u8>) {
        self.snapshot.data = data;
    }

    /// The hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard
    }

    /// The first index held (at most one past the snapshot's: entries before the snapshot
    /// may be kept).
    pub fn first(&self) -> u64 {
        self.compacted.0 + 1
    }

    /// The last index held (the snapshot's if there are no entries after it).
    pub fn last(&self) -> u64 {
        self.compacted.0 + self.entries.len() as u64
    }

    /// The entry at `index`, if held.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let first = self.first();
        if index < first {
            return None;
        }
        self.entries.get((index - first) as usize)
    }

    /// The entries from `from` on.
    pub fn entries_from(&self, from: u64) -> &[Entry] {
        let skip = from.saturating_sub(self.first()) as usize;
        self.entries.get(skip..).unwrap_or(&[])
    }

    /// Appends entries (contiguous, starting at most one past the last). Entries at and after
    /// the first new index are replaced; returns that index if any existing entry was replaced.
    /// Entries that would leave a gap or start before the log are refused, changing nothing
    /// (raft-rs never asks for that).
    pub fn append(&mut self, ents: &[Entry]) -> Result<Option<u64>, AppendOutside> {
        let Some(first_new) = ents.first().map(|e| e.index) else {
            return Ok(None);
        };
        if first_new < self.first() || first_new > self.last() + 1 {
            return Err(AppendOutside {
                first_new,
                first: self.first(),
                last: self.last(),
            });
        }
        let replaced = (first_new <= self.last()).then_some(first_new);
        self.entries.truncate((first_new - self.first()) as usize);
        self.entries.extend_from_slice(ents);
        Ok(replaced)
    }

    /// Sets the hard state.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard = hs;
    }

    /// Sets the commit index.
    pub fn set_commit(&mut self, commit: u64) {
        self.hard.commit = commit;
    }

    /// Replaces the log with a snapshot received from the leader: everything before is gone.
    pub fn install(&mut self, snap: Snapshot) {
        let meta = snap.get_metadata();
        self.hard.term = self.hard.term.max(meta.term);
        self.hard.commit = self.hard.commit.max(meta.index);
        self.conf = meta.get_conf_state().clone();
        self.compacted = (meta.index, meta.term);
        self.entries.clear();
        self.snapshot = snap;
    }

    /// Records a snapshot this replica took (or adopted) at an index it has applied, and drops
    /// the entries up to `keep_after` (clamped to the snapshot's index); later entries stay.
    pub fn compact(&mut self, snap: Snapshot, keep_after: u64) {
        let index = snap.get_metadata().index;
        if index <= self.snapshot_index() || index > self.last() {
            return;
        }
        let to = keep_after.clamp(self.compacted.0, index);
        if let Some(term) = self.term_of(to) {
            self.entries.drain(..(to - self.compacted.0) as usize);
            self.compacted = (to, term);
        }
        self.snapshot = snap;
    }

    /// The term of the entry at `index` (or of the snapshot, at its index; or of the last
    /// entry compacted away, at its index).
    pub fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index() {
            return Some(self.snapshot.get_metadata().term);
        }
        if index == self.compacted.0 {
            return Some(self.compacted.1);
        }
        self.entry(index).map(|e| e.term)
    }

    /// The configuration: the one raft-rs starts from (the snapshot's, or the founding one),
    /// then the latest one applied (what a snapshot taken now records).
    pub fn conf_state(&self) -> &ConfState {
        &self.conf
    }

    /// Whether raft-rs asked for a snapshot since the last call that the latest one could not
    /// serve (it was older than asked for, or did not name the replica it was for). raft-rs
    /// asks again at its next attempt to reach that replica, so a replica taking a snapshot
    /// meanwhile may ignore this.
    pub fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    /// Records configuration `conf`, applied from the log at position `at`, which added the
    /// replicas `added`.
    pub fn set_conf_state(&mut self, conf: ConfState, at: u64, added: &[u64]) {
        for &id in added {
            self.added_at.insert(id, at);
        }
        let names = |id: &u64| {
            [
                &conf.voters,
                &conf.learners,
                &conf.voters_outgoing,
                &conf.learners_next,
            ]
            .iter()
            .any(|ids| ids.contains(id))
        };
        self.added_at.retain(|id, _| names(id));
        self.conf = conf;
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard.clone(),
            conf_state: self.conf.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.first()) as usize;
        let to = (high - self.first()) as usize;
        let mut ents = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.compacted.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    /// The latest snapshot, unless it is older than `request_index` or than the change that
    /// last added `to`, or does not name `to` among its members (a replica added after it
    /// would refuse it; one removed and added again would take an earlier membership from
    /// it). Then a newer one is wanted ([`LogStore::take_snapshot_wanted`]), and raft-rs asks
    /// again once it is there.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let cs = self.snapshot.get_metadata().get_conf_state();
        let names = |id| {
            [
                &cs.voters,
                &cs.learners,
                &cs.voters_outgoing,
                &cs.learners_next,
            ]
            .iter()
            .any(|ids| ids.contains(&id))
        };
        let added_at = self.added_at.get(&to).copied().unwrap_or(0);
        if self.snapshot_index() < request_index.max(added_at) || !names(to) {
            self.snapshot_wanted.set(true);
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

/// Entries that would not extend the log: they start before its first entry or past one after
/// its last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("append of entries from {first_new} outside the log ({first}..={last}) ignored")]
pub struct AppendOutside {
    /// The first entry's index.
    pub first_new: u64,
    /// The log's first index.
    pub first: u64,
    /// The log's last index.
    pub last: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    #[test]
    fn append_reports_replaced_entries_and_compaction_keeps_the_rest() {
        let mut s = LogStore::new(vec![1, 2, 3]);
        assert_eq!(s.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]), Ok(None));
        assert_eq!(s.append(&[entry(4, 1)]), Ok(None));
        assert_eq!(s.append(&[entry(3, 2), entry(4, 2)]), Ok(Some(3)));
        assert_eq!(
            s.append(&[entry(6, 2)]),
            Err(AppendOutside {
                first_new: 6,
                first: 1,
                last: 4
            }),
            "a gap is refused"
        );
        assert_eq!((s.first(), s.last()), (1, 4));
        assert_eq!(s.term_of(3), Some(2));
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 2;
        snap.mut_metadata().term = 1;
        s.compact(snap, 2);
        assert_eq!((s.first(), s.last()), (3, 4));
        assert_eq!(s.term(2), Ok(1));
        assert!(s.term(1).is_err());
        assert_eq!(
            s.entries(3, 5, None, GetEntriesContext::empty(false))
                .unwrap()
                .len(),
            2
        );
        assert!(s
            .entries(2, 4, None, GetEntriesContext::empty(false))
            .is_err());
    }

    /// A snapshot is sent only to a replica it names: one added after it would refuse it (its
    /// state is not taken until a snapshot taken since the change is). A refusal says a newer
    /// one is wanted, once.
    #[test]
    fn a_snapshot_is_offered_only_to_the_members_it_names() {
        let mut s = LogStore::new(vec![1, 2, 3]);
        s.append(&[entry(1, 1), entry(2, 1)]).expect("appended");
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 2;
        snap.mut_metadata().term = 1;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s.compact(snap, 2);
        assert!(s.snapshot(2, 3).is_ok());
        assert!(!s.take_snapshot_wanted(), "the latest one served");
        assert_eq!(
            s.snapshot(2, 4),
            Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable
            )),
            "replica 4 joined after it"
        );
        assert!(s.take_snapshot_wanted());
        assert!(!s.take_snapshot_wanted(), "reported once");
        assert!(s.snapshot(3, 3).is_err(), "older than asked for");
        assert!(s.take_snapshot_wanted());
        // Replica 3, removed and added again at 4 (with an empty disk): the snapshot of 2
        // names it from its earlier membership.
        let conf = ConfState {
            voters: vec![1, 2],
            learners: vec![3],
            ..ConfState::default()
        };
        s.set_conf_state(conf, 4, &[3]);
        assert!(s.snapshot(2, 3).is_err(), "from before it was added again");
        assert!(s.take_snapshot_wanted());
        assert!(s.snapshot(2, 1).is_ok(), "replica 1 was not added since");
    }

    /// A compaction may keep entries before its snapshot: they are served and their terms
    /// known, the snapshot is the latest, and a later compaction drops them.
    #[test]
    fn compaction_keeps_the_entries_after_the_point_asked_for() {
        let mut s = LogStore::new(vec![1, 2, 3]);
        let ents: Vec<Entry> = (1..=10).map(|i| entry(i, 1 + i / 5)).collect();
        s.append(&ents).unwrap();
        let snap_at = |index: u64, term: u64| {
            let mut snap = Snapshot::default();
            snap.mut_metadata().index = index;
            snap.mut_metadata().term = term;
            snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
            snap
        };
        s.compact(snap_at(4, 1), 0);
        s.compact(snap_at(8, 2), 4);
        assert_eq!((s.first(), s.snapshot_index(), s.last()), (5, 8, 10));
        assert_eq!(s.term(4), Ok(1), "the last entry compacted away");
        assert_eq!(s.term(6), Ok(2));
        assert!(s.term(3).is_err());
        let served = s
            .entries(5, 11, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(served.first().map(|e| e.index), Some(5));
        assert_eq!(s.snapshot(0, 2).unwrap().get_metadata().index, 8);
        // Keeping entries past the snapshot is clamped to it.
        s.compact(snap_at(9, 2), 20);
        assert_eq!((s.first(), s.snapshot_index(), s.last()), (10, 9, 10));
        assert_eq!(s.term(9), Ok(2));
        // An install drops everything.
        s.install(snap_at(15, 3));
        assert_eq!((s.first(), s.last()), (16, 15));
        assert_eq!(s.term(15), Ok(3));
    }
}
