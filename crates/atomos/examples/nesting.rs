//! Closed and open nesting on a local node.
//!
//! - Closed nesting (`tx.nested`): a block inside a transaction whose failure (an application
//!   error, or a conflict) rolls back only the block; the enclosing transaction goes on.
//! - Open nesting (`tx.open_nested`): a block that commits on its own at once, visible to
//!   everyone, guarded by an abstract lock held until the enclosing transaction ends, with an
//!   `on_abort` compensation run if that transaction aborts and an `on_commit` action run if
//!   it commits.
//!
//! `cargo run -p atomos --example nesting`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use atomos::{Node, TRef, TxError};

/// Writes `value` to `r` in a transaction of its own, on another thread, and waits for it.
fn set_elsewhere(node: &Node, r: &TRef<i64>, value: i64) -> Result<(), TxError> {
    thread::scope(|s| {
        s.spawn(|| node.atomically(|tx| tx.write(r, value)))
            .join()
            .expect("the writer panicked")
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = Node::local();
    let stock: TRef<i64> = TRef::new("stock/book");
    let wraps: TRef<i64> = TRef::new("stock/gift-wrap");
    let fees: TRef<i64> = TRef::new("fees");
    let sold: TRef<i64> = TRef::new("sold");
    node.atomically(|tx| {
        tx.create(&stock, 10)?;
        tx.create(&wraps, 0)?;
        tx.create(&fees, 0)?;
        tx.create(&sold, 0)
    })?;

    // 1. Closed nesting, an application error: the order goes through without gift wrap.
    let wrapped = node.atomically(|tx| {
        tx.modify(&stock, |s| *s -= 1)?;
        let wrap = tx.nested(|tx| {
            tx.modify(&fees, |f| *f += 3)?; // Undone with the block.
            if *tx.read(&wraps)? == 0 {
                return Err(TxError::abort("out of gift wrap"));
            }
            tx.modify(&wraps, |w| *w -= 1)
        });
        println!("closed: nested block said {wrap:?}; the order goes on without it");
        Ok(wrap.is_ok())
    })?;
    let (s, f) = node.atomically_read(|tx| Ok((*tx.read(&stock)?, *tx.read(&fees)?)))?;
    println!("closed: stock {s}, fees {f} (the block's fee was rolled back)");
    assert!(!wrapped);
    assert_eq!((s, f), (9, 0));

    // 2. Closed nesting, a conflict: another thread changes what only the block read, so
    //    only the block re-runs; the outer part runs once.
    let (outer_runs, inner_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let other = node.clone();
    node.atomically(|tx| {
        outer_runs.fetch_add(1, Ordering::Relaxed);
        let base = *tx.read(&stock)?;
        tx.nested(|tx| {
            let fee = *tx.read(&fees)?;
            if inner_runs.fetch_add(1, Ordering::Relaxed) == 0 {
                // Another thread replaces `fees` under the block (the block then reads again,
                // and its snapshot cannot be extended past the change), then again.
                set_elsewhere(&other, &fees, 10)?;
                tx.read(&stock)?;
                set_elsewhere(&other, &fees, 20)?;
                tx.write(&fees, fee + 1)?;
                return tx.read(&fees).map(|_| ());
            }
            tx.write(&fees, fee + base)
        })
    })?;
    let fee = node.atomically_read(|tx| Ok(*tx.read(&fees)?))?;
    let (outer, inner) = (outer_runs.into_inner(), inner_runs.into_inner());
    println!("closed: outer ran {outer}x, block ran {inner}x, fees now {fee}");
    assert_eq!((outer, inner), (1, 2));
    assert_eq!(fee, 20 + 9);
    assert!(node.stats().nested_rollbacks >= 1);

    // 3. Open nesting: reserve a copy (committed at once, under the abstract lock "sku-7"),
    //    then the payment fails: the enclosing transaction aborts and the compensation puts
    //    the copy back; the on-commit action never runs.
    let out = node.atomically(|tx| {
        tx.open_nested(|tx| {
            tx.abstract_lock("sku-7")?;
            tx.modify(&stock, |s| *s -= 1)?;
            let stock = stock.clone();
            tx.on_abort(move |tx| tx.modify(&stock, |s| *s += 1));
            let sold = sold.clone();
            tx.on_commit(move |tx| tx.modify(&sold, |n| *n += 1));
            Ok(())
        })?;
        // The reservation is visible to other transactions already, and the lock is held.
        let seen = thread::scope(|s| {
            s.spawn(|| other.atomically_read(|tx| Ok(*tx.read(&stock)?)))
                .join()
                .expect("the reader panicked")
        })?;
        println!("open: while the order runs, another thread sees stock {seen}");
        assert_eq!(seen, 8);
        assert!(tx.engine().abstract_lock_held("sku-7"));
        Err::<(), _>(TxError::abort("payment refused"))
    });
    let state = node.atomically_read(|tx| Ok((*tx.read(&stock)?, *tx.read(&sold)?)))?;
    println!("open: order failed ({out:?}); stock, sold = {state:?} after compensation");
    assert!(out.is_err());
    assert_eq!(state, (9, 0));
    assert!(!node.engine().abstract_lock_held("sku-7"));

    // 4. The same order with the payment accepted: the on-commit action records the sale.
    node.atomically(|tx| {
        tx.open_nested(|tx| {
            tx.abstract_lock("sku-7")?;
            tx.modify(&stock, |s| *s -= 1)?;
            let sold = sold.clone();
            tx.on_commit(move |tx| tx.modify(&sold, |n| *n += 1));
            Ok(())
        })
    })?;
    let state = node.atomically_read(|tx| Ok((*tx.read(&stock)?, *tx.read(&sold)?)))?;
    println!("open: order paid; stock, sold = {state:?}");
    assert_eq!(state, (8, 1));
    assert!(!node.engine().abstract_lock_held("sku-7"));
    Ok(())
}
