//! A checkpointed transaction: `node.steps(state).step(..).step(..).run()` runs its steps as
//! one transaction over a cloneable state, taking a checkpoint before each step. When a
//! conflict hits, it resumes from the latest step whose earlier reads are still valid instead
//! of starting over: here a costly first step (an inventory scan) is not redone when only the
//! price read by the second step changes.
//!
//! `cargo run -p atomos --example checkpoints`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use atomos::{Key, Node, TRef};

const ITEMS: u64 = 50;

/// What the steps build up: carried from step to step, and cloned at each checkpoint.
#[derive(Clone, Debug, Default)]
struct Quote {
    units: i64,
    price: i64,
    total: i64,
}

fn item(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("inventory/", i))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = Node::local();
    let price: TRef<i64> = TRef::new("price");
    let order: TRef<i64> = TRef::new("order-total");
    node.atomically(|tx| {
        for i in 0..ITEMS {
            tx.create(&item(i), 2)?;
        }
        tx.create(&price, 5)?;
        tx.create(&order, 0)
    })?;

    let runs = [
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ];
    let other = node.clone();
    let quote = node
        .steps(Quote::default())
        // Step 1: the costly part, a scan of the whole inventory.
        .step(|tx, q| {
            runs[0].fetch_add(1, Ordering::Relaxed);
            q.units = (0..ITEMS)
                .map(|i| tx.read(&item(i)).copied())
                .sum::<Result<_, _>>()?;
            Ok(())
        })
        // Step 2: the unit price.
        .step(|tx, q| {
            runs[1].fetch_add(1, Ordering::Relaxed);
            q.price = *tx.read(&price)?;
            Ok(())
        })
        // Step 3: the order. On its first run another thread raises the price, so the price
        // step's read is stale (the inventory scan's reads are not): the transaction resumes
        // from the checkpoint before step 2.
        .step(|tx, q| {
            if runs[2].fetch_add(1, Ordering::Relaxed) == 0 {
                thread::scope(|s| {
                    s.spawn(|| other.atomically(|tx| tx.write(&price, 7)))
                        .join()
                        .expect("the price writer panicked")
                })?;
            }
            q.total = q.units * q.price;
            tx.write(&order, q.total)
        })
        .run()?;

    let runs = runs.map(AtomicUsize::into_inner);
    let stored = node.atomically_read(|tx| Ok(*tx.read(&order)?))?;
    println!("quote {quote:?}, stored order total {stored}");
    println!(
        "step runs: scan {}, price {}, order {}; checkpoint resumes: {}",
        runs[0],
        runs[1],
        runs[2],
        node.stats().checkpoint_resumes
    );
    assert_eq!(quote.units, 2 * ITEMS as i64);
    assert_eq!(quote.price, 7, "the committed quote uses the new price");
    assert_eq!(stored, quote.total);
    assert_eq!(
        runs,
        [1, 2, 2],
        "only the steps after the last valid checkpoint re-ran"
    );
    assert!(node.stats().checkpoint_resumes >= 1);
    Ok(())
}
