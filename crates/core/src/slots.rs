//! Per-thread slots: where a thread publishes its read-only snapshot and counts its statistics.
//!
//! A slot is written by one thread only, so transactions never write a shared cache line for
//! bookkeeping. The engine reads all slots to compute the reclamation horizon and statistics.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::stats::{Counters, Stats};

/// Marks a slot with no running read-only snapshot.
const IDLE: u64 = u64::MAX;

/// One thread's slot.
pub(crate) struct Slot {
    snapshot: CachePadded<AtomicU64>,
    pub(crate) counters: CachePadded<Counters>,
    registry: Weak<SlotRegistry>,
}

impl Slot {
    /// Publishes a read-only snapshot and returns its timestamp, which the reclaimer will not
    /// overtake until [`Slot::end_snapshot`].
    pub(crate) fn begin_snapshot(&self, registry: &SlotRegistry, clock: &AtomicU64) -> u64 {
        let mut s = clock.load(Ordering::Acquire);
        loop {
            self.snapshot.store(s, Ordering::SeqCst);
            // Pairs with the reclaimer's store of `pending` before it scans the slots: either it
            // sees our slot, or we see its pending horizon and move our snapshot up to it.
            fence(Ordering::SeqCst);
            let pending = registry.pending.load(Ordering::SeqCst);
            if pending <= s {
                return s;
            }
            s = clock.load(Ordering::Acquire).max(pending);
        }
    }

    pub(crate) fn end_snapshot(&self) {
        self.snapshot.store(IDLE, Ordering::Release);
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
    /// The horizon a reclaimer is about to publish (see [`Slot::begin_snapshot`]).
    pending: CachePadded<AtomicU64>,
    /// No running or future snapshot reads below this timestamp.
    horizon: CachePadded<AtomicU64>,
    retired: Counters,
}

impl SlotRegistry {
    pub(crate) fn new() -> Arc<SlotRegistry> {
        Arc::new(SlotRegistry {
            slots: Mutex::new(Vec::new()),
            pending: CachePadded::new(AtomicU64::new(0)),
            horizon: CachePadded::new(AtomicU64::new(0)),
            retired: Counters::default(),
        })
    }

    /// A new slot for the calling thread.
    pub(crate) fn register(self: &Arc<Self>) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            snapshot: CachePadded::new(AtomicU64::new(IDLE)),
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

    /// Recomputes the horizon from the clock and the running snapshots.
    pub(crate) fn advance_horizon(&self, clock: &AtomicU64) {
        let now = clock.load(Ordering::Acquire);
        self.pending.fetch_max(now, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut h = now;
        for w in self.slots.lock().iter() {
            if let Some(slot) = w.upgrade() {
                h = h.min(slot.snapshot.load(Ordering::SeqCst));
            }
        }
        self.horizon.fetch_max(h, Ordering::AcqRel);
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
        let s = a.begin_snapshot(&reg, &clock);
        assert_eq!(s, 10);
        clock.store(50, Ordering::SeqCst);
        reg.advance_horizon(&clock);
        assert_eq!(reg.horizon(), 10);
        a.end_snapshot();
        reg.advance_horizon(&clock);
        assert_eq!(reg.horizon(), 50);
        // A snapshot that begins now may not start below the pending horizon.
        let b = reg.register();
        assert!(b.begin_snapshot(&reg, &clock) >= 50);
    }
}
