//! Contention managers: what a transaction does when it meets a conflict.

use std::time::Duration;

/// How a transaction reacts to a conflict. Chosen per node, overridable per transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ContentionPolicy {
    /// Abort at once and re-run at once.
    AbortSelf,
    /// Abort, then wait a random time drawn from a window that doubles with each consecutive
    /// abort (up to a cap) before the re-run.
    #[default]
    Backoff,
    /// The higher-priority transaction wins, and among equals the older one (the one whose first
    /// attempt started earlier): a winner waits for a lock held by a loser to be released; a loser
    /// aborts at once and backs off longer the lower its priority.
    Priority,
}

/// What to do about a cell locked by another committer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnLocked {
    /// Spin briefly for the holder to finish, then look again.
    Wait,
    /// Give up and abort.
    Abort,
}

/// Spins allowed while waiting for a lock before the waiter gives up.
pub(crate) const LOCK_WAIT_SPINS: u32 = 256;

impl ContentionPolicy {
    /// The decision for a transaction (`priority`, `age`) meeting a lock held by (`holder_priority`,
    /// `holder_age`).
    #[inline]
    pub(crate) fn on_locked(
        self,
        priority: u16,
        age: u64,
        holder_priority: u16,
        holder_age: u64,
    ) -> OnLocked {
        match self {
            ContentionPolicy::AbortSelf => OnLocked::Abort,
            // Commit-time locks are held for a few hundred nanoseconds: a short wait is cheaper
            // than an abort.
            ContentionPolicy::Backoff => OnLocked::Wait,
            ContentionPolicy::Priority => {
                if (priority, std::cmp::Reverse(age))
                    >= (holder_priority, std::cmp::Reverse(holder_age))
                {
                    OnLocked::Wait
                } else {
                    OnLocked::Abort
                }
            }
        }
    }

    /// How long to wait before attempt number `consecutive_aborts + 1`. `random` is a fresh
    /// random word from the transaction's generator.
    pub(crate) fn backoff(self, consecutive_aborts: u32, priority: u16, random: u64) -> Duration {
        let exp = match self {
            ContentionPolicy::AbortSelf => return Duration::ZERO,
            ContentionPolicy::Backoff => consecutive_aborts.min(12),
            // Low priorities back off harder, so high priorities get through.
            ContentionPolicy::Priority => {
                if priority >= u16::MAX / 2 {
                    0
                } else {
                    (consecutive_aborts + 2).min(14)
                }
            }
        };
        if exp == 0 {
            return Duration::ZERO;
        }
        // Window: 2^exp * 64 ns, so the first back-off is at most a fraction of a microsecond and
        // the cap is about a quarter of a millisecond (one second for the lowest priority).
        let window = 64u64 << exp;
        Duration::from_nanos(random % window)
    }
}

/// Waits for `d`: spins for short waits, sleeps for longer ones. In a scheduled task the wait
/// is a safe point checked all along: the task spins and gives the CPU to other threads
/// between checks instead of sleeping (a sleep overshoots by tens of microseconds, the timer
/// slack), so a backing-off transaction hands its worker to a more urgent request at once. In
/// a fiber (`atomos_sched::fiber`), the fiber suspends until the end of the wait.
pub(crate) fn pause(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = std::time::Instant::now() + d;
    if let Some(task) = atomos_sched::current() {
        let mut spins = 0u32;
        while std::time::Instant::now() < end {
            if task.safe_point() {
                // It gave way to a more urgent request and resumed later: its back-off is
                // long over.
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        return;
    }
    if atomos_sched::fiber::pause_until(end) {
        return;
    }
    let left = end.saturating_duration_since(std::time::Instant::now());
    if left < Duration::from_micros(20) {
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
        return;
    }
    std::thread::sleep(left);
}

/// A small, fast generator for back-off jitter (xorshift64*). Not for anything that needs
/// unpredictability.
#[derive(Clone, Debug)]
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn new(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_policy_lets_the_higher_or_older_transaction_wait() {
        let p = ContentionPolicy::Priority;
        assert_eq!(p.on_locked(5, 10, 1, 1), OnLocked::Wait);
        assert_eq!(p.on_locked(1, 10, 5, 20), OnLocked::Abort);
        assert_eq!(
            p.on_locked(3, 10, 3, 20),
            OnLocked::Wait,
            "older wins among equals"
        );
        assert_eq!(p.on_locked(3, 30, 3, 20), OnLocked::Abort);
        assert_eq!(
            ContentionPolicy::AbortSelf.on_locked(9, 0, 0, 9),
            OnLocked::Abort
        );
    }

    #[test]
    fn backoff_window_grows_and_is_capped() {
        let b = ContentionPolicy::Backoff;
        assert_eq!(b.backoff(0, 0, 12345), Duration::ZERO);
        assert!(b.backoff(3, 0, u64::MAX) < Duration::from_nanos(64 << 3));
        assert!(b.backoff(100, 0, u64::MAX) < Duration::from_nanos(64 << 12));
        assert_eq!(
            ContentionPolicy::AbortSelf.backoff(50, 0, 7),
            Duration::ZERO
        );
    }
}
