//! Whether spinning waits pay off on this machine right now.
//!
//! A spinning wait (a transport's busy poll, a thread polling for an answer) trades a core for
//! latency. That pays while cores are idle, and hurts when other runnable threads want them
//! (more processes or threads than cores): the spinner then takes the core from the very
//! thread whose work it waits for. Measured: TFA bank over TCP with a process per node, 4
//! processes on 2 cores, ran at 4.5K tx/s with both spinning waits on and at 16K with both off
//! (docs/BENCHMARKS.md).
//!
//! A spinner notices that case itself: between two of its looks, its thread was off its core
//! for longer than a look takes ([`PREEMPTED_GAP`]), so some other thread wanted the core. It
//! then closes the process's [`SpinGate`]: every spinning wait in the process waits without
//! spinning for [`PAUSE`], and spinning resumes on trial after that. On a machine with cores to
//! spare the gate stays open and the waits spin as configured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A gap between two looks of a spinning wait longer than this means its thread lost its core
/// to another thread meanwhile. A look (a load, a clock read, a yield with nothing else to run)
/// takes a few microseconds; a thread descheduled in favour of another stays off for at least
/// the scheduler's minimum slice, hundreds of microseconds or more.
pub const PREEMPTED_GAP: Duration = Duration::from_micros(200);

/// How long spinning waits do not spin after a spinner lost its core.
pub const PAUSE: Duration = Duration::from_millis(50);

/// The process's verdict on spinning: open (spinning waits spin) or closed until some instant.
#[derive(Debug)]
pub struct SpinGate {
    base: Instant,
    /// Nanoseconds from `base` until which spinning waits do not spin (0: never closed).
    closed_until: AtomicU64,
}

impl Default for SpinGate {
    fn default() -> Self {
        SpinGate::new()
    }
}

impl SpinGate {
    /// An open gate.
    pub fn new() -> SpinGate {
        SpinGate {
            base: Instant::now(),
            closed_until: AtomicU64::new(0),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether spinning waits may spin at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        self.nanos(now) >= self.closed_until.load(Ordering::Relaxed)
    }

    /// When the gate opens again (`None`: it is open at `now`).
    pub fn closed_until(&self, now: Instant) -> Option<Instant> {
        let until = self.closed_until.load(Ordering::Relaxed);
        (self.nanos(now) < until).then(|| self.base + Duration::from_nanos(until))
    }

    /// Closes the gate for [`PAUSE`] from `now`.
    pub fn close(&self, now: Instant) {
        let until = self.nanos(now).saturating_add(PAUSE.as_nanos() as u64);
        self.closed_until.fetch_max(until, Ordering::Relaxed);
    }

    /// A spell of spinning starting now.
    pub fn spinner(&self) -> Spinner<'_> {
        Spinner {
            gate: self,
            last: Instant::now(),
        }
    }
}

/// The gate every spinning wait of this process consults.
pub fn gate() -> &'static SpinGate {
    static GATE: OnceLock<SpinGate> = OnceLock::new();
    GATE.get_or_init(SpinGate::new)
}

/// One spell of a spinning wait: call [`Spinner::look`] at each look, and stop spinning (wait
/// some other way) as soon as it says so.
#[derive(Debug)]
pub struct Spinner<'g> {
    gate: &'g SpinGate,
    last: Instant,
}

impl Spinner<'_> {
    /// Notes a look now. False when the wait should stop spinning: the gate is closed, or this
    /// thread was off its core since the last look (which closes the gate).
    pub fn look(&mut self) -> bool {
        self.look_at(Instant::now())
    }

    /// [`Spinner::look`] at a given instant.
    pub fn look_at(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last) > PREEMPTED_GAP {
            self.gate.close(now);
            return false;
        }
        self.last = now;
        self.gate.is_open(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_looks_keep_spinning_and_a_long_gap_closes_the_gate_for_the_pause() {
        let gate = SpinGate::new();
        let t0 = Instant::now();
        let mut spinner = gate.spinner();
        spinner.last = t0;
        for i in 1..100 {
            assert!(spinner.look_at(t0 + Duration::from_micros(i * 10)));
        }
        assert!(gate.is_open(t0 + Duration::from_millis(1)));
        // Off the core for a millisecond: stop, and the gate closes for everyone.
        let late = t0 + Duration::from_millis(2);
        assert!(!spinner.look_at(late));
        assert!(!gate.is_open(late));
        assert_eq!(gate.closed_until(late), Some(late + PAUSE));
        let mut other = gate.spinner();
        other.last = late;
        assert!(!other.look_at(late + Duration::from_micros(10)));
        // It opens again once the pause is over.
        let after = late + PAUSE;
        assert!(gate.is_open(after));
        assert_eq!(gate.closed_until(after), None);
        let mut again = gate.spinner();
        again.last = after;
        assert!(again.look_at(after + Duration::from_micros(5)));
    }

    #[test]
    fn a_new_gate_is_open() {
        let gate = SpinGate::new();
        assert!(gate.is_open(Instant::now()));
        assert!(gate.spinner().look());
    }
}
