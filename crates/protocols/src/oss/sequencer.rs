//! Numbering commits in one domain: what the token holder and the ultra-peer coordinator both
//! do. A commit request names the commit id of every version it read; it is valid when none of
//! those keys was written since, by a commit applied here or one numbered but not applied yet
//! (backward validation, OSS III-B: the per-object table of last commit ids).

use atomos_core::Key;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::write_set::{CommitId, DomainId, Epoch, TxId, WriteSet};

/// A transaction asking to commit in a domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRequest {
    /// The transaction.
    pub tx: TxId,
    /// Each key it read in the domain, with the commit id of the version it read (0: never
    /// written).
    pub reads: Vec<(Key, CommitId)>,
    /// Its writes in the domain, each key once (`None`: a deletion).
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
}

/// Why a request was not numbered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// A key it read that a later commit wrote.
    pub key: Key,
    /// The commit id it read.
    pub read: CommitId,
    /// The commit id of the newest write of that key.
    pub newest: CommitId,
}

/// One epoch's numbering of one domain.
#[derive(Debug)]
pub struct Sequencer {
    domain: DomainId,
    epoch: Epoch,
    next: CommitId,
    /// Keys written by commits numbered (by anyone) but not applied here yet: their newest id.
    pending: FxHashMap<Key, CommitId>,
}

impl Sequencer {
    /// Numbers `domain`'s commits in `epoch` from `next` on. `unapplied` are the write sets
    /// below `next` this node holds but has not applied (all of them must be here: the caller
    /// waits for every write set before `next` first).
    pub fn new<'a>(
        domain: DomainId,
        epoch: Epoch,
        next: CommitId,
        unapplied: impl IntoIterator<Item = &'a WriteSet>,
    ) -> Sequencer {
        let mut s = Sequencer {
            domain,
            epoch,
            next,
            pending: FxHashMap::default(),
        };
        for ws in unapplied {
            s.note(ws);
        }
        s
    }

    /// The id the next valid request gets.
    pub fn next(&self) -> CommitId {
        self.next
    }

    /// The epoch it numbers in.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn note(&mut self, ws: &WriteSet) {
        for (key, _) in &ws.writes {
            let e = self.pending.entry(key.clone()).or_default();
            *e = (*e).max(ws.cid);
        }
    }

    /// Validates `req` against the commits applied here (`applied(key)`: the id of the newest
    /// applied write of `key`, 0 if none) and those numbered since; a valid one gets the next
    /// id and becomes a write set to send to every node.
    pub fn number(
        &mut self,
        req: CommitRequest,
        applied: impl Fn(&Key) -> CommitId,
    ) -> Result<WriteSet, Conflict> {
        for (key, read) in &req.reads {
            let newest = self
                .pending
                .get(key)
                .copied()
                .unwrap_or_else(|| applied(key));
            if newest != *read {
                return Err(Conflict {
                    key: key.clone(),
                    read: *read,
                    newest,
                });
            }
        }
        let ws = WriteSet {
            domain: self.domain,
            epoch: self.epoch,
            cid: self.next,
            tx: req.tx,
            writes: req.writes,
        };
        self.next += 1;
        self.note(&ws);
        Ok(ws)
    }

    /// Forgets what applying through `applied` made visible in the applied table.
    pub fn applied_through(&mut self, applied: CommitId) {
        self.pending.retain(|_, cid| *cid > applied);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::from(s)
    }

    fn req(n: u64, reads: &[(&str, CommitId)], writes: &[&str]) -> CommitRequest {
        CommitRequest {
            tx: TxId { node: 1, run: 0, n },
            reads: reads.iter().map(|(k, c)| (key(k), *c)).collect(),
            writes: writes.iter().map(|k| (key(k), Some(vec![1]))).collect(),
        }
    }

    #[test]
    fn the_first_of_two_conflicting_commits_wins() {
        // "a" was last written by commit 4, applied here.
        let applied = |k: &Key| if *k == key("a") { 4 } else { 0 };
        let mut s = Sequencer::new(0, 1, 5, []);
        let first = s.number(req(1, &[("a", 4)], &["a"]), applied).unwrap();
        assert_eq!((first.cid, first.epoch), (5, 1));
        let second = s.number(req(2, &[("a", 4)], &["b"]), applied);
        assert_eq!(
            second,
            Err(Conflict {
                key: key("a"),
                read: 4,
                newest: 5
            })
        );
        // Reading what the first wrote is valid; so is a key never written.
        let third = s.number(req(3, &[("a", 5), ("z", 0)], &["z"]), applied);
        assert_eq!(third.map(|w| w.cid), Ok(6));
        assert_eq!(s.next(), 7);
    }

    #[test]
    fn write_sets_held_but_not_applied_count_as_written() {
        let held = WriteSet {
            domain: 0,
            epoch: 1,
            cid: 3,
            tx: TxId {
                node: 2,
                run: 0,
                n: 1,
            },
            writes: vec![(key("a"), None)],
        };
        let mut s = Sequencer::new(0, 1, 4, [&held]);
        let stale = s.number(req(1, &[("a", 0)], &["a"]), |_| 0);
        assert!(stale.is_err(), "read before commit 3 deleted it");
        // Once applied, the table here answers for it.
        s.applied_through(3);
        let fresh = s.number(req(2, &[("a", 3)], &[]), |_| 3);
        assert_eq!(fresh.map(|w| w.cid), Ok(4));
    }
}
