//! Object cells: a versioned lock word and a chain of committed versions, newest first.
//!
//! The lock word is either `version << 1` (unlocked; `version` is the commit timestamp of the
//! newest version) or an owner word with bit 0 set (locked by a committing transaction, which
//! records its priority and age there so a contention manager can decide who waits).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::pool::BlockPool;
use crate::version::{OwnedVersion, Version};

/// The shared home of one object on one node: 16 bytes, so four cells share a cache line and
/// a scan over many objects touches few lines. (The key lives in the object table.)
pub struct Cell {
    lock: AtomicU64,
    head: AtomicPtr<Version>,
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

/// The most versions newer than the horizon a commit walks past to trim a chain.
const TRIM_WALK: usize = 32;

impl Cell {
    pub(crate) fn new() -> Cell {
        Cell {
            lock: AtomicU64::new(0),
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
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

    /// The newest version (null: never written). Dereference only under an epoch guard.
    #[inline]
    pub(crate) fn head(&self) -> *const Version {
        self.head.load(Ordering::Acquire)
    }

    /// Installs `node` as the newest version with timestamp `ts`. The caller holds the cell's
    /// lock. Versions that no snapshot at or after `horizon` can read are unlinked and returned
    /// (null if none) for the caller to retire: readers may still hold them.
    pub(crate) fn install(&self, mut node: OwnedVersion, ts: u64, horizon: u64) -> Retired {
        let old = self.head.load(Ordering::Relaxed);
        let header = node.header_mut();
        header.ts = ts;
        *header.prev.get_mut() = old;
        let new = node.into_raw();
        self.head.store(new, Ordering::Release);
        // Keep every version newer than the horizon and the newest one at or below it.
        let mut keep = new;
        let mut walked = 0;
        // SAFETY: versions reachable from the head are unlinked only by the lock holder (us) and
        // freed only once no reader can hold them (see `reclaim`).
        unsafe {
            while (*keep).ts > horizon {
                let prev = (*keep).prev.load(Ordering::Acquire);
                walked += 1;
                if prev.is_null() || walked > TRIM_WALK {
                    // Nothing to cut, or an old snapshot (a long or preempted transaction)
                    // holds the horizon back: cut later, once the horizon is near the head
                    // again, rather than walk the whole chain on every commit.
                    return Retired(std::ptr::null_mut());
                }
                keep = prev;
            }
            // Only the lock holder writes `prev` links, so a plain load and store suffice (most
            // of the time there is nothing older to cut). Readers that still follow the old link
            // are protected by the reclamation rule, which orders this store before the
            // retirement stamp with a SeqCst fence.
            let cut = (*keep).prev.load(Ordering::Relaxed);
            if !cut.is_null() {
                (*keep).prev.store(std::ptr::null_mut(), Ordering::Relaxed);
            }
            Retired(cut)
        }
    }

    /// How many versions are still linked (for tests and memory accounting).
    pub(crate) fn number_of_versions(&self) -> usize {
        let mut n = 0;
        let mut cur = self.head();
        // SAFETY: callers make sure no version of this cell is retired meanwhile.
        while let Some(v) = unsafe { cur.as_ref() } {
            n += 1;
            cur = v.prev.load(Ordering::Acquire);
        }
        n
    }
}

/// A chain of versions unlinked from its cell, owned by whoever holds this (null: empty).
pub(crate) struct Retired(pub(crate) *mut Version);

// SAFETY: the chain is unreachable from any cell; only its holder touches it.
unsafe impl Send for Retired {}

impl Retired {
    /// Whether the chain is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_null()
    }

    /// Frees the chain, keeping its blocks in `pool`. Only once no reader can hold any of its
    /// versions (as for dropping it).
    pub(crate) fn recycle(mut self, pool: &mut BlockPool) {
        self.take_each(|node| node.recycle(pool));
    }

    /// Hands each version of the chain, newest first, to `free`, leaving the chain empty.
    fn take_each(&mut self, mut free: impl FnMut(OwnedVersion)) {
        let mut cur = std::mem::replace(&mut self.0, std::ptr::null_mut());
        while !cur.is_null() {
            // SAFETY: the chain is owned here and unreachable.
            let node = unsafe { OwnedVersion::from_raw(cur) };
            cur = unsafe { (*cur).prev.load(Ordering::Relaxed) };
            free(node);
        }
    }
}

impl Drop for Retired {
    /// Frees the chain. Only drop it once no reader can hold any of its versions.
    fn drop(&mut self) {
        self.take_each(drop);
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        // A cell is dropped when its last owner goes; nothing can reach its versions.
        drop(Retired(*self.head.get_mut()));
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
        let cell = Cell::new();
        for ts in 1..=10 {
            drop(cell.install(OwnedVersion::new(Some(ts)), ts, 5));
        }
        // Versions 5..=10 survive: 5 is the newest at or below the horizon.
        assert_eq!(cell.number_of_versions(), 6);
        let retired = cell.install(OwnedVersion::new(Some(11u64)), 11, 11);
        assert!(!retired.is_empty());
        assert_eq!(cell.number_of_versions(), 1);
    }
}
