//! Whether spinning waits pay off on this machine right now.
//!
//! A spinning wait (a transport's busy poll, a thread polling for an answer) trades a core for
//! latency. That pays while cores are idle, and hurts when other processes' threads want them:
//! the spinner then takes the core from the very thread whose work it waits for. Measured: TFA
//! bank over TCP with a process per node, 4 processes on 2 cores, ran at 4.3K tx/s with both
//! spinning waits on and at 13.7K with both off (docs/BENCHMARKS.md).
//!
//! A spinner notices that case itself. Between two of its looks more time passed than a look
//! takes ([`PREEMPTED_GAP`]): its thread was taken off its core for another (or, for a task on a
//! runtime worker, the worker was busy with other tasks). If other
//! processes have been keeping the cores busy (see [`SpinGate::lost_core`]), the spinner closes
//! the process's [`SpinGate`]: every spinning wait in the process waits without spinning for
//! [`PAUSE`], and spinning resumes on trial after that. When only this process's own threads
//! compete for the cores, the gate stays open (the spell that saw the gap still ends, but the
//! process's other waits go on spinning); so it does on a machine with cores to spare.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A gap between two looks of a spinning wait longer than this means its thread lost its core
/// to another thread meanwhile. A look (a load, a clock read, a yield with nothing else to run)
/// takes a few microseconds; a thread descheduled in favour of another stays off for at least
/// the scheduler's minimum slice, hundreds of microseconds or more.
pub const PREEMPTED_GAP: Duration = Duration::from_micros(200);

/// How long spinning waits do not spin after a spinner lost its core to another process.
pub const PAUSE: Duration = Duration::from_millis(50);

/// The shortest interval over which the other processes' use of the cores is measured (the
/// kernel counts machine-wide CPU time in ticks of 10 ms).
const LOAD_INTERVAL: Duration = Duration::from_millis(100);

/// The longest interval a measurement may cover: a baseline older than this says nothing about
/// the load now, so the measurement only starts a new interval (and counts the others as busy).
const MAX_LOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Other processes busy for more than this share of one core count as competing for the cores.
const OTHERS_SHARE: f64 = 0.2;

/// CPU time used so far by the whole machine and by this process (`None` where it cannot be
/// read).
pub type LoadClock = fn() -> Option<(Duration, Duration)>;

/// This process's CPU time, from the kernel.
fn process_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| {
        Duration::new(
            ts.tv_sec.max(0) as u64,
            ts.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    })
}

/// Busy CPU time of the whole machine since boot (user, nice and system time; not idle, I/O
/// wait, time stolen by a hypervisor, or interrupts, which the kernel may not charge to the
/// process whose network traffic they serve), from `/proc/stat`.
fn machine_busy_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let busy = [0, 1, 2]
        .iter()
        .try_fold(0u64, |sum, &i| sum.checked_add(*ticks.get(i)?))?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).ok().filter(|&t| t > 0)?;
    Some(
        Duration::from_secs(busy / per_second)
            + Duration::from_nanos((busy % per_second) * 1_000_000_000 / per_second),
    )
}

fn machine_and_process_time() -> Option<(Duration, Duration)> {
    Some((machine_busy_time()?, process_cpu_time()?))
}

/// The process's verdict on spinning: open (spinning waits spin) or closed until some instant.
#[derive(Debug)]
pub struct SpinGate {
    base: Instant,
    /// Nanoseconds from `base` until which spinning waits do not spin (0: never closed).
    closed_until: AtomicU64,
    load_clock: LoadClock,
    /// The machine's busy time, the process's CPU time and the wall time (in nanoseconds, the
    /// last from `base`) when the other processes' load was last measured, and the verdict.
    sampled_machine: AtomicU64,
    sampled_process: AtomicU64,
    sampled_at: AtomicU64,
    others_busy: AtomicBool,
}

impl Default for SpinGate {
    fn default() -> Self {
        SpinGate::new()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl SpinGate {
    /// An open gate that reads the machine's and this process's CPU time from the kernel.
    pub fn new() -> SpinGate {
        SpinGate::with_load_clock(machine_and_process_time)
    }

    /// An open gate that reads the machine's and this process's CPU time from `load_clock`.
    pub fn with_load_clock(load_clock: LoadClock) -> SpinGate {
        let (machine, process) = load_clock().unwrap_or_default();
        SpinGate {
            base: Instant::now(),
            closed_until: AtomicU64::new(0),
            load_clock,
            sampled_machine: AtomicU64::new(nanos(machine)),
            sampled_process: AtomicU64::new(nanos(process)),
            sampled_at: AtomicU64::new(0),
            others_busy: AtomicBool::new(true),
        }
    }

    fn at(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.base))
    }

    /// Whether spinning waits may spin at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        self.at(now) >= self.closed_until.load(Ordering::Relaxed)
    }

    /// When the gate opens again (`None`: it is open at `now`).
    pub fn closed_until(&self, now: Instant) -> Option<Instant> {
        let until = self.closed_until.load(Ordering::Relaxed);
        (self.at(now) < until).then(|| self.base + Duration::from_nanos(until))
    }

    /// Closes the gate for [`PAUSE`] from `now`.
    pub fn close(&self, now: Instant) {
        let until = self.at(now).saturating_add(nanos(PAUSE));
        self.closed_until.fetch_max(until, Ordering::Relaxed);
    }

    /// A spinner saw a gap between its looks ending `now`: closes the gate, unless only this
    /// process's own threads have been keeping the cores busy (then whatever took the core was
    /// one of them).
    pub fn lost_core(&self, now: Instant) {
        if self.others_busy(now) {
            self.close(now);
        }
    }

    /// Whether other processes used more than [`OTHERS_SHARE`] of a core since the last
    /// measurement, at least [`LOAD_INTERVAL`] and at most [`MAX_LOAD_INTERVAL`] ago. A more
    /// recent one's verdict stands; after an older one, or where the kernel's counts cannot be
    /// read, the others count as busy.
    fn others_busy(&self, now: Instant) -> bool {
        let at = self.at(now);
        let since = self.sampled_at.load(Ordering::Relaxed);
        if at.saturating_sub(since) < nanos(LOAD_INTERVAL)
            // One measurement per interval: the spinner that moves the mark measures.
            || self
                .sampled_at
                .compare_exchange(since, at, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return self.others_busy.load(Ordering::Relaxed);
        }
        let busy = match (self.load_clock)() {
            Some((machine, process)) => {
                let machine = nanos(machine);
                let process = nanos(process);
                let machine_used =
                    machine.saturating_sub(self.sampled_machine.swap(machine, Ordering::Relaxed));
                let process_used =
                    process.saturating_sub(self.sampled_process.swap(process, Ordering::Relaxed));
                let others = machine_used.saturating_sub(process_used);
                let interval = at - since;
                interval > nanos(MAX_LOAD_INTERVAL)
                    || others as f64 > OTHERS_SHARE * interval as f64
            }
            None => true,
        };
        self.others_busy.store(busy, Ordering::Relaxed);
        busy
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
    /// Notes a look now. False when the wait should stop spinning: the gate is closed, or more
    /// than [`PREEMPTED_GAP`] passed since the last look (see [`SpinGate::lost_core`]).
    pub fn look(&mut self) -> bool {
        self.look_at(Instant::now())
    }

    /// [`Spinner::look`] at a given instant.
    pub fn look_at(&mut self, now: Instant) -> bool {
        let gap = now.saturating_duration_since(self.last);
        self.last = now;
        if gap > PREEMPTED_GAP {
            self.gate.lost_core(now);
            return false;
        }
        self.gate.is_open(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A fake load clock the tests move by hand: machine and process CPU time in nanoseconds
    /// (one per test: tests run in parallel).
    macro_rules! fake_clock {
        ($machine:ident, $process:ident) => {{
            static $machine: AtomicU64 = AtomicU64::new(0);
            static $process: AtomicU64 = AtomicU64::new(0);
            fn read() -> Option<(Duration, Duration)> {
                Some((
                    Duration::from_nanos($machine.load(Ordering::SeqCst)),
                    Duration::from_nanos($process.load(Ordering::SeqCst)),
                ))
            }
            (&$machine, &$process, read as LoadClock)
        }};
    }

    #[test]
    fn close_looks_keep_spinning_and_losing_the_core_to_another_process_closes_the_gate() {
        let (machine, _, clock) = fake_clock!(M1, P1);
        let gate = SpinGate::with_load_clock(clock);
        let t0 = gate.base;
        let mut spinner = gate.spinner();
        spinner.last = t0;
        for i in 1..100 {
            assert!(spinner.look_at(t0 + Duration::from_micros(i * 10)));
        }
        // Off the core for a millisecond while other processes kept both cores busy for 200 ms.
        // Stop, and the gate closes for everyone.
        machine.store(400_000_000, Ordering::SeqCst);
        let late = t0 + Duration::from_millis(200);
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
    fn losing_the_core_to_the_process_own_threads_keeps_the_gate_open() {
        let (machine, process, clock) = fake_clock!(M2, P2);
        let gate = SpinGate::with_load_clock(clock);
        let t0 = gate.base;
        // Both cores busy for 200 ms, all of it this process.
        machine.store(400_000_000, Ordering::SeqCst);
        process.store(400_000_000, Ordering::SeqCst);
        let mut spinner = gate.spinner();
        let now = t0 + Duration::from_millis(200);
        spinner.last = now - Duration::from_millis(1);
        // This spell stops (its thread lost the core), but the gate stays open.
        assert!(!spinner.look_at(now));
        assert!(gate.is_open(now));
        // In the next 200 ms other processes take a core: the gate closes.
        machine.store(800_000_000, Ordering::SeqCst);
        process.store(600_000_000, Ordering::SeqCst);
        let later = t0 + Duration::from_millis(400);
        spinner.last = later - Duration::from_millis(1);
        assert!(!spinner.look_at(later));
        assert!(!gate.is_open(later));
    }

    #[test]
    fn a_measurement_over_too_long_an_interval_counts_the_others_as_busy() {
        let (machine, process, clock) = fake_clock!(M3, P3);
        let gate = SpinGate::with_load_clock(clock);
        let t0 = gate.base;
        // Two seconds of this process alone, measured in one go: too old to judge by.
        machine.store(4_000_000_000, Ordering::SeqCst);
        process.store(4_000_000_000, Ordering::SeqCst);
        let now = t0 + Duration::from_secs(2);
        assert!(gate.others_busy(now));
        // The next interval is a fresh one: this process alone again keeps the gate open.
        machine.store(4_400_000_000, Ordering::SeqCst);
        process.store(4_400_000_000, Ordering::SeqCst);
        assert!(!gate.others_busy(now + Duration::from_millis(200)));
    }

    #[test]
    fn a_new_gate_is_open_and_reads_the_kernel_counts() {
        let gate = SpinGate::new();
        let mut spinner = gate.spinner();
        let now = spinner.last;
        assert!(gate.is_open(now));
        assert!(spinner.look_at(now + Duration::from_micros(1)));
        let (machine, process) = machine_and_process_time().expect("readable on Linux");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(process_cpu_time().expect("readable") > process, "{x}");
        assert!(machine_busy_time().expect("readable") >= machine);
    }
}
