//! How much time the machine takes away from a thread that never blocks: one thread per core
//! reads the clock in a loop for a few seconds, and every gap between two reads longer than
//! 10 us is time the core spent elsewhere (interrupts, kernel threads, other processes, the
//! hypervisor). The open-loop benchmark's tails include these gaps under every policy; run this
//! in the same sitting to see how many there were.
//!
//! `cargo run --release -p atomos-sched --example stalls [SECONDS]` (default 5).

use std::thread;
use std::time::{Duration, Instant};

/// Gap bounds in microseconds: a gap is counted under the largest bound it exceeds.
const BOUNDS_US: [u64; 6] = [10, 50, 200, 500, 1_000, 5_000];

/// What one spinning thread saw.
struct Gaps {
    /// Gaps per bound of [`BOUNDS_US`].
    counts: [u64; BOUNDS_US.len()],
    /// Time in gaps over 10 us.
    lost: Duration,
    longest: Duration,
}

fn spin(length: Duration) -> Gaps {
    let mut gaps = Gaps {
        counts: [0; BOUNDS_US.len()],
        lost: Duration::ZERO,
        longest: Duration::ZERO,
    };
    let start = Instant::now();
    let mut last = start;
    loop {
        let now = Instant::now();
        let gap = now.duration_since(last);
        last = now;
        if now.duration_since(start) >= length {
            return gaps;
        }
        let micros = gap.as_micros() as u64;
        if let Some(bucket) = BOUNDS_US.iter().rposition(|&b| micros > b) {
            gaps.counts[bucket] += 1;
            gaps.lost += gap;
            gaps.longest = gaps.longest.max(gap);
        }
    }
}

fn main() {
    let seconds: f64 = match std::env::args().nth(1).map(|a| a.parse::<f64>()) {
        None => 5.0,
        Some(Ok(s)) if s > 0.0 && s <= 3_600.0 => s,
        Some(_) => {
            eprintln!("usage: stalls [SECONDS] (a number of seconds, at most 3600)");
            std::process::exit(2);
        }
    };
    let length = Duration::from_secs_f64(seconds);
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<_> = (0..cores)
        .map(|_| thread::spawn(move || spin(length)))
        .collect();
    let header: Vec<String> = BOUNDS_US.iter().map(|b| format!("> {b} us")).collect();
    println!(
        "{cores} threads spinning {seconds} s; gaps between two clock reads: {} | time lost | longest",
        header.join(" | ")
    );
    for (i, t) in threads.into_iter().enumerate() {
        let Ok(g) = t.join() else {
            eprintln!("thread {i} panicked");
            std::process::exit(1);
        };
        let counts: Vec<String> = g.counts.iter().map(u64::to_string).collect();
        println!(
            "thread {i}: {} | {:.1} ms ({:.2}%) | {:.2} ms",
            counts.join(" | "),
            g.lost.as_secs_f64() * 1e3,
            100.0 * g.lost.as_secs_f64() / seconds,
            g.longest.as_secs_f64() * 1e3
        );
    }
}
