//! Per-thread slots, and the reclamation of versions they protect.
//!
//! A running attempt publishes its start timestamp in its thread's slot. That one value does two
//! jobs: it is the snapshot a read-only attempt reads (so versions it needs are not unlinked:
//! the *horizon*), and it protects every version node the attempt may hold a reference to from
//! being freed (epoch-style reclamation, with the version clock as the epoch). A slot is written
//! by one thread only, so transactions never write a shared cache line for bookkeeping.
//!
//! Reclamation rule: a chain unlinked by a committer is stamped with a clock value `r` read
//! after the unlink, behind a SeqCst fence (the committer stamps at its next scan). It may be freed once a later scan finds no attempt
//! that published a start `<= r`. An attempt that published `s > r` read the clock after the
//! stamp was read, and its SeqCst fence comes after the unlinker's, so it cannot reach the
//! chain; an attempt that published before the scan's fence is seen by the scan.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::cell::Retired;
use crate::stats::{Counters, Event, Stats};

/// Marks a slot with no running attempt.
const IDLE: u64 = u64::MAX;

/// Version chains waiting to be freed, each with the clock value read after it was unlinked.
pub(crate) type Garbage = Vec<(u64, Retired)>;

/// The stamp of garbage that has not been stamped yet (it may not be freed).
pub(crate) const UNSTAMPED: u64 = u64::MAX;

/// One thread's slot.
pub(crate) struct Slot {
    active: CachePadded<AtomicU64>,
    pub(crate) counters: CachePadded<Counters>,
    registry: Weak<SlotRegistry>,
}

impl Slot {
    /// Publishes the start of an attempt and returns its timestamp: the horizon will not
    /// overtake it and nothing retired after it is freed until [`Slot::end`].
    pub(crate) fn begin(&self, registry: &SlotRegistry, clock: &AtomicU64) -> u64 {
        let mut s = clock.load(Ordering::SeqCst);
        loop {
            self.active.store(s, Ordering::Relaxed);
            // Pairs with the fence a scan makes after raising `pending` and before it reads the
            // slots: either it sees our slot, or we see its pending horizon and move our start up
            // to it. Also orders every read of this attempt after the publication (see the
            // reclamation rule above).
            fence(Ordering::SeqCst);
            let pending = registry.pending.load(Ordering::Relaxed);
            if pending <= s {
                return s;
            }
            s = clock.load(Ordering::SeqCst).max(pending);
        }
    }

    /// Ends the attempt: it holds no version any more.
    pub(crate) fn end(&self) {
        self.active.store(IDLE, Ordering::Release);
    }

    /// Hands garbage of a state that goes away to the registry (or frees it if the engine is
    /// gone, when no reader can remain).
    pub(crate) fn orphan(&self, garbage: Garbage) {
        if garbage.is_empty() {
            return;
        }
        if let Some(reg) = self.registry.upgrade() {
            reg.orphans.lock().extend(garbage);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(reg) = self.registry.upgrade() {
            reg.retired.absorb(&self.counters);
        }
    }
}

/// All slots of one engine, and the version horizon below which no snapshot reads.
pub(crate) struct SlotRegistry {
    slots: Mutex<Vec<Weak<Slot>>>,
    /// The horizon a reclaimer is about to publish (see [`Slot::begin`]).
    pending: CachePadded<AtomicU64>,
    /// No running or future snapshot reads below this timestamp.
    horizon: CachePadded<AtomicU64>,
    retired: Counters,
    /// Garbage left by transaction states that were dropped.
    orphans: Mutex<Garbage>,
}

impl SlotRegistry {
    pub(crate) fn new() -> Arc<SlotRegistry> {
        Arc::new(SlotRegistry {
            slots: Mutex::new(Vec::new()),
            pending: CachePadded::new(AtomicU64::new(0)),
            horizon: CachePadded::new(AtomicU64::new(0)),
            retired: Counters::default(),
            orphans: Mutex::new(Vec::new()),
        })
    }

    /// A new slot for the calling thread.
    pub(crate) fn register(self: &Arc<Self>) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            active: CachePadded::new(AtomicU64::new(IDLE)),
            counters: CachePadded::new(Counters::default()),
            registry: Arc::downgrade(self),
        });
        let mut slots = self.slots.lock();
        slots.retain(|w| w.strong_count() > 0);
        slots.push(Arc::downgrade(&slot));
        slot
    }

    /// The current horizon: versions older than the newest one at or below it can be dropped.
    #[inline]
    pub(crate) fn horizon(&self) -> u64 {
        self.horizon.load(Ordering::Acquire)
    }

    /// Scans the slots: advances the horizon and returns the oldest published start (IDLE if
    /// none): garbage stamped below it may be freed. Frees orphaned garbage that qualifies.
    pub(crate) fn scan(&self, clock: &AtomicU64) -> u64 {
        let now = clock.load(Ordering::SeqCst);
        self.pending.fetch_max(now, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut oldest = IDLE;
        for w in self.slots.lock().iter() {
            if let Some(slot) = w.upgrade() {
                oldest = oldest.min(slot.active.load(Ordering::SeqCst));
            }
        }
        self.horizon.fetch_max(now.min(oldest), Ordering::AcqRel);
        if let Some(mut orphans) = self.orphans.try_lock() {
            orphans.retain(|(stamp, _)| *stamp >= oldest);
            if orphans.iter().any(|(stamp, _)| *stamp == UNSTAMPED) {
                // Unlinked before they were handed over (the lock orders that before us); stamp
                // them now, behind a fence, to be freed by a later scan.
                fence(Ordering::SeqCst);
                let stamp = clock.load(Ordering::Relaxed);
                for g in orphans.iter_mut().filter(|(s, _)| *s == UNSTAMPED) {
                    g.0 = stamp;
                }
            }
        }
        oldest
    }

    /// Counts a rare event that happens outside any thread's transaction (shared counter).
    pub(crate) fn count_rare(&self, e: Event) {
        self.retired.add(e);
    }

    /// Sums every slot's counters, including slots of threads that have ended.
    pub(crate) fn stats(&self) -> Stats {
        let mut s = Stats::default();
        self.retired.add_into(&mut s);
        for w in self.slots.lock().iter() {
            if let Some(slot) = w.upgrade() {
                slot.counters.add_into(&mut s);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_stays_below_running_snapshots() {
        let reg = SlotRegistry::new();
        let clock = AtomicU64::new(10);
        let a = reg.register();
        let s = a.begin(&reg, &clock);
        assert_eq!(s, 10);
        clock.store(50, Ordering::SeqCst);
        assert_eq!(reg.scan(&clock), 10);
        assert_eq!(reg.horizon(), 10);
        a.end();
        assert_eq!(reg.scan(&clock), IDLE);
        assert_eq!(reg.horizon(), 50);
        // A snapshot that begins now may not start below the pending horizon.
        let b = reg.register();
        assert!(b.begin(&reg, &clock) >= 50);
    }
}
