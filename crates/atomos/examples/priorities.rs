//! Priorities (PRESTO) through a node's transaction service: transactions are submitted with a
//! priority (1 lowest to 5) and run on a pool of workers, most urgent first. One worker is
//! busy with a long low-priority transaction and two more wait behind it when an urgent one
//! arrives:
//!
//! - under `Policy::None` the urgent one jumps the queue but waits for the running one to end;
//! - under `Policy::Preemptive` the running one is suspended at its next transactional
//!   operation, the urgent one runs at once, and the suspended one resumes afterwards with its
//!   snapshot intact (it does not re-run: the urgent one wrote nothing it read).
//!
//! `cargo run -p atomos --example priorities`

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use atomos::service::{Policy, ServiceConfig, Ticket, Timing};
use atomos::{Key, Node, TRef, TxError, TxService};

const OBJECTS: u64 = 20;
/// How long each low-priority transaction keeps reading.
const LONG: Duration = Duration::from_millis(150);

type Outcome<T> = Ticket<Result<T, TxError>>;

fn object(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("obj/", i))
}

/// A long level-1 transaction: reads every object again and again for `LONG` (each read is a
/// safe point where it may be preempted), then bumps `done`. Counts its attempts.
fn submit_long(s: &TxService, started: &Arc<AtomicBool>, attempts: &Arc<AtomicU32>) -> Outcome<()> {
    let (started, attempts) = (started.clone(), attempts.clone());
    s.submit(1, move |tx| {
        attempts.fetch_add(1, Ordering::Relaxed);
        started.store(true, Ordering::Release);
        let begin = Instant::now();
        while begin.elapsed() < LONG {
            for i in 0..OBJECTS {
                tx.read(&object(i))?;
            }
        }
        tx.modify(&TRef::<i64>::new("done"), |d| *d += 1)
    })
    .expect("level 1 is one of the service's")
}

/// Runs three long transactions and one urgent one under `policy`; returns the timings of the
/// long ones, of the urgent one, and the first long one's attempts.
fn scenario(policy: Policy) -> Result<(Vec<Timing>, Timing, u32), Box<dyn std::error::Error>> {
    let node = Node::local();
    node.atomically(|tx| {
        (0..OBJECTS).try_for_each(|i| tx.create(&object(i), 1))?;
        tx.create(&TRef::<i64>::new("done"), 0)?;
        tx.create(&TRef::<i64>::new("urgent"), 0)
    })?;
    let config = ServiceConfig {
        workers: 1,
        policy,
        ..ServiceConfig::default()
    };
    let service = TxService::start(&node, config)?;

    let (started, attempts) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU32::new(0)),
    );
    let mut long = vec![submit_long(&service, &started, &attempts)];
    while !started.load(Ordering::Acquire) {
        thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..2 {
        long.push(submit_long(&service, &Arc::default(), &Arc::default()));
    }
    let urgent = service.submit(5, |tx| tx.modify(&TRef::<i64>::new("urgent"), |u| *u += 1))?;
    let (result, urgent) = urgent.wait()?;
    result?;
    let mut timings = Vec::new();
    for t in long {
        let (result, timing) = t.wait()?;
        result?;
        timings.push(timing);
    }
    let done = node.atomically_read(|tx| Ok(*tx.read(&TRef::<i64>::new("done"))?))?;
    assert_eq!(done, 3, "every long transaction committed once");
    Ok((timings, urgent, attempts.load(Ordering::Relaxed)))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for policy in [Policy::None, Policy::Preemptive] {
        let (long, urgent, attempts) = scenario(policy)?;
        let at = |t: Instant| t.duration_since(long[0].submitted).as_millis();
        println!("policy {policy:?}:");
        for (i, t) in long.iter().enumerate() {
            println!(
                "  low #{}   ran {:>3}..{:>3} ms, preempted {}x",
                i + 1,
                at(t.started),
                at(t.ended),
                t.preemptions
            );
        }
        println!(
            "  urgent   ran {:>3}..{:>3} ms, waited {:?} for a worker",
            at(urgent.started),
            at(urgent.ended),
            urgent.reaction()
        );
        // Either way the urgent one runs before the low ones that were still queued.
        assert!(urgent.ended <= long[1].started && urgent.ended <= long[2].started);
        match policy {
            Policy::None => {
                // It waited for the running one to end.
                assert!(urgent.started >= long[0].ended);
                assert_eq!(long[0].preemptions, 0);
            }
            _ => {
                // It took the worker from the running one, which ended after it.
                assert!(urgent.ended <= long[0].ended);
                assert_eq!(long[0].preemptions, 1);
                assert_eq!(attempts, 1, "the preempted transaction resumed, not re-ran");
            }
        }
    }
    Ok(())
}
