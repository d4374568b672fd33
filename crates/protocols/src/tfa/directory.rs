//! Where objects live (thesis 4.2): each key has a home node, chosen by hash among the members;
//! the home's tracker records the key's current owner. Other nodes cache owners and correct the
//! cache when a request reaches a node that no longer owns the object.

use rustc_hash::FxHashMap as HashMap;

use atomos_core::Key;
use serde::{Deserialize, Serialize};

pub use atomos_seam::NodeId;

/// Finds an object's home node. Pluggable, so another lookup scheme can replace hashing.
pub trait Directory {
    /// The node that tracks `key`'s owner.
    fn home(&self, key: &Key) -> NodeId;
}

/// Homes by a stable hash (FNV-1a over the key's bytes) of the key among a fixed member list:
/// every node computes the same home for a key, in every build.
#[derive(Clone, Debug)]
pub struct HashDirectory {
    members: Vec<NodeId>,
}

impl HashDirectory {
    /// Homes among `members` (sorted here, so the order given does not matter). Empty members
    /// are refused.
    pub fn new(mut members: Vec<NodeId>) -> Option<HashDirectory> {
        if members.is_empty() {
            return None;
        }
        members.sort_unstable();
        members.dedup();
        Some(HashDirectory { members })
    }

    /// Whether `node` is one of the members.
    pub fn is_member(&self, node: NodeId) -> bool {
        self.members.binary_search(&node).is_ok()
    }
}

impl Directory for HashDirectory {
    fn home(&self, key: &Key) -> NodeId {
        self.members
            [(atomos_seam::stable::fnv1a(key.as_bytes()) % self.members.len() as u64) as usize]
    }
}

/// What a home knows of one key's object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// The node that owns it (or owned it, if lost).
    pub owner: NodeId,
    /// The owner's incarnation when it took the object: a later incarnation of the owner no
    /// longer has it.
    pub incarnation: u64,
    /// The version the owner wrote (0: the home holds it as a never created object).
    pub version: u64,
    /// The object was lost: its owner restarted (or was given up on) holding it.
    pub lost: bool,
}

/// A home node's record of the current owner of each key it is home to. Records carry the
/// version the owner wrote, so updates that arrive late or twice never move a record back.
/// A key without a record was never created, and is owned by its home (as a missing object).
/// A lost object stays lost until a newer version of it turns up (its committer, which took
/// it while it was in doubt, reports it).
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    owners: HashMap<Key, OwnerRecord>,
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// The record of `key`, if any.
    pub fn record(&self, key: &Key) -> Option<OwnerRecord> {
        self.owners.get(key).copied()
    }

    /// The recorded owner of `key`, if any and not lost.
    pub fn owner(&self, key: &Key) -> Option<NodeId> {
        self.owners.get(key).filter(|r| !r.lost).map(|r| r.owner)
    }

    /// `owner` (in `incarnation`) committed `key` at `version` (a creation, a move, or a
    /// deletion: the deleting node keeps the object's "missing" state). Applied only if newer
    /// than the record; returns the new record if it was.
    pub fn update(
        &mut self,
        key: Key,
        owner: NodeId,
        incarnation: u64,
        version: u64,
    ) -> Option<OwnerRecord> {
        let record = OwnerRecord {
            owner,
            incarnation,
            version,
            lost: false,
        };
        match self.owners.get_mut(&key) {
            Some(rec) if rec.version >= version => None,
            Some(rec) => {
                *rec = record;
                Some(record)
            }
            None => {
                self.owners.insert(key, record);
                Some(record)
            }
        }
    }

    /// `key`, held by `owner` at `version`, was lost. Applied unless the record is newer (or
    /// says lost at that version already): a record lost at an older version moves up to this
    /// one, so that a late report of a move to `version` cannot bring the object back. Returns
    /// the new record if it was applied.
    pub fn lose(&mut self, key: Key, owner: NodeId, version: u64) -> Option<OwnerRecord> {
        let rec = self.owners.entry(key).or_insert(OwnerRecord {
            owner,
            incarnation: 0,
            version,
            lost: false,
        });
        if rec.version > version || (rec.lost && rec.version == version) {
            return None;
        }
        *rec = OwnerRecord {
            owner,
            incarnation: rec.incarnation,
            version,
            lost: true,
        };
        Some(*rec)
    }

    /// Node `node` restarted as `incarnation`: whatever an earlier incarnation of it owned is
    /// lost. Returns the keys marked, with their new records, in key order.
    pub fn lose_owner(&mut self, node: NodeId, incarnation: u64) -> Vec<(Key, OwnerRecord)> {
        let mut lost: Vec<(Key, OwnerRecord)> = self
            .owners
            .iter_mut()
            .filter(|(_, r)| r.owner == node && r.incarnation < incarnation && !r.lost)
            .map(|(k, r)| {
                r.lost = true;
                (k.clone(), *r)
            })
            .collect();
        lost.sort_by(|a, b| a.0.cmp(&b.0));
        lost
    }

    /// Sets `key`'s record as it was saved (when a node recovers its log).
    pub fn restore(&mut self, key: Key, record: OwnerRecord) {
        self.owners.insert(key, record);
    }

    /// Every record, in key order.
    pub fn records(&self) -> Vec<(Key, OwnerRecord)> {
        let mut all: Vec<(Key, OwnerRecord)> =
            self.owners.iter().map(|(k, r)| (k.clone(), *r)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// How many keys have a record.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether no key has a record.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

/// A node's guesses of where objects live, learned from lookups and corrected by redirects.
#[derive(Clone, Debug, Default)]
pub struct OwnerCache {
    owners: HashMap<Key, NodeId>,
}

impl OwnerCache {
    /// An empty cache.
    pub fn new() -> OwnerCache {
        OwnerCache::default()
    }

    /// Where to ask for `key` first: the cached owner, else its home (which knows the owner).
    pub fn ask(&self, key: &Key, dir: &impl Directory) -> NodeId {
        self.owners
            .get(key)
            .copied()
            .unwrap_or_else(|| dir.home(key))
    }

    /// `key` is owned by `owner` (learned from the home, an answer, or a redirect).
    pub fn learn(&mut self, key: Key, owner: NodeId) {
        self.owners.insert(key, owner);
    }

    /// `key` is gone (deleted, or its owner was lost): forget the guess.
    pub fn forget(&mut self, key: &Key) {
        self.owners.remove(key);
    }

    /// Node `node` restarted: forget every guess that names it.
    pub fn forget_node(&mut self, node: NodeId) {
        self.owners.retain(|_, owner| *owner != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_stable_and_spread() {
        let a = HashDirectory::new(vec![3, 1, 2]).unwrap();
        let b = HashDirectory::new(vec![1, 2, 3]).unwrap();
        let mut per_node = [0usize; 4];
        for i in 0..3000u64 {
            let k = Key::from(i);
            assert_eq!(a.home(&k), b.home(&k), "the member order does not matter");
            per_node[a.home(&k) as usize] += 1;
        }
        assert!(per_node[1..].iter().all(|&n| n > 800), "{per_node:?}");
        assert!(HashDirectory::new(vec![]).is_none());
    }

    #[test]
    fn the_tracker_keeps_the_newest_owner() {
        let k = Key::from("acct");
        let mut t = Tracker::new();
        assert_eq!(t.owner(&k), None);
        assert!(t.update(k.clone(), 1, 0, 5).is_some());
        assert!(t.update(k.clone(), 3, 0, 9).is_some());
        assert!(
            t.update(k.clone(), 2, 0, 7).is_none(),
            "a late move is ignored"
        );
        assert!(
            t.update(k.clone(), 3, 0, 9).is_none(),
            "a duplicate is ignored"
        );
        assert_eq!(t.owner(&k), Some(3));
    }

    #[test]
    fn a_restarted_owner_loses_what_it_held_until_a_newer_version_turns_up() {
        let (a, b) = (Key::from("a"), Key::from("b"));
        let mut t = Tracker::new();
        t.update(a.clone(), 3, 1, 5);
        t.update(b.clone(), 3, 2, 6);
        let lost = t.lose_owner(3, 2);
        assert_eq!(lost.len(), 1, "only what the earlier incarnation held");
        assert_eq!(lost[0].0, a);
        assert_eq!(t.owner(&a), None);
        assert!(t.record(&a).is_some_and(|r| r.lost));
        assert!(t.lose_owner(3, 2).is_empty(), "marked once");
        assert!(t.update(a.clone(), 4, 1, 5).is_none(), "not an older copy");
        assert!(t.update(a.clone(), 4, 1, 8).is_some(), "a newer version");
        assert_eq!(t.owner(&a), Some(4));
        assert!(t.lose(b.clone(), 3, 5).is_none(), "a newer record stays");
        assert!(t.lose(b.clone(), 3, 6).is_some());
        assert_eq!(t.owner(&b), None);
    }

    /// Found by the simulation (seed 552 of `tfa_sim` with the abstract-lock families): the
    /// home marked a key lost with its restarted owner at version 27; the old owner then reported
    /// that the key, which it had committed at 33, went to the restarted node and died there
    /// (`Lost` at 33); a late `Track` of that same version 33 from the old owner arrived after.
    /// The loss at 33 must stick: the old owner no longer holds the key.
    #[test]
    fn a_loss_reported_at_a_newer_version_sticks_against_a_late_move_to_it() {
        let k = Key::from("k");
        let mut t = Tracker::new();
        t.update(k.clone(), 4, 0, 27);
        assert_eq!(t.lose_owner(4, 1).len(), 1);
        assert!(
            t.lose(k.clone(), 4, 33).is_some(),
            "the loss moves up to 33"
        );
        assert!(t.lose(k.clone(), 4, 33).is_none(), "once");
        assert!(
            t.update(k.clone(), 2, 0, 33).is_none(),
            "the late move to 33 does not bring it back"
        );
        assert_eq!(t.owner(&k), None);
        assert!(
            t.update(k.clone(), 1, 0, 40).is_some(),
            "a newer version does"
        );
    }

    #[test]
    fn the_cache_asks_the_home_until_it_learns() {
        let dir = HashDirectory::new(vec![1, 2, 3]).unwrap();
        let k = Key::from("x");
        let mut c = OwnerCache::new();
        assert_eq!(c.ask(&k, &dir), dir.home(&k));
        c.learn(k.clone(), 9);
        assert_eq!(c.ask(&k, &dir), 9);
        c.forget(&k);
        assert_eq!(c.ask(&k, &dir), dir.home(&k));
    }
}
