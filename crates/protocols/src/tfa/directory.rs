//! Where objects live (thesis 4.2): each key has a home node, chosen by hash among the members;
//! the home's tracker records the key's current owner. Other nodes cache owners and correct the
//! cache when a request reaches a node that no longer owns the object.

use rustc_hash::FxHashMap as HashMap;

use atomos_core::Key;

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
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Directory for HashDirectory {
    fn home(&self, key: &Key) -> NodeId {
        self.members[(fnv1a(key.as_bytes()) % self.members.len() as u64) as usize]
    }
}

/// A home node's record of the current owner of each key it is home to. Records carry the
/// version the owner wrote, so updates that arrive late or twice never move a record back.
/// A key without a record is owned by its home (as a missing object).
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    owners: HashMap<Key, (NodeId, u64)>,
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// The recorded owner of `key`, if any.
    pub fn owner(&self, key: &Key) -> Option<NodeId> {
        self.owners.get(key).map(|&(o, _)| o)
    }

    /// `owner` committed `key` at `version` (a creation, a move, or a deletion: the deleting
    /// node keeps the object's "missing" state). Applied only if newer than the record;
    /// returns whether it was.
    pub fn update(&mut self, key: Key, owner: NodeId, version: u64) -> bool {
        match self.owners.get_mut(&key) {
            Some(rec) if rec.1 >= version => false,
            Some(rec) => {
                *rec = (owner, version);
                true
            }
            None => {
                self.owners.insert(key, (owner, version));
                true
            }
        }
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
        assert!(t.update(k.clone(), 1, 5));
        assert!(t.update(k.clone(), 3, 9));
        assert!(!t.update(k.clone(), 2, 7), "a late move is ignored");
        assert!(!t.update(k.clone(), 3, 9), "a duplicate is ignored");
        assert_eq!(t.owner(&k), Some(3));
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
