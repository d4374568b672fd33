//! The objects a node owns (thesis figure 5.2, owner side): the committed value and version of
//! each, commit locks, and where objects that left went.
//!
//! A commit lock, once granted, is held until the owner learns the committer's decision: the
//! lock reply doubles as the owner's validation, so freeing it on a timer while the decision is
//! in flight would let two nodes own the object. A lock whose committer stays silent past its
//! lease makes the owner ask the committer ([`OwnedObjects::overdue`]); a committer that never
//! answers (crashed and gone) loses its locks after the abandon time.

use rustc_hash::FxHashMap as HashMap;

use atomos_core::Key;
use serde::{Deserialize, Serialize};

use super::directory::NodeId;

/// A transaction: the node that runs it and its number there (numbers of a restarted node
/// start above every number of its earlier runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TxId {
    /// The node running the transaction.
    pub node: NodeId,
    /// Its number on that node.
    pub n: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lock {
    tx: TxId,
    /// When the lock was granted.
    since: u64,
    /// When the owner next asks the committer for its decision.
    ask_at: u64,
}

#[derive(Clone, Debug)]
struct Owned {
    /// `None`: the object does not exist (deleted, or never created and owned by its home).
    value: Option<Vec<u8>>,
    version: u64,
    lock: Option<Lock>,
}

/// An object as its owner holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held<'a> {
    /// The committed value (encoded); `None` if the object does not exist.
    pub value: Option<&'a [u8]>,
    /// The version: the committing node's clock when it was written (0: never written).
    pub version: u64,
    /// The transaction holding its commit lock, if any.
    pub locked_by: Option<TxId>,
}

/// Why locks were not granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Refusal {
    /// Another transaction holds this key's lock.
    Busy(Key),
    /// The version read is no longer current, or the object left this node.
    Invalid(Key),
    /// The object was lost with the given node.
    Lost(Key, NodeId),
}

/// Where an object that left went.
#[derive(Clone, Copy, Debug)]
struct Moved {
    to: NodeId,
    /// The incarnation of `to` that took it.
    incarnation: u64,
    /// The version it left at.
    version: u64,
}

/// The objects this node owns, their locks, and forwarding addresses of objects that left.
#[derive(Clone, Debug, Default)]
pub struct OwnedObjects {
    objects: HashMap<Key, Owned>,
    /// Keys locked by each transaction.
    locked: HashMap<TxId, Vec<Key>>,
    /// Where objects that left went, with the version they left at.
    moved: HashMap<Key, Moved>,
}

impl OwnedObjects {
    /// Nothing owned.
    pub fn new() -> OwnedObjects {
        OwnedObjects::default()
    }

    /// How many objects (deleted ones included) this node owns.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether this node owns nothing.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Takes ownership of `key` at `version` (a commit here wrote it), unlocked. A previous
    /// copy's lock, if this node held one, must have been released or committed first.
    pub fn adopt(&mut self, key: Key, value: Option<Vec<u8>>, version: u64) {
        self.moved.remove(&key);
        self.objects.insert(
            key,
            Owned {
                value,
                version,
                lock: None,
            },
        );
    }

    /// Whether this node owns `key`.
    pub fn owns(&self, key: &Key) -> bool {
        self.objects.contains_key(key)
    }

    /// The committed copy of `key`, if this node owns it.
    pub fn get(&self, key: &Key) -> Option<Held<'_>> {
        self.objects.get(key).map(|o| Held {
            value: o.value.as_deref(),
            version: o.version,
            locked_by: o.lock.map(|l| l.tx),
        })
    }

    /// Where `key` went when it left this node, if it did and has not come back.
    pub fn moved_to(&self, key: &Key) -> Option<NodeId> {
        self.moved.get(key).map(|m| m.to)
    }

    /// Where `key` went and the version it left at, if it left and has not come back.
    pub fn moved(&self, key: &Key) -> Option<(NodeId, u64)> {
        self.moved.get(key).map(|m| (m.to, m.version))
    }

    /// Node `node` restarted as `incarnation`: forwarding addresses to an earlier run of it
    /// lead nowhere (what it took died with it). Removes them; returns each key with the
    /// version it left here at, in key order.
    pub fn forget_moves_to(&mut self, node: NodeId, incarnation: u64) -> Vec<(Key, u64)> {
        let mut gone: Vec<(Key, u64)> = self
            .moved
            .iter()
            .filter(|(_, m)| m.to == node && m.incarnation < incarnation)
            .map(|(k, m)| (k.clone(), m.version))
            .collect();
        for (key, _) in &gone {
            self.moved.remove(key);
        }
        gone.sort();
        gone
    }

    /// Locks every `(key, version read)` for `tx`, or none: each key must be owned here, at the
    /// version read (`None`: not read, any version), and not locked by another transaction.
    /// Locks `tx` already holds are kept. The lock is held until [`OwnedObjects::release`] or
    /// [`OwnedObjects::surrender`]; after `lease` the owner starts asking the committer.
    pub fn try_lock(
        &mut self,
        tx: TxId,
        items: &[(Key, Option<u64>)],
        now: u64,
        lease: u64,
    ) -> Result<(), Refusal> {
        for (key, version) in items {
            match self.objects.get(key) {
                None => return Err(Refusal::Invalid(key.clone())),
                Some(o) => {
                    if let Some(l) = o.lock {
                        if l.tx != tx {
                            return Err(Refusal::Busy(key.clone()));
                        }
                    }
                    if version.is_some_and(|v| v != o.version) {
                        return Err(Refusal::Invalid(key.clone()));
                    }
                }
            }
        }
        for (key, _) in items {
            if let Some(o) = self.objects.get_mut(key) {
                if o.lock.is_none() {
                    o.lock = Some(Lock {
                        tx,
                        since: now,
                        ask_at: now + lease,
                    });
                    self.locked.entry(tx).or_default().push(key.clone());
                }
            }
        }
        Ok(())
    }

    /// Whether a read of `key` at `version` is still current for `tx`: owned here, the version
    /// unchanged, and no other transaction holds the lock.
    pub fn validate(&self, tx: TxId, key: &Key, version: u64) -> bool {
        self.objects
            .get(key)
            .is_some_and(|o| o.version == version && o.lock.is_none_or(|l| l.tx == tx))
    }

    /// `tx` committed: it installed its writes at node `to` at `version`. Each object it
    /// locked here that `taken` names, at the version named there (`None`: any), leaves this
    /// node (forwarding requests to `to`); its other locks here are released (objects locked
    /// when read for a write that did not happen, or locked again by a late duplicate request
    /// after the object came back). Returns the keys that left.
    pub fn surrender(
        &mut self,
        tx: TxId,
        to: NodeId,
        version: u64,
        taken: &[(Key, Option<u64>)],
    ) -> Vec<Key> {
        let mut keys = self.locked.remove(&tx).unwrap_or_default();
        keys.retain(|key| self.locked_by(key) == Some(tx));
        keys.retain(|key| {
            let named = taken.iter().any(|(k, v)| {
                k == key && v.is_none_or(|v| self.objects.get(key).is_some_and(|o| o.version == v))
            });
            if !named {
                if let Some(o) = self.objects.get_mut(key) {
                    o.lock = None;
                }
            }
            named
        });
        for key in &keys {
            self.objects.remove(key);
            self.moved.insert(
                key.clone(),
                Moved {
                    to,
                    incarnation: tx.n >> 32,
                    version,
                },
            );
        }
        keys
    }

    /// The keys `tx` holds locked here.
    pub fn locked_keys(&self, tx: TxId) -> impl Iterator<Item = Key> + '_ {
        let keys = self.locked.get(&tx).map_or(&[][..], Vec::as_slice);
        keys.iter()
            .filter(move |k| self.locked_by(k) == Some(tx))
            .cloned()
    }

    fn locked_by(&self, key: &Key) -> Option<TxId> {
        self.objects.get(key).and_then(|o| o.lock).map(|l| l.tx)
    }

    /// `tx` committed here, on objects this node keeps: installs the new values at `version`
    /// and unlocks them.
    pub fn install(&mut self, tx: TxId, writes: &[(Key, Option<Vec<u8>>)], version: u64) {
        for (key, value) in writes {
            // A copy still locked by another committer is one that already moved on (its
            // decision is in flight) and came back through this commit: that transaction's
            // decision must no longer touch the new copy.
            if let Some(other) = self.locked_by(key).filter(|&t| t != tx) {
                if let Some(keys) = self.locked.get_mut(&other) {
                    keys.retain(|k| k != key);
                    if keys.is_empty() {
                        self.locked.remove(&other);
                    }
                }
            }
            self.objects.insert(
                key.clone(),
                Owned {
                    value: value.clone(),
                    version,
                    lock: None,
                },
            );
            self.moved.remove(key);
        }
        self.locked.remove(&tx);
    }

    /// The outcome of `tx` cannot be known any more (its committer restarted or was given up
    /// on): every object it locked here may have moved to it, so each is dropped. Returns the
    /// dropped keys with the versions held, in key order.
    pub fn drop_in_doubt(&mut self, tx: TxId) -> Vec<(Key, u64)> {
        let mut keys = self.locked.remove(&tx).unwrap_or_default();
        keys.retain(|key| self.locked_by(key) == Some(tx));
        keys.sort();
        keys.into_iter()
            .filter_map(|key| {
                let o = self.objects.remove(&key)?;
                Some((key, o.version))
            })
            .collect()
    }

    /// Transactions holding locks here, in order.
    pub fn lockers(&self) -> Vec<TxId> {
        let mut txs: Vec<TxId> = self.locked.keys().copied().collect();
        txs.sort();
        txs
    }

    /// `tx` aborted (or was presumed aborted): its locks here are released. Returns how many.
    pub fn release(&mut self, tx: TxId) -> usize {
        let keys = self.locked.remove(&tx).unwrap_or_default();
        for key in &keys {
            if let Some(o) = self.objects.get_mut(key) {
                if o.lock.is_some_and(|l| l.tx == tx) {
                    o.lock = None;
                }
            }
        }
        keys.len()
    }

    /// Transactions whose locks outlived their lease at `now`, with how long they have held
    /// them; each is reported again `lease` later while it keeps them.
    pub fn overdue(&mut self, now: u64, lease: u64) -> Vec<(TxId, u64)> {
        let mut out = Vec::new();
        for (tx, keys) in &self.locked {
            let Some(first) = keys.first().and_then(|k| self.objects.get(k)) else {
                continue;
            };
            let Some(lock) = first.lock else { continue };
            if lock.ask_at <= now {
                out.push((*tx, now - lock.since));
            }
        }
        for (tx, _) in &out {
            for key in &self.locked[tx] {
                if let Some(Owned { lock: Some(l), .. }) = self.objects.get_mut(key) {
                    l.ask_at = now + lease;
                }
            }
        }
        out.sort();
        out
    }

    /// How many keys are locked right now.
    pub fn locks_held(&self) -> usize {
        self.locked.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(n: u64) -> TxId {
        TxId { node: 1, n }
    }

    #[test]
    fn locks_are_all_or_nothing_and_validated() {
        let (a, b) = (Key::from("a"), Key::from("b"));
        let mut o = OwnedObjects::new();
        o.adopt(a.clone(), Some(vec![1]), 3);
        o.adopt(b.clone(), Some(vec![2]), 4);
        o.try_lock(tx(1), &[(a.clone(), Some(3))], 0, 10).unwrap();
        assert_eq!(
            o.try_lock(tx(2), &[(b.clone(), Some(4)), (a.clone(), Some(3))], 0, 10),
            Err(Refusal::Busy(a.clone()))
        );
        assert_eq!(
            o.get(&b).unwrap().locked_by,
            None,
            "nothing taken on refusal"
        );
        assert_eq!(
            o.try_lock(tx(2), &[(b.clone(), Some(3))], 0, 10),
            Err(Refusal::Invalid(b.clone())),
            "stale version"
        );
        assert!(!o.validate(tx(2), &a, 3), "locked by another");
        assert!(o.validate(tx(1), &a, 3));
        assert_eq!(o.release(tx(1)), 1);
        assert!(o.validate(tx(2), &a, 3));
    }

    #[test]
    fn surrender_forwards_and_install_commits_in_place() {
        let (a, b) = (Key::from("a"), Key::from("b"));
        let mut o = OwnedObjects::new();
        o.adopt(a.clone(), Some(vec![1]), 3);
        o.adopt(b.clone(), Some(vec![2]), 3);
        o.try_lock(tx(1), &[(a.clone(), Some(3))], 0, 10).unwrap();
        assert_eq!(
            o.surrender(tx(1), 7, 9, &[(a.clone(), Some(3))]),
            vec![a.clone()]
        );
        assert!(!o.owns(&a));
        assert_eq!(o.moved_to(&a), Some(7));
        o.try_lock(tx(2), &[(b.clone(), Some(3))], 0, 10).unwrap();
        o.install(tx(2), &[(b.clone(), None)], 5);
        assert_eq!(
            o.get(&b),
            Some(Held {
                value: None,
                version: 5,
                locked_by: None
            })
        );
        assert_eq!(o.locks_held(), 0);
    }

    #[test]
    fn a_late_decision_never_touches_a_copy_that_came_back() {
        let a = Key::from("a");
        let mut o = OwnedObjects::new();
        o.adopt(a.clone(), Some(vec![1]), 3);
        // tx 1 (node 1) locks the copy here and commits elsewhere; before its decision
        // arrives, tx 2 of this node takes the object back from the new owner at version 5.
        o.try_lock(tx(1), &[(a.clone(), Some(3))], 0, 10).unwrap();
        o.install(tx(2), &[(a.clone(), Some(vec![2]))], 5);
        assert!(o.surrender(tx(1), 1, 4, &[(a.clone(), Some(3))]).is_empty());
        assert_eq!(o.get(&a).map(|h| h.version), Some(5));
        assert_eq!(o.locks_held(), 0);
    }

    #[test]
    fn only_what_the_commit_names_at_the_version_read_leaves() {
        let (a, b, c) = (Key::from("a"), Key::from("b"), Key::from("c"));
        let mut o = OwnedObjects::new();
        o.adopt(a.clone(), Some(vec![1]), 3);
        o.adopt(b.clone(), Some(vec![2]), 3);
        o.adopt(c.clone(), Some(vec![3]), 8);
        // tx 1 locked a (written), b (read for a write it did not make) and c (a late
        // duplicate lock on a copy newer than the one it read).
        o.try_lock(
            tx(1),
            &[(a.clone(), None), (b.clone(), None), (c.clone(), None)],
            0,
            10,
        )
        .unwrap();
        let taken = [(a.clone(), Some(3)), (c.clone(), Some(5))];
        assert_eq!(o.surrender(tx(1), 7, 9, &taken), vec![a.clone()]);
        assert!(!o.owns(&a));
        assert_eq!(o.get(&b).map(|h| (h.version, h.locked_by)), Some((3, None)));
        assert_eq!(o.get(&c).map(|h| (h.version, h.locked_by)), Some((8, None)));
        assert_eq!(o.locks_held(), 0);
    }

    #[test]
    fn overdue_locks_are_reported_once_per_lease() {
        let a = Key::from("a");
        let mut o = OwnedObjects::new();
        o.adopt(a.clone(), None, 0);
        o.try_lock(tx(1), &[(a.clone(), None)], 100, 10).unwrap();
        assert!(o.overdue(105, 10).is_empty());
        assert_eq!(o.overdue(110, 10), vec![(tx(1), 10)]);
        assert!(o.overdue(115, 10).is_empty());
        assert_eq!(o.overdue(121, 10), vec![(tx(1), 21)]);
        o.release(tx(1));
        assert!(o.overdue(200, 10).is_empty());
    }
}
