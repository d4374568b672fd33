//! Measures the service's preemption reaction time without any engine: every worker runs a
//! low-priority task that passes a safe point about every microsecond, and high-priority
//! requests arrive as a Poisson process; prints how long those that needed a preemption waited
//! from submission to their start (p50, p99, p99.9, max).
//!
//! `cargo run --release -p atomos-sched --example reaction -- [WORKERS] [RATE] [SECONDS]`
//! (defaults 1 worker, 20,000 requests per second, 3 seconds).

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_sched::{yield_now, Policy, ServiceConfig, TxService};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: f64| {
        args.get(i)
            .map_or(Ok(default), |a| a.parse::<f64>())
            .unwrap_or_else(|e| {
                eprintln!("argument {}: {e}", i + 1);
                std::process::exit(2)
            })
    };
    let workers = arg(0, 1.0) as usize;
    let rate = arg(1, 20_000.0);
    let seconds = arg(2, 3.0);
    let service = match TxService::start(ServiceConfig {
        workers,
        levels: 5,
        contexts: 1024,
        stack_bytes: 64 * 1024,
        policy: Policy::Preemptive,
        ..ServiceConfig::default()
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2)
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let background: Vec<_> = (0..workers)
        .map(|_| {
            let stop = stop.clone();
            service.submit(1, move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(1) {
                        std::hint::spin_loop();
                    }
                    yield_now();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));

    // Poisson arrivals from a seeded generator (fixed seed: runs are comparable).
    let mut rng = SplitMix64::seed_from_u64(1);
    let mut uniform = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut next = Instant::now();
    let mut tickets = Vec::new();
    while next < end {
        next += Duration::from_secs_f64(-(1.0 - uniform()).ln() / rate);
        while Instant::now() < next {
            std::hint::spin_loop();
        }
        match service.submit(5, || ()) {
            Ok(t) => tickets.push(t),
            Err(e) => eprintln!("{e}"),
        }
    }
    let mut reactions: Vec<u64> = tickets
        .into_iter()
        .filter_map(|t| t.wait().ok())
        .filter(|(_, timing)| timing.needed_preemption)
        .map(|(_, timing)| timing.reaction().as_nanos() as u64)
        .collect();
    stop.store(true, Ordering::Relaxed);
    for t in background.into_iter().flatten() {
        let _ = t.wait();
    }
    reactions.sort_unstable();
    let at = |q: f64| {
        reactions
            .get(((reactions.len() as f64 * q) as usize).min(reactions.len().saturating_sub(1)))
            .map_or(0.0, |&ns| ns as f64 / 1000.0)
    };
    println!(
        "{} preempting arrivals: reaction p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us; {:?}",
        reactions.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0),
        service.stats()
    );
}
