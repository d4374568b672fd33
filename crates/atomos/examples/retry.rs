//! `tx.retry()` as a condition variable: a transaction that finds nothing to do abandons its
//! attempt and blocks until an object it read changes, then runs again. Here a bounded queue
//! (one object) connects a producer and a consumer thread: the consumer blocks while the queue
//! is empty, the producer while it is full. Neither polls, and neither holds a lock.
//!
//! `cargo run -p atomos --example retry`

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use atomos::{Node, TRef, TxError};

const CAPACITY: usize = 2;
const ITEMS: u64 = 8;

/// Takes the oldest item, blocking (through `retry`) while the queue is empty.
fn take(node: &Node, queue: &TRef<VecDeque<u64>>, attempts: &AtomicU64) -> Result<u64, TxError> {
    // A timeout bounds the wait: a lost wake-up would fail the example instead of hanging it.
    node.tx().timeout(Duration::from_secs(10)).run(|tx| {
        attempts.fetch_add(1, Ordering::Relaxed);
        if tx.read(queue)?.is_empty() {
            return tx.retry(); // Sleeps until `queue` changes, then runs this closure again.
        }
        tx.modify(queue, |q| q.pop_front().expect("not empty"))
    })
}

/// Appends `item`, blocking while the queue holds `CAPACITY` items.
fn put(node: &Node, queue: &TRef<VecDeque<u64>>, item: u64) -> Result<(), TxError> {
    node.tx().timeout(Duration::from_secs(10)).run(|tx| {
        if tx.read(queue)?.len() >= CAPACITY {
            return tx.retry();
        }
        tx.modify(queue, |q| q.push_back(item))
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = Node::local();
    let queue: TRef<VecDeque<u64>> = TRef::new("queue");
    node.atomically(|tx| tx.create(&queue, VecDeque::new()))?;
    let start = Instant::now();

    // The producer starts late (the consumer waits on an empty queue first), then produces
    // faster than the consumer takes (it waits on a full queue).
    let producer = {
        let (node, queue) = (node.clone(), queue.clone());
        thread::spawn(move || -> Result<(), TxError> {
            thread::sleep(Duration::from_millis(100));
            for item in 1..=ITEMS {
                put(&node, &queue, item)?;
                println!("{:>4} ms  put  {item}", start.elapsed().as_millis());
            }
            Ok(())
        })
    };

    let attempts = Arc::new(AtomicU64::new(0));
    let mut got = Vec::new();
    for _ in 0..ITEMS {
        let item = take(&node, &queue, &attempts)?;
        println!("{:>4} ms  took {item}", start.elapsed().as_millis());
        got.push(item);
        thread::sleep(Duration::from_millis(20)); // A slow consumer.
    }
    producer.join().expect("the producer panicked")?;

    let stats = node.stats();
    let attempts = attempts.load(Ordering::Relaxed);
    println!(
        "consumer: {ITEMS} items in {attempts} attempts; {} waits in retry on the node",
        stats.retry_waits
    );
    assert_eq!(got, (1..=ITEMS).collect::<Vec<_>>(), "every item, in order");
    assert!(node.atomically_read(|tx| Ok(tx.read(&queue)?.is_empty()))?);
    // The first take found the queue empty and waited; the producer found it full and waited.
    assert!(stats.retry_waits >= 2, "{stats:?}");
    // A blocked transaction re-runs only when the queue changes: a few attempts per item, not
    // the thousands a polling loop would make.
    assert!(
        attempts <= 4 * ITEMS,
        "{attempts} attempts for {ITEMS} items"
    );
    Ok(())
}
