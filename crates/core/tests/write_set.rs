//! A transaction's write set holds one entry per object, whatever path its writes take: a
//! `modify` whose closure writes the same object through the transaction commits once, with
//! `modify`'s value, and never fights itself for the object's lock.

use atomos_core::{Engine, TRef, TxOptions};

/// A bounded number of attempts: a transaction that cannot commit fails the test instead of
/// running forever.
fn bounded() -> TxOptions {
    TxOptions {
        max_attempts: Some(5),
        ..TxOptions::default()
    }
}

fn value(engine: &Engine, r: &TRef<u64>) -> u64 {
    engine.atomically(|tx| Ok(*tx.read(r)?)).unwrap()
}

#[test]
fn a_modify_whose_closure_writes_the_same_object_commits_its_own_value() {
    let engine = Engine::default();
    let a: TRef<u64> = TRef::new("a");
    engine.atomically(|tx| tx.create(&a, 1)).unwrap();

    // No earlier write to `a`: the closure's write makes an entry, which `modify` replaces.
    engine
        .run(&bounded(), |tx| {
            tx.modify(&a, |v| {
                tx.write(&a, 100).unwrap();
                *v += 1
            })
        })
        .unwrap();
    assert_eq!(value(&engine, &a), 2);

    // An earlier write to `a`: the same entry is replaced twice.
    engine
        .run(&bounded(), |tx| {
            tx.write(&a, 10)?;
            tx.modify(&a, |v| {
                tx.write(&a, 100).unwrap();
                *v += 1
            })
        })
        .unwrap();
    assert_eq!(value(&engine, &a), 11);
}

#[test]
fn the_same_holds_past_the_write_sets_linear_size() {
    let engine = Engine::default();
    let a: TRef<u64> = TRef::new("a");
    let others: Vec<TRef<u64>> = (0..20u64).map(|i| TRef::new(format!("o{i}"))).collect();
    engine
        .atomically(|tx| {
            tx.create(&a, 1)?;
            for o in &others {
                tx.create(o, 0)?;
            }
            Ok(())
        })
        .unwrap();
    engine
        .run(&bounded(), |tx| {
            for (i, o) in others.iter().enumerate() {
                tx.write(o, i as u64 + 1)?;
            }
            // Past 16 entries the write set is searched through its hash index.
            tx.modify(&a, |v| {
                tx.write(&a, 100).unwrap();
                tx.write(&others[3], 40).unwrap();
                *v += 1
            })
        })
        .unwrap();
    assert_eq!(value(&engine, &a), 2);
    assert_eq!(value(&engine, &others[3]), 40);
    assert_eq!(value(&engine, &others[19]), 20);
}
