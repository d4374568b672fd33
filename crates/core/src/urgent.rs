//! Starvation relief for the priority contention manager.
//!
//! With commit-time locking, a transaction cannot make another one abort: a high-priority
//! transaction whose reads keep being overwritten by lower-priority commits can lose over and
//! over. After a few such aborts it becomes *urgent*: until it ends, committers of lower
//! priority wait a short, bounded time before they lock anything, which gives it a window to
//! validate and commit. Committers pay one load of a line that is almost never written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// How long a lower-priority committer waits for an urgent transaction before it goes ahead.
const MAX_WAIT: Duration = Duration::from_micros(200);
const TOKEN_BITS: u32 = 48;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;

/// The one urgent transaction of an engine, if any: `(priority + 1) << 48 | token`, or 0.
pub(crate) struct Urgent {
    word: CachePadded<AtomicU64>,
    next_token: AtomicU64,
}

impl Urgent {
    pub(crate) fn new() -> Urgent {
        Urgent {
            word: CachePadded::new(AtomicU64::new(0)),
            next_token: AtomicU64::new(1),
        }
    }

    /// Makes a transaction of `priority` the urgent one unless one of at least its priority
    /// already is. Returns the claim to release later (0: not claimed).
    pub(crate) fn claim(&self, priority: u16) -> u64 {
        let token = (self.next_token.fetch_add(1, Ordering::Relaxed) & TOKEN_MASK).max(1);
        let mine = ((priority as u64 + 1) << TOKEN_BITS) | token;
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur != 0 && cur >> TOKEN_BITS >= mine >> TOKEN_BITS {
                return 0;
            }
            match self
                .word
                .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return mine,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives up a claim (no effect if it was replaced by a higher-priority one meanwhile).
    pub(crate) fn release(&self, claim: u64) {
        if claim != 0 {
            let _ = self
                .word
                .compare_exchange(claim, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Called by a committer of `priority` holding `claim` before it locks its write set:
    /// waits, at most [`MAX_WAIT`], while a transaction of higher priority is urgent.
    #[inline]
    pub(crate) fn yield_to_higher(&self, priority: u16, claim: u64) {
        let u = self.word.load(Ordering::Relaxed);
        if u == 0 || u == claim || u >> TOKEN_BITS <= priority as u64 + 1 {
            return;
        }
        self.wait_while(u);
    }

    #[cold]
    fn wait_while(&self, u: u64) {
        let start = Instant::now();
        let mut spins = 0u32;
        while self.word.load(Ordering::Acquire) == u && start.elapsed() < MAX_WAIT {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_higher_priority_replaces_the_urgent_one() {
        let u = Urgent::new();
        let low = u.claim(1);
        assert_ne!(low, 0);
        assert_eq!(u.claim(1), 0, "an equal priority does not replace it");
        let high = u.claim(5);
        assert_ne!(high, 0);
        u.release(low); // already replaced: no effect
        assert_eq!(u.word.load(Ordering::Relaxed), high);
        u.release(high);
        assert_eq!(u.word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn only_lower_priorities_wait_and_not_for_long() {
        let u = Urgent::new();
        let claim = u.claim(5);
        let t = Instant::now();
        u.yield_to_higher(7, 0);
        u.yield_to_higher(5, 0);
        u.yield_to_higher(1, claim);
        assert!(
            t.elapsed() < MAX_WAIT,
            "no wait for higher, equal or own priority"
        );
        let t = Instant::now();
        u.yield_to_higher(1, 0);
        assert!(t.elapsed() >= MAX_WAIT);
    }
}
