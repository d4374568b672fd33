//! Object cells: a versioned lock word and a chain of committed versions, newest first.
//!
//! The lock word is either `version << 1` (unlocked; `version` is the commit timestamp of the
//! newest version) or an owner word with bit 0 set (locked by a committing transaction, which
//! records its priority and age there so a contention manager can decide who waits).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crate::key::Key;

/// A type-erased object value. Values are kept typed in memory and never encoded locally.
pub type Value = Box<dyn Any + Send + Sync>;

/// One committed version of an object. `value == None` marks a deletion.
pub(crate) struct Version {
    pub(crate) ts: u64,
    pub(crate) value: Option<Value>,
    pub(crate) prev: Atomic<Version>,
}

/// The shared home of one object on one node.
pub struct Cell {
    lock: AtomicU64,
    head: Atomic<Version>,
    key: Key,
}

/// Decoded view of a lock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockState {
    /// Unlocked; the newest version has this commit timestamp (0: never written).
    Free(u64),
    /// Locked by a committer of this priority that started at this clock value.
    Held { priority: u16, age: u64 },
}

const AGE_BITS: u32 = 47;
const AGE_MASK: u64 = (1 << AGE_BITS) - 1;

/// The lock word a committer with `priority` and start time `age` stores while it holds a cell.
#[inline]
pub(crate) fn owner_word(priority: u16, age: u64) -> u64 {
    ((priority as u64) << 48) | ((age & AGE_MASK) << 1) | 1
}

#[inline]
pub(crate) fn decode(word: u64) -> LockState {
    if word & 1 == 0 {
        LockState::Free(word >> 1)
    } else {
        LockState::Held {
            priority: (word >> 48) as u16,
            age: (word >> 1) & AGE_MASK,
        }
    }
}

impl Cell {
    pub(crate) fn new(key: Key) -> Cell {
        Cell {
            lock: AtomicU64::new(0),
            head: Atomic::null(),
            key,
        }
    }

    /// The object's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    #[inline]
    pub(crate) fn lock_word(&self) -> u64 {
        self.lock.load(Ordering::Acquire)
    }

    /// Tries to move the lock word from `expected` (unlocked) to `owner`.
    #[inline]
    pub(crate) fn try_lock(&self, expected: u64, owner: u64) -> bool {
        self.lock
            .compare_exchange(expected, owner, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Releases a lock held by the caller, publishing `version` as the newest version.
    #[inline]
    pub(crate) fn unlock(&self, version: u64) {
        self.lock.store(version << 1, Ordering::Release);
    }

    #[inline]
    pub(crate) fn head<'g>(&self, guard: &'g Guard) -> Shared<'g, Version> {
        self.head.load(Ordering::Acquire, guard)
    }

    /// Installs a new newest version. The caller holds the cell's lock. Versions that no snapshot
    /// at or after `horizon` can read are unlinked and handed to epoch reclamation.
    pub(crate) fn install(&self, ts: u64, value: Option<Value>, horizon: u64, guard: &Guard) {
        let old = self.head.load(Ordering::Relaxed, guard);
        let node = Owned::new(Version {
            ts,
            value,
            prev: Atomic::null(),
        });
        node.prev.store(old, Ordering::Relaxed);
        let new = node.into_shared(guard);
        self.head.store(new, Ordering::Release);
        // Keep every version newer than the horizon and the newest one at or below it.
        let mut keep = new;
        // SAFETY: versions reachable from the head are only unlinked by the lock holder (us), and
        // unlinked ones are destroyed through the epoch collector, so `guard` keeps them alive.
        unsafe {
            while let Some(v) = keep.as_ref() {
                if v.ts <= horizon {
                    break;
                }
                let prev = v.prev.load(Ordering::Acquire, guard);
                if prev.is_null() {
                    return;
                }
                keep = prev;
            }
            if let Some(v) = keep.as_ref() {
                let cut = v.prev.swap(Shared::null(), Ordering::AcqRel, guard);
                retire_chain(cut, guard);
            }
        }
    }

    /// How many versions are still linked (for tests and memory accounting).
    pub(crate) fn number_of_versions(&self, guard: &Guard) -> usize {
        let mut n = 0;
        let mut cur = self.head(guard);
        // SAFETY: guarded traversal of the version chain.
        while let Some(v) = unsafe { cur.as_ref() } {
            n += 1;
            cur = v.prev.load(Ordering::Acquire, guard);
        }
        n
    }
}

/// Hands every version of a chain that was unlinked from its cell to the epoch collector.
///
/// # Safety
/// `chain` must be unreachable from any cell, and owned by the caller.
unsafe fn retire_chain<'g>(mut chain: Shared<'g, Version>, guard: &'g Guard) {
    while let Some(v) = chain.as_ref() {
        let next = v.prev.load(Ordering::Acquire, guard);
        guard.defer_destroy(chain);
        chain = next;
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        // SAFETY: a cell is dropped when its last owner goes; nothing can reach its versions.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut cur = self.head.load(Ordering::Relaxed, guard);
            while !cur.is_null() {
                let next = cur.deref().prev.load(Ordering::Relaxed, guard);
                drop(cur.into_owned());
                cur = next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_words_round_trip() {
        assert_eq!(decode(42 << 1), LockState::Free(42));
        assert_eq!(
            decode(owner_word(7, 1234)),
            LockState::Held {
                priority: 7,
                age: 1234
            }
        );
    }

    #[test]
    fn install_trims_versions_below_the_horizon() {
        let cell = Cell::new(Key::from("x"));
        let guard = crossbeam_epoch::pin();
        for ts in 1..=10 {
            cell.install(ts, Some(Box::new(ts)), 5, &guard);
        }
        // Versions 5..=10 survive: 5 is the newest at or below the horizon.
        assert_eq!(cell.number_of_versions(&guard), 6);
        cell.install(11, Some(Box::new(11u64)), 11, &guard);
        assert_eq!(cell.number_of_versions(&guard), 1);
    }
}
