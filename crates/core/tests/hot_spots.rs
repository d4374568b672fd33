//! Conflict monitoring: an object another transaction changed under a running one is counted
//! as that one's conflict, by name, most conflicted first.

use std::sync::Arc;

use atomos_core::{Engine, EngineConfig, Key, TRef};

#[test]
fn the_object_changed_under_a_transaction_is_counted() {
    let engine = Arc::new(Engine::new(EngineConfig {
        monitor_conflicts: true,
        ..EngineConfig::default()
    }));
    let hot: TRef<u64> = TRef::new("hot");
    let calm: TRef<u64> = TRef::new("calm");
    let out: TRef<u64> = TRef::new("out");
    engine
        .atomically(|tx| {
            tx.create(&hot, 0)?;
            tx.create(&calm, 0)?;
            tx.create(&out, 0)
        })
        .unwrap();
    for round in 0..3u64 {
        let mut first = true;
        engine
            .atomically(|tx| {
                let h = *tx.read(&hot)?;
                let c = *tx.read(&calm)?;
                if first {
                    first = false;
                    // Another thread commits a change of `hot` now: this attempt conflicts.
                    let (e, r) = (engine.clone(), hot.clone());
                    std::thread::spawn(move || e.atomically(|tx| tx.write(&r, round + 100)))
                        .join()
                        .unwrap()
                        .unwrap();
                }
                tx.write(&out, h + c)
            })
            .unwrap();
    }
    let top = engine.hot_spots(5);
    assert_eq!(top.first().map(|(k, _)| k.clone()), Some(Key::from("hot")));
    assert!(top[0].1 >= 3, "{top:?}");
    assert!(
        top.iter().all(|(k, _)| *k != Key::from("calm")),
        "an object nobody changed is no hot spot: {top:?}"
    );
}

/// Forward validation: `check` fails as soon as an object the attempt read was replaced, and
/// passes while nothing it read changed.
#[test]
fn a_check_fails_once_something_read_was_replaced() {
    let engine = Arc::new(Engine::new(EngineConfig::default()));
    let a: TRef<u64> = TRef::new("a");
    let b: TRef<u64> = TRef::new("b");
    engine
        .atomically(|tx| {
            tx.create(&a, 0)?;
            tx.create(&b, 0)
        })
        .unwrap();
    let mut attempts = 0;
    let mut checks_passed = 0;
    engine
        .atomically(|tx| {
            attempts += 1;
            let v = *tx.read(&a)?;
            // Something this attempt did not read changes: it goes on.
            let (e, r) = (engine.clone(), b.clone());
            std::thread::spawn(move || e.atomically(|tx| tx.modify(&r, |x| *x += 1)))
                .join()
                .unwrap()
                .unwrap();
            tx.check()?;
            checks_passed += 1;
            if attempts == 1 {
                // What it read changes: the check fails, and the attempt re-runs.
                let (e, r) = (engine.clone(), a.clone());
                std::thread::spawn(move || e.atomically(|tx| tx.write(&r, 7)))
                    .join()
                    .unwrap()
                    .unwrap();
                tx.check()?;
                unreachable!("the check passed after a read was replaced");
            }
            tx.write(&b, v)
        })
        .unwrap();
    assert_eq!((attempts, checks_passed), (2, 2));
    assert_eq!(engine.atomically(|tx| Ok(*tx.read(&b)?)).unwrap(), 7);
}

/// Automatic forward validation in a replicated engine: a write set applied from elsewhere
/// aborts, at its next operation, the running transaction that read what it wrote, and only
/// that one.
#[test]
fn an_applied_commit_dooms_the_transactions_that_read_what_it_wrote() {
    let engine = Arc::new(Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    }));
    let encoded = |v: u64| {
        let e = Engine::new(EngineConfig {
            replicated: true,
            ..EngineConfig::default()
        });
        e.atomically(|tx| tx.create(&TRef::<u64>::new("x"), v))
            .unwrap();
        e.snapshot_objects().unwrap().remove(0).2
    };
    engine.apply_certified(
        1,
        &[],
        vec![(Key::from("a"), encoded(1)), (Key::from("b"), encoded(1))],
    );
    let (a, b): (TRef<u64>, TRef<u64>) = (TRef::new("a"), TRef::new("b"));
    let mut attempts = 0;
    let seen = engine
        .atomically(|tx| {
            attempts += 1;
            let x = *tx.read(&a)?;
            if attempts == 1 {
                // A commit of `b`, which it has not read: it goes on, and reads the new `b`.
                engine.apply_certified(2, &[], vec![(Key::from("b"), encoded(2))]);
            }
            Ok(x + *tx.read(&b)?)
        })
        .unwrap();
    assert_eq!(
        (seen, attempts),
        (3, 1),
        "a commit of what it did not read dooms nothing"
    );
    // An update transaction that read `a` is doomed by a commit of `a` at its next operation.
    let mut attempts = 0;
    let mut failed_at_next_read = false;
    engine
        .atomically(|tx| {
            attempts += 1;
            let x = *tx.read(&a)?;
            if attempts == 1 {
                engine.apply_certified(3, &[], vec![(Key::from("a"), encoded(5))]);
                let r = tx.read(&b).copied();
                failed_at_next_read = matches!(r, Err(atomos_core::TxError::Conflict));
                r?;
            }
            Ok(x)
        })
        .map(|x| assert_eq!(x, 5))
        .unwrap();
    assert!(
        failed_at_next_read,
        "the read after the commit did not fail"
    );
    assert_eq!(attempts, 2);
}
