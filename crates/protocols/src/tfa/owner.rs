//! The objects a node owns (thesis figure 5.2, owner side): the committed value and version of
//! each, and commit locks that a committer takes in key order, validates under, and releases by
//! committing or aborting. Every lock carries a lease: a committer that crashed or was cut off
//! loses its locks when the lease runs out, so no lock is held forever.

use std::collections::HashMap;

use atomos_core::Key;

use super::directory::NodeId;

/// A transaction: the node that runs it and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxId {
    /// The node running the transaction.
    pub node: NodeId,
    /// Its number on that node.
    pub n: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lock {
    tx: TxId,
    until: u64,
}

#[derive(Clone, Debug)]
struct Owned {
    value: Vec<u8>,
    version: u64,
    lock: Option<Lock>,
}

/// An object as its owner holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held<'a> {
    /// The committed value (encoded).
    pub value: &'a [u8],
    /// The version: the committing node's clock when it was written.
    pub version: u64,
    /// Whether a commit holds its lock right now.
    pub locked: bool,
}

/// Why locks were not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// Another transaction holds this key's lock.
    Busy {
        /// The key.
        key: Key,
        /// The holder.
        holder: TxId,
    },
    /// This node does not own the key (it moved, or was deleted).
    NotHere {
        /// The key.
        key: Key,
    },
}

/// Why a commit step was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitError {
    /// The transaction does not hold the key's lock (its lease ran out, or it never took it).
    NotLocked {
        /// The key.
        key: Key,
    },
}

/// The objects this node owns.
#[derive(Clone, Debug, Default)]
pub struct OwnedObjects {
    objects: HashMap<Key, Owned>,
}

impl OwnedObjects {
    /// Nothing owned.
    pub fn new() -> OwnedObjects {
        OwnedObjects::default()
    }

    /// How many objects this node owns.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether this node owns nothing.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Takes ownership of `key` (created here, or moved here by a commit), unlocked.
    pub fn adopt(&mut self, key: Key, value: Vec<u8>, version: u64) {
        self.objects.insert(
            key,
            Owned {
                value,
                version,
                lock: None,
            },
        );
    }

    /// The committed copy of `key`, if this node owns it.
    pub fn get(&self, key: &Key) -> Option<Held<'_>> {
        self.objects.get(key).map(|o| Held {
            value: &o.value,
            version: o.version,
            locked: o.lock.is_some(),
        })
    }

    /// Locks every key in `keys` for `tx` until `now + lease`, or none of them. A lock `tx`
    /// already holds is renewed.
    pub fn try_lock(
        &mut self,
        tx: TxId,
        keys: &[Key],
        now: u64,
        lease: u64,
    ) -> Result<(), LockError> {
        for key in keys {
            match self.objects.get(key) {
                None => return Err(LockError::NotHere { key: key.clone() }),
                Some(Owned { lock: Some(l), .. }) if l.tx != tx && l.until > now => {
                    return Err(LockError::Busy {
                        key: key.clone(),
                        holder: l.tx,
                    })
                }
                Some(_) => {}
            }
        }
        for key in keys {
            if let Some(o) = self.objects.get_mut(key) {
                o.lock = Some(Lock {
                    tx,
                    until: now + lease,
                });
            }
        }
        Ok(())
    }

    /// Whether a read of `key` at `version` is still current for `tx`: the version has not
    /// changed and no other transaction holds the lock.
    pub fn validate(&self, tx: TxId, key: &Key, version: u64, now: u64) -> bool {
        self.objects.get(key).is_some_and(|o| {
            o.version == version && o.lock.is_none_or(|l| l.tx == tx || l.until <= now)
        })
    }

    /// Installs `tx`'s write of `key` at `version` and releases its lock.
    pub fn commit(
        &mut self,
        tx: TxId,
        key: &Key,
        value: Vec<u8>,
        version: u64,
        now: u64,
    ) -> Result<(), CommitError> {
        match self.objects.get_mut(key) {
            Some(o) if o.lock.is_some_and(|l| l.tx == tx && l.until > now) => {
                o.value = value;
                o.version = version;
                o.lock = None;
                Ok(())
            }
            _ => Err(CommitError::NotLocked { key: key.clone() }),
        }
    }

    /// Gives up `key` under `tx`'s lock (it moves to the committer, or is deleted): returns its
    /// committed value and version.
    pub fn surrender(
        &mut self,
        tx: TxId,
        key: &Key,
        now: u64,
    ) -> Result<(Vec<u8>, u64), CommitError> {
        match self.objects.get(key) {
            Some(o) if o.lock.is_some_and(|l| l.tx == tx && l.until > now) => {
                let o = self.objects.remove(key).expect("checked above");
                Ok((o.value, o.version))
            }
            _ => Err(CommitError::NotLocked { key: key.clone() }),
        }
    }

    /// Releases every lock `tx` holds (it aborted).
    pub fn release(&mut self, tx: TxId) {
        for o in self.objects.values_mut() {
            if o.lock.is_some_and(|l| l.tx == tx) {
                o.lock = None;
            }
        }
    }

    /// Releases the locks whose lease ran out by `now`; returns their keys (sorted).
    pub fn expire(&mut self, now: u64) -> Vec<Key> {
        let mut freed = Vec::new();
        for (k, o) in self.objects.iter_mut() {
            if o.lock.is_some_and(|l| l.until <= now) {
                o.lock = None;
                freed.push(k.clone());
            }
        }
        freed.sort();
        freed
    }

    /// How many locks are held (expired or not).
    pub fn locks_held(&self) -> usize {
        self.objects.values().filter(|o| o.lock.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: TxId = TxId { node: 1, n: 1 };
    const T2: TxId = TxId { node: 2, n: 1 };

    fn table() -> OwnedObjects {
        let mut t = OwnedObjects::new();
        t.adopt(Key::from("a"), b"1".to_vec(), 3);
        t.adopt(Key::from("b"), b"2".to_vec(), 4);
        t
    }

    #[test]
    fn locks_are_all_or_nothing_and_busy_names_the_holder() {
        let mut t = table();
        let (a, b) = (Key::from("a"), Key::from("b"));
        t.try_lock(T1, std::slice::from_ref(&a), 0, 10).unwrap();
        assert_eq!(
            t.try_lock(T2, &[b.clone(), a.clone()], 1, 10),
            Err(LockError::Busy {
                key: a.clone(),
                holder: T1
            })
        );
        assert!(!t.get(&b).unwrap().locked, "nothing taken on failure");
        assert_eq!(
            t.try_lock(T2, &[Key::from("gone")], 1, 10),
            Err(LockError::NotHere {
                key: Key::from("gone")
            })
        );
        t.release(T1);
        t.try_lock(T2, &[a, b], 2, 10).unwrap();
        assert_eq!(t.locks_held(), 2);
    }

    #[test]
    fn validation_commit_and_surrender_follow_the_lock() {
        let mut t = table();
        let a = Key::from("a");
        assert!(t.validate(T2, &a, 3, 0));
        t.try_lock(T1, std::slice::from_ref(&a), 0, 10).unwrap();
        assert!(!t.validate(T2, &a, 3, 1), "locked by another committer");
        assert!(t.validate(T1, &a, 3, 1));
        assert_eq!(
            t.commit(T2, &a, b"x".to_vec(), 9, 1),
            Err(CommitError::NotLocked { key: a.clone() })
        );
        t.commit(T1, &a, b"x".to_vec(), 9, 1).unwrap();
        assert_eq!(
            t.get(&a),
            Some(Held {
                value: b"x",
                version: 9,
                locked: false
            })
        );
        assert!(!t.validate(T2, &a, 3, 2), "a newer version was committed");
        t.try_lock(T2, std::slice::from_ref(&a), 2, 10).unwrap();
        assert_eq!(t.surrender(T2, &a, 3), Ok((b"x".to_vec(), 9)));
        assert!(t.get(&a).is_none());
    }

    #[test]
    fn a_lease_that_runs_out_frees_the_lock() {
        let mut t = table();
        let a = Key::from("a");
        t.try_lock(T1, std::slice::from_ref(&a), 0, 10).unwrap();
        assert!(t.try_lock(T2, std::slice::from_ref(&a), 9, 10).is_err());
        // The committer went silent: at its lease's end others may lock, and it may not commit.
        t.try_lock(T2, std::slice::from_ref(&a), 10, 10).unwrap();
        assert_eq!(
            t.commit(T1, &a, b"late".to_vec(), 5, 11),
            Err(CommitError::NotLocked { key: a.clone() })
        );
        assert_eq!(t.expire(20), vec![a]);
        assert_eq!(t.locks_held(), 0);
    }
}
